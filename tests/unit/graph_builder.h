// Builds small IR graphs by hand for pass and executor tests.
#pragma once

#include <random>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "graph/passes.h"
#include "plan/tile_plan.h"
#include "runtime/executor.h"
#include "runtime/reference/reference_ops.h"

namespace sparsecol::testing {

inline Tensor random_tensor(std::vector<int64_t> shape, uint32_t seed, float lo = -1.0f,
                            float hi = 1.0f) {
  Tensor t = Tensor::zeros(DType::kFloat32, std::move(shape));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

// A random tensor with each element zeroed with probability `sparsity`.
inline Tensor pruned_tensor(std::vector<int64_t> shape, uint32_t seed, double sparsity) {
  Tensor t = random_tensor(std::move(shape), seed);
  std::mt19937 rng(seed + 1000);
  std::bernoulli_distribution zero(sparsity);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (zero(rng)) t.data<float>()[i] = 0.0f;
  }
  return t;
}

inline Tensor scalar(float v) {
  Tensor t = Tensor::zeros(DType::kFloat32, {});
  t.data<float>()[0] = v;
  return t;
}

class GraphBuilder {
 public:
  GraphBuilder() {
    graph_.source = "test.onnx";
    graph_.opset = 13;
  }

  // A graph input; dims < 0 are symbolic and named by `symbol`.
  int input(const std::string& name, std::vector<int64_t> dims, const std::string& symbol = "N") {
    graph::Shape shape;
    for (int64_t d : dims) shape.push_back(d < 0 ? graph::Dim{-1, symbol} : graph::Dim{d, {}});
    const int id = graph_.add_value({name, DType::kFloat32, true, shape, std::nullopt, -1});
    graph_.inputs.push_back(id);
    return id;
  }

  int constant(const std::string& name, Tensor t) {
    const graph::Shape shape = graph::make_shape(t.shape());
    return graph_.add_value({name, t.dtype(), true, shape, std::move(t), -1});
  }

  // Adds a node with one output; `shape` (optional) is what ONNX shape inference would record.
  int node(const std::string& op, std::vector<int> inputs,
           std::map<std::string, graph::AttrValue> attrs = {},
           std::optional<graph::Shape> shape = std::nullopt) {
    const std::string name = op + "_" + std::to_string(graph_.nodes.size());
    const int out = graph_.add_value(
        {name + "_out", DType::kFloat32, shape.has_value(), shape, std::nullopt, -1});
    graph_.nodes.push_back(
        graph::Node{name, op, "", std::move(inputs), {out}, std::move(attrs), {}});
    return out;
  }

  graph::Graph finish(std::vector<int> outputs) {
    graph_.outputs = std::move(outputs);
    graph_.link();
    return graph_;
  }

 private:
  graph::Graph graph_;
};

// A LayerNormalization over the last axis of `x` (`features` wide), scale and bias random from
// `seed` and `seed` + 1.
inline int layer_norm(GraphBuilder& b, int x, int64_t features, uint32_t seed) {
  return b.node("LayerNormalization",
                {x, b.constant("gamma", random_tensor({features}, seed)),
                 b.constant("beta", random_tensor({features}, seed + 1))},
                {{"axis", int64_t{-1}}, {"epsilon", 1e-5f}});
}

// The token-wise part of a transformer encoder layer in miniature, x [batch, 128, 24]: an FFN of
// two 90%-pruned linear layers (bias and Relu fused into the first, whose output only the second
// reads; bias and the residual x into the second), a layer norm (also a graph output, read after
// the column), a dense linear layer with two residual Adds (the kernel fuses one: both run
// after it), a scale per feature, a softmax over the features; then an attention-like product of
// two activations (every token reads every other: it ends the column) and a softmax over its 128
// columns.
inline graph::Graph token_net(int64_t hidden = 40) {
  constexpr int64_t kFeatures = 24;
  const int64_t kHidden = hidden;
  GraphBuilder b;
  const int x = b.input("x", {-1, 128, kFeatures});
  auto linear = [&](int in, Tensor w, const std::string& name) {
    return b.node("MatMul", {in, b.constant(name, std::move(w))});
  };
  const int up =
      b.node("Relu", {b.node("Add", {linear(x, pruned_tensor({kFeatures, kHidden}, 1, 0.9), "w1"),
                                     b.constant("b1", random_tensor({kHidden}, 2))})});
  const int down =
      b.node("Add", {b.node("Add", {linear(up, pruned_tensor({kHidden, kFeatures}, 3, 0.9), "w2"),
                                    b.constant("b2", random_tensor({kFeatures}, 4))}),
                     x});
  const int norm = layer_norm(b, down, kFeatures, 5);
  const int dense = b.node(
      "Add",
      {b.node("Add", {linear(norm, random_tensor({kFeatures, kFeatures}, 7), "w3"), x}), down});
  const int scaled = b.node("Mul", {dense, b.constant("scale", random_tensor({kFeatures}, 8))});
  const int probs = b.node("Softmax", {scaled}, {{"axis", int64_t{-1}}});
  const int keys = b.node("Transpose", {norm}, {{"perm", std::vector<int64_t>{0, 2, 1}}});
  const int scores = b.node("Softmax", {b.node("MatMul", {probs, keys})}, {{"axis", int64_t{-1}}});
  return b.finish({scores, norm});
}

// The FFN of token_net() or another graph whose linear weights are named w1 and w2: the
// indices of the MatMuls that read them, in graph order.
inline std::vector<std::size_t> ffn_matmuls(const graph::Graph& g) {
  std::vector<std::size_t> found;
  for (std::size_t n = 0; n < g.nodes.size(); ++n) {
    const graph::Node& node = g.nodes[n];
    if (node.op_type != "MatMul") continue;
    const std::string& weight = g.values[static_cast<std::size_t>(node.input(1))].name;
    if (weight == "w1" || weight == "w2") found.push_back(n);
  }
  return found;
}

// The cache budgets a planner sweep walks: 4 KiB (every op whole) to 4 MiB (one column).
inline std::vector<int64_t> swept_budgets() {
  std::vector<int64_t> budgets;
  for (int64_t b = 4 << 10; b <= (4 << 20); b *= 2) budgets.push_back(b);
  return budgets;
}

// The depth-wise plan of specialized graph `g` under a cache budget of `budget` bytes, for
// `threads` threads, with tiles of `tile_rows` rows forced (0: chosen).
inline plan::TilePlan plan_under_budget(const graph::Graph& g, int64_t budget, int threads = 1,
                                        int64_t tile_rows = 0) {
  plan::PlanOptions options;
  options.cache_budget_bytes = budget;
  options.threads = threads;
  options.tile_rows = tile_rows;
  return plan::plan_columns(g, options);
}

// Runs `graph` on the reference executor with the given inputs (shapes fixed from them).
inline NamedTensors run_reference(const graph::Graph& graph, const NamedTensors& inputs) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, t] : inputs) shapes[name] = t.shape();
  return runtime::make_reference_executor(graph::specialize(graph, shapes, runtime::evaluate_node))
      ->run(inputs);
}

inline float max_abs_diff(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return std::numeric_limits<float>::infinity();
  float worst = 0.0f;
  for (int64_t i = 0; i < a.numel(); ++i) {
    worst = std::max(worst, std::fabs(a.data<float>()[i] - b.data<float>()[i]));
  }
  return worst;
}

// The largest |value| of a float tensor: the scale of a tensor's comparison tolerance.
inline float max_abs(const Tensor& t) {
  float m = 0.0f;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(t.data<float>()[i]));
  return m;
}

// Whether `actual` holds every output of `expected`, of its shape and within
// relative_tolerance x max(1, max_abs) of it (a scale per output, not per element: the executors'
// sums are reordered, so small values carry the large ones' rounding).
inline ::testing::AssertionResult outputs_near(const NamedTensors& actual,
                                               const NamedTensors& expected,
                                               float relative_tolerance) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << actual.size() << " outputs, expected " << expected.size();
  }
  for (const auto& [name, want] : expected) {
    const auto it = actual.find(name);
    if (it == actual.end())
      return ::testing::AssertionFailure() << "output " << name << " is missing";
    const float diff = max_abs_diff(it->second, want),
                bound = relative_tolerance * std::max(1.0f, max_abs(want));
    if (!(diff <= bound)) {
      return ::testing::AssertionFailure()
             << "output " << name << " differs by " << diff << " (bound " << bound << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

inline const std::vector<int64_t> kPad1 = {1, 1, 1, 1};

// A small residual CNN shared by the executor tests: conv+relu, depthwise conv, 1x1 conv +
// residual add + relu, strided conv, clip, max pool, then global average pool, flatten and a
// linear layer. Input x [N, 3, 13, 11], output [N, 10].
inline graph::Graph residual_cnn() {
  GraphBuilder b;
  const int x = b.input("x", {-1, 3, 13, 11});
  const int c1 = b.node("Relu", {b.node("Conv",
                                        {x, b.constant("w1", random_tensor({8, 3, 3, 3}, 1)),
                                         b.constant("b1", random_tensor({8}, 2))},
                                        {{"pads", kPad1}})});
  const int dw = b.node("Conv", {c1, b.constant("w2", random_tensor({8, 1, 3, 3}, 3))},
                        {{"pads", kPad1}, {"group", int64_t{8}}});
  const int pw = b.node("Conv", {dw, b.constant("w3", random_tensor({8, 8, 1, 1}, 4)),
                                 b.constant("b3", random_tensor({8}, 5))});
  const int res = b.node("Relu", {b.node("Add", {pw, c1})});
  const int down = b.node("Conv", {res, b.constant("w4", random_tensor({16, 8, 3, 3}, 6))},
                          {{"pads", kPad1}, {"strides", std::vector<int64_t>{2, 2}}});
  const int clip =
      b.node("Clip", {down, b.constant("lo", scalar(0.0f)), b.constant("hi", scalar(6.0f))});
  const int pool = b.node("MaxPool", {clip},
                          {{"kernel_shape", std::vector<int64_t>{3, 3}},
                           {"strides", std::vector<int64_t>{2, 2}},
                           {"pads", kPad1}});
  const int gap = b.node("GlobalAveragePool", {pool});
  const int flat = b.node("Flatten", {gap});
  const int fc = b.node("Gemm",
                        {flat, b.constant("wf", random_tensor({10, 16}, 7)),
                         b.constant("bf", random_tensor({10}, 8))},
                        {{"transB", int64_t{1}}});
  return b.finish({fc});
}

// 1x1 convolutions with fused residual adds, five ways, for the executors' choice of writing a
// convolution's output over its residual's buffer (Step::writes_over_input). In order: a sparse
// conv and a dense one whose residual nothing reads later (may be written over), one whose
// residual is read later by a Mul, one whose residual is its own input, one whose residual is
// the graph input (the product after it keeps that conv's output from being the graph's).
// Input x [N, 16, h, w], output [N, 16, h, w].
inline graph::Graph residual_reuse_net(int64_t h, int64_t w) {
  GraphBuilder b;
  const int x = b.input("x", {-1, 16, h, w});
  uint32_t seed = 60;
  auto conv = [&](int in, Tensor weight, std::vector<int64_t> pads = {0, 0, 0, 0}) {
    return b.node("Conv",
                  {in, b.constant("w" + std::to_string(seed), std::move(weight)),
                   b.constant("b" + std::to_string(seed), random_tensor({16}, seed + 1))},
                  {{"pads", pads}});
  };
  auto dense = [&](int64_t k) { return random_tensor({16, 16, k, k}, seed += 2); };
  const int a = b.node("Relu", {conv(x, dense(1))});
  const int c = b.node("Relu", {conv(a, dense(3), kPad1)});
  const int d =
      b.node("Relu", {b.node("Add", {conv(c, pruned_tensor({16, 16, 1, 1}, seed += 2, 0.9)), a})});
  const int e = b.node("Relu", {conv(d, dense(1))});
  const int f = b.node("Add", {conv(e, dense(1)), d});
  const int g = b.node("Relu", {conv(f, dense(1))});
  const int k = b.node("Mul", {b.node("Add", {conv(g, dense(1)), f}), f});
  const int m = b.node("Add", {conv(k, dense(1)), k});
  const int n = b.node("Add", {conv(m, dense(1)), x});
  return b.finish({b.node("Mul", {n, n})});
}

// Which of a graph's convolutions with a fused residual add (op "Conv+Add...") an executor writes
// over their residual's buffer, in graph order.
inline std::vector<bool> written_over_residuals(const std::vector<LayerInfo>& layers) {
  std::vector<bool> over;
  for (const LayerInfo& info : layers) {
    if (info.op.rfind("Conv+Add", 0) != 0) continue;
    over.push_back(info.implementation.find("in place over its input") != std::string::npos);
  }
  return over;
}

// Convolutions on planes small enough that several images are stacked into one product
// (kernels::conv2d_images) at a batch above 1: 3x3 conv + relu, 1x1 conv + residual add + relu,
// strided 3x3 conv, 1x1 conv whose weight is 90% zeros (sparse), all on 8x8 or 4x4 planes.
// Input x [N, 16, 8, 8], output [N, 48, 4, 4].
inline graph::Graph small_plane_cnn() {
  GraphBuilder b;
  const int x = b.input("x", {-1, 16, 8, 8});
  const int c1 = b.node("Relu", {b.node("Conv",
                                        {x, b.constant("w1", random_tensor({32, 16, 3, 3}, 41)),
                                         b.constant("b1", random_tensor({32}, 42))},
                                        {{"pads", kPad1}})});
  const int c2 = b.node("Conv", {c1, b.constant("w2", random_tensor({32, 32, 1, 1}, 43))});
  const int res = b.node("Relu", {b.node("Add", {c2, c1})});
  const int down = b.node("Conv", {res, b.constant("w3", random_tensor({32, 32, 3, 3}, 44))},
                          {{"pads", kPad1}, {"strides", std::vector<int64_t>{2, 2}}});
  Tensor w4 = random_tensor({48, 32, 1, 1}, 45);
  for (int64_t i = 0; i < w4.numel(); ++i) {
    if (i % 10 != 0) w4.data<float>()[i] = 0.0f;
  }
  return b.finish({b.node("Conv", {down, b.constant("w4", std::move(w4))})});
}

}  // namespace sparsecol::testing
