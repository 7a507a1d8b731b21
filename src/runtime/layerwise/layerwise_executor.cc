// The layer-by-layer schedule: every node in order over whole tensors, each on its fast kernel
// (steps.h) split over an OpenMP team, every intermediate in one arena planned at build
// (plan/memory_plan.h). Nothing is allocated per run but the outputs handed to the caller.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include <fmt/format.h>

#include "graph/passes.h"
#include "plan/memory_plan.h"
#include "runtime/executor.h"
#include "runtime/layerwise/steps.h"

namespace sparsecol::runtime {

namespace {

bool verbose_from_env() {
  const char* v = std::getenv("SPARSECOL_VERBOSE");
  return v != nullptr && std::strcmp(v, "0") != 0 && *v != '\0';
}

class LayerwiseExecutor final : public Executor {
 public:
  LayerwiseExecutor(graph::Graph graph, int threads, const Options& options)
      : graph_(std::move(graph)), threads_(std::max(1, threads)), options_(options) {
    if (threads < 1) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("layerwise: threads must be >= 1, got {}", threads));
    }
    tensors_.resize(graph_.values.size());
    scratch_.resize(static_cast<std::size_t>(threads_));
    const bool verbose = verbose_from_env();
    choose_steps(verbose);
    plan_buffers(verbose);
  }

  NamedTensors run(const NamedTensors& inputs) override {
    for (int v : graph_.inputs) {
      tensors_[static_cast<std::size_t>(v)] = inputs.at(value(v).name);
    }
    for (int v : owned_outputs_) {
      tensors_[static_cast<std::size_t>(v)] = Tensor::zeros(value(v).dtype, dims(v));
    }
    layerwise::RunContext ctx{tensors_, threads_, scratch_};
    if (profiler_ != nullptr) profiler_->begin_run(1);
    for (std::size_t n = 0; n < steps_.size(); ++n) {
      // One event per layer on "thread" 0: the step's own OpenMP team is inside it.
      Profiler::Scope timed(profiler_, 0, graph_.nodes[n]);
      steps_[n]->run(ctx);
    }
    NamedTensors outputs;
    for (int v : graph_.outputs) {
      const Tensor& t = tensors_[static_cast<std::size_t>(v)];
      // Caller inputs and constants are shared storage: hand out a copy the caller owns.
      outputs[value(v).name] = root_[static_cast<std::size_t>(v)] == kOwned ? t : t.clone();
    }
    // Drop this run's references: the caller's inputs, the outputs now owned by the caller.
    for (int v : graph_.inputs) tensors_[static_cast<std::size_t>(v)] = Tensor();
    for (int v : owned_outputs_) tensors_[static_cast<std::size_t>(v)] = Tensor();
    return outputs;
  }

  std::vector<LayerInfo> layers() const override {
    std::vector<LayerInfo> infos;
    for (std::size_t n = 0; n < steps_.size(); ++n) {
      infos.push_back(describe_node(graph_, graph_.nodes[n]));
      steps_[n]->describe(infos.back());
      if (written_over(graph_.nodes[n].outputs[0]))
        infos.back().implementation += layerwise::kWrittenOverInput;
    }
    return infos;
  }

 private:
  // root_ of a value that is not in the arena.
  static constexpr int kNotPlanned = -1;  // constant or caller input
  static constexpr int kOwned = -2;       // graph output, allocated per run

  const graph::Value& value(int id) const { return graph_.values[static_cast<std::size_t>(id)]; }
  std::vector<int64_t> dims(int id) const { return graph_.concrete_dims(id); }

  // One step per node: a zero-copy view, the fast kernel, or the reference op.
  void choose_steps(bool verbose) {
    root_.assign(graph_.values.size(), kNotPlanned);
    for (std::size_t v = 0; v < graph_.values.size(); ++v) {
      if (graph_.values[v].producer >= 0 && !graph_.values[v].constant) {
        root_[v] = graph_.is_output(static_cast<int>(v)) ? kOwned : static_cast<int>(v);
      }
    }
    for (std::size_t n = 0; n < graph_.nodes.size(); ++n) {
      const graph::Node& node = graph_.nodes[n];
      std::string why_not;
      std::unique_ptr<layerwise::Step> step =
          layerwise::make_whole_step(graph_, node, options_, &why_not);
      layerwise::place_output(graph_, n, *step, root_, written_over_);
      if (verbose) {
        std::fprintf(stderr, "layerwise: %s '%s': %s%s\n", node.op_type.c_str(), node.name.c_str(),
                     step->implementation().c_str(),
                     why_not.empty() ? "" : fmt::format(" ({})", why_not).c_str());
      }
      steps_.push_back(std::move(step));
    }
    for (std::size_t v = 0; v < graph_.values.size(); ++v) {
      if (graph_.values[v].constant) tensors_[v] = *graph_.values[v].constant;
      if (root_[v] == kOwned) owned_outputs_.push_back(static_cast<int>(v));
    }
  }

  // Lifetimes of the arena buffers (a view extends its root's), then one offset each.
  void plan_buffers(bool verbose) {
    std::vector<int> buffer_of(graph_.values.size(), -1);
    std::vector<int> buffer_values;
    std::vector<plan::BufferRequest> requests;
    for (std::size_t v = 0; v < graph_.values.size(); ++v) {
      if (root_[v] != static_cast<int>(v)) continue;
      const int step = graph_.values[v].producer;
      const auto size =
          static_cast<int64_t>(checked_numel(dims(static_cast<int>(v))) *
                               static_cast<int64_t>(dtype_size(graph_.values[v].dtype)));
      buffer_of[v] = static_cast<int>(requests.size());
      buffer_values.push_back(static_cast<int>(v));
      requests.push_back({size, step, step});
    }
    for (std::size_t n = 0; n < graph_.nodes.size(); ++n) {
      for (int v : graph_.nodes[n].inputs) {
        if (v < 0 || root_[static_cast<std::size_t>(v)] < 0) continue;
        plan::BufferRequest& r = requests[static_cast<std::size_t>(
            buffer_of[static_cast<std::size_t>(root_[static_cast<std::size_t>(v)])])];
        r.last_step = std::max(r.last_step, static_cast<int>(n));
      }
    }
    const plan::MemoryPlan plan = plan::plan_memory(requests);
    arena_size_ = plan.arena_size;
    arena_ = plan::allocate_arena(arena_size_);
    for (std::size_t b = 0; b < buffer_values.size(); ++b) {
      const int v = buffer_values[b];
      tensors_[static_cast<std::size_t>(v)] =
          Tensor::view(arena_.get() + plan.offsets[b], value(v).dtype, dims(v));
    }
    for (int v : written_over_) {
      const int b = buffer_of[static_cast<std::size_t>(root_[static_cast<std::size_t>(v)])];
      tensors_[static_cast<std::size_t>(v)] = Tensor::view(
          arena_.get() + plan.offsets[static_cast<std::size_t>(b)], value(v).dtype, dims(v));
    }
    if (verbose) {
      int64_t total = 0;
      for (const plan::BufferRequest& r : requests) total += r.size;
      std::fprintf(stderr,
                   "layerwise: %zu buffers, arena %.1f MiB (%.1f MiB without reuse), %d threads\n",
                   requests.size(), static_cast<double>(arena_size_) / (1 << 20),
                   static_cast<double>(total) / (1 << 20), threads_);
    }
  }

  bool written_over(int v) const {
    return std::find(written_over_.begin(), written_over_.end(), v) != written_over_.end();
  }

  graph::Graph graph_;
  int threads_;
  Options options_;
  std::vector<Tensor> tensors_;  // by value id: arena views, constants, inputs/outputs per run
  std::vector<int> root_;        // value id whose buffer a value lives in, or kNotPlanned/kOwned
  // Outputs placed in the buffer of an input their step writes over (Step::writes_over_input).
  std::vector<int> written_over_;
  std::vector<int> owned_outputs_;
  std::vector<std::unique_ptr<layerwise::Step>> steps_;  // one per node, in order
  plan::Arena arena_;
  int64_t arena_size_ = 0;
  std::vector<std::vector<float>> scratch_;  // one per thread, grown by the kernels
};

}  // namespace

std::unique_ptr<Executor> make_layerwise_executor(graph::Graph graph, int threads,
                                                  const Options& options) {
  graph::fold_matmul_transposes(graph);
  return std::make_unique<LayerwiseExecutor>(std::move(graph), threads, options);
}

}  // namespace sparsecol::runtime
