// What the pattern-matching passes (epilogue fusion, layer-norm fusion) share: who reads a value,
// the operand of a binary node other than a given one, scalar constants, and dropping the nodes
// a fusion absorbed. A pass marks absorbed nodes in removed_ and calls compact() at the end, so
// node indices stay valid while it matches.
#pragma once

#include <optional>
#include <vector>

#include "graph/graph.h"

namespace sparsecol::graph {

class PatternPass {
 protected:
  explicit PatternPass(Graph& graph)
      : graph_(graph), readers_(graph.consumers()), removed_(graph.nodes.size(), false) {}

  const Value& value(int id) const { return graph_.values[static_cast<std::size_t>(id)]; }
  const Node& node(int n) const { return graph_.nodes[static_cast<std::size_t>(n)]; }
  const std::vector<int>& readers(int id) const { return readers_[static_cast<std::size_t>(id)]; }
  bool is_graph_output(int id) const { return graph_.is_output(id); }

  // The single node reading `id` (not a graph output, not already absorbed), or -1.
  int sole_reader(int id) const;
  // The operand of binary node `n` other than `id` (either order), or -1 if `id` is not one.
  int other_operand(int n, int id) const;
  // A one-element float32 or float64 constant's value.
  std::optional<float> scalar_constant(int id) const;

  // Drops the nodes marked removed_ and the values nobody reads any more.
  void compact();

  Graph& graph_;
  std::vector<std::vector<int>> readers_;
  std::vector<bool> removed_;
};

}  // namespace sparsecol::graph
