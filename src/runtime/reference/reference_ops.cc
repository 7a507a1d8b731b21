#include "runtime/reference/reference_ops.h"

#include <cmath>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "graph/ops.h"
#include "runtime/epilogue.h"

namespace sparsecol::runtime {

namespace {

const std::map<std::string, const RefOp*>& registry() {
  static const std::map<std::string, const RefOp*> ops = [] {
    std::map<std::string, const RefOp*> all;
    for (auto family : {elementwise_reference_ops(), nn_reference_ops(), tensor_reference_ops()}) {
      for (const RefOp& op : family) all[op.op_type] = &op;
    }
    return all;
  }();
  return ops;
}

}  // namespace

const RefOp* find_reference_op(const std::string& op_type) {
  auto it = registry().find(op_type);
  return it == registry().end() ? nullptr : it->second;
}

std::vector<Tensor> evaluate_node(const graph::Graph& graph, const graph::Node& node,
                                  const std::vector<const Tensor*>& inputs) {
  const RefOp* op = find_reference_op(node.op_type);
  if (op == nullptr) {
    graph::fail(graph, node, ErrorCode::kUnsupported, "no reference implementation");
  }
  if (inputs.size() != node.inputs.size()) {
    graph::fail(
        graph, node, ErrorCode::kInternal,
        fmt::format("evaluated with {} inputs, node has {}", inputs.size(), node.inputs.size()));
  }
  std::vector<Tensor> outputs;
  outputs.reserve(node.outputs.size());
  for (int id : node.outputs) {
    const graph::Value& value = graph.values[static_cast<std::size_t>(id)];
    std::optional<std::vector<int64_t>> dims =
        value.shape ? graph::concrete(*value.shape) : std::nullopt;
    if (!dims || !value.dtype_known) {
      graph::fail(graph, node, ErrorCode::kInternal,
                  fmt::format("output '{}' has no inferred shape", value.name));
    }
    outputs.push_back(Tensor::zeros(value.dtype, *dims));
  }
  RefOpContext ctx{graph, node, {}, {}};
  ctx.inputs.assign(inputs.begin(),
                    inputs.begin() + static_cast<std::ptrdiff_t>(node.own_input_count()));
  for (Tensor& t : outputs) ctx.outputs.push_back(&t);
  op->run(ctx);
  if (!node.epilogue.empty()) apply_epilogue(graph, node, inputs, outputs.at(0));
  return outputs;
}

}  // namespace sparsecol::runtime
