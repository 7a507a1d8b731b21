// Marks element-wise successors of Conv / Gemm / MatMul as epilogues of that node, so a kernel
// can apply them while the output tile is still in registers instead of in another pass over
// memory. A fused node moves to the position of the last node it absorbs: everything it now
// reads (a residual, say) is computed by then.
#include <cmath>
#include <limits>

#include "graph/passes.h"
#include "graph/passes/pattern_pass.h"

namespace sparsecol::graph {

namespace {

class Fuser : PatternPass {
 public:
  explicit Fuser(Graph& graph) : PatternPass(graph) {}

  void run() {
    for (std::size_t n = 0; n < graph_.nodes.size(); ++n) {
      const std::string& op = graph_.nodes[n].op_type;
      if (removed_[n] || (op != "Conv" && op != "Gemm" && op != "MatMul")) continue;
      std::size_t at = n;
      while (absorb_next(at)) {
      }
    }
    compact();
  }

 private:
  bool same_known_shape(int a, int b) const {
    const auto& sa = value(a).shape;
    const auto& sb = value(b).shape;
    if (!sa || !sb || sa->size() != sb->size()) return false;
    for (std::size_t i = 0; i < sa->size(); ++i) {
      if (!((*sa)[i] == (*sb)[i])) return false;
    }
    return true;
  }

  // A constant vector along the last axis of a MatMul's output: the bias of a Linear layer.
  bool is_bias_of(const Node& producer, int operand) const {
    if (producer.op_type != "MatMul" || !value(operand).constant) return false;
    const int weight = producer.input(1);
    if (weight < 0 || !value(weight).constant) return false;
    const Tensor& w = *value(weight).constant;
    const Tensor& b = *value(operand).constant;
    return b.dtype() == DType::kFloat32 && b.rank() == 1 && w.rank() >= 2 &&
           b.dim(0) == w.shape().back();
  }

  // Moves the producer at `at` to the slot of `last` (the final absorbed node), taking over its
  // output, and marks the absorbed nodes removed.
  void absorb(std::size_t& at, const std::vector<int>& absorbed, EpilogueOp op, int operand) {
    Node& producer = graph_.nodes[at];
    if (operand >= 0) {
      producer.inputs.push_back(operand);
      op.input = static_cast<int>(producer.inputs.size()) - 1;
    }
    producer.epilogue.push_back(op);
    const std::size_t last = static_cast<std::size_t>(absorbed.back());
    producer.outputs[0] = graph_.nodes[last].outputs[0];
    for (int n : absorbed) removed_[static_cast<std::size_t>(n)] = true;
    graph_.nodes[last] = std::move(producer);
    removed_[last] = false;
    removed_[at] = true;
    at = last;
  }

  bool absorb_next(std::size_t& at) {
    const Node& producer = graph_.nodes[at];
    if (producer.outputs.size() != 1) return false;
    const int out = producer.outputs[0];
    if (try_gelu(at, out)) return true;
    const int next = sole_reader(out);
    if (next < 0) return false;
    const Node& node = graph_.nodes[static_cast<std::size_t>(next)];
    if (!node.epilogue.empty() || node.outputs.size() != 1 || node.inputs.empty()) return false;
    if (node.op_type == "Relu") {
      absorb(at, {next}, EpilogueOp{EpilogueOp::Kind::kRelu}, -1);
      return true;
    }
    if (node.op_type == "Clip" && node.inputs[0] == out) {
      EpilogueOp op{EpilogueOp::Kind::kClip};
      op.min = -std::numeric_limits<float>::infinity();
      op.max = std::numeric_limits<float>::infinity();
      if (node.input(1) >= 0) {
        auto lo = scalar_constant(node.input(1));
        if (!lo) return false;
        op.min = *lo;
      }
      if (node.input(2) >= 0) {
        auto hi = scalar_constant(node.input(2));
        if (!hi) return false;
        op.max = *hi;
      }
      absorb(at, {next}, op, -1);
      return true;
    }
    if (node.op_type == "Add") {
      const int operand = other_operand(next, out);
      if (operand < 0 || operand == out) return false;
      const bool residual = !value(operand).constant && same_known_shape(operand, out) &&
                            same_known_shape(node.outputs[0], out);
      if (!residual && !is_bias_of(producer, operand)) return false;
      absorb(at, {next}, EpilogueOp{EpilogueOp::Kind::kAdd}, operand);
      return true;
    }
    return false;
  }

  // PyTorch's erf GELU: Mul(Mul(x, Add(Erf(Div(x, sqrt 2)), 1)), 0.5).
  bool try_gelu(std::size_t& at, int x) {
    if (is_graph_output(x) || readers(x).size() != 2) return false;
    int div = -1, mul = -1;
    for (int r : readers(x)) {
      const std::string& op = graph_.nodes[static_cast<std::size_t>(r)].op_type;
      if (op == "Div") div = r;
      if (op == "Mul") mul = r;
    }
    if (div < 0 || mul < 0) return false;
    const Node& div_node = graph_.nodes[static_cast<std::size_t>(div)];
    auto divisor = div_node.inputs.size() == 2 && div_node.inputs[0] == x
                       ? scalar_constant(div_node.inputs[1])
                       : std::nullopt;
    if (!divisor || std::fabs(*divisor - std::sqrt(2.0f)) > 1e-3f) return false;
    const int erf = sole_reader(div_node.outputs[0]);
    if (erf < 0 || graph_.nodes[static_cast<std::size_t>(erf)].op_type != "Erf") return false;
    const int erf_out = graph_.nodes[static_cast<std::size_t>(erf)].outputs[0];
    const int add = sole_reader(erf_out);
    if (add < 0 || graph_.nodes[static_cast<std::size_t>(add)].op_type != "Add") return false;
    const Node& add_node = graph_.nodes[static_cast<std::size_t>(add)];
    auto one = scalar_constant(other_operand(add, erf_out));
    if (!one || *one != 1.0f || sole_reader(add_node.outputs[0]) != mul) return false;
    const Node& mul_node = graph_.nodes[static_cast<std::size_t>(mul)];
    if (other_operand(mul, x) != add_node.outputs[0]) return false;
    const int half_mul = sole_reader(mul_node.outputs[0]);
    if (half_mul < 0 || graph_.nodes[static_cast<std::size_t>(half_mul)].op_type != "Mul") {
      return false;
    }
    auto half = scalar_constant(other_operand(half_mul, mul_node.outputs[0]));
    if (!half || *half != 0.5f) return false;
    absorb(at, {div, erf, add, mul, half_mul}, EpilogueOp{EpilogueOp::Kind::kGelu}, -1);
    return true;
  }
};

}  // namespace

void fuse_epilogues(Graph& graph) { Fuser(graph).run(); }

}  // namespace sparsecol::graph
