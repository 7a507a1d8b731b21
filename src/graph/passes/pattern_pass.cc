#include "graph/passes/pattern_pass.h"

#include <algorithm>

namespace sparsecol::graph {

int PatternPass::sole_reader(int id) const {
  if (id < 0 || graph_.is_output(id) || readers(id).size() != 1) return -1;
  const int n = readers(id)[0];
  return removed_[static_cast<std::size_t>(n)] ? -1 : n;
}

int PatternPass::other_operand(int n, int id) const {
  if (n < 0) return -1;
  const Node& b = node(n);
  if (b.inputs.size() != 2) return -1;
  if (b.inputs[0] == id) return b.inputs[1];
  if (b.inputs[1] == id) return b.inputs[0];
  return -1;
}

std::optional<float> PatternPass::scalar_constant(int id) const {
  if (id < 0 || !value(id).constant) return std::nullopt;
  const Tensor& t = *value(id).constant;
  if (t.numel() != 1) return std::nullopt;
  if (t.dtype() == DType::kFloat32) return t.data<float>()[0];
  if (t.dtype() == DType::kFloat64) return static_cast<float>(t.data<double>()[0]);
  return std::nullopt;
}

void PatternPass::compact() {
  std::vector<Node> kept;
  for (std::size_t n = 0; n < graph_.nodes.size(); ++n) {
    if (!removed_[n]) kept.push_back(std::move(graph_.nodes[n]));
  }
  graph_.nodes = std::move(kept);
  graph_.remove_dead();
}

}  // namespace sparsecol::graph
