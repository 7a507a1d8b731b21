// Folds a constant scalar Div or Mul of a product of two activations into the linear layer that
// computes one of its operands (passes.h). BERT's attention scores, per layer:
//
//   q = Reshape(MatMul(x, Wq) + bq)            (the bias fused as the MatMul's epilogue)
//   scores = Div(Einsum(q, k), 8)              (8 = sqrt of the head depth)
//
// become scores = Einsum(q', k) with q' = Reshape(MatMul(x, Wq / 8) + bq / 8): the same values
// (dividing by a power of two is exact), one pass over the [batch, heads, tokens, tokens] scores
// fewer.
#include <algorithm>
#include <optional>
#include <string>

#include "graph/passes.h"
#include "graph/passes/pattern_pass.h"

namespace sparsecol::graph {

namespace {

class ProductScaleFolder : PatternPass {
 public:
  explicit ProductScaleFolder(Graph& graph) : PatternPass(graph) {}

  void run() {
    bool changed = false;
    for (std::size_t n = 0; n < graph_.nodes.size(); ++n) {
      const Node& product = graph_.nodes[n];
      if (!removed_[n] && (product.op_type == "MatMul" || product.op_type == "Einsum") &&
          product.domain.empty() && product.epilogue.empty() && product.inputs.size() == 2 &&
          product.outputs.size() == 1) {
        changed |= try_fold(n);
      }
    }
    if (changed) compact();
  }

 private:
  static bool moves_values_only(const Node& n) {
    return (keeps_element_order(n) || (n.op_type == "Transpose" && n.domain.empty())) &&
           n.epilogue.empty() && !n.inputs.empty();
  }

  bool is_float_constant(int id) const {
    return id >= 0 && value(id).constant && value(id).constant->dtype() == DType::kFloat32;
  }

  // The linear layer that computes `id` through nodes that only move values, each value read by
  // the next node alone: a MatMul of an activation and a float32 constant weight whose epilogue
  // adds float32 constants only (its bias), so that scaling the weight and those constants
  // scales `id`. -1 if none.
  int scalable_linear_layer(int id) const {
    while (sole_reader(id) >= 0 && value(id).producer >= 0) {
      const Node& p = node(value(id).producer);
      if (moves_values_only(p)) {
        id = p.inputs[0];
        continue;
      }
      const bool linear = p.op_type == "MatMul" && p.domain.empty() &&
                          !is_float_constant(p.input(0)) && is_float_constant(p.input(1));
      const bool adds_constants =
          std::all_of(p.epilogue.begin(), p.epilogue.end(), [&](const EpilogueOp& op) {
            return op.kind == EpilogueOp::Kind::kAdd &&
                   is_float_constant(p.inputs[static_cast<std::size_t>(op.input)]);
          });
      return linear && adds_constants ? value(id).producer : -1;
    }
    return -1;
  }

  // The factor a Div or Mul by a float scalar constant, the product's sole reader, applies.
  std::optional<float> factor_of(int reader, int product_out) const {
    if (reader < 0) return std::nullopt;
    const Node& r = node(reader);
    // The same shape out as in: a scalar of higher rank would broadcast the product's.
    const std::optional<Shape>& in = value(product_out).shape;
    const std::optional<Shape>& scaled = value(r.outputs[0]).shape;
    if (!r.domain.empty() || !r.epilogue.empty() || r.inputs.size() != 2 || !in || !scaled ||
        *in != *scaled || !concrete(*in)) {
      return std::nullopt;
    }
    const std::optional<float> c = scalar_constant(other_operand(reader, product_out));
    if (!c || !is_float_constant(other_operand(reader, product_out))) return std::nullopt;
    if (r.op_type == "Mul") return *c;
    if (r.op_type == "Div" && r.inputs[0] == product_out && *c != 0.0f) return 1.0f / *c;
    return std::nullopt;
  }

  // A float32 constant `id` times `factor`, as a new value (the original may have other readers).
  int scaled_constant(int id, float factor) {
    Value v = value(id);
    v.name += "/scaled";
    v.constant = v.constant->clone();
    float* data = v.constant->data<float>();
    for (int64_t i = 0; i < v.constant->numel(); ++i) data[i] *= factor;
    return graph_.add_value(std::move(v));
  }

  bool try_fold(std::size_t n) {
    const Node& product = graph_.nodes[n];
    if (product.inputs[0] == product.inputs[1]) return false;  // x x^T: both operands would scale
    const int out = product.outputs[0];
    const int reader = sole_reader(out);
    const std::optional<float> factor = factor_of(reader, out);
    if (!factor) return false;
    int layer = -1;
    for (int operand : product.inputs) {
      if (layer < 0) layer = scalable_linear_layer(operand);
    }
    if (layer < 0) return false;
    Node& linear = graph_.nodes[static_cast<std::size_t>(layer)];
    linear.inputs[1] = scaled_constant(linear.inputs[1], *factor);
    for (const EpilogueOp& op : linear.epilogue) {
      int& addend = linear.inputs[static_cast<std::size_t>(op.input)];
      addend = scaled_constant(addend, *factor);
    }
    // The product writes the scaled value itself; its readers all come after it.
    graph_.nodes[n].outputs[0] = node(reader).outputs[0];
    removed_[static_cast<std::size_t>(reader)] = true;
    return true;
  }
};

}  // namespace

void fold_product_scale(Graph& graph) { ProductScaleFolder(graph).run(); }

}  // namespace sparsecol::graph
