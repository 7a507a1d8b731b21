// Binds graph nodes to the naive kernels of kernels/reference: the oracle executor's ops.
//
// Each op family has one file (ops_<family>.cc) holding a table of RefOp; the registry in
// reference_ops.cc lists the families. A RefOp reads the node's attributes, checks what the
// kernel needs, and calls the kernel on raw pointers: kernels never see the graph.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace sparsecol::runtime {

struct RefOpContext {
  const graph::Graph& graph;
  const graph::Node& node;
  std::vector<const Tensor*> inputs;  // the op's own inputs; nullptr for omitted optionals
  std::vector<Tensor*> outputs;       // allocated with the inferred dtype and shape

  [[noreturn]] void fail(ErrorCode code, const std::string& message) const {
    graph::fail(graph, node, code, message);
  }
};

using RefOpFn = void (*)(RefOpContext&);

struct RefOp {
  const char* op_type;
  RefOpFn run;
};

std::span<const RefOp> elementwise_reference_ops();
std::span<const RefOp> nn_reference_ops();
std::span<const RefOp> tensor_reference_ops();

// The reference implementation of an op, or nullptr.
const RefOp* find_reference_op(const std::string& op_type);

// Runs one node on constant inputs: infers output shapes (graph/ops.h), allocates, runs the
// reference op, then applies the node's epilogue. Used by the reference executor and as the
// evaluator of the constant-folding pass.
std::vector<Tensor> evaluate_node(const graph::Graph& graph, const graph::Node& node,
                                  const std::vector<const Tensor*>& inputs);

}  // namespace sparsecol::runtime
