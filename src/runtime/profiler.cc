#include "runtime/profiler.h"

#include <algorithm>

namespace sparsecol::runtime {

void Profiler::begin_run(int threads) {
  by_thread_.assign(static_cast<std::size_t>(std::max(1, threads)), {});
  start_ = std::chrono::steady_clock::now();
}

int64_t Profiler::now_ns() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              start_)
      .count();
}

void Profiler::record(ProfileEvent event) {
  const auto t = static_cast<std::size_t>(std::max(0, event.thread));
  if (t < by_thread_.size()) by_thread_[t].push_back(std::move(event));
}

std::vector<ProfileEvent> Profiler::events() const {
  std::vector<ProfileEvent> all;
  for (const auto& list : by_thread_) all.insert(all.end(), list.begin(), list.end());
  std::stable_sort(all.begin(), all.end(), [](const ProfileEvent& a, const ProfileEvent& b) {
    return a.start_ns < b.start_ns;
  });
  return all;
}

Profiler::Scope::Scope(Profiler* profiler, int thread, const graph::Node& node, int tile)
    : profiler_(profiler), node_(&node), thread_(thread), tile_(tile) {
  if (profiler_ != nullptr) start_ns_ = profiler_->now_ns();
}

Profiler::Scope::~Scope() {
  if (profiler_ == nullptr) return;
  profiler_->record(ProfileEvent{node_->name, node_->op_type, thread_, tile_, start_ns_,
                                 profiler_->now_ns() - start_ns_});
}

LayerInfo describe_node(const graph::Graph& graph, const graph::Node& node) {
  LayerInfo info;
  info.node = node.name;
  info.op = node.op_type;
  for (const graph::EpilogueOp& op : node.epilogue) {
    info.op += "+";
    info.op += graph::to_string(op.kind);
  }
  const int out = node.output(0);
  if (out >= 0) {
    const graph::Value& v = graph.values[static_cast<std::size_t>(out)];
    if (v.shape) {
      for (const graph::Dim& d : *v.shape) info.output_shape.push_back(d.known() ? d.value : -1);
    }
  }
  const bool has_weight = node.op_type == "Conv" || node.op_type == "Gemm" ||
                          node.op_type == "MatMul" || node.op_type == "ConvTranspose";
  const int w = has_weight ? node.input(1) : -1;
  if (w >= 0) {
    const graph::Value& v = graph.values[static_cast<std::size_t>(w)];
    if (v.constant && v.constant->dtype() == DType::kFloat32) {
      const Tensor& t = *v.constant;
      info.weight_shape = t.shape();
      const float* p = t.data<float>();
      int64_t zeros = 0;
      for (int64_t i = 0; i < t.numel(); ++i) zeros += p[i] == 0.0f ? 1 : 0;
      info.weight_sparsity = t.numel() > 0 ? static_cast<double>(zeros) / t.numel() : 0.0;
      info.weight_format = "dense";
      info.packed_bytes = static_cast<int64_t>(t.nbytes());
    }
  }
  return info;
}

}  // namespace sparsecol::runtime
