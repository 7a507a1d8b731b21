// Engine and Session: load, optimize once; specialize per input shapes and run.
#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "graph/passes.h"
#include "onnx/onnx_importer.h"
#include "runtime/executor.h"
#include "runtime/reference/reference_ops.h"
#include "runtime/topology.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol {

namespace {

bool verbose_from_env() {
  const char* v = std::getenv("SPARSECOL_VERBOSE");
  return v != nullptr && std::string(v) != "0" && std::string(v).size() > 0;
}

TensorInfo describe_value(const graph::Value& value) {
  TensorInfo info;
  info.name = value.name;
  info.dtype = value.dtype;
  info.shape_known = value.shape.has_value();
  if (value.shape) {
    for (const graph::Dim& d : *value.shape) {
      info.shape.push_back(d.known() ? d.value : -1);
      info.dim_names.push_back(d.symbol);
    }
  }
  return info;
}

std::map<std::string, int> op_histogram(const graph::Graph& graph) {
  std::map<std::string, int> counts;
  for (const graph::Node& node : graph.nodes) ++counts[node.op_type];
  return counts;
}

}  // namespace

struct Engine::Impl {
  Options options;
  graph::Graph graph;  // after the load-time passes, dimensions may be symbolic
  std::map<std::string, int> file_ops;
  std::vector<TensorInfo> inputs, outputs;
  int threads = 1;  // options.threads resolved (0: one per physical core)
};

struct Session::Impl {
  std::shared_ptr<const Engine::Impl> engine;
  // One executor per distinct set of input shapes (a batch size, typically).
  std::map<std::vector<std::vector<int64_t>>, std::unique_ptr<runtime::Executor>> executors;
  bool profiling = false;
  runtime::Profiler profiler;
  std::vector<ProfileEvent> profile;  // the last profiled run's events
};

namespace {

// The executor of the engine's schedule for a graph specialized to its input shapes.
std::unique_ptr<runtime::Executor> make_executor(const Engine::Impl& engine,
                                                 graph::Graph specialized) {
  switch (engine.options.schedule) {
    case Schedule::kReference:
      return runtime::make_reference_executor(std::move(specialized));
    case Schedule::kLayerWise:
      return runtime::make_layerwise_executor(std::move(specialized), engine.threads,
                                              engine.options);
    case Schedule::kOneDnn:
      return runtime::make_onednn_executor(std::move(specialized), engine.threads);
    case Schedule::kDepthWise:
      return runtime::make_depthwise_executor(std::move(specialized), engine.threads,
                                              engine.options);
    case Schedule::kCuda:
    case Schedule::kCudaSparse:
      return runtime::make_cuda_executor(std::move(specialized), engine.options);
  }
  throw Error(ErrorCode::kInvalidArgument, "unknown schedule");
}

}  // namespace

Engine Engine::load(const std::string& path, const Options& options) {
  auto impl = std::make_shared<Impl>();
  impl->options = options;
  impl->options.verbose = options.verbose || verbose_from_env();
  if (options.threads < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("threads must be >= 0 (0: one per core), got {}", options.threads));
  }
  // One thread per physical core by default: the kernels are FMA-bound, and two hyper-threads
  // share one core's FMA units.
  impl->threads =
      options.threads > 0 ? options.threads : runtime::machine_topology().physical_cores;
  impl->graph = onnx_import::import_model_file(path);
  impl->file_ops = op_histogram(impl->graph);
  graph::optimize(impl->graph, runtime::evaluate_node);
  for (int v : impl->graph.inputs) {
    impl->inputs.push_back(describe_value(impl->graph.values[static_cast<std::size_t>(v)]));
  }
  for (int v : impl->graph.outputs) {
    impl->outputs.push_back(describe_value(impl->graph.values[static_cast<std::size_t>(v)]));
  }
  if (impl->options.verbose) {
    std::cerr << fmt::format(
        "sparsecol: loaded {}: {} nodes in the file, {} after passes\n", path,
        [&] {
          int n = 0;
          for (const auto& [op, count] : impl->file_ops) n += count;
          return n;
        }(),
        impl->graph.nodes.size());
  }
  return Engine(std::move(impl));
}

const std::vector<TensorInfo>& Engine::inputs() const { return impl_->inputs; }
const std::vector<TensorInfo>& Engine::outputs() const { return impl_->outputs; }
const Options& Engine::options() const { return impl_->options; }

Session Engine::session() const {
  auto impl = std::make_unique<Session::Impl>();
  impl->engine = impl_;
  return Session(std::move(impl));
}

std::string Engine::describe() const {
  const graph::Graph& g = impl_->graph;
  std::string text = fmt::format("model: {} (opset {})\n", g.source, g.opset);
  text += "inputs:\n";
  for (const TensorInfo& info : impl_->inputs) {
    text +=
        fmt::format("  {:<24} {:<8} {}\n", info.name, to_string(info.dtype), shape_string(info));
  }
  text += "outputs:\n";
  for (const TensorInfo& info : impl_->outputs) {
    text +=
        fmt::format("  {:<24} {:<8} {}\n", info.name, to_string(info.dtype), shape_string(info));
  }
  text += "ops in the file:\n";
  for (const auto& [op, count] : impl_->file_ops) text += fmt::format("  {:<24} {}\n", op, count);
  std::map<std::string, int> fused;
  for (const graph::Node& node : g.nodes) {
    for (const graph::EpilogueOp& op : node.epilogue) {
      ++fused[fmt::format("{} + {}", node.op_type, graph::to_string(op.kind))];
    }
  }
  // The schedules run this graph specialized to the input shapes, where shape-dependent passes
  // (folding a scale into a projection, Transposes into products) may change it further.
  text +=
      "ops after the load-time passes (constant folding, BatchNormalization and layer-norm "
      "fusion, epilogue fusion; the layer table shows what a schedule runs at the given "
      "batch):\n";
  for (const auto& [op, count] : op_histogram(g)) text += fmt::format("  {:<24} {}\n", op, count);
  for (const auto& [op, count] : fused) text += fmt::format("  {:<24} {} fused\n", op, count);

  text += "initializers (name, dtype, shape, sparsity = fraction of exact zeros):\n";
  int64_t total = 0, zeros_total = 0;
  for (const graph::Value& v : g.values) {
    if (!v.constant || v.constant->numel() < 2) continue;  // skip scalars folded from attrs
    const Tensor& t = *v.constant;
    int64_t zeros = 0;
    if (t.dtype() == DType::kFloat32) {
      const float* p = t.data<float>();
      for (int64_t i = 0; i < t.numel(); ++i) zeros += p[i] == 0.0f ? 1 : 0;
      total += t.numel();
      zeros_total += zeros;
    }
    text += fmt::format("  {:<40} {:<8} {:<20} {:6.2f}%\n", v.name, to_string(t.dtype()),
                        graph::to_string(graph::make_shape(t.shape())),
                        t.numel() ? 100.0 * static_cast<double>(zeros) / t.numel() : 0.0);
  }
  text += fmt::format("float32 parameters: {}, sparsity {:.2f}%\n", total,
                      total ? 100.0 * static_cast<double>(zeros_total) / total : 0.0);
  return text;
}

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::~Session() = default;
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;

NamedTensors Session::run(const NamedTensors& inputs) {
  const Engine::Impl& engine = *impl_->engine;
  const std::string& file = engine.graph.source;
  for (const auto& [name, tensor] : inputs) {
    bool known = false;
    for (const TensorInfo& info : engine.inputs) known = known || info.name == name;
    if (!known) {
      std::vector<std::string> names;
      for (const TensorInfo& info : engine.inputs) names.push_back(info.name);
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: the model has no input named '{}' (inputs: {})", file, name,
                              fmt::join(names, ", ")));
    }
  }
  std::vector<std::vector<int64_t>> key;
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const TensorInfo& info : engine.inputs) {
    auto it = inputs.find(info.name);
    if (it == inputs.end()) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: input '{}' is missing", file, info.name));
    }
    const Tensor& t = it->second;
    if (t.dtype() != info.dtype) {
      throw Error(ErrorCode::kDtypeMismatch,
                  fmt::format("{}: input '{}' expects dtype {}, got {}", file, info.name,
                              to_string(info.dtype), to_string(t.dtype())));
    }
    if (t.raw_data() == nullptr && t.numel() > 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: input '{}' has no data", file, info.name));
    }
    key.push_back(t.shape());
    shapes[info.name] = t.shape();
  }
  auto& executor = impl_->executors[key];
  if (!executor) {
    executor =
        make_executor(engine, graph::specialize(engine.graph, shapes, runtime::evaluate_node));
  }
  executor->set_profiler(impl_->profiling ? &impl_->profiler : nullptr);
  NamedTensors outputs = executor->run(inputs);
  if (impl_->profiling) impl_->profile = impl_->profiler.events();
  return outputs;
}

void Session::set_profiling(bool on) { impl_->profiling = on; }

const std::vector<ProfileEvent>& Session::profile() const { return impl_->profile; }

namespace {

// The engine's graph specialized to `shapes`, symbolic dimensions of inputs not named set to 1.
graph::Graph specialize_for(const Engine::Impl& engine,
                            const std::map<std::string, std::vector<int64_t>>& shapes) {
  std::map<std::string, std::vector<int64_t>> all = shapes;
  for (const TensorInfo& info : engine.inputs) {
    if (all.count(info.name) != 0) continue;
    std::vector<int64_t> dims = info.shape;
    for (int64_t& d : dims) d = d < 0 ? 1 : d;
    all[info.name] = dims;
  }
  return graph::specialize(engine.graph, all, runtime::evaluate_node);
}

}  // namespace

std::vector<LayerInfo> Engine::layers(
    const std::map<std::string, std::vector<int64_t>>& shapes) const {
  return make_executor(*impl_, specialize_for(*impl_, shapes))->layers();
}

std::string Engine::plan_report(const std::map<std::string, std::vector<int64_t>>& shapes) const {
  return runtime::describe_depthwise_plan(specialize_for(*impl_, shapes), impl_->threads,
                                          impl_->options);
}

}  // namespace sparsecol
