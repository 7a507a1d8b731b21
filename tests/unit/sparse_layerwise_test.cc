// Pruned Conv, Gemm and MatMul layers through the layerwise executor's sparse kernels give what
// the reference executor gives, at any thread count and bit-identical across thread counts; the
// format each layer gets follows Options::sparse_threshold and is reported by layers().
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include <fmt/format.h>

#include "graph/passes.h"
#include "graph_builder.h"

namespace sparsecol::testing {
namespace {

std::unique_ptr<runtime::Executor> layerwise(graph::Graph g, const NamedTensors& inputs,
                                             int threads, double sparse_threshold) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, t] : inputs) shapes[name] = t.shape();
  graph::optimize(g, runtime::evaluate_node);
  Options options;
  options.sparse_threshold = sparse_threshold;
  return runtime::make_layerwise_executor(graph::specialize(g, shapes, runtime::evaluate_node),
                                          threads, options);
}

// A residual CNN whose every convolution and the classifier are 90% pruned: 3x3 conv + relu,
// grouped 3x3, 1x1 + residual add + relu, strided 3x3, 1x1 on a 4x4 image, GAP, Gemm (transB).
graph::Graph pruned_cnn() {
  GraphBuilder b;
  const int x = b.input("x", {-1, 8, 15, 13});
  const int c1 = b.node("Relu", {b.node("Conv",
                                        {x, b.constant("w1", pruned_tensor({32, 8, 3, 3}, 1, 0.9)),
                                         b.constant("b1", random_tensor({32}, 2))},
                                        {{"pads", kPad1}})});
  const int grouped = b.node("Conv", {c1, b.constant("w2", pruned_tensor({32, 8, 3, 3}, 3, 0.9))},
                             {{"pads", kPad1}, {"group", int64_t{4}}});
  const int pw = b.node("Conv", {grouped, b.constant("w3", pruned_tensor({32, 32, 1, 1}, 4, 0.9)),
                                 b.constant("b3", random_tensor({32}, 5))});
  const int res = b.node("Relu", {b.node("Add", {pw, c1})});
  const int down = b.node("Conv", {res, b.constant("w4", pruned_tensor({48, 32, 3, 3}, 6, 0.9))},
                          {{"pads", kPad1}, {"strides", std::vector<int64_t>{2, 2}}});
  const int down2 = b.node("Conv", {down, b.constant("w5", pruned_tensor({48, 48, 3, 3}, 7, 0.95))},
                           {{"pads", kPad1}, {"strides", std::vector<int64_t>{2, 2}}});
  const int small = b.node(
      "Relu", {b.node("Conv", {down2, b.constant("w6", pruned_tensor({64, 48, 1, 1}, 8, 0.9))})});
  const int flat = b.node("Flatten", {b.node("GlobalAveragePool", {small})});
  const int fc = b.node("Gemm",
                        {flat, b.constant("wf", pruned_tensor({10, 64}, 9, 0.9)),
                         b.constant("bf", random_tensor({10}, 10))},
                        {{"transB", int64_t{1}}});
  return b.finish({fc, res});
}

// Pruned transformer linear layers: MatMul + bias + GELU, MatMul + residual, over `tokens`
// tokens per sequence (70: a full block of 64 and a tail); `gelu_out`: the GELU's output is a
// graph output too.
graph::Graph pruned_mlp(int64_t tokens = 70, bool gelu_out = false) {
  GraphBuilder b;
  const int x = b.input("x", {-1, tokens, 48});
  const int h =
      b.node("Add", {b.node("MatMul", {x, b.constant("w1", pruned_tensor({48, 96}, 1, 0.9))}),
                     b.constant("b1", random_tensor({96}, 2))});
  const int erf = b.node("Erf", {b.node("Div", {h, b.constant("sqrt2", scalar(std::sqrt(2.0f)))})});
  const int gelu =
      b.node("Mul", {b.node("Mul", {h, b.node("Add", {erf, b.constant("one", scalar(1.0f))})}),
                     b.constant("half", scalar(0.5f))});
  const int out = b.node(
      "Add", {b.node("MatMul", {gelu, b.constant("w2", pruned_tensor({96, 48}, 3, 0.95))}), x});
  return gelu_out ? b.finish({out, gelu}) : b.finish({out});
}

// Layerwise with the default threshold (the pruned layers sparse) at 1, 2 and 3 threads against
// the reference; the thread counts agree bit for bit. Returns the layers of the last executor.
std::vector<LayerInfo> expect_sparse_matches_reference(const graph::Graph& g,
                                                       const NamedTensors& inputs) {
  const NamedTensors expected = run_reference(g, inputs);
  NamedTensors first;
  std::vector<LayerInfo> layers;
  for (int threads : {1, 2, 3}) {
    auto executor = layerwise(g, inputs, threads, -1.0);
    const NamedTensors actual = executor->run(inputs);
    for (const auto& [name, t] : expected) {
      float scale = 1.0f;
      for (int64_t i = 0; i < t.numel(); ++i)
        scale = std::max(scale, std::fabs(t.data<float>()[i]));
      EXPECT_LE(max_abs_diff(t, actual.at(name)), 1e-4f * scale) << name << " threads " << threads;
      if (threads == 1) {
        first[name] = actual.at(name);
      } else {
        EXPECT_EQ(max_abs_diff(first.at(name), actual.at(name)), 0.0f)
            << name << ": threads " << threads << " differs from threads 1";
      }
    }
    layers = executor->layers();
  }
  return layers;
}

int count_format(const std::vector<LayerInfo>& layers, const std::string& format) {
  int n = 0;
  for (const LayerInfo& l : layers) n += l.weight_format == format ? 1 : 0;
  return n;
}

TEST(SparseLayerwise, PrunedCnnMatchesReference) {
  const std::vector<LayerInfo> layers =
      expect_sparse_matches_reference(pruned_cnn(), {{"x", random_tensor({2, 8, 15, 13}, 11)}});
  EXPECT_EQ(count_format(layers, "sparse-csr"), 7);  // six convolutions and the classifier
  for (const LayerInfo& l : layers) {
    if (l.weight_format != "sparse-csr") continue;
    EXPECT_NE(l.implementation.find("spmm"), std::string::npos) << l.node;
    EXPECT_GT(l.packed_bytes, 0) << l.node;
    EXPECT_GE(l.weight_sparsity, 0.85) << l.node;
  }
}

TEST(SparseLayerwise, PrunedCnnAtBatchOneMatchesReference) {
  expect_sparse_matches_reference(pruned_cnn(), {{"x", random_tensor({1, 8, 15, 13}, 12)}});
}

// How many layers run with `what` in their implementation.
int count_implementation(const std::vector<LayerInfo>& layers, const std::string& what) {
  int n = 0;
  for (const LayerInfo& l : layers) n += l.implementation.find(what) != std::string::npos ? 1 : 0;
  return n;
}

// A 90%-pruned 1x1 expansion (+ Relu) from `channels` to `hidden` channels and a projection back
// over a residual (+ Relu), on side x side planes; `seed` and the next two seed the weights.
graph::Graph expand_and_project(int64_t channels, int64_t side, int64_t hidden, uint32_t seed) {
  GraphBuilder b;
  const int x = b.input("x", {-1, channels, side, side});
  const int h = b.node(
      "Relu",
      {b.node("Conv", {x, b.constant("w1", pruned_tensor({hidden, channels, 1, 1}, seed, 0.9)),
                       b.constant("b1", random_tensor({hidden}, seed + 1))})});
  const int projection =
      b.node("Conv", {h, b.constant("w2", pruned_tensor({channels, hidden, 1, 1}, seed + 2, 0.9))});
  return b.finish({b.node("Relu", {b.node("Add", {projection, x})})});
}

// 90%-pruned 1x1 layers on 7x7 planes, a residual fused into the second: their images are
// stacked, and at batch 3 the threads split them into stacks of 2 and 1 images
// (stacked_conv_tasks), 3 threads by channel blocks too.
TEST(SparseLayerwise, StackedImagesSplitIntoGroupsMatchReference) {
  const std::vector<LayerInfo> layers = expect_sparse_matches_reference(
      expand_and_project(64, 7, 96, 21), {{"x", random_tensor({3, 64, 7, 7}, 24)}});
  EXPECT_EQ(count_format(layers, "sparse-csr"), 2);
  EXPECT_EQ(count_implementation(layers, "images stacked"), 2);
}

// A 90%-pruned expansion and projection on 14x14 planes, a residual fused into the projection:
// the projection (more input than output channels) sums its input in two halves
// (kernels::kInputHalvesMaxPixels), which at batch 1 on several threads run as tasks of their own
// before the sums are added; every thread count gives the same bits, at batch 1 and 2.
TEST(SparseLayerwise, InputHalvesOnThreadsMatchReference) {
  const graph::Graph g = expand_and_project(32, 14, 96, 31);
  for (const int64_t batch : {1, 2}) {
    SCOPED_TRACE(fmt::format("batch {}", batch));
    const std::vector<LayerInfo> layers =
        expect_sparse_matches_reference(g, {{"x", random_tensor({batch, 32, 14, 14}, 34)}});
    EXPECT_EQ(count_implementation(layers, "in input halves"), 1);
  }
}

TEST(SparseLayerwise, PrunedLinearLayersMatchReference) {
  // 140 tokens fill no whole number of blocks: the layers pass their activation token-major.
  const std::vector<LayerInfo> layers = expect_sparse_matches_reference(
      pruned_mlp(), {{"x", random_tensor({2, 70, 48}, 21, -2.0f, 2.0f)}});
  EXPECT_EQ(count_format(layers, "sparse-csr"), 2);
  EXPECT_EQ(count_implementation(layers, "feature blocks"), 0);
}

TEST(SparseLayerwise, LinearLayersInARowPassFeatureBlocks) {
  // 2 x 96 tokens: three whole blocks; the first layer writes its output in feature blocks and
  // the second reads it so, with the same results as the reference at every thread count.
  const std::vector<LayerInfo> layers = expect_sparse_matches_reference(
      pruned_mlp(96), {{"x", random_tensor({2, 96, 48}, 22, -2.0f, 2.0f)}});
  EXPECT_EQ(count_implementation(layers, "(output in feature blocks)"), 1);
  EXPECT_EQ(count_implementation(layers, "(input in feature blocks)"), 1);
  // Not when the activation is also a graph output (the caller reads it token-major).
  const std::vector<LayerInfo> read = expect_sparse_matches_reference(
      pruned_mlp(96, true), {{"x", random_tensor({2, 96, 48}, 23, -2.0f, 2.0f)}});
  EXPECT_EQ(count_format(read, "sparse-csr"), 2);
  EXPECT_EQ(count_implementation(read, "feature blocks"), 0);
}

TEST(SparseLayerwise, ThresholdOptionPicksTheFormat) {
  const NamedTensors inputs = {{"x", random_tensor({1, 8, 15, 13}, 13)}};
  // Above every layer's sparsity: all dense; 0: every weighted layer but none depthwise sparse.
  const auto dense = layerwise(pruned_cnn(), inputs, 2, 0.99);
  EXPECT_EQ(count_format(dense->layers(), "sparse-csr"), 0);
  EXPECT_EQ(count_format(dense->layers(), "dense"), 7);
  const auto sparse = layerwise(pruned_cnn(), inputs, 2, 0.0);
  EXPECT_EQ(count_format(sparse->layers(), "sparse-csr"), 7);
  const NamedTensors a = dense->run(inputs), b = sparse->run(inputs);
  for (const auto& [name, t] : a) EXPECT_LE(max_abs_diff(t, b.at(name)), 1e-4f) << name;
}

}  // namespace
}  // namespace sparsecol::testing
