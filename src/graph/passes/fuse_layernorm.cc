// Replaces the decomposed layer normalization that PyTorch exports below opset 17
//
//   mean = ReduceMean(x, axes=[-1])   d = Sub(x, mean)   var = ReduceMean(Pow(d, 2), axes=[-1])
//   y = Add(Mul(Div(d, Sqrt(Add(var, eps))), gamma), beta)
//
// by one LayerNormalization(x, gamma, beta, axis=-1, epsilon=eps) node: nine passes over the
// activations become one, and the fast executors run it on a row kernel. Every operand that
// the fused op takes as a parameter must be a constant, and every intermediate must be read by
// the pattern alone (a second reader would need the value the fusion removes).
#include <algorithm>
#include <optional>
#include <string>

#include "graph/passes.h"
#include "graph/passes/pattern_pass.h"

namespace sparsecol::graph {

namespace {

class LayerNormFuser : PatternPass {
 public:
  explicit LayerNormFuser(Graph& graph) : PatternPass(graph) {}

  void run() {
    bool changed = false;
    for (std::size_t n = 0; n < graph_.nodes.size(); ++n) {
      if (!removed_[n] && graph_.nodes[n].op_type == "ReduceMean") changed |= try_fuse(n);
    }
    if (changed) compact();
  }

 private:
  // The single default-domain node of type `op` reading `id`, without an epilogue, or -1.
  int sole_reader(int id, const char* op) const {
    const int r = PatternPass::sole_reader(id);
    if (r < 0) return -1;
    const Node& reader = node(r);
    if (reader.op_type != op || !reader.domain.empty() || !reader.epilogue.empty() ||
        reader.outputs.size() != 1) {
      return -1;
    }
    return r;
  }

  std::optional<int64_t> rank(int id) const {
    if (id < 0 || !value(id).shape) return std::nullopt;
    return static_cast<int64_t>(value(id).shape->size());
  }

  // ReduceMean over the last axis of x (the pattern keeps x's rank throughout) only, keeping
  // it; axes as attribute, or as a constant input from opset 18.
  bool reduces_last_axis(const Node& mean, int x) const {
    std::vector<int64_t> axes;
    if (mean.inputs.size() >= 2 && mean.inputs[1] >= 0) {
      const Value& a = value(mean.inputs[1]);
      if (!a.constant || a.constant->dtype() != DType::kInt64) return false;
      axes.assign(a.constant->data<int64_t>(), a.constant->data<int64_t>() + a.constant->numel());
    } else {
      axes = mean.attr_ints("axes");
    }
    if (axes.size() != 1 || mean.attr_int("keepdims", 1) != 1) return false;
    if (axes[0] == -1) return true;
    const std::optional<int64_t> r = rank(x);
    return r && axes[0] == *r - 1;
  }

  // gamma or beta: a float32 constant of one value per normalized element, [D] or [1, ..., D].
  // Where x's shape is known (it may not be before a batch size is fixed), D must be its last
  // dimension; LayerNormalization's own check then runs when the graph is specialized.
  bool is_affine_param(int id, int x) const {
    if (id < 0 || !value(id).constant) return false;
    const Tensor& t = *value(id).constant;
    if (t.dtype() != DType::kFloat32 || t.rank() < 1 || t.numel() != t.shape().back()) {
      return false;
    }
    // With x's rank unknown, only a vector surely keeps the output's rank.
    if (!value(x).shape) return t.rank() == 1;
    const Shape& xs = *value(x).shape;
    if (xs.empty() || t.rank() > static_cast<int>(xs.size())) return false;
    return !xs.back().known() || xs.back().value == t.shape().back();
  }

  // LayerNormalization's Scale and B broadcast only up to the normalized shape [D]: a
  // [1, ..., D] constant becomes a new [D] one.
  int as_vector(int id) {
    const Tensor& t = *value(id).constant;
    if (t.rank() == 1) return id;
    Value v = value(id);
    v.name += "/vector" + std::to_string(graph_.values.size());
    v.constant = t.reshaped({t.numel()});
    v.shape = make_shape({t.numel()});
    v.producer = -1;
    return graph_.add_value(std::move(v));
  }

  bool try_fuse(std::size_t first) {
    const Node& mean = graph_.nodes[first];
    if (!mean.domain.empty() || !mean.epilogue.empty() || mean.inputs.empty() ||
        mean.outputs.size() != 1 || !reduces_last_axis(mean, mean.inputs[0])) {
      return false;
    }
    const int x = mean.inputs[0];
    const int sub = sole_reader(mean.outputs[0], "Sub");
    if (sub < 0 || node(sub).inputs.size() != 2 || node(sub).inputs[0] != x ||
        node(sub).inputs[1] != mean.outputs[0]) {
      return false;
    }
    // d = x - mean feeds exactly the Pow and the Div.
    const int d = node(sub).outputs[0];
    const auto& d_readers = readers_[static_cast<std::size_t>(d)];
    if (is_graph_output(d) || d_readers.size() != 2) return false;
    int pow = -1, div = -1;
    for (int r : d_readers) {
      if (node(r).op_type == "Pow") pow = r;
      if (node(r).op_type == "Div") div = r;
    }
    if (pow < 0 || div < 0 || node(pow).inputs.size() != 2 || node(pow).inputs[0] != d ||
        scalar_constant(node(pow).inputs[1]) != 2.0f || !node(pow).epilogue.empty() ||
        !node(pow).domain.empty()) {
      return false;
    }
    const int var = sole_reader(node(pow).outputs[0], "ReduceMean");
    if (var < 0 || node(var).inputs[0] != node(pow).outputs[0] ||
        !reduces_last_axis(node(var), x)) {
      return false;
    }
    const int add_eps = sole_reader(node(var).outputs[0], "Add");
    if (add_eps < 0) return false;
    const std::optional<float> eps = scalar_constant(other_operand(add_eps, node(var).outputs[0]));
    if (!eps || !(*eps >= 0.0f)) return false;
    const int sqrt = sole_reader(node(add_eps).outputs[0], "Sqrt");
    if (sqrt < 0 || sole_reader(node(sqrt).outputs[0], "Div") != div ||
        node(div).inputs.size() != 2 || node(div).inputs[0] != d ||
        node(div).inputs[1] != node(sqrt).outputs[0] || !node(div).epilogue.empty()) {
      return false;
    }
    const int mul = sole_reader(node(div).outputs[0], "Mul");
    if (mul < 0) return false;
    const int gamma = other_operand(mul, node(div).outputs[0]);
    const int add_beta = sole_reader(node(mul).outputs[0], "Add");
    if (add_beta < 0 || !is_affine_param(gamma, x)) return false;
    const int beta = other_operand(add_beta, node(mul).outputs[0]);
    if (!is_affine_param(beta, x)) return false;

    // The fused node takes the final Add's slot (everything it reads exists by then) and its
    // output; the rest of the pattern goes.
    Node fused;
    fused.name = mean.name;
    fused.op_type = "LayerNormalization";
    fused.inputs = {x, as_vector(gamma), as_vector(beta)};
    fused.outputs = {node(add_beta).outputs[0]};
    fused.attrs["axis"] = int64_t{-1};
    fused.attrs["epsilon"] = *eps;
    for (int n : {static_cast<int>(first), sub, pow, var, add_eps, sqrt, div, mul}) {
      removed_[static_cast<std::size_t>(n)] = true;
    }
    graph_.nodes[static_cast<std::size_t>(add_beta)] = std::move(fused);
    return true;
  }
};

}  // namespace

void fuse_layernorm(Graph& graph) { LayerNormFuser(graph).run(); }

}  // namespace sparsecol::graph
