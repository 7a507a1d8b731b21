// Constant folding and shape inference, one walk in topological order.
#include <fmt/format.h>

#include "graph/ops.h"
#include "graph/passes.h"

namespace sparsecol::graph {

namespace {

bool shape_is_concrete(const Value& value) {
  return value.constant || (value.shape && concrete(*value.shape) && value.dtype_known);
}

// Ops whose result depends only on the input's shape, not its contents.
bool reads_only_shape(const std::string& op_type) {
  return op_type == "Shape" || op_type == "Size";
}

}  // namespace

void fold_constants(Graph& graph, const Evaluator& evaluate) {
  std::vector<bool> folded(graph.nodes.size(), false);
  // Values that may still become constant or concrete once specialize() fixes the input shapes:
  // the outputs of nodes that wait for it, and what is computed from them without folding. An
  // exported shape computation often has a known shape long before its value: ViT's class-token
  // Expand takes [batch, -1, -1] built from Shape(x)[0], a scalar whose shape ONNX's shape
  // inference gives even while the batch is symbolic.
  std::vector<bool> pending(graph.values.size(), false);
  const auto mark_outputs_pending = [&](const Node& node) {
    for (int v : node.outputs) pending[static_cast<std::size_t>(v)] = true;
  };
  for (std::size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& node = graph.nodes[n];
    const OpDef* def = find_op(node.op_type);
    if (def == nullptr || !node.domain.empty()) {
      fail(graph, node, ErrorCode::kUnsupported,
           fmt::format("op {} is not supported", node.op_type));
    }
    bool all_constant = true;
    bool all_concrete = true;
    bool any_pending = false;
    for (int v : node.inputs) {
      if (v < 0) continue;
      const Value& value = graph.values[static_cast<std::size_t>(v)];
      all_constant = all_constant && value.constant.has_value();
      all_concrete = all_concrete && shape_is_concrete(value);
      any_pending = any_pending || pending[static_cast<std::size_t>(v)];
    }
    if (!all_concrete) {  // a symbolic dimension upstream: wait for specialize()
      mark_outputs_pending(node);
      continue;
    }

    InferContext ctx(graph, node);
    if (any_pending) {
      // What this node rejects now (a shape input that is not constant yet) may be a constant
      // after specialize(), which runs this walk again with nothing pending and keeps the error.
      try {
        def->infer(ctx);
      } catch (const Error&) {
        mark_outputs_pending(node);
        continue;
      }
    } else {
      def->infer(ctx);
    }
    for (std::size_t i = 0; i < node.outputs.size(); ++i) {
      const InferContext::Output& out = ctx.outputs()[i];
      if (!out.set) continue;
      Value& value = graph.values[static_cast<std::size_t>(node.outputs[i])];
      value.dtype = out.dtype;
      value.dtype_known = true;
      value.shape = make_shape(out.shape);
    }

    const bool shape_only = reads_only_shape(node.op_type) && node.input(0) >= 0;
    if (!all_constant && !shape_only) {
      if (any_pending) mark_outputs_pending(node);
      continue;
    }
    std::vector<Tensor> placeholders;  // shape-only inputs: a data-less view of the right shape
    placeholders.reserve(node.inputs.size());
    std::vector<const Tensor*> inputs;
    for (int v : node.inputs) {
      if (v < 0) {
        inputs.push_back(nullptr);
        continue;
      }
      const Value& value = graph.values[static_cast<std::size_t>(v)];
      if (value.constant) {
        inputs.push_back(&*value.constant);
      } else {
        placeholders.push_back(Tensor::view(nullptr, value.dtype, *concrete(*value.shape)));
        inputs.push_back(&placeholders.back());
      }
    }
    std::vector<Tensor> outputs = evaluate(graph, node, inputs);
    for (std::size_t i = 0; i < node.outputs.size() && i < outputs.size(); ++i) {
      graph.values[static_cast<std::size_t>(node.outputs[i])].constant = std::move(outputs[i]);
    }
    folded[n] = true;
  }

  std::vector<Node> kept;
  for (std::size_t n = 0; n < graph.nodes.size(); ++n) {
    if (!folded[n]) kept.push_back(std::move(graph.nodes[n]));
  }
  graph.nodes = std::move(kept);
  graph.link();
}

Graph specialize(const Graph& graph, const std::map<std::string, std::vector<int64_t>>& shapes,
                 const Evaluator& evaluate) {
  Graph out = graph;
  for (const auto& [name, dims] : shapes) {
    int id = out.find_value(name);
    bool is_input = false;
    for (int v : out.inputs) is_input = is_input || v == id;
    if (!is_input) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: the model has no input named '{}'", graph.source, name));
    }
    Value& value = out.values[static_cast<std::size_t>(id)];
    if (value.shape) {
      const Shape& declared = *value.shape;
      bool matches = declared.size() == dims.size();
      for (std::size_t i = 0; matches && i < dims.size(); ++i) {
        matches = !declared[i].known() || declared[i].value == dims[i];
      }
      if (!matches) {
        throw Error(ErrorCode::kShapeMismatch,
                    fmt::format("{}: input '{}' expects shape {}, got {}", graph.source, name,
                                to_string(declared), to_string(make_shape(dims))));
      }
    }
    value.shape = make_shape(dims);
  }
  // Every value's shape is recomputed from the fixed inputs; stale symbolic ones go.
  for (Value& value : out.values) {
    bool is_input = false;
    for (int v : out.inputs)
      is_input = is_input || &out.values[static_cast<std::size_t>(v)] == &value;
    if (!is_input && !value.constant) value.shape.reset();
  }
  fold_constants(out, evaluate);
  out.remove_dead();
  for (const Node& node : out.nodes) {
    for (int v : node.outputs) {
      const Value& value = out.values[static_cast<std::size_t>(v)];
      if (!value.shape || !concrete(*value.shape)) {
        fail(out, node, ErrorCode::kShapeMismatch,
             fmt::format("cannot infer the shape of '{}' from the input shapes", value.name));
      }
    }
  }
  // Again, now that every shape is known: a residual Add fuses only where both operands have the
  // same known shape, which symbolic dims that shape inference named apart hide (BERT's 24
  // residual Adds after its linear layers: each one pass over the activations).
  fuse_epilogues(out);
  fold_product_scale(out);
  out.remove_dead();
  return out;
}

void optimize(Graph& graph, const Evaluator& evaluate) {
  fold_constants(graph, evaluate);
  fold_batchnorm(graph);
  fuse_layernorm(graph);
  fuse_epilogues(graph);
  fold_product_scale(graph);
  graph.remove_dead();
}

}  // namespace sparsecol::graph
