// fuse_layernorm replaces PyTorch's decomposed LayerNorm (opset 13) by one LayerNormalization
// node with the same results, and leaves every near miss alone.
#include <gtest/gtest.h>

#include "graph/passes.h"
#include "graph_builder.h"

namespace sparsecol::testing {
namespace {

constexpr int64_t kHidden = 8;

// What may be changed in the pattern to make it a near miss.
struct Pattern {
  std::vector<int64_t> axes = {-1};
  bool eps_is_input = false;     // eps is a graph input, not a constant
  bool mean_read_twice = false;  // the first mean is also a graph output
  float exponent = 2.0f;
  std::vector<int64_t> beta_shape = {kHidden};
};

// x [N, 5, 8] -> nn.LayerNorm(8) as torch.onnx exports it at opset 13.
graph::Graph layer_norm_graph(const Pattern& p) {
  GraphBuilder b;
  const int x = b.input("x", {-1, 5, kHidden});
  const int eps = p.eps_is_input ? b.input("eps", {}) : b.constant("eps", scalar(1e-5f));
  const std::map<std::string, graph::AttrValue> reduce = {{"axes", p.axes}};
  const int mean = b.node("ReduceMean", {x}, reduce);
  const int d = b.node("Sub", {x, mean});
  const int sq = b.node("Pow", {d, b.constant("two", scalar(p.exponent))});
  const int var = b.node("ReduceMean", {sq}, reduce);
  const int std_dev = b.node("Sqrt", {b.node("Add", {var, eps})});
  const int normed = b.node("Div", {d, std_dev});
  const int scaled = b.node("Mul", {normed, b.constant("gamma", random_tensor({kHidden}, 1))});
  const int y = b.node("Add", {scaled, b.constant("beta", random_tensor(p.beta_shape, 2))});
  std::vector<int> outputs = {y};
  if (p.mean_read_twice) outputs.push_back(mean);
  return b.finish(outputs);
}

NamedTensors inputs_for(const Pattern& p) {
  NamedTensors inputs = {{"x", random_tensor({2, 5, kHidden}, 3, -2.0f, 3.0f)}};
  if (p.eps_is_input) inputs["eps"] = scalar(1e-5f);
  return inputs;
}

int count_ops(const graph::Graph& g, const std::string& op) {
  int n = 0;
  for (const graph::Node& node : g.nodes) n += node.op_type == op ? 1 : 0;
  return n;
}

TEST(FuseLayerNorm, DecomposedPatternBecomesOneNodeWithTheSameResults) {
  const graph::Graph g = layer_norm_graph({});
  ASSERT_EQ(g.nodes.size(), 9u);
  graph::Graph fused = g;
  graph::fuse_layernorm(fused);
  ASSERT_EQ(fused.nodes.size(), 1u);
  const graph::Node& ln = fused.nodes[0];
  EXPECT_EQ(ln.op_type, "LayerNormalization");
  EXPECT_EQ(ln.attr_int("axis", 0), -1);
  EXPECT_FLOAT_EQ(ln.attr_float("epsilon", 0.0f), 1e-5f);
  const NamedTensors inputs = inputs_for({});
  const Tensor expected = run_reference(g, inputs).begin()->second;
  const Tensor actual = run_reference(fused, inputs).begin()->second;
  EXPECT_LE(max_abs_diff(expected, actual), 1e-5f);
}

TEST(FuseLayerNorm, OptimizeFusesItBeforeEpilogues) {
  graph::Graph g = layer_norm_graph({});
  graph::optimize(g, runtime::evaluate_node);
  EXPECT_EQ(count_ops(g, "LayerNormalization"), 1);
  EXPECT_EQ(g.nodes.size(), 1u);
}

TEST(FuseLayerNorm, RowVectorBetaBecomesAVectorOperand) {
  Pattern p;
  p.beta_shape = {1, kHidden};
  const graph::Graph g = layer_norm_graph(p);
  graph::Graph fused = g;
  graph::fuse_layernorm(fused);
  ASSERT_EQ(count_ops(fused, "LayerNormalization"), 1);
  const NamedTensors inputs = inputs_for(p);
  EXPECT_LE(max_abs_diff(run_reference(g, inputs).begin()->second,
                         run_reference(fused, inputs).begin()->second),
            1e-5f);
}

TEST(FuseLayerNorm, PositiveLastAxisIsTheSameAxis) {
  Pattern p;
  p.axes = {2};
  graph::Graph g = layer_norm_graph(p);
  graph::fuse_layernorm(g);
  EXPECT_EQ(count_ops(g, "LayerNormalization"), 1);
}

// At load the batch is symbolic, so an intermediate's shape is not known yet: the pass must
// not need it.
TEST(FuseLayerNorm, FusesOverAnIntermediateOfUnknownShape) {
  GraphBuilder b;
  const int x = b.node("Relu", {b.input("x", {-1, 5, kHidden})});
  const std::map<std::string, graph::AttrValue> last = {{"axes", std::vector<int64_t>{-1}}};
  const int d = b.node("Sub", {x, b.node("ReduceMean", {x}, last)});
  const int var = b.node("ReduceMean", {b.node("Pow", {d, b.constant("two", scalar(2.0f))})}, last);
  const int normed =
      b.node("Div", {d, b.node("Sqrt", {b.node("Add", {b.constant("eps", scalar(1e-6f)), var})})});
  // gamma and beta on the left, as some exporters write them.
  const int y =
      b.node("Add", {b.constant("beta", random_tensor({kHidden}, 2)),
                     b.node("Mul", {b.constant("gamma", random_tensor({kHidden}, 1)), normed})});
  const graph::Graph g = b.finish({y});
  ASSERT_FALSE(g.values[static_cast<std::size_t>(x)].shape.has_value());
  graph::Graph fused = g;
  graph::fuse_layernorm(fused);
  ASSERT_EQ(count_ops(fused, "LayerNormalization"), 1);
  EXPECT_FLOAT_EQ(fused.nodes.back().attr_float("epsilon", 0.0f), 1e-6f);
  const NamedTensors inputs = {{"x", random_tensor({2, 5, kHidden}, 3)}};
  EXPECT_LE(max_abs_diff(run_reference(g, inputs).begin()->second,
                         run_reference(fused, inputs).begin()->second),
            1e-5f);
}

struct NearMiss {
  const char* name;
  Pattern pattern;
};

class FuseLayerNormNearMiss : public ::testing::TestWithParam<NearMiss> {};

TEST_P(FuseLayerNormNearMiss, IsLeftAloneAndStillComputesTheSame) {
  const Pattern& p = GetParam().pattern;
  const graph::Graph g = layer_norm_graph(p);
  graph::Graph after = g;
  graph::fuse_layernorm(after);
  EXPECT_EQ(after.nodes.size(), g.nodes.size());
  EXPECT_EQ(count_ops(after, "LayerNormalization"), 0);
  const NamedTensors inputs = inputs_for(p);
  const NamedTensors expected = run_reference(g, inputs), actual = run_reference(after, inputs);
  for (const auto& [name, t] : expected) EXPECT_EQ(max_abs_diff(t, actual.at(name)), 0.0f);
}

NearMiss near_miss(const char* name, void (*change)(Pattern&)) {
  NearMiss m{name, {}};
  change(m.pattern);
  return m;
}

INSTANTIATE_TEST_SUITE_P(
    Patterns, FuseLayerNormNearMiss,
    ::testing::Values(near_miss("WrongAxes", [](Pattern& p) { p.axes = {1}; }),
                      near_miss("TwoAxes",
                                [](Pattern& p) {
                                  p.axes = {1, 2};
                                }),
                      near_miss("EpsNotConstant", [](Pattern& p) { p.eps_is_input = true; }),
                      near_miss("MeanHasAnotherReader",
                                [](Pattern& p) { p.mean_read_twice = true; }),
                      near_miss("ExponentNotTwo", [](Pattern& p) { p.exponent = 3.0f; })),
    [](const ::testing::TestParamInfo<NearMiss>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace sparsecol::testing
