// The depth-wise executor computes what the reference executor computes, whatever the thread
// count, the tile height (1 row, a prime, taller than the image), the cache budget and the way
// tiles get their halo rows (recomputed, or kept in rolling line buffers): bit for bit what the
// layer-by-layer executor computes, since tiles change where work is cut, not the arithmetic.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include <fmt/format.h>

#include "graph/passes.h"
#include "graph_builder.h"
#include "plan/tile_plan.h"

namespace sparsecol::testing {
namespace {

graph::Graph specialized(graph::Graph g, const NamedTensors& inputs) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, t] : inputs) shapes[name] = t.shape();
  graph::optimize(g, runtime::evaluate_node);
  return graph::specialize(g, shapes, runtime::evaluate_node);
}

std::unique_ptr<runtime::Executor> depthwise(graph::Graph g, const NamedTensors& inputs,
                                             int threads, const Options& options) {
  return runtime::make_depthwise_executor(specialized(std::move(g), inputs), threads, options);
}

struct Variant {
  int threads;
  int tile_rows;             // 0: the planner's
  int64_t cache_budget = 0;  // 0: the machine's (3/4 of its L2)
};

const char* name_of(TileReuse reuse) { return reuse == TileReuse::kHalo ? "halo" : "rolling"; }

// Depth-wise against the unoptimized graph on the reference executor to rounding, and against
// the layer-by-layer executor exactly, for each variant and both ways of reusing tiles.
void expect_matches_reference(const graph::Graph& g, const NamedTensors& inputs) {
  const NamedTensors expected = run_reference(g, inputs);
  Options layerwise_options;
  const NamedTensors layerwise =
      runtime::make_layerwise_executor(specialized(g, inputs), 2, layerwise_options)->run(inputs);
  std::vector<Variant> variants;
  for (int threads : {1, 2, 3, 4}) {
    for (int rows : {0, 1, 5, 7, 1000}) variants.push_back({threads, rows});
  }
  variants.push_back({2, 0, 8 << 10});  // a budget so small that most ops run whole
  variants.push_back({3, 3, 64 << 10});
  for (TileReuse reuse : {TileReuse::kHalo, TileReuse::kRolling}) {
    for (const Variant& v : variants) {
      Options options;
      options.tile_rows = v.tile_rows;
      options.cache_budget_bytes = v.cache_budget;
      options.tile_reuse = reuse;
      const NamedTensors actual = depthwise(g, inputs, v.threads, options)->run(inputs);
      const std::string variant =
          fmt::format("{}, threads {}, tile rows {}, budget {}", name_of(reuse), v.threads,
                      v.tile_rows, v.cache_budget);
      EXPECT_TRUE(outputs_near(actual, expected, 1e-4f)) << variant;
      EXPECT_TRUE(outputs_near(actual, layerwise, 0.0f)) << "against layer by layer: " << variant;
    }
  }
}

TEST(Depthwise, ResidualCnnMatchesReference) {
  expect_matches_reference(residual_cnn(), {{"x", random_tensor({3, 3, 13, 11}, 11)}});
}

// Ops run whole may write a convolution's output over its residual's buffer (as layer by layer);
// a column's output never does (a later tile may still read the residual's rows as a halo).
// Inside a column a convolution writes over its residual's tile buffer where each tile computes
// the same rows of both (plan::share_residual_buffers): in row tiles not over a residual that a
// 3x3 convolution also reads (it holds halo rows), in whole-image tiles over that one too.
TEST(Depthwise, ResidualsAreWrittenOverOnlyWhereNothingReadsThemLater) {
  const NamedTensors inputs = {{"x", random_tensor({3, 16, 9, 10}, 48)}};
  expect_matches_reference(residual_reuse_net(9, 10), inputs);
  auto written_over = [&](int64_t budget, int64_t tile_rows) {
    Options options;
    options.cache_budget_bytes = budget;
    options.tile_rows = tile_rows;
    return written_over_residuals(
        depthwise(residual_reuse_net(9, 10), inputs, 2, options)->layers());
  };
  // A budget too small for any column: every op runs whole.
  EXPECT_EQ(written_over(1 << 10, 0), (std::vector<bool>{true, true, false, false, false}));
  // Forced tiles: one column of every op.
  EXPECT_EQ(written_over(0, 3), (std::vector<bool>{false, true, false, false, false}));
  EXPECT_EQ(written_over(0, 9), (std::vector<bool>{true, true, false, false, false}));
}

// Options::measure_columns: an executor's first runs run the columns as tiles and with their
// ops whole, alternately, each way in a placement of its own (whole ops write over residuals,
// as layer by layer does); then the way its runs measured faster. Every run gives layer by
// layer's outputs for its own inputs (none reads a buffer the other way left), and afterwards
// the column's ops all report the way it settled on. Off, the column stays tiles.
TEST(Depthwise, MeasuredColumnsGiveLayerByLayersOutputsEveryRunAndSettle) {
  const graph::Graph g = residual_reuse_net(9, 10);
  auto inputs_of_run = [](int run) {
    return NamedTensors{{"x", random_tensor({3, 16, 9, 10}, 60 + static_cast<uint64_t>(run))}};
  };
  auto layerwise = runtime::make_layerwise_executor(specialized(g, inputs_of_run(0)), 2, {});
  for (bool measure : {true, false}) {
    Options options;
    options.tile_rows = 3;  // one column of every op
    options.measure_columns = measure;
    auto executor = depthwise(g, inputs_of_run(0), 2, options);
    for (int run = 0; run < kColumnMeasuringRuns + 3; ++run) {
      const NamedTensors inputs = inputs_of_run(run);
      EXPECT_TRUE(outputs_near(executor->run(inputs), layerwise->run(inputs), 0.0f))
          << "measure " << measure << ", run " << run;
    }
    const std::vector<LayerInfo> layers = executor->layers();
    std::size_t tiles = 0, whole = 0;
    for (const LayerInfo& info : layers) {
      tiles += info.implementation.rfind("column 0 (", 0) == 0 ? 1 : 0;
      whole += info.implementation.rfind("whole (measured faster than column 0's tiles)", 0) == 0
                   ? 1
                   : 0;
    }
    EXPECT_TRUE((tiles == layers.size() && whole == 0) || (whole == layers.size() && tiles == 0))
        << "measure " << measure << ": " << tiles << " ops as tiles, " << whole << " whole, of "
        << layers.size();
    if (!measure) {
      EXPECT_EQ(tiles, layers.size());
    }
    // Whole, the column's ops write over residuals as the ops run whole by a small budget do.
    if (whole > 0) {
      EXPECT_EQ(written_over_residuals(layers),
                (std::vector<bool>{true, true, false, false, false}));
    }
  }
}

// A column's layers report their packed weights as the steps run whole do: format and bytes.
TEST(Depthwise, LayersInColumnsReportTheirPackedWeights) {
  Options columns;
  columns.tile_rows = 3;
  const NamedTensors images = {{"x", random_tensor({2, 16, 9, 10}, 49)}};
  const NamedTensors tokens = {{"x", random_tensor({1, 128, 24}, 50)}};
  int sparse = 0, dense = 0;
  for (const auto& layers : {depthwise(residual_reuse_net(9, 10), images, 2, columns)->layers(),
                             depthwise(token_net(), tokens, 2, columns)->layers()}) {
    for (const LayerInfo& info : layers) {
      if (info.weight_shape.empty() || info.implementation.find("column") != 0) continue;
      const bool spmm = info.implementation.find("spmm") != std::string::npos;
      EXPECT_EQ(info.weight_format, spmm ? "sparse-csr" : "dense") << info.implementation;
      EXPECT_GT(info.packed_bytes, 0) << info.implementation;
      ++(spmm ? sparse : dense);
    }
  }
  EXPECT_GE(sparse, 3);  // the pruned conv and the FFN's two linear layers
  EXPECT_GE(dense, 5);
}

// Several images of small planes: dense convolutions run whole (stacking their images), the
// column that ends on the sparse one holds them too; forced tile heights tile them all.
TEST(Depthwise, SmallPlanesAtSeveralImagesMatchReference) {
  expect_matches_reference(small_plane_cnn(), {{"x", random_tensor({5, 16, 8, 8}, 47)}});
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

// A weight with ~90% of its entries zeroed (seeded), so that the conv runs sparse.
Tensor pruned(std::vector<int64_t> shape, uint32_t seed) { return pruned_tensor(shape, seed, 0.9); }

// A ResNet downsample block, pruned: the strided 1x1 convs (stride `s1x1`, pads `pads`) read
// every stride-th pixel, which the conv kernel gathers unless a tap can fall in padding
// (kernels::gathers_strided_pointwise), one with the residual Add + Relu fused, one plain (bias
// only) read by the next conv.
graph::Graph downsample_net(std::vector<int64_t> s1x1, std::vector<int64_t> pads) {
  GraphBuilder b;
  const int x = b.input("x", {-1, 16, 13, 11});
  const int h =
      b.node("Relu",
             {b.node("Conv", {x, b.constant("w1", pruned({24, 16, 3, 3}, 1))}, {{"pads", kPad1}})});
  const int down = b.node(
      "Conv",
      {h, b.constant("wd", pruned({32, 24, 1, 1}, 3)), b.constant("bd", random_tensor({32}, 5))},
      {{"strides", s1x1}, {"pads", pads}});
  const int branch = b.node("Conv", {h, b.constant("w2", pruned({32, 24, 1, 1}, 6))},
                            {{"strides", s1x1}, {"pads", pads}});
  const int sum = b.node("Relu", {b.node("Add", {branch, down})});
  const int last = b.node("Conv", {sum, b.constant("w3", pruned({20, 32, 1, 1}, 8))});
  return b.finish({last});
}

// Token columns: the FFN's hidden activation passes between the two sparse layers in feature
// blocks where every tile holds whole blocks (the planner's tiles, 1000 rows: whole sequences),
// token-major elsewhere (1, 5, 7 rows); batch 3 gives the threads uneven shares.
TEST(Depthwise, TokenColumnsMatchReference) {
  expect_matches_reference(token_net(), {{"x", random_tensor({3, 128, 24}, 31)}});
}

// A pre-norm FFN block: layer norm, then two pruned linear layers (the first with bias and Relu),
// then the residual Add. `hidden` wide.
graph::Graph norm_ffn_net(int64_t hidden) {
  constexpr int64_t kFeatures = 24;
  GraphBuilder b;
  const int x = b.input("x", {-1, 128, kFeatures});
  const int norm = layer_norm(b, x, kFeatures, 1);
  const int up = b.node(
      "Relu",
      {b.node("Add", {b.node("MatMul",
                             {norm, b.constant("w1", pruned_tensor({kFeatures, hidden}, 3, 0.9))}),
                      b.constant("b1", random_tensor({hidden}, 4))})});
  const int down =
      b.node("MatMul", {up, b.constant("w2", pruned_tensor({hidden, kFeatures}, 5, 0.9))});
  return b.finish({b.node("Add", {down, x})});
}

// Where a column boundary cuts the FFN (a column ends at its first sparse layer, the second runs
// whole), the hidden activation between them crosses in memory token-major: the whole step must
// not read it in feature blocks, which the column's tiles do not write (found on a 1 MiB L2,
// where the planner had put BERT's FFN down projection in a column and left the up projection
// whole). The budgets sweep the planner's choices; at least one of them must cut the FFN.
TEST(Depthwise, FfnCutByAColumnBoundaryMatchesReference) {
  constexpr int64_t kHidden = 512;  // a hidden tile that outweighs the rest of a column
  const NamedTensors inputs = {{"x", random_tensor({2, 128, 24}, 32)}};
  const NamedTensors expected = run_reference(norm_ffn_net(kHidden), inputs);
  const graph::Graph g = specialized(norm_ffn_net(kHidden), inputs);
  const std::vector<std::size_t> ffn = ffn_matmuls(g);
  ASSERT_EQ(ffn.size(), 2u);
  int cuts = 0;
  for (int64_t budget : swept_budgets()) {
    const plan::TilePlan plan = plan_under_budget(g, budget);
    const int first = plan.column_of[ffn[0]], second = plan.column_of[ffn[1]];
    cuts += first != second;
    Options options;
    options.cache_budget_bytes = budget;
    const NamedTensors actual = depthwise(norm_ffn_net(kHidden), inputs, 2, options)->run(inputs);
    EXPECT_TRUE(outputs_near(actual, expected, 1e-4f))
        << "budget " << budget << ", FFN columns " << first << " and " << second;
  }
  EXPECT_GT(cuts, 0) << "no budget cut the FFN: the case is not exercised";
}

TEST(Depthwise, StridedSparse1x1MatchesReference) {
  const NamedTensors inputs = {{"x", random_tensor({3, 16, 13, 11}, 26)}};
  // Odd planes: the last gathered row and column are the image's last ones (13 = 6 * 2 + 1).
  for (const std::vector<int64_t>& strides :
       {std::vector<int64_t>{2, 2}, std::vector<int64_t>{3, 2}, std::vector<int64_t>{1, 3}}) {
    SCOPED_TRACE(::testing::Message() << "strides " << strides[0] << "x" << strides[1]);
    const graph::Graph g = downsample_net(strides, {0, 0, 0, 0});
    expect_matches_reference(g, inputs);
    int gathered = 0;
    for (const LayerInfo& info : depthwise(g, inputs, 2, {})->layers()) {
      gathered += info.implementation.find("spmm-1x1-gathered") != std::string::npos;
    }
    EXPECT_EQ(gathered, 2) << "both strided 1x1 convs gathered";
  }
  // Bottom and right padding no tap reaches (out 7x6 from 13x11): gathered too.
  expect_matches_reference(downsample_net({2, 2}, {0, 0, 1, 1}), inputs);
  // Top and left padding: taps outside the image, left to the conv kernel's own lowering.
  const graph::Graph padded = downsample_net({2, 2}, {1, 1, 0, 0});
  expect_matches_reference(padded, inputs);
  for (const LayerInfo& info : depthwise(padded, inputs, 2, {})->layers()) {
    EXPECT_EQ(info.implementation.find("spmm-1x1-gathered"), std::string::npos) << info.node;
  }
}

// Rows kept in rolling buffers from one run must not leak into the next (every run's first
// tile of a thread recomputes its halo).
TEST(Depthwise, SecondRunInReusedBuffersGivesTheSameResult) {
  const NamedTensors inputs = {{"x", random_tensor({2, 3, 13, 11}, 22)}};
  for (TileReuse reuse : {TileReuse::kHalo, TileReuse::kRolling}) {
    Options options;
    options.tile_rows = 2;
    options.tile_reuse = reuse;
    auto executor = depthwise(residual_cnn(), inputs, 2, options);
    const NamedTensors first = executor->run(inputs);
    const NamedTensors other = executor->run({{"x", random_tensor({2, 3, 13, 11}, 23)}});
    const NamedTensors again = executor->run(inputs);
    for (const auto& [name, t] : first) {
      EXPECT_EQ(max_abs_diff(t, again.at(name)), 0.0f) << name << ", " << name_of(reuse);
      EXPECT_GT(max_abs_diff(t, other.at(name)), 0.0f)
          << name << " ignores its input, " << name_of(reuse);
    }
  }
}

// A thread that runs an image's tiles in order computes each row of an op once with rolling
// buffers (what it keeps plus what it computes is exactly what the tile needs), where halo
// recomputation computes the rows its tiles share more than once.
TEST(Depthwise, RollingBuffersComputeEachRowOnce) {
  const std::pair<graph::Graph, std::vector<int64_t>> graphs[] = {{residual_cnn(), {1, 3, 13, 11}},
                                                                  {eltwise_net(), {1, 4, 15, 9}}};
  for (const auto& [g, shape] : graphs) {
    const graph::Graph s = specialized(g, {{"x", random_tensor(shape, 1)}});
    for (int64_t rows : {1, 2, 5}) {
      plan::PlanOptions options;
      options.tile_rows = rows;
      const plan::TilePlan plan = plan::plan_columns(s, options);
      ASSERT_FALSE(plan.columns.empty());
      int64_t recomputed_by_halo = 0;
      for (const plan::Column& c : plan.columns) {
        for (std::size_t i = 0; i < c.ops.size(); ++i) {
          int64_t halo = 0, rolling = 0;
          plan::RowRange needed;
          for (std::size_t t = 0; t < c.rows.size(); ++t) {
            const plan::RowRange r = c.rows[t][i];
            const plan::RowRange kept =
                t > 0 ? plan::kept_rows(c.rows[t - 1][i], r) : plan::RowRange{};
            if (!kept.empty()) {
              EXPECT_EQ(kept.begin, r.begin) << "kept rows are a prefix";
            }
            halo += r.size();
            rolling += r.size() - kept.size();
            needed = plan::hull(needed, r);
          }
          EXPECT_EQ(rolling, needed.size()) << "column op " << i << ", " << rows << " tile rows";
          recomputed_by_halo += halo - needed.size();
        }
      }
      // One row per tile: every 3x3 window of the column needs rows of the neighbouring tiles.
      if (rows == 1) {
        EXPECT_GT(recomputed_by_halo, 0);
      }
    }
  }
}

TEST(Depthwise, KeptRowsAreTheOverlapOfConsecutiveTiles) {
  using plan::kept_rows;
  EXPECT_EQ(kept_rows({0, 5}, {3, 9}), (plan::RowRange{3, 5}));
  EXPECT_TRUE(kept_rows({0, 5}, {5, 9}).empty()) << "adjacent tiles share nothing";
  EXPECT_TRUE(kept_rows({0, 5}, {7, 9}).empty()) << "a gap (strided reader)";
  EXPECT_TRUE(kept_rows({}, {0, 4}).empty()) << "the previous tile computed nothing";
  EXPECT_TRUE(kept_rows({2, 5}, {1, 6}).empty()) << "not monotone: recompute";
  EXPECT_EQ(kept_rows({2, 9}, {4, 9}), (plan::RowRange{4, 9})) << "the last tile, all kept";
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

// Weight copies per NUMA node: a no-op on this one-node machine, which must still run (the
// copy's kernels are the ones bound) and give the same bits.
TEST(Depthwise, ReplicatedWeightsGiveTheSameResult) {
  const NamedTensors inputs = {{"x", random_tensor({2, 3, 13, 11}, 25)}};
  Options options;
  options.tile_rows = 3;
  const NamedTensors expected = depthwise(residual_cnn(), inputs, 2, options)->run(inputs);
  options.replicate_weights = true;
  const NamedTensors actual = depthwise(residual_cnn(), inputs, 2, options)->run(inputs);
  for (const auto& [name, t] : expected) EXPECT_EQ(max_abs_diff(t, actual.at(name)), 0.0f) << name;
}

TEST(Depthwise, RejectsNegativeTileRowsAndCacheSizes) {
  for (int which = 0; which < 3; ++which) {
    Options options;
    if (which == 0) options.tile_rows = -1;
    if (which == 1) options.cache_budget_bytes = -1;
    if (which == 2) options.shared_cache_bytes = -1;
    EXPECT_THROW(depthwise(residual_cnn(), {{"x", random_tensor({1, 3, 13, 11}, 1)}}, 1, options),
                 Error)
        << which;
  }
}

// The shared cache the planner assumes is the user's where given (the plan names it), and the
// outputs stay the same bits whatever the plan.
TEST(Depthwise, SharedCacheSizeGivenIsTheOnePlanned) {
  const NamedTensors inputs = {{"x", random_tensor({4, 3, 13, 11}, 26)}};
  const NamedTensors expected = depthwise(residual_cnn(), inputs, 2, Options{})->run(inputs);
  for (const int64_t kib : {96, 3072, 1 << 20}) {
    Options options;
    options.shared_cache_bytes = kib * 1024;
    const std::string plan =
        runtime::describe_depthwise_plan(specialized(residual_cnn(), inputs), 2, options);
    const std::string size =
        kib < 1024 ? fmt::format("{}.0 KiB", kib) : fmt::format("{}.0 MiB", kib / 1024);
    const std::string header = plan.substr(0, plan.find('\n'));  // the budgets and the L3
    EXPECT_NE(header.find(size), std::string::npos) << size << ":\n" << plan;
    const NamedTensors actual = depthwise(residual_cnn(), inputs, 2, options)->run(inputs);
    for (const auto& [name, t] : expected)
      EXPECT_EQ(max_abs_diff(t, actual.at(name)), 0.0f) << name;
  }
}

}  // namespace
}  // namespace sparsecol::testing
