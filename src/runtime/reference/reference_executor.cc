// The oracle: every node in order through its reference kernel, every intermediate in its own
// owning tensor, freed after its last reader.
#include <fmt/format.h>

#include "runtime/executor.h"
#include "runtime/reference/reference_ops.h"

namespace sparsecol::runtime {

namespace {

class ReferenceExecutor final : public Executor {
 public:
  explicit ReferenceExecutor(graph::Graph graph) : graph_(std::move(graph)) {
    last_reader_.assign(graph_.values.size(), -1);
    for (std::size_t n = 0; n < graph_.nodes.size(); ++n) {
      for (int v : graph_.nodes[n].inputs) {
        if (v >= 0) last_reader_[static_cast<std::size_t>(v)] = static_cast<int>(n);
      }
    }
    for (int v : graph_.outputs) last_reader_[static_cast<std::size_t>(v)] = kKeep;
  }

  NamedTensors run(const NamedTensors& inputs) override {
    std::vector<Tensor> live(graph_.values.size());
    for (int v : graph_.inputs) {
      const graph::Value& value = graph_.values[static_cast<std::size_t>(v)];
      live[static_cast<std::size_t>(v)] = inputs.at(value.name);
    }
    for (std::size_t i = 0; i < graph_.values.size(); ++i) {
      if (graph_.values[i].constant) live[i] = *graph_.values[i].constant;
    }
    if (profiler_ != nullptr) profiler_->begin_run(1);
    for (std::size_t n = 0; n < graph_.nodes.size(); ++n) {
      const graph::Node& node = graph_.nodes[n];
      Profiler::Scope timed(profiler_, 0, node);
      std::vector<const Tensor*> args;
      for (int v : node.inputs)
        args.push_back(v >= 0 ? &live[static_cast<std::size_t>(v)] : nullptr);
      std::vector<Tensor> results = evaluate_node(graph_, node, args);
      for (std::size_t i = 0; i < node.outputs.size(); ++i) {
        live[static_cast<std::size_t>(node.outputs[i])] = std::move(results[i]);
      }
      for (int v : node.inputs) {
        if (v >= 0 && last_reader_[static_cast<std::size_t>(v)] == static_cast<int>(n)) {
          live[static_cast<std::size_t>(v)] = Tensor();
        }
      }
    }
    NamedTensors outputs;
    for (int v : graph_.outputs) {
      const graph::Value& value = graph_.values[static_cast<std::size_t>(v)];
      Tensor& t = live[static_cast<std::size_t>(v)];
      // Constants and caller inputs are shared storage; hand out a copy the caller owns.
      const bool computed = value.producer >= 0 && !value.constant;
      outputs[value.name] = computed ? t : t.clone();
    }
    return outputs;
  }

  std::vector<LayerInfo> layers() const override {
    std::vector<LayerInfo> infos;
    for (const graph::Node& node : graph_.nodes) {
      infos.push_back(describe_node(graph_, node));
      infos.back().implementation = "reference";
    }
    return infos;
  }

 private:
  static constexpr int kKeep = 1 << 30;
  graph::Graph graph_;
  std::vector<int> last_reader_;
};

}  // namespace

std::unique_ptr<Executor> make_reference_executor(graph::Graph graph) {
  return std::make_unique<ReferenceExecutor>(std::move(graph));
}

}  // namespace sparsecol::runtime
