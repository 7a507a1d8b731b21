// The depth-wise executor computes what the reference executor computes, whatever the thread
// count, the tile height (1 row, a prime, taller than the image) and the cache budget.
#include <gtest/gtest.h>

#include <cmath>

#include "graph/passes.h"
#include "graph_builder.h"

namespace sparsecol::testing {
namespace {

std::unique_ptr<runtime::Executor> depthwise(graph::Graph g, const NamedTensors& inputs,
                                             int threads, const Options& options) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, t] : inputs) shapes[name] = t.shape();
  graph::optimize(g, runtime::evaluate_node);
  return runtime::make_depthwise_executor(graph::specialize(g, shapes, runtime::evaluate_node),
                                          threads, options);
}

float max_abs(const Tensor& t) {
  float m = 0.0f;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(t.data<float>()[i]));
  return m;
}

struct Variant {
  int threads;
  int tile_rows;             // 0: the planner's
  int64_t cache_budget = 0;  // 0: the machine's L2
};

// Depth-wise against the unoptimized graph on the reference executor, for each variant; every
// variant must also agree with the first to rounding (tiles compute each element the same way).
void expect_matches_reference(const graph::Graph& g, const NamedTensors& inputs) {
  const NamedTensors expected = run_reference(g, inputs);
  std::vector<Variant> variants;
  for (int threads : {1, 2, 3, 4}) {
    for (int rows : {0, 1, 5, 1000}) variants.push_back({threads, rows});
  }
  variants.push_back({2, 0, 8 << 10});  // a budget so small that most ops run whole
  variants.push_back({3, 3, 64 << 10});
  for (const Variant& v : variants) {
    Options options;
    options.tile_rows = v.tile_rows;
    options.cache_budget_bytes = v.cache_budget;
    const NamedTensors actual = depthwise(g, inputs, v.threads, options)->run(inputs);
    ASSERT_EQ(actual.size(), expected.size());
    for (const auto& [name, t] : expected) {
      const float tolerance = 1e-4f * std::max(1.0f, max_abs(t));
      EXPECT_LE(max_abs_diff(t, actual.at(name)), tolerance)
          << name << ": threads " << v.threads << ", tile rows " << v.tile_rows << ", budget "
          << v.cache_budget;
    }
  }
}

TEST(Depthwise, ResidualCnnMatchesReference) {
  expect_matches_reference(residual_cnn(), {{"x", random_tensor({3, 3, 13, 11}, 11)}});
}

TEST(Depthwise, BatchOfOneMatchesReference) {
  expect_matches_reference(residual_cnn(), {{"x", random_tensor({1, 3, 13, 11}, 12)}});
}

// Ops the epilogue pass leaves standalone: SiLU (x * sigmoid(x), two tile inputs), an Add of a
// per-channel constant, a dilated conv, average pooling with padding counted, and an
// intermediate that is both read in the column and a graph output.
graph::Graph eltwise_net() {
  GraphBuilder b;
  const int x = b.input("x", {-1, 4, 15, 9});
  const int c = b.node(
      "Conv", {x, b.constant("w1", random_tensor({6, 4, 3, 3}, 1))},
      {{"pads", std::vector<int64_t>{2, 2, 2, 2}}, {"dilations", std::vector<int64_t>{2, 2}}});
  const int silu = b.node("Mul", {c, b.node("Sigmoid", {c})});
  const int shifted = b.node("Add", {silu, b.constant("shift", random_tensor({6, 1, 1}, 2))});
  const int avg = b.node("AveragePool", {shifted},
                         {{"kernel_shape", std::vector<int64_t>{3, 3}},
                          {"pads", kPad1},
                          {"count_include_pad", int64_t{1}}});
  const int scaled = b.node("Mul", {avg, b.constant("half", scalar(0.5f))});
  const int last = b.node("Conv", {scaled, b.constant("w2", random_tensor({5, 6, 3, 1}, 3))},
                          {{"strides", std::vector<int64_t>{3, 1}}});
  return b.finish({last, silu});
}

TEST(Depthwise, ElementwiseOpsAndEscapingIntermediatesMatchReference) {
  expect_matches_reference(eltwise_net(), {{"x", random_tensor({2, 4, 15, 9}, 21)}});
}

TEST(Depthwise, SecondRunInReusedBuffersGivesTheSameResult) {
  const NamedTensors inputs = {{"x", random_tensor({2, 3, 13, 11}, 22)}};
  Options options;
  options.tile_rows = 2;
  auto executor = depthwise(residual_cnn(), inputs, 2, options);
  const NamedTensors first = executor->run(inputs);
  const NamedTensors other = executor->run({{"x", random_tensor({2, 3, 13, 11}, 23)}});
  const NamedTensors again = executor->run(inputs);
  for (const auto& [name, t] : first) {
    EXPECT_EQ(max_abs_diff(t, again.at(name)), 0.0f) << name;
    EXPECT_GT(max_abs_diff(t, other.at(name)), 0.0f) << name << " ignores its input";
  }
}

// The per-tile profile: one event per op per tile, on the worker threads that ran them.
TEST(Depthwise, ProfilerRecordsEachOpOnEachTile) {
  const NamedTensors inputs = {{"x", random_tensor({2, 3, 13, 11}, 24)}};
  Options options;
  options.tile_rows = 3;
  auto executor = depthwise(residual_cnn(), inputs, 2, options);
  runtime::Profiler profiler;
  executor->set_profiler(&profiler);
  executor->run(inputs);
  int tiled = 0, whole = 0;
  for (const ProfileEvent& e : profiler.events()) {
    (e.tile >= 0 ? tiled : whole) += 1;
    EXPECT_GE(e.thread, 0);
    EXPECT_LT(e.thread, 2);
  }
  EXPECT_GT(tiled, 0);
  EXPECT_GT(whole, 0);  // GAP, Flatten, Gemm
  bool column = false;
  for (const LayerInfo& info : executor->layers()) {
    column = column || info.implementation.rfind("column ", 0) == 0;
  }
  EXPECT_TRUE(column);
}

TEST(Depthwise, RejectsNegativeTileRows) {
  Options options;
  options.tile_rows = -1;
  EXPECT_THROW(depthwise(residual_cnn(), {{"x", random_tensor({1, 3, 13, 11}, 1)}}, 1, options),
               Error);
}

}  // namespace
}  // namespace sparsecol::testing
