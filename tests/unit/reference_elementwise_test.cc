// The element-wise ops and reductions, run one node at a time through shape inference
// (graph/ops_elementwise.cc) and the reference ops (runtime/reference/ops_elementwise.cc),
// against independent computations: explicit index arithmetic for broadcasting, nested loops
// for reductions, plain <cmath> formulas for the activations.
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../test_util.h"
#include "graph/graph.h"
#include "graph/ops.h"
#include "runtime/reference/broadcast.h"
#include "runtime/reference/reference_ops.h"

namespace sparsecol {
namespace {

using Attrs = std::map<std::string, graph::AttrValue>;
using Shape = std::vector<int64_t>;

// ---- tensors ----

template <typename T>
Tensor make(Shape shape, const std::vector<T>& values) {
  Tensor t = Tensor::zeros(DTypeOf<T>::kValue, std::move(shape));
  if (static_cast<int64_t>(values.size()) != t.numel()) throw std::runtime_error("bad test data");
  for (std::size_t i = 0; i < values.size(); ++i) t.data<T>()[i] = values[i];
  return t;
}

template <typename T>
Tensor random_tensor(Shape shape, std::mt19937& rng, double lo = -2.0, double hi = 2.0) {
  Tensor t = Tensor::zeros(DTypeOf<T>::kValue, std::move(shape));
  T* data = t.data<T>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if constexpr (std::is_same_v<T, bool>) {
      data[i] = std::bernoulli_distribution(0.5)(rng);
    } else if constexpr (std::is_floating_point_v<T>) {
      data[i] = static_cast<T>(std::uniform_real_distribution<double>(lo, hi)(rng));
    } else {
      data[i] = static_cast<T>(std::uniform_int_distribution<int64_t>(
          static_cast<int64_t>(lo), static_cast<int64_t>(hi))(rng));
    }
  }
  return t;
}

template <typename T>
std::vector<T> values(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

// ---- running one node ----

// One input of a node: a constant tensor, an omitted optional input, or (with `runtime`) a
// graph input whose contents are not known at inference time.
struct In {
  In(Tensor t) : tensor(std::move(t)) {}  // implicit, so that input lists read {x, y}
  static In omitted() { return In(); }
  static In runtime(Tensor t) {
    In in(std::move(t));
    in.constant = false;
    return in;
  }
  std::optional<Tensor> tensor;
  bool constant = true;

 private:
  In() = default;
};

struct Node {
  graph::Graph graph;
  std::vector<Tensor> inputs;  // kept alive for RefOpContext's pointers
};

Node build(const std::string& op, const std::vector<In>& inputs, const Attrs& attrs, int64_t opset,
           int outputs) {
  Node n;
  n.graph.source = "test.onnx";
  n.graph.opset = opset;
  graph::Node node{"n", op, "", {}, {}, attrs, {}};
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].tensor) {
      node.inputs.push_back(-1);
      continue;
    }
    const Tensor& t = *inputs[i].tensor;
    graph::Value v{"x" + std::to_string(i),      t.dtype(),    true,
                   graph::make_shape(t.shape()), std::nullopt, -1};
    if (inputs[i].constant) v.constant = t;
    node.inputs.push_back(n.graph.add_value(v));
    if (!inputs[i].constant) n.graph.inputs.push_back(node.inputs.back());
  }
  for (int i = 0; i < outputs; ++i) {
    graph::Value out;
    out.name = "y" + std::to_string(i);
    node.outputs.push_back(n.graph.add_value(out));
  }
  n.graph.nodes.push_back(node);
  return n;
}

// Infers, allocates and runs `op`; returns its outputs. Throws sparsecol::Error as the op does.
std::vector<Tensor> run(const std::string& op, const std::vector<In>& inputs,
                        const Attrs& attrs = {}, int64_t opset = 13, int outputs = 1) {
  Node n = build(op, inputs, attrs, opset, outputs);
  const graph::Node& node = n.graph.nodes[0];
  const graph::OpDef* def = graph::find_op(op);
  const runtime::RefOp* ref = runtime::find_reference_op(op);
  if (def == nullptr || ref == nullptr) throw std::runtime_error("op not registered: " + op);
  graph::InferContext ctx(n.graph, node);
  def->infer(ctx);
  std::vector<Tensor> results;
  for (const auto& out : ctx.outputs()) {
    if (!out.set) throw std::runtime_error(op + ": an output was not inferred");
    results.push_back(Tensor::zeros(out.dtype, out.shape));
  }
  runtime::RefOpContext rctx{n.graph, node, {}, {}};
  for (const In& in : inputs) rctx.inputs.push_back(in.tensor ? &*in.tensor : nullptr);
  for (Tensor& t : results) rctx.outputs.push_back(&t);
  ref->run(rctx);
  return results;
}

Tensor run1(const std::string& op, const std::vector<In>& inputs, const Attrs& attrs = {},
            int64_t opset = 13) {
  return run(op, inputs, attrs, opset).at(0);
}

// The ErrorCode `op` fails with (inference or execution), or nullopt if it succeeds.
std::optional<ErrorCode> error_of(const std::string& op, const std::vector<In>& inputs,
                                  const Attrs& attrs = {}, int64_t opset = 13,
                                  std::string* message = nullptr) {
  try {
    run(op, inputs, attrs, opset);
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  return std::nullopt;
}

// ---- independent index arithmetic ----

using test::unravel;

// Flat index into an operand of `shape` (right-aligned, size-1 dims repeated) of out_index.
int64_t broadcast_index(const Shape& out_index, const Shape& shape) {
  const std::size_t lead = out_index.size() - shape.size();
  int64_t flat = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    flat = flat * shape[d] + (shape[d] == 1 ? 0 : out_index[lead + d]);
  }
  return flat;
}

int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Random operand shapes that broadcast together: each takes a random suffix of `full`'s rank
// and sets random dimensions to 1; with first_is_full, the first operand is `full` itself (for
// ops that broadcast one way only).
std::vector<Shape> random_broadcast_shapes(std::mt19937& rng, int operands,
                                           bool first_is_full = false) {
  const int rank = std::uniform_int_distribution<int>(0, 4)(rng);
  Shape full(static_cast<std::size_t>(rank));
  for (int64_t& d : full) d = std::uniform_int_distribution<int64_t>(1, 4)(rng);
  std::vector<Shape> shapes;
  for (int k = 0; k < operands; ++k) {
    const int r = std::uniform_int_distribution<int>(0, rank)(rng);
    Shape s(full.end() - r, full.end());
    for (int64_t& d : s) {
      if (std::bernoulli_distribution(0.3)(rng)) d = 1;
    }
    shapes.push_back(k == 0 && first_is_full ? full : s);
  }
  return shapes;
}

Shape expected_broadcast(const std::vector<Shape>& shapes) {
  std::size_t rank = 0;
  for (const Shape& s : shapes) rank = std::max(rank, s.size());
  Shape out(rank, 1);
  for (const Shape& s : shapes) {
    for (std::size_t d = 0; d < s.size(); ++d) {
      int64_t& o = out[rank - s.size() + d];
      o = std::max(o, s[d]);
    }
  }
  return out;
}

template <typename T>
void expect_close(const Tensor& actual, const std::vector<T>& expected, double tolerance,
                  const std::string& what) {
  ASSERT_EQ(actual.numel(), static_cast<int64_t>(expected.size())) << what;
  const T* a = actual.data<T>();
  for (std::size_t i = 0; i < expected.size(); ++i) {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(expected[i])) {
        EXPECT_TRUE(std::isnan(a[i])) << what << " at " << i;
      } else {
        EXPECT_NEAR(a[i], expected[i], tolerance * std::max(1.0, std::fabs(double(expected[i]))))
            << what << " at " << i;
      }
    } else {
      EXPECT_EQ(a[i], expected[i]) << what << " at " << i;
    }
  }
}

// ---- registry ----

TEST(ElementwiseOps, EveryInferredOpHasAReferenceAndViceVersa) {
  for (const graph::OpDef& def : graph::elementwise_op_defs()) {
    EXPECT_NE(runtime::find_reference_op(def.op_type), nullptr) << def.op_type;
  }
  for (const runtime::RefOp& op : runtime::elementwise_reference_ops()) {
    EXPECT_NE(graph::find_op(op.op_type), nullptr) << op.op_type;
  }
}

// ---- broadcasting binary ops ----

template <typename T, typename R = T, typename F>
void check_binary_broadcast(const std::string& op, F reference, uint32_t seed, double lo, double hi,
                            double tolerance = 1e-6, bool unidirectional = false) {
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 40; ++trial) {
    const std::vector<Shape> shapes = random_broadcast_shapes(rng, 2, unidirectional);
    const Tensor a = random_tensor<T>(shapes[0], rng, lo, hi);
    Tensor b = random_tensor<T>(shapes[1], rng, lo, hi);
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {  // no zero divisors
      for (int64_t i = 0; i < b.numel(); ++i) {
        if (b.data<T>()[i] == 0) b.data<T>()[i] = 1;
      }
    }
    const Tensor y = run1(op, {a, b});
    const Shape out_shape = expected_broadcast(shapes);
    ASSERT_EQ(y.shape(), out_shape) << op;
    std::vector<R> expected(static_cast<std::size_t>(numel(out_shape)));
    for (std::size_t i = 0; i < expected.size(); ++i) {
      const Shape index = unravel(static_cast<int64_t>(i), out_shape);
      expected[i] = reference(a.data<T>()[broadcast_index(index, shapes[0])],
                              b.data<T>()[broadcast_index(index, shapes[1])]);
    }
    expect_close<R>(y, expected, tolerance, op);
  }
}

TEST(ElementwiseBroadcast, FloatArithmeticMatchesExplicitIndexing) {
  check_binary_broadcast<float>(
      "Add", [](float a, float b) { return a + b; }, 1, -2, 2);
  check_binary_broadcast<float>(
      "Sub", [](float a, float b) { return a - b; }, 2, -2, 2);
  check_binary_broadcast<float>(
      "Mul", [](float a, float b) { return a * b; }, 3, -2, 2);
  check_binary_broadcast<float>(
      "Div", [](float a, float b) { return a / b; }, 4, 0.5, 2);
  check_binary_broadcast<double>(
      "Add", [](double a, double b) { return a + b; }, 5, -2, 2);
  // PRelu's slope broadcasts to X, never X to the slope.
  check_binary_broadcast<float>(
      "PRelu", [](float a, float b) { return a < 0 ? a * b : a; }, 6, -2, 2, 1e-6, true);
}

TEST(ElementwiseBroadcast, Int64ArithmeticTruncatesDivisionTowardZero) {
  const auto trunc_div = [](int64_t a, int64_t b) {
    const int64_t q = std::abs(a) / std::abs(b);  // magnitudes, then the sign
    return (a < 0) != (b < 0) ? -q : q;
  };
  check_binary_broadcast<int64_t>(
      "Add", [](int64_t a, int64_t b) { return a + b; }, 7, -50, 50);
  check_binary_broadcast<int64_t>(
      "Sub", [](int64_t a, int64_t b) { return a - b; }, 8, -50, 50);
  check_binary_broadcast<int64_t>(
      "Mul", [](int64_t a, int64_t b) { return a * b; }, 9, -50, 50);
  check_binary_broadcast<int64_t>("Div", trunc_div, 10, -50, 50);
  check_binary_broadcast<int32_t>("Div", trunc_div, 11, -50, 50);
}

TEST(ElementwiseBroadcast, IntegerModFollowsTheDivisorSignAndFmodTheDividend) {
  // Python's %: a - b * floor(a / b).
  const auto python_mod = [](int64_t a, int64_t b) {
    return a - b * static_cast<int64_t>(std::floor(static_cast<double>(a) / b));
  };
  check_binary_broadcast<int64_t>("Mod", python_mod, 12, -30, 30);
  const Tensor a = make<int32_t>({4}, {-7, 7, -7, 7});
  const Tensor b = make<int32_t>({4}, {3, 3, -3, -3});
  EXPECT_EQ(values<int32_t>(run1("Mod", {a, b})), (std::vector<int32_t>{2, 1, -1, -2}));
  EXPECT_EQ(values<int32_t>(run1("Mod", {a, b}, {{"fmod", int64_t{1}}})),
            (std::vector<int32_t>{-1, 1, -1, 1}));
  const Tensor x = make<float>({2}, {-7.5f, 7.5f});
  const Tensor y = make<float>({2}, {2.0f, 2.0f});
  EXPECT_EQ(values<float>(run1("Mod", {x, y}, {{"fmod", int64_t{1}}})),
            (std::vector<float>{std::fmod(-7.5f, 2.0f), std::fmod(7.5f, 2.0f)}));
}

TEST(ElementwiseBroadcast, IntegerEdgeCasesDoNotTrap) {
  const int64_t min = std::numeric_limits<int64_t>::min();
  const Tensor a = make<int64_t>({3}, {min, 5, min});
  const Tensor b = make<int64_t>({3}, {-1, 0, -1});
  // Wrapping, as two's complement hardware would, instead of SIGFPE.
  EXPECT_EQ(values<int64_t>(run1("Div", {a, b})), (std::vector<int64_t>{min, 0, min}));
  EXPECT_EQ(values<int64_t>(run1("Mod", {a, b})), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(values<int64_t>(run1("Mul", {a, b})), (std::vector<int64_t>{min, 0, min}));
}

TEST(ElementwiseBroadcast, ComparisonsProduceBool) {
  check_binary_broadcast<float, bool>(
      "Less", [](float a, float b) { return a < b; }, 13, -2, 2);
  check_binary_broadcast<int64_t, bool>(
      "Equal", [](int64_t a, int64_t b) { return a == b; }, 14, -2, 2);
  check_binary_broadcast<int32_t, bool>(
      "GreaterOrEqual", [](int32_t a, int32_t b) { return a >= b; }, 15, -2, 2);
  check_binary_broadcast<bool, bool>(
      "Xor", [](bool a, bool b) { return a != b; }, 16, 0, 1);
  check_binary_broadcast<bool, bool>(
      "And", [](bool a, bool b) { return a && b; }, 17, 0, 1);
}

TEST(ElementwiseBroadcast, WhereBroadcastsAllThreeOperands) {
  std::mt19937 rng(18);
  for (int trial = 0; trial < 40; ++trial) {
    const std::vector<Shape> shapes = random_broadcast_shapes(rng, 3);
    const Tensor cond = random_tensor<bool>(shapes[0], rng);
    const Tensor x = random_tensor<int64_t>(shapes[1], rng, 0, 100);
    const Tensor y = random_tensor<int64_t>(shapes[2], rng, -100, -1);
    const Tensor out = run1("Where", {cond, x, y});
    const Shape out_shape = expected_broadcast(shapes);
    ASSERT_EQ(out.shape(), out_shape);
    for (int64_t i = 0; i < out.numel(); ++i) {
      const Shape index = unravel(i, out_shape);
      const bool c = cond.data<bool>()[broadcast_index(index, shapes[0])];
      const int64_t expected = c ? x.data<int64_t>()[broadcast_index(index, shapes[1])]
                                 : y.data<int64_t>()[broadcast_index(index, shapes[2])];
      ASSERT_EQ(out.data<int64_t>()[i], expected) << "trial " << trial << " at " << i;
    }
  }
}

TEST(ElementwiseBroadcast, VariadicOpsFoldEveryInput) {
  std::mt19937 rng(19);
  for (int trial = 0; trial < 20; ++trial) {
    const std::vector<Shape> shapes = random_broadcast_shapes(rng, 3);
    std::vector<Tensor> ins;
    for (const Shape& s : shapes) ins.push_back(random_tensor<float>(s, rng));
    const Shape out_shape = expected_broadcast(shapes);
    const Tensor sum = run1("Sum", {ins[0], ins[1], ins[2]});
    const Tensor mean = run1("Mean", {ins[0], ins[1], ins[2]});
    const Tensor max = run1("Max", {ins[0], ins[1], ins[2]});
    const Tensor min = run1("Min", {ins[0], ins[1], ins[2]});
    std::vector<float> e_sum, e_mean, e_max, e_min;
    for (int64_t i = 0; i < numel(out_shape); ++i) {
      const Shape index = unravel(i, out_shape);
      std::vector<float> v;
      for (std::size_t k = 0; k < 3; ++k) {
        v.push_back(ins[k].data<float>()[broadcast_index(index, shapes[k])]);
      }
      e_sum.push_back(v[0] + v[1] + v[2]);
      e_mean.push_back((v[0] + v[1] + v[2]) / 3);
      e_max.push_back(std::max({v[0], v[1], v[2]}));
      e_min.push_back(std::min({v[0], v[1], v[2]}));
    }
    expect_close(sum, e_sum, 1e-6, "Sum");
    expect_close(mean, e_mean, 1e-6, "Mean");
    expect_close(max, e_max, 0, "Max");
    expect_close(min, e_min, 0, "Min");
  }
  // One input is a copy.
  const Tensor one = make<int64_t>({2}, {4, -4});
  EXPECT_EQ(values<int64_t>(run1("Max", {one})), values<int64_t>(one));
}

TEST(ElementwiseBroadcast, MaxAndMinPropagateNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor a = make<float>({2}, {nan, 1.0f});
  const Tensor b = make<float>({2}, {1.0f, nan});
  for (const char* op : {"Max", "Min"}) {
    const std::vector<float> y = values<float>(run1(op, {a, b}));
    EXPECT_TRUE(std::isnan(y[0]) && std::isnan(y[1])) << op;
  }
}

TEST(ElementwiseBroadcast, PowTakesExponentsOfAnotherType) {
  const Tensor base = make<float>({2, 2}, {2.0f, -3.0f, 0.5f, 4.0f});
  const Tensor int_exponent = make<int64_t>({2}, {3, 2});
  expect_close(run1("Pow", {base, int_exponent}), std::vector<float>{8, 9, 0.125f, 16}, 1e-6,
               "float^int64");
  const Tensor int_base = make<int32_t>({3}, {1, 2, 3});
  const Tensor float_exponent = make<float>({3}, {1.0f, 2.0f, 3.0f});
  EXPECT_EQ(values<int32_t>(run1("Pow", {int_base, float_exponent})),
            (std::vector<int32_t>{1, 4, 27}));
  check_binary_broadcast<float>(
      "Pow", [](float a, float b) { return std::pow(a, b); }, 20, 0.1, 3, 1e-5);
}

TEST(ElementwiseBroadcast, BroadcastBinaryAddsABiasInPlace) {
  std::mt19937 rng(21);
  Tensor out = random_tensor<float>({2, 3, 4}, rng);
  const Tensor original = out.clone();
  const Tensor bias = random_tensor<float>({3, 1}, rng);
  runtime::broadcast_binary<float>(out, bias, out, [](float x, float b) { return x + b; });
  for (int64_t i = 0; i < out.numel(); ++i) {
    const Shape index = unravel(i, {2, 3, 4});
    EXPECT_EQ(out.data<float>()[i], original.data<float>()[i] + bias.data<float>()[index[1]]);
  }
  Tensor wrong = Tensor::zeros(DType::kFloat32, {2, 3, 4});
  const Tensor bad_bias = random_tensor<float>({4, 1}, rng);
  try {
    runtime::broadcast_binary<float>(wrong, bad_bias, wrong,
                                     [](float x, float b) { return x + b; });
    FAIL() << "a [4, 1] bias was broadcast over [2, 3, 4]";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kShapeMismatch);
  }
}

// ---- unary ops ----

struct UnaryCase {
  const char* op;
  Attrs attrs;
  double alpha, beta;  // the reference's parameters (ONNX's defaults where attrs is empty)
  double lo, hi;       // input range where the op is defined
  double (*reference)(double x, double alpha, double beta);
};

using D = double;

// One op a line, as a table.
// clang-format off
std::vector<UnaryCase> unary_cases() {
  return {
      {"Abs", {}, 0, 0, -3, 3, [](D x, D, D) { return std::fabs(x); }},
      {"Neg", {}, 0, 0, -3, 3, [](D x, D, D) { return -x; }},
      {"Sign", {}, 0, 0, -3, 3, [](D x, D, D) { return D((x > 0) - (x < 0)); }},
      {"Relu", {}, 0, 0, -3, 3, [](D x, D, D) { return x > 0 ? x : 0; }},
      {"Sqrt", {}, 0, 0, 0, 9, [](D x, D, D) { return std::sqrt(x); }},
      {"Exp", {}, 0, 0, -3, 3, [](D x, D, D) { return std::exp(x); }},
      {"Log", {}, 0, 0, 0.01, 9, [](D x, D, D) { return std::log(x); }},
      {"Erf", {}, 0, 0, -3, 3, [](D x, D, D) { return std::erf(x); }},
      {"Reciprocal", {}, 0, 0, 0.1, 3, [](D x, D, D) { return 1 / x; }},
      {"Floor", {}, 0, 0, -3, 3, [](D x, D, D) { return std::floor(x); }},
      {"Ceil", {}, 0, 0, -3, 3, [](D x, D, D) { return std::ceil(x); }},
      {"Sin", {}, 0, 0, -3, 3, [](D x, D, D) { return std::sin(x); }},
      {"Cos", {}, 0, 0, -3, 3, [](D x, D, D) { return std::cos(x); }},
      {"Tan", {}, 0, 0, -1.2, 1.2, [](D x, D, D) { return std::tan(x); }},
      {"Asin", {}, 0, 0, -1, 1, [](D x, D, D) { return std::asin(x); }},
      {"Acos", {}, 0, 0, -1, 1, [](D x, D, D) { return std::acos(x); }},
      {"Atan", {}, 0, 0, -3, 3, [](D x, D, D) { return std::atan(x); }},
      {"Sinh", {}, 0, 0, -3, 3, [](D x, D, D) { return std::sinh(x); }},
      {"Cosh", {}, 0, 0, -3, 3, [](D x, D, D) { return std::cosh(x); }},
      {"Asinh", {}, 0, 0, -3, 3, [](D x, D, D) { return std::asinh(x); }},
      {"Acosh", {}, 0, 0, 1, 5, [](D x, D, D) { return std::acosh(x); }},
      {"Atanh", {}, 0, 0, -0.9, 0.9, [](D x, D, D) { return std::atanh(x); }},
      {"Tanh", {}, 0, 0, -3, 3, [](D x, D, D) { return std::tanh(x); }},
      {"Sigmoid", {}, 0, 0, -30, 30, [](D x, D, D) { return 1 / (1 + std::exp(-x)); }},
      {"LeakyRelu", {}, 0.01, 0, -3, 3, [](D x, D a, D) { return x > 0 ? x : a * x; }},
      {"LeakyRelu", {{"alpha", 0.3f}}, 0.3, 0, -3, 3,
       [](D x, D a, D) { return x > 0 ? x : a * x; }},
      {"Elu", {{"alpha", 0.5f}}, 0.5, 0, -3, 3,
       [](D x, D a, D) { return x > 0 ? x : a * (std::exp(x) - 1); }},
      {"Selu", {}, 1.67326319217681884765625, 1.05070102214813232421875, -3, 3,
       [](D x, D a, D g) { return x > 0 ? g * x : g * (a * std::exp(x) - a); }},
      {"Celu", {{"alpha", 2.0f}}, 2.0, 0, -3, 3,
       [](D x, D a, D) { return std::max(0.0, x) + std::min(0.0, a * (std::exp(x / a) - 1)); }},
      {"HardSigmoid", {}, 0.2, 0.5, -4, 4,
       [](D x, D a, D b) { return std::clamp(a * x + b, 0.0, 1.0); }},
      {"HardSwish", {}, 0, 0, -4, 4,
       [](D x, D, D) { return x * std::clamp(x / 6 + 0.5, 0.0, 1.0); }},
      {"Softplus", {}, 0, 0, -20, 20, [](D x, D, D) { return std::log(std::exp(x) + 1); }},
      {"Softsign", {}, 0, 0, -3, 3, [](D x, D, D) { return x / (1 + std::fabs(x)); }},
      {"ThresholdedRelu", {{"alpha", 0.5f}}, 0.5, 0, -3, 3,
       [](D x, D a, D) { return x > a ? x : 0; }},
  };
}
// clang-format on

TEST(ElementwiseUnary, FloatOpsMatchCmathFormulas) {
  std::mt19937 rng(22);
  for (const UnaryCase& c : unary_cases()) {
    const Tensor x = random_tensor<float>({3, 5}, rng, c.lo, c.hi);
    const Tensor y = run1(c.op, {x}, c.attrs);
    ASSERT_EQ(y.shape(), x.shape()) << c.op;
    ASSERT_EQ(y.dtype(), DType::kFloat32) << c.op;
    std::vector<float> expected;
    for (float v : values<float>(x)) expected.push_back(float(c.reference(v, c.alpha, c.beta)));
    expect_close(y, expected, 2e-6, c.op);
    // The double instantiation agrees with the same formulas, more tightly.
    Tensor xd = Tensor::zeros(DType::kFloat64, x.shape());
    for (int64_t i = 0; i < x.numel(); ++i) xd.data<double>()[i] = x.data<float>()[i];
    std::vector<double> expected_d;
    for (double v : values<double>(xd)) expected_d.push_back(c.reference(v, c.alpha, c.beta));
    expect_close(run1(c.op, {xd}, c.attrs), expected_d, 1e-7, std::string(c.op) + " (double)");
  }
}

TEST(ElementwiseUnary, RoundSendsHalvesToTheEvenNeighbour) {
  // ONNX's own examples for Round.
  const Tensor x = make<float>({7}, {0.9f, 2.5f, 2.3f, 1.5f, -4.5f, -0.5f, 0.5f});
  EXPECT_EQ(values<float>(run1("Round", {x})),
            (std::vector<float>{1.0f, 2.0f, 2.0f, 2.0f, -4.0f, -0.0f, 0.0f}));
}

TEST(ElementwiseUnary, IntegerOpsWrapInsteadOfOverflowing) {
  const Tensor x = make<int8_t>({4}, {-128, -5, 0, 7});
  EXPECT_EQ(values<int8_t>(run1("Abs", {x})), (std::vector<int8_t>{-128, 5, 0, 7}));
  EXPECT_EQ(values<int8_t>(run1("Neg", {x})), (std::vector<int8_t>{-128, 5, 0, -7}));
  EXPECT_EQ(values<int8_t>(run1("Sign", {x})), (std::vector<int8_t>{-1, -1, 0, 1}));
  EXPECT_EQ(values<int8_t>(run1("Relu", {x})), (std::vector<int8_t>{0, 0, 0, 7}));
}

TEST(ElementwiseUnary, PredicatesAndNot) {
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor x = make<float>({4}, {inf, -inf, std::nanf(""), 1.0f});
  const Tensor nan = run1("IsNaN", {x});
  EXPECT_EQ(nan.dtype(), DType::kBool);
  EXPECT_EQ(values<bool>(nan), (std::vector<bool>{false, false, true, false}));
  EXPECT_EQ(values<bool>(run1("IsInf", {x})), (std::vector<bool>{true, true, false, false}));
  EXPECT_EQ(values<bool>(run1("IsInf", {x}, {{"detect_positive", int64_t{0}}})),
            (std::vector<bool>{false, true, false, false}));
  EXPECT_EQ(values<bool>(run1("IsInf", {x}, {{"detect_negative", int64_t{0}}})),
            (std::vector<bool>{true, false, false, false}));
  EXPECT_EQ(values<bool>(run1("Not", {make<bool>({2}, {true, false})})),
            (std::vector<bool>{false, true}));
}

TEST(ElementwiseUnary, ClipWithEitherBoundOmitted) {
  std::mt19937 rng(23);
  const Tensor x = random_tensor<float>({4, 6}, rng, -3, 3);
  const Tensor lo = make<float>({}, {-1.0f});
  const Tensor hi = make<float>({}, {0.5f});
  const std::vector<float> v = values<float>(x);
  std::vector<float> both, only_min, only_max;
  for (float e : v) {
    both.push_back(e < -1 ? -1 : e > 0.5f ? 0.5f : e);
    only_min.push_back(e < -1 ? -1 : e);
    only_max.push_back(e > 0.5f ? 0.5f : e);
  }
  EXPECT_EQ(values<float>(run1("Clip", {x, lo, hi})), both);
  EXPECT_EQ(values<float>(run1("Clip", {x, lo})), only_min);
  EXPECT_EQ(values<float>(run1("Clip", {x, In::omitted(), hi})), only_max);
  EXPECT_EQ(values<float>(run1("Clip", {x})), v);
  // Opset 6 form: attributes.
  EXPECT_EQ(values<float>(run1("Clip", {x}, {{"min", -1.0f}, {"max", 0.5f}}, 6)), both);
  // Integers, with the bound given as a 1-element tensor.
  const Tensor xi = make<int8_t>({5}, {-128, -6, 0, 6, 127});
  EXPECT_EQ(values<int8_t>(run1("Clip", {xi, In::omitted(), make<int8_t>({1}, {5})})),
            (std::vector<int8_t>{-128, -6, 0, 5, 5}));
}

TEST(ElementwiseUnary, CastRoundTripsAndTruncates) {
  std::mt19937 rng(24);
  const Tensor ints = random_tensor<int32_t>({3, 4}, rng, -1000, 1000);
  const Tensor as_float = run1("Cast", {ints}, {{"to", int64_t{1}}});
  ASSERT_EQ(as_float.dtype(), DType::kFloat32);
  const Tensor back = run1("Cast", {as_float}, {{"to", int64_t{6}}});
  EXPECT_EQ(values<int32_t>(back), values<int32_t>(ints));
  const Tensor as_double = run1("Cast", {as_float}, {{"to", int64_t{11}}});
  const Tensor as_int64 = run1("Cast", {as_double}, {{"to", int64_t{7}}});
  for (int64_t i = 0; i < ints.numel(); ++i) {
    EXPECT_EQ(as_int64.data<int64_t>()[i], ints.data<int32_t>()[i]);
  }

  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor f = make<float>({6}, {-2.7f, 2.7f, 300.0f, -300.0f, nan, 0.0f});
  EXPECT_EQ(values<int64_t>(run1("Cast", {f}, {{"to", int64_t{7}}})),
            (std::vector<int64_t>{-2, 2, 300, -300, 0, 0}));
  EXPECT_EQ(values<uint8_t>(run1("Cast", {f}, {{"to", int64_t{2}}})),
            (std::vector<uint8_t>{0, 2, 255, 0, 0, 0}));
  EXPECT_EQ(values<bool>(run1("Cast", {f}, {{"to", int64_t{9}}})),
            (std::vector<bool>{true, true, true, true, true, false}));
  EXPECT_EQ(values<float>(run1("Cast", {make<bool>({2}, {true, false})}, {{"to", int64_t{1}}})),
            (std::vector<float>{1.0f, 0.0f}));
  // CastLike takes the type of its second input.
  const Tensor like = run1("CastLike", {f, make<int8_t>({1}, {0})});
  EXPECT_EQ(like.dtype(), DType::kInt8);
  EXPECT_EQ(values<int8_t>(like), (std::vector<int8_t>{-2, 2, 127, -128, 0, 0}));
}

TEST(ElementwiseUnary, DropoutAtInferenceIsIdentityWithAnAllTrueMask) {
  std::mt19937 rng(25);
  const Tensor x = random_tensor<float>({2, 5}, rng);
  const std::vector<Tensor> out =
      run("Dropout", {x, make<float>({}, {0.3f})}, {}, 13, /*outputs=*/2);
  EXPECT_EQ(values<float>(out[0]), values<float>(x));
  ASSERT_EQ(out[1].dtype(), DType::kBool);
  EXPECT_EQ(values<bool>(out[1]), std::vector<bool>(10, true));
  // Training mode with ratio 0 drops nothing, so it is served too.
  EXPECT_EQ(values<float>(run1("Dropout", {x, make<float>({}, {0.0f}), make<bool>({}, {true})})),
            values<float>(x));
  EXPECT_EQ(values<float>(run1("Identity", {x})), values<float>(x));
}

// ---- reductions ----

struct ReduceCase {
  const char* op;
  double lo, hi;  // input range
  double (*finish)(const std::vector<double>& group);
};

double sum_of(const std::vector<double>& g) {
  double s = 0;
  for (double v : g) s += v;
  return s;
}

const ReduceCase kReduceCases[] = {
    {"ReduceSum", -2, 2, sum_of},
    {"ReduceMean", -2, 2, [](const std::vector<double>& g) { return sum_of(g) / g.size(); }},
    {"ReduceMax", -2, 2,
     [](const std::vector<double>& g) { return *std::max_element(g.begin(), g.end()); }},
    {"ReduceMin", -2, 2,
     [](const std::vector<double>& g) { return *std::min_element(g.begin(), g.end()); }},
    {"ReduceProd", 0.5, 1.5,
     [](const std::vector<double>& g) {
       double p = 1;
       for (double v : g) p *= v;
       return p;
     }},
    {"ReduceL1", -2, 2,
     [](const std::vector<double>& g) {
       double s = 0;
       for (double v : g) s += std::fabs(v);
       return s;
     }},
    {"ReduceL2", -2, 2,
     [](const std::vector<double>& g) {
       double s = 0;
       for (double v : g) s += v * v;
       return std::sqrt(s);
     }},
    {"ReduceLogSum", 0.1, 2, [](const std::vector<double>& g) { return std::log(sum_of(g)); }},
    {"ReduceLogSumExp", -2, 2,
     [](const std::vector<double>& g) {
       double s = 0;
       for (double v : g) s += std::exp(v);
       return std::log(s);
     }},
    {"ReduceSumSquare", -2, 2,
     [](const std::vector<double>& g) {
       double s = 0;
       for (double v : g) s += v * v;
       return s;
     }},
};

class Reduce : public ::testing::TestWithParam<ReduceCase> {};

TEST_P(Reduce, MatchesNestedLoopsOverRandomAxesAndKeepdims) {
  const ReduceCase& c = GetParam();
  std::mt19937 rng(26);
  for (int trial = 0; trial < 30; ++trial) {
    const int rank = std::uniform_int_distribution<int>(1, 4)(rng);
    Shape shape(static_cast<std::size_t>(rank));
    for (int64_t& d : shape) d = std::uniform_int_distribution<int64_t>(1, 4)(rng);
    std::vector<bool> reduced(shape.size());
    std::vector<int64_t> axes;  // random subset, random sign, random order
    for (int d = 0; d < rank; ++d) {
      if (std::bernoulli_distribution(0.5)(rng)) {
        reduced[static_cast<std::size_t>(d)] = true;
        axes.push_back(std::bernoulli_distribution(0.5)(rng) ? d - rank : d);
      }
    }
    std::shuffle(axes.begin(), axes.end(), rng);
    if (axes.empty()) reduced.assign(shape.size(), true);  // no axes: reduce all
    const bool keepdims = std::bernoulli_distribution(0.5)(rng);
    const Tensor x = random_tensor<float>(shape, rng, c.lo, c.hi);

    // ReduceSum takes its axes as an input from opset 13; the others as an attribute.
    Tensor y;
    const Attrs keep = {{"keepdims", int64_t{keepdims}}};
    if (std::string(c.op) == "ReduceSum") {
      y = axes.empty() ? run1(c.op, {x}, keep)
                       : run1(c.op, {x, make<int64_t>({int64_t(axes.size())}, axes)}, keep);
    } else {
      Attrs attrs = keep;
      if (!axes.empty()) attrs["axes"] = axes;
      y = run1(c.op, {x}, attrs);
    }

    Shape out_shape, kept_shape;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if (!reduced[d]) kept_shape.push_back(shape[d]);
      if (!reduced[d] || keepdims) out_shape.push_back(reduced[d] ? 1 : shape[d]);
    }
    ASSERT_EQ(y.shape(), out_shape) << c.op << " trial " << trial;
    std::vector<std::vector<double>> groups(static_cast<std::size_t>(numel(kept_shape)));
    for (int64_t i = 0; i < x.numel(); ++i) {
      const Shape index = unravel(i, shape);
      int64_t slot = 0;
      for (std::size_t d = 0; d < shape.size(); ++d) {
        if (!reduced[d]) slot = slot * shape[d] + index[d];
      }
      groups[static_cast<std::size_t>(slot)].push_back(x.data<float>()[i]);
    }
    std::vector<float> expected;
    for (const auto& g : groups) expected.push_back(static_cast<float>(c.finish(g)));
    expect_close(y, expected, 1e-5, std::string(c.op) + " trial " + std::to_string(trial));
  }
}

INSTANTIATE_TEST_SUITE_P(ElementwiseReductions, Reduce, ::testing::ValuesIn(kReduceCases),
                         [](const auto& info) { return std::string(info.param.op); });

TEST(ElementwiseReductions, IntegerReductionsAreExact) {
  std::mt19937 rng(27);
  const Tensor x = random_tensor<int64_t>({3, 4, 5}, rng, -1000, 1000);
  const Tensor sum = run1("ReduceSum", {x, make<int64_t>({1}, {1})}, {{"keepdims", int64_t{0}}});
  const Tensor max = run1("ReduceMax", {x}, {{"axes", std::vector<int64_t>{1}}});
  ASSERT_EQ(sum.shape(), (Shape{3, 5}));
  ASSERT_EQ(max.shape(), (Shape{3, 1, 5}));
  for (int64_t a = 0; a < 3; ++a) {
    for (int64_t c = 0; c < 5; ++c) {
      int64_t s = 0, m = std::numeric_limits<int64_t>::min();
      for (int64_t b = 0; b < 4; ++b) {
        const int64_t v = x.data<int64_t>()[(a * 4 + b) * 5 + c];
        s += v;
        m = std::max(m, v);
      }
      EXPECT_EQ(sum.data<int64_t>()[a * 5 + c], s);
      EXPECT_EQ(max.data<int64_t>()[a * 5 + c], m);
    }
  }
}

TEST(ElementwiseReductions, EmptyAxesWithNoopIsIdentityAndWithoutReducesAll) {
  std::mt19937 rng(28);
  const Tensor x = random_tensor<float>({2, 3}, rng);
  const Tensor none = make<int64_t>({0}, {});
  const Tensor noop = run1("ReduceSum", {x, none}, {{"noop_with_empty_axes", int64_t{1}}});
  EXPECT_EQ(noop.shape(), x.shape());
  EXPECT_EQ(values<float>(noop), values<float>(x));
  const Tensor all = run1("ReduceSum", {x, none}, {{"keepdims", int64_t{0}}});
  EXPECT_EQ(all.shape(), Shape{});
  double s = 0;
  for (float v : values<float>(x)) s += v;
  EXPECT_NEAR(all.data<float>()[0], s, 1e-5);
  // Opset 18 moved every Reduce*'s axes to an input.
  const Tensor max18 = run1("ReduceMax", {x, make<int64_t>({1}, {-1})}, {}, 18);
  EXPECT_EQ(max18.shape(), (Shape{2, 1}));
}

TEST(ElementwiseReductions, LogSumExpDoesNotOverflow) {
  const Tensor x = make<float>({3}, {1000.0f, 1000.0f, -std::numeric_limits<float>::infinity()});
  const Tensor y = run1("ReduceLogSumExp", {x}, {{"keepdims", int64_t{0}}});
  EXPECT_NEAR(y.data<float>()[0], 1000.0 + std::log(2.0), 1e-3);
}

TEST(ElementwiseReductions, ArgMaxAndArgMinPickFirstOrLastOfTies) {
  std::mt19937 rng(29);
  for (int trial = 0; trial < 30; ++trial) {
    const Shape shape = {std::uniform_int_distribution<int64_t>(1, 3)(rng),
                         std::uniform_int_distribution<int64_t>(1, 4)(rng),
                         std::uniform_int_distribution<int64_t>(1, 3)(rng)};
    const int64_t axis = std::uniform_int_distribution<int64_t>(-3, 2)(rng);
    const int64_t a = axis < 0 ? axis + 3 : axis;
    const bool keepdims = std::bernoulli_distribution(0.5)(rng);
    const bool last = std::bernoulli_distribution(0.5)(rng);
    // Few distinct values, so that ties are common.
    const Tensor x = random_tensor<int32_t>(shape, rng, 0, 2);
    for (const bool is_max : {true, false}) {
      const Tensor y = run1(
          is_max ? "ArgMax" : "ArgMin", {x},
          {{"axis", axis}, {"keepdims", int64_t{keepdims}}, {"select_last_index", int64_t{last}}});
      ASSERT_EQ(y.dtype(), DType::kInt64);
      Shape out_shape = shape;
      if (keepdims)
        out_shape[a] = 1;
      else
        out_shape.erase(out_shape.begin() + a);
      ASSERT_EQ(y.shape(), out_shape);
      Shape kept = shape;
      kept[a] = 1;
      for (int64_t o = 0; o < numel(kept); ++o) {
        Shape index = unravel(o, kept);
        int64_t best = 0;
        for (int64_t k = 0; k < shape[a]; ++k) {
          index[a] = k;
          const int32_t v =
              x.data<int32_t>()[(index[0] * shape[1] + index[1]) * shape[2] + index[2]];
          index[a] = best;
          const int32_t b =
              x.data<int32_t>()[(index[0] * shape[1] + index[1]) * shape[2] + index[2]];
          const bool better = is_max ? v > b : v < b;
          if (better || (last && v == b)) best = k;
        }
        EXPECT_EQ(y.data<int64_t>()[o], best) << "trial " << trial << " is_max " << is_max;
      }
    }
  }
}

// ---- quantization ----

// Halves round to even, results saturate to the zero point's type, and the zero point's dtype
// names the output's; per axis, each index of the axis takes its own scale and zero point.
TEST(Quantization, QuantizeRoundsHalvesToEvenAndSaturatesPerTensorAndPerAxis) {
  const Tensor x = make<float>({2, 3}, {0.5f, 1.5f, 2.5f, -300.0f, 300.0f, -1.5f});
  const Tensor u8 = run1("QuantizeLinear", {x, make<float>({}, {1.0f}), make<uint8_t>({}, {10})});
  EXPECT_EQ(u8.dtype(), DType::kUInt8);
  EXPECT_EQ(values<uint8_t>(u8), (std::vector<uint8_t>{10, 12, 12, 0, 255, 8}));
  const Tensor i8 = run1("QuantizeLinear", {x, make<float>({1}, {1.0f}), make<int8_t>({1}, {0})});
  EXPECT_EQ(values<int8_t>(i8), (std::vector<int8_t>{0, 2, 2, -128, 127, -2}));
  const Tensor per_row =
      run1("QuantizeLinear", {x, make<float>({2}, {0.5f, 10.0f}), make<int8_t>({2}, {1, -1})},
           {{"axis", int64_t{0}}});
  EXPECT_EQ(values<int8_t>(per_row), (std::vector<int8_t>{2, 4, 6, -31, 29, -1}));
  std::string message;
  EXPECT_EQ(error_of("QuantizeLinear", {x, make<float>({3}, {1, 1, 1})}, {{"axis", int64_t{0}}}, 13,
                     &message),
            ErrorCode::kShapeMismatch);
  EXPECT_NE(message.find("one per index of axis 0 of [2, 3]"), std::string::npos) << message;
}

// Dequantizing what quantizing gave returns the grid point, per axis too; an int32 input (a
// quantized bias) keeps its full range.
TEST(Quantization, DequantizeInvertsQuantizeOnTheGrid) {
  const Tensor q = make<uint8_t>({2, 2}, {0, 128, 255, 7});
  const Tensor y =
      run1("DequantizeLinear", {q, make<float>({2}, {0.5f, 2.0f}), make<uint8_t>({2}, {128, 7})},
           {{"axis", int64_t{1}}});
  EXPECT_EQ(values<float>(y), (std::vector<float>{-64.0f, 242.0f, 63.5f, 0.0f}));
  const Tensor wide = run1(
      "DequantizeLinear", {make<int32_t>({2}, {2147483647, -2147483647}), make<float>({}, {1.0f})});
  EXPECT_EQ(values<float>(wide), (std::vector<float>{2147483647.0f, -2147483647.0f}));
  EXPECT_EQ(error_of("DequantizeLinear", {q, make<float>({}, {1.0f}), make<int8_t>({}, {0})}),
            ErrorCode::kDtypeMismatch);
}

// ---- errors ----

TEST(ElementwiseErrors, BadModelsAreRefusedWithTheRightCode) {
  std::mt19937 rng(30);
  const Tensor f = random_tensor<float>({2, 3}, rng);
  const Tensor i64 = random_tensor<int64_t>({2, 3}, rng, 1, 5);
  std::string message;
  EXPECT_EQ(error_of("Add", {f, i64}, {}, 13, &message), ErrorCode::kDtypeMismatch);
  EXPECT_NE(message.find("node 'n' (Add)"), std::string::npos) << message;
  EXPECT_EQ(error_of("Add", {f, random_tensor<float>({3, 2}, rng)}), ErrorCode::kShapeMismatch);
  EXPECT_EQ(error_of("Sqrt", {i64}, {}, 13, &message), ErrorCode::kUnsupported);
  EXPECT_NE(message.find("int64"), std::string::npos) << message;
  EXPECT_EQ(error_of("Cast", {f}, {{"to", int64_t{10}}}, 13, &message), ErrorCode::kUnsupported);
  EXPECT_NE(message.find("FLOAT16"), std::string::npos) << message;
  EXPECT_EQ(error_of("Cast", {f}), ErrorCode::kInvalidModel);
  EXPECT_EQ(error_of("Mod", {f, f}), ErrorCode::kInvalidModel);  // floats need fmod=1
  EXPECT_EQ(error_of("Dropout", {f, make<float>({}, {0.5f}), make<bool>({}, {true})}),
            ErrorCode::kUnsupported);
  EXPECT_EQ(error_of("Dropout", {f, make<float>({}, {0.5f}), In::runtime(make<bool>({}, {false}))}),
            ErrorCode::kUnsupported);
  EXPECT_EQ(error_of("ReduceSum", {f, In::runtime(make<int64_t>({1}, {0}))}),
            ErrorCode::kUnsupported);
  EXPECT_EQ(error_of("ReduceMean", {f}, {{"axes", std::vector<int64_t>{1, -1}}}),
            ErrorCode::kInvalidModel);
  EXPECT_EQ(error_of("ReduceMean", {f}, {{"axes", std::vector<int64_t>{2}}}),
            ErrorCode::kInvalidModel);
  EXPECT_EQ(error_of("ArgMax", {f}, {{"axis", int64_t{5}}}), ErrorCode::kInvalidModel);
  EXPECT_EQ(error_of("PRelu", {make<float>({3}, {1, 2, 3}), f}), ErrorCode::kShapeMismatch);
  EXPECT_EQ(error_of("Clip", {f, make<float>({2}, {0, 1})}), ErrorCode::kShapeMismatch);
  EXPECT_EQ(error_of("Where", {f, f, f}), ErrorCode::kUnsupported);  // cond must be bool
  EXPECT_EQ(error_of("And", {f, f}), ErrorCode::kUnsupported);
  EXPECT_EQ(error_of("Sum", {}), ErrorCode::kInvalidModel);
}

}  // namespace
}  // namespace sparsecol
