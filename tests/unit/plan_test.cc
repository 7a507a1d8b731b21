// The depth-wise planner: the tile algebra's row arithmetic, the partition into columns, and the
// working-set model (plan/tile_plan.h).
#include <gtest/gtest.h>

#include <random>

#include <fmt/format.h>

#include "f32-conv/conv.h"
#include "f32-spmm/spmm.h"
#include "graph/passes.h"
#include "graph_builder.h"
#include "plan/tile_plan.h"

namespace sparsecol::testing {
namespace {

using plan::RowMap;
using plan::RowRange;

// Window maps over random kernel, stride, dilation and padding: the rows the planner names hold
// every input row the output rows read (brute force), and agree with the conv kernel's own
// conv_input_rows (kernels/f32-conv), the rows the kernel will actually read.
TEST(TileAlgebra, WindowRowsCoverEveryTapAndMatchTheConvKernel) {
  std::mt19937 rng(7);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 2000; ++trial) {
    RowMap map{RowMap::Kind::kWindow};
    map.kernel = pick(1, 7);
    map.stride = pick(1, 3);
    map.dilation = pick(1, 3);
    map.pad_top = pick(0, (map.kernel - 1) * map.dilation);
    map.in_rows = pick(1, 40);
    const int64_t pad_bottom = pick(0, (map.kernel - 1) * map.dilation);
    const int64_t span = (map.kernel - 1) * map.dilation + 1;
    const int64_t out_rows = (map.in_rows + map.pad_top + pad_bottom - span) / map.stride + 1;
    if (out_rows < 1) continue;
    const int64_t r0 = pick(0, static_cast<int>(out_rows - 1));
    const int64_t r1 = pick(static_cast<int>(r0 + 1), static_cast<int>(out_rows));
    const RowRange got = map.input_rows({r0, r1});

    RowRange touched;
    for (int64_t oh = r0; oh < r1; ++oh) {
      for (int64_t ky = 0; ky < map.kernel; ++ky) {
        const int64_t ih = oh * map.stride - map.pad_top + ky * map.dilation;
        if (ih >= 0 && ih < map.in_rows) touched = plan::hull(touched, {ih, ih + 1});
      }
    }
    const std::string what = ::testing::PrintToString(std::vector<int64_t>{
        map.kernel, map.stride, map.dilation, map.pad_top, map.in_rows, r0, r1});
    if (!touched.empty()) {
      EXPECT_LE(got.begin, touched.begin) << what;
      EXPECT_GE(got.end, touched.end) << what;
    }
    EXPECT_GE(got.begin, 0) << what;
    EXPECT_LE(got.end, map.in_rows) << what;

    kernels::ConvGeometry g;
    g.in_h = map.in_rows;
    g.kernel_h = map.kernel;
    g.stride_h = map.stride;
    g.dilation_h = map.dilation;
    g.pad_top = map.pad_top;
    int64_t first = 0, last = 0;
    kernels::conv_input_rows(g, r0, r1, &first, &last);
    EXPECT_EQ(got, (RowRange{first, last})) << what;
  }
}

TEST(TileAlgebra, SameAndNoneMaps) {
  EXPECT_EQ(RowMap{RowMap::Kind::kSame}.input_rows({3, 9}), (RowRange{3, 9}));
  EXPECT_TRUE(RowMap{}.input_rows({3, 9}).empty());
  EXPECT_TRUE((RowMap{RowMap::Kind::kSame}.input_rows({5, 5}).empty()));
  EXPECT_EQ(plan::hull({}, {2, 4}), (RowRange{2, 4}));
  EXPECT_EQ(plan::hull({1, 3}, {2, 7}), (RowRange{1, 7}));
}

graph::Graph prepared(graph::Graph g, std::vector<int64_t> input_shape) {
  graph::optimize(g, runtime::evaluate_node);
  return graph::specialize(g, {{"x", std::move(input_shape)}}, runtime::evaluate_node);
}

// A strided, dilated conv reads its input through a window with those parameters.
TEST(TileAlgebra, ConvTileOpReadsItsWindow) {
  GraphBuilder b;
  const int x = b.input("x", {-1, 4, 17, 9});
  const int y = b.node("Conv", {x, b.constant("w", random_tensor({6, 4, 3, 3}, 1))},
                       {{"pads", std::vector<int64_t>{2, 1, 2, 1}},
                        {"strides", std::vector<int64_t>{2, 1}},
                        {"dilations", std::vector<int64_t>{2, 1}}});
  const graph::Graph g = prepared(b.finish({y}), {3, 4, 17, 9});
  std::string why;
  const std::optional<plan::TileOp> op = plan::make_tile_op(g, 0, &why);
  ASSERT_TRUE(op) << why;
  EXPECT_EQ(op->inputs[0].kind, RowMap::Kind::kWindow);
  EXPECT_EQ(op->inputs[0].kernel, 3);
  EXPECT_EQ(op->inputs[0].stride, 2);
  EXPECT_EQ(op->inputs[0].dilation, 2);
  EXPECT_EQ(op->inputs[0].pad_top, 2);
  EXPECT_EQ(op->inputs[0].in_rows, 17);
  EXPECT_EQ(op->rows, 9);  // (17 + 4 - 5) / 2 + 1
  EXPECT_EQ(op->weight_bytes, 6 * 4 * 3 * 3 * 4);
}

// A residual CNN: stem, a residual block, a strided conv, max pool, then whole-tensor ops.
graph::Graph residual_cnn() {
  GraphBuilder b;
  const int x = b.input("x", {-1, 3, 32, 24});
  const int c1 = b.node("Relu", {b.node("Conv",
                                        {x, b.constant("w1", random_tensor({16, 3, 3, 3}, 1)),
                                         b.constant("b1", random_tensor({16}, 2))},
                                        {{"pads", kPad1}})});
  const int c2 =
      b.node("Relu", {b.node("Conv", {c1, b.constant("w2", random_tensor({16, 16, 3, 3}, 3))},
                             {{"pads", kPad1}})});
  const int c3 = b.node("Conv", {c2, b.constant("w3", random_tensor({16, 16, 1, 1}, 4))});
  const int res = b.node("Relu", {b.node("Add", {c3, c1})});
  const int down = b.node("Conv", {res, b.constant("w4", random_tensor({32, 16, 3, 3}, 5))},
                          {{"pads", kPad1}, {"strides", std::vector<int64_t>{2, 2}}});
  const int pool = b.node("MaxPool", {down},
                          {{"kernel_shape", std::vector<int64_t>{3, 3}},
                           {"strides", std::vector<int64_t>{2, 2}},
                           {"pads", kPad1}});
  const int gap = b.node("GlobalAveragePool", {pool});
  const int fc =
      b.node("Gemm", {b.node("Flatten", {gap}), b.constant("wf", random_tensor({10, 32}, 6))},
             {{"transB", int64_t{1}}});
  // A second pass over the pooled map after the whole-tensor op: a column after it.
  const int after =
      b.node("Relu", {b.node("Conv", {pool, b.constant("w5", random_tensor({8, 32, 1, 1}, 7))})});
  return b.finish({fc, after});
}

// The invariants every plan must hold, whatever the budget.
void expect_valid_plan(const graph::Graph& g, const plan::TilePlan& plan) {
  ASSERT_EQ(plan.column_of.size(), g.nodes.size());
  for (std::size_t ci = 0; ci < plan.columns.size(); ++ci) {
    const plan::Column& c = plan.columns[ci];
    // One op alone keeps nothing in cache: it runs whole.
    ASSERT_GE(c.ops.size(), 2u);
    // Consecutive nodes, all in this column: a column never crosses a node that runs whole.
    for (int n = c.ops.front().node; n <= c.ops.back().node; ++n) {
      EXPECT_EQ(plan.column_of[static_cast<std::size_t>(n)], static_cast<int>(ci))
          << "node " << g.nodes[static_cast<std::size_t>(n)].name;
    }
    EXPECT_EQ(c.ops.back().node - c.ops.front().node + 1, static_cast<int>(c.ops.size()));
    EXPECT_EQ(c.outputs.front(), c.ops.back().output) << "the anchor comes first";
    EXPECT_GE(c.tile_rows, 1);
    EXPECT_EQ(c.tiles_per_image, (c.ops.back().rows + c.tile_rows - 1) / c.tile_rows);
    ASSERT_EQ(c.rows.size(), static_cast<std::size_t>(c.tiles_per_image));
    for (std::size_t i = 0; i < c.ops.size(); ++i) {
      const plan::TileOp& op = c.ops[i];
      // Own rows of an output partition its rows; others own none.
      int64_t next = 0;
      for (std::size_t t = 0; t < c.rows.size(); ++t) {
        const RowRange own = c.own[t][i];
        if (!c.is_output(static_cast<int>(i))) {
          EXPECT_TRUE(own.empty());
          continue;
        }
        EXPECT_EQ(own.begin, next) << "op " << i << " tile " << t;
        next = std::max(next, own.end);
        if (!own.empty()) {
          EXPECT_LE(c.rows[t][i].begin, own.begin);
          EXPECT_GE(c.rows[t][i].end, own.end);
        }
      }
      if (c.is_output(static_cast<int>(i))) {
        EXPECT_EQ(next, op.rows) << "op " << i;
      }
      // Every input row an op reads on a tile is in its producer's tile rows.
      const graph::Node& node = g.nodes[static_cast<std::size_t>(op.node)];
      for (std::size_t j = 0; j < node.inputs.size(); ++j) {
        for (std::size_t k = 0; k < i; ++k) {
          if (c.ops[k].output != node.inputs[j]) continue;
          for (std::size_t t = 0; t < c.rows.size(); ++t) {
            const RowRange need = op.inputs[j].input_rows(c.rows[t][i]);
            if (need.empty()) continue;
            EXPECT_LE(c.rows[t][k].begin, need.begin) << "op " << i << " reads op " << k;
            EXPECT_GE(c.rows[t][k].end, need.end) << "op " << i << " reads op " << k;
          }
        }
      }
    }
    EXPECT_LE(c.working_set_bytes, c.arena_bytes + c.scratch_bytes + c.weight_bytes);
    EXPECT_GE(c.working_set_bytes, c.arena_bytes + c.scratch_bytes);
    EXPECT_GE(c.halo_overhead, 0.0);
    if (c.tier == plan::Tier::kL3) {
      EXPECT_FALSE(c.weights_streamed);
    }
  }
  for (std::size_t n = 0; n < g.nodes.size(); ++n) {
    if (plan.column_of[n] < 0) {
      EXPECT_FALSE(plan.why_whole[n].empty()) << g.nodes[n].name;
    }
  }
  EXPECT_LE(plan.depthwise_bytes, plan.layerwise_bytes);
  // Every byte layer by layer writes is either written depth-wise too or kept in a tier.
  EXPECT_EQ(plan.depthwise_bytes + plan.bytes_in_l2 + plan.bytes_in_l3, plan.layerwise_bytes);
}

// The budget a column of `tier` must fit under `options` (plan/tile_plan.h).
int64_t tier_budget(plan::Tier tier, const plan::PlanOptions& options) {
  if (tier == plan::Tier::kL2) return options.cache_budget_bytes;
  return static_cast<int64_t>(options.shared_cache_fraction *
                              static_cast<double>(options.shared_cache_bytes) / options.threads);
}

TEST(Partition, ColumnsNeverCrossWholeTensorOps) {
  const graph::Graph g = prepared(residual_cnn(), {2, 3, 32, 24});
  plan::PlanOptions options;
  options.cache_budget_bytes = 1 << 20;
  const plan::TilePlan plan = plan::plan_columns(g, options);
  expect_valid_plan(g, plan);
  for (std::size_t n = 0; n < g.nodes.size(); ++n) {
    const std::string& op = g.nodes[n].op_type;
    if (op == "GlobalAveragePool" || op == "Gemm" || op == "Flatten") {
      EXPECT_EQ(plan.column_of[n], -1) << op << " needs the whole tensor";
    }
    if ((op == "Conv" || op == "MaxPool") && n + 1 < g.nodes.size()) {
      EXPECT_GE(plan.column_of[n], 0) << g.nodes[n].name;
    }
  }
  // With a roomy budget everything from the stem to the pool (the residual block's skip
  // connection inside) forms one column; the conv after the GAP, alone, runs whole (at batch 2
  // its 8x6 images stack layer by layer).
  ASSERT_EQ(plan.columns.size(), 1u) << plan::describe_plan(g, plan);
  EXPECT_EQ(plan.why_whole.back(), "at batch 2, layer by layer stacks its whole 8x6 images");
  EXPECT_EQ(plan.columns[0].ops.front().node, 0);
  EXPECT_EQ(g.nodes[static_cast<std::size_t>(plan.columns[0].ops.back().node)].op_type, "MaxPool");
  EXPECT_LT(plan.depthwise_bytes, plan.layerwise_bytes);
  // The pooled map is read after the column (by the GAP and the last conv): its one output.
  EXPECT_EQ(plan.columns[0].outputs.size(), 1u);
  EXPECT_GT(plan.columns[0].bytes_in_cache, 0);
}

TEST(Partition, WorkingSetStaysUnderTheBudget) {
  const graph::Graph g = prepared(residual_cnn(), {2, 3, 32, 24});
  for (int64_t budget : {24 << 10, 48 << 10, 96 << 10, 256 << 10, 4 << 20}) {
    plan::PlanOptions options;
    options.cache_budget_bytes = budget;
    const plan::TilePlan plan = plan::plan_columns(g, options);
    expect_valid_plan(g, plan);
    for (const plan::Column& c : plan.columns) {
      EXPECT_LE(c.working_set_bytes, budget) << plan::describe_plan(g, plan);
      EXPECT_LE(c.halo_overhead, options.max_halo_overhead + 1e-9);
    }
  }
}

// Whatever the two caches, every column fits its own tier's budget and the plan is valid; a
// machine without a usable L3 (unknown, or no larger than L2) gets L2 columns only.
TEST(Partition, WorkingSetStaysUnderTheChosenTiersBudget) {
  const graph::Graph g = prepared(residual_cnn(), {2, 3, 32, 24});
  for (int threads : {1, 2}) {
    for (int64_t l2 : {24 << 10, 96 << 10, 512 << 10}) {
      for (int64_t l3 : {int64_t{0}, int64_t{256} << 10, int64_t{2} << 20, int64_t{32} << 20}) {
        plan::PlanOptions options;
        options.threads = threads;
        options.cache_budget_bytes = l2;
        options.shared_cache_bytes = l3;
        const plan::TilePlan plan = plan::plan_columns(g, options);
        expect_valid_plan(g, plan);
        const bool l3_tier = tier_budget(plan::Tier::kL3, options) > l2;
        for (const plan::Column& c : plan.columns) {
          EXPECT_EQ(c.budget_bytes, tier_budget(c.tier, options));
          EXPECT_LE(c.working_set_bytes, c.budget_bytes) << plan::describe_plan(g, plan);
          if (!l3_tier) {
            EXPECT_EQ(c.tier, plan::Tier::kL2) << plan::describe_plan(g, plan);
          }
        }
        if (!l3_tier) {
          EXPECT_EQ(plan.bytes_in_l3, 0);
        }
      }
    }
  }
}

// A stem and four residual blocks (3x3 conv + ReLU, 1x1 conv, Add + ReLU), then a global pool.
// Its weights have a `sparsity` fraction of zeros (pruned_tensor).
// `stem_channels` > 16: the stem widens to that many channels and a 1x1 convolution narrows
// them back, so that the stem's activation is larger than the blocks'.
graph::Graph residual_chain(double sparsity = 0.0, int64_t stem_channels = 16) {
  GraphBuilder b;
  int h = b.input("x", {-1, 16, 32, 24});
  h = b.node(
      "Relu",
      {b.node("Conv", {h, b.constant("w0", pruned_tensor({stem_channels, 16, 3, 3}, 1, sparsity))},
              {{"pads", kPad1}})});
  if (stem_channels != 16) {
    h = b.node("Conv", {h, b.constant("w0n", pruned_tensor({16, stem_channels, 1, 1}, 2, 0.0))});
  }
  for (uint32_t block = 0; block < 4; ++block) {
    const int c1 =
        b.node("Relu", {b.node("Conv",
                               {h, b.constant(fmt::format("w{}a", block),
                                              pruned_tensor({16, 16, 3, 3}, 10 + block, sparsity))},
                               {{"pads", kPad1}})});
    const int c2 =
        b.node("Conv", {c1, b.constant(fmt::format("w{}b", block),
                                       pruned_tensor({16, 16, 1, 1}, 20 + block, sparsity))});
    h = b.node("Relu", {b.node("Add", {c2, h})});
  }
  return b.finish({b.node("GlobalAveragePool", {h})});
}

// The tier choice on synthetic caches. A 64 KiB L2 holds the row tiles of about one block (a
// deeper column recomputes too many halo rows at the few rows that fit); a 1 MiB L3 holds
// whole images of the stem and all four blocks (each block two convs once the ReLUs and the Add
// are fused), so one L3 column covers them and only its last output goes to memory.
TEST(Partition, TierChoiceOnSyntheticCaches) {
  const graph::Graph g = prepared(residual_chain(), {16, 16, 32, 24});
  plan::PlanOptions l2_only;
  l2_only.cache_budget_bytes = 64 << 10;
  const plan::TilePlan shallow = plan::plan_columns(g, l2_only);
  expect_valid_plan(g, shallow);
  ASSERT_GT(shallow.columns.size(), 1u) << plan::describe_plan(g, shallow);
  for (const plan::Column& c : shallow.columns) EXPECT_EQ(c.tier, plan::Tier::kL2);

  plan::PlanOptions both = l2_only;
  both.shared_cache_bytes = 1 << 20;  // below the batch's 768 KiB activations x 2
  const plan::TilePlan deep = plan::plan_columns(g, both);
  expect_valid_plan(g, deep);
  ASSERT_EQ(deep.columns.size(), 1u) << plan::describe_plan(g, deep);
  const plan::Column& c = deep.columns[0];
  EXPECT_EQ(c.tier, plan::Tier::kL3);
  EXPECT_EQ(c.ops.size(), g.nodes.size() - 1) << "every node but the global pool";
  EXPECT_EQ(c.tile_rows, 32) << "whole images: no halo";
  EXPECT_EQ(c.halo_overhead, 0.0);
  EXPECT_EQ(c.outputs.size(), 1u);
  EXPECT_EQ(deep.depthwise_bytes, c.bytes_to_memory + 16 * 16 * 4) << "and the pooled output";
  EXPECT_LT(deep.depthwise_bytes, shallow.depthwise_bytes);
  EXPECT_GT(deep.bytes_in_l3, 0);
  EXPECT_EQ(deep.bytes_in_l2, 0);
  EXPECT_NE(plan::describe_plan(g, deep).find("column 0 (L3)"), std::string::npos);

  // An L3 share no larger than L2, none to fill (a budget the user set), or an L3 that holds
  // the batch's activations layer by layer already: no L3 tier.
  for (auto [bytes, fraction] :
       {std::pair{2 * l2_only.cache_budget_bytes, 0.5}, std::pair{int64_t{1} << 20, 0.0},
        std::pair{int64_t{64} << 20, 0.5}}) {
    both.shared_cache_bytes = bytes;
    both.shared_cache_fraction = fraction;
    const plan::TilePlan plan = plan::plan_columns(g, both);
    for (const plan::Column& col : plan.columns) EXPECT_EQ(col.tier, plan::Tier::kL2);
  }
}

// Where layer by layer keeps the activations in the L3, an L2 column of a dense 3x3 and 1x1
// convolution (80 FLOPs per byte it would keep in L2: the 3x3's output) is compute-bound and
// does not form: no column of more than 64 FLOPs per byte does. Pruned to 95% zeros (about 4
// FLOPs per byte) they form columns, and so does the dense one where no L3 is known, where the
// user's budget is the only tier, or at a forced tile height.
TEST(Partition, ComputeBoundColumnsRunWholeWhereTheL3HoldsTheActivations) {
  constexpr int64_t kL3 = 32 << 20;  // holds the 48 KiB activations of one image many times
  auto plan_for = [](double sparsity, int64_t l3, double l3_fraction, int64_t tile_rows) {
    const graph::Graph g = prepared(residual_chain(sparsity), {1, 16, 32, 24});
    plan::PlanOptions options;
    // Columns of about one block (see TierChoiceOnSyntheticCaches).
    options.cache_budget_bytes = 64 << 10;
    options.shared_cache_bytes = l3;
    options.shared_cache_fraction = l3_fraction;
    options.tile_rows = tile_rows;
    const plan::TilePlan plan = plan::plan_columns(g, options);
    expect_valid_plan(g, plan);
    return std::pair{g, plan};
  };
  const auto [g, dense] = plan_for(0.0, kL3, 0.5, 0);
  const auto bound = static_cast<std::size_t>(
      std::find_if(dense.why_whole.begin(), dense.why_whole.end(),
                   [](const std::string& why) {
                     return why.find("80 FLOPs per byte") != std::string::npos &&
                            why.find("compute-bound") != std::string::npos;
                   }) -
      dense.why_whole.begin());
  ASSERT_LT(bound, g.nodes.size()) << plan::describe_plan(g, dense);
  for (const plan::Column& c : dense.columns) {
    EXPECT_LE(c.flops_per_cached_byte(), 64.0) << plan::describe_plan(g, dense);
  }
  const auto [gs, sparse] = plan_for(0.95, kL3, 0.5, 0);
  ASSERT_FALSE(sparse.columns.empty()) << plan::describe_plan(gs, sparse);
  EXPECT_GE(sparse.column_of[bound], 0) << plan::describe_plan(gs, sparse);
  for (const plan::Column& c : sparse.columns) {
    EXPECT_LT(c.flops_per_cached_byte(), 8.0) << plan::describe_plan(gs, sparse);
  }
  for (const auto& [l3, fraction, rows] :
       {std::tuple{int64_t{0}, 0.5, int64_t{0}}, std::tuple{kL3, 0.0, int64_t{0}},
        std::tuple{kL3, 0.5, int64_t{4}}}) {
    const auto [gd, other] = plan_for(0.0, l3, fraction, rows);
    EXPECT_GE(other.column_of[bound], 0)
        << "L3 " << l3 << ", fraction " << fraction << ", tile rows " << rows << "\n"
        << plan::describe_plan(gd, other);
  }

  // Per column: a stem whose activation (192 KiB) spills a 128 KiB L3 share (two threads: no L3
  // tier) keeps its column, and does not keep the blocks' compute-bound columns (48 KiB
  // activations, which the share holds) from running whole.
  const graph::Graph wide = prepared(residual_chain(0.0, 64), {1, 16, 32, 24});
  plan::PlanOptions options;
  options.cache_budget_bytes = 64 << 10;
  options.shared_cache_bytes = 256 << 10;
  options.shared_cache_fraction = 0.5;
  options.threads = 2;
  const plan::TilePlan wide_plan = plan::plan_columns(wide, options);
  expect_valid_plan(wide, wide_plan);
  EXPECT_GE(wide_plan.column_of[0], 0) << "the stem's column stays\n"
                                       << plan::describe_plan(wide, wide_plan);
  EXPECT_NE(std::find_if(wide_plan.why_whole.begin(), wide_plan.why_whole.end(),
                         [](const std::string& why) {
                           return why.find("compute-bound") != std::string::npos;
                         }),
            wide_plan.why_whole.end())
      << plan::describe_plan(wide, wide_plan);
}

// A residual block of 90% pruned convolutions, `outer` channels in and out and `inner` in
// between: 1x1 (+ ReLU), 3x3 (+ ReLU), 1x1 (+ Add + ReLU). ResNet's bottleneck narrows (outer >
// inner), MobileNetV2's inverted residual widens (outer < inner).
graph::Graph pruned_block(int64_t outer, int64_t inner) {
  GraphBuilder b;
  const int x = b.input("x", {-1, outer, 32, 24});
  auto conv = [&](int in, int64_t out_c, int64_t in_c, int64_t k, uint32_t seed) {
    std::map<std::string, graph::AttrValue> attrs;
    if (k == 3) attrs["pads"] = kPad1;
    return b.node(
        "Conv",
        {in, b.constant(fmt::format("w{}", seed), pruned_tensor({out_c, in_c, k, k}, seed, 0.9))},
        attrs);
  };
  const int a = b.node("Relu", {conv(x, inner, outer, 1, 1)});
  const int m = b.node("Relu", {conv(a, inner, inner, 3, 2)});
  return b.finish({b.node("Relu", {b.node("Add", {conv(m, outer, inner, 1, 3), x})})});
}

// Where layer by layer keeps the activations in the L3, an L2 column of image rows forms only
// where it keeps at least twice the bytes it writes: a bottleneck block keeps its narrow
// intermediates (half what it writes) and runs whole, an inverted residual block keeps its wide
// ones (8x) in a column. With no L3 known the bottleneck forms its column too.
TEST(Partition, L2ColumnsThatKeepLittleRunWholeWhereTheL3HoldsTheActivations) {
  auto plan_for = [](int64_t outer, int64_t inner, int64_t l3) {
    const graph::Graph g = prepared(pruned_block(outer, inner), {1, outer, 32, 24});
    plan::PlanOptions options;
    options.cache_budget_bytes = 256 << 10;
    options.shared_cache_bytes = l3;
    const plan::TilePlan plan = plan::plan_columns(g, options);
    expect_valid_plan(g, plan);
    return std::pair{g, plan};
  };
  constexpr int64_t kL3 = 32 << 20;
  const auto [gb, bottleneck] = plan_for(64, 16, kL3);
  EXPECT_TRUE(bottleneck.columns.empty()) << plan::describe_plan(gb, bottleneck);
  EXPECT_NE(std::find_if(bottleneck.why_whole.begin(), bottleneck.why_whole.end(),
                         [](const std::string& why) {
                           return why.find("bytes in L2 per byte it writes") != std::string::npos;
                         }),
            bottleneck.why_whole.end())
      << plan::describe_plan(gb, bottleneck);

  const auto [gi, inverted] = plan_for(16, 64, kL3);
  ASSERT_FALSE(inverted.columns.empty()) << plan::describe_plan(gi, inverted);
  for (const plan::Column& c : inverted.columns) {
    EXPECT_GE(c.bytes_in_cache, 2 * c.bytes_to_memory) << plan::describe_plan(gi, inverted);
  }

  const auto [gu, unknown_l3] = plan_for(64, 16, 0);
  EXPECT_FALSE(unknown_l3.columns.empty()) << plan::describe_plan(gu, unknown_l3);
  for (const plan::Column& c : unknown_l3.columns) {
    EXPECT_LT(c.bytes_in_cache, 2 * c.bytes_to_memory) << plan::describe_plan(gu, unknown_l3);
  }
}

// Two inverted residual blocks (1x1 expansion 8 -> 48 + ReLU, 3x3 depthwise + ReLU, 1x1
// projection back to 8), the first with its residual Add, the second without (as MobileNetV2's
// blocks that change the stride or the width): the first block's end and the second's expansion
// are both single-output cuts, and the expansion writes 6x the bytes.
graph::Graph inverted_blocks() {
  GraphBuilder b;
  const int x = b.input("x", {-1, 8, 32, 24});
  uint32_t seed = 40;
  auto conv = [&](int in, int64_t out_c, int64_t in_c, int64_t k, int64_t groups) {
    std::map<std::string, graph::AttrValue> attrs;
    if (k == 3) attrs["pads"] = kPad1;
    if (groups > 1) attrs["group"] = groups;
    return b.node("Conv",
                  {in, b.constant(fmt::format("w{}", seed),
                                  random_tensor({out_c, in_c / groups, k, k}, seed++))},
                  attrs);
  };
  auto block = [&](int in) {
    const int expanded = b.node("Relu", {conv(in, 48, 8, 1, 1)});
    const int filtered = b.node("Relu", {conv(expanded, 48, 48, 3, 48)});
    return conv(filtered, 8, 48, 1, 1);
  };
  const int first = b.node("Add", {block(x), x});
  return b.finish({block(first)});
}

// A column that could end after the next block's expansion ends at the block's projection
// instead: the narrow value goes to memory, and the expansion starts the next column, which
// keeps its wide output in cache. Columns of at most 4 ops (the first block and the second's
// expansion) and a roomy budget with no L3 known, so that only the cut is weighed.
TEST(Partition, ColumnsEndBeforeAnExpansionWhereABlockEnds) {
  const graph::Graph g = prepared(inverted_blocks(), {1, 8, 32, 24});
  plan::PlanOptions options;
  options.cache_budget_bytes = 4 << 20;
  options.max_column_ops = 4;
  const plan::TilePlan plan = plan::plan_columns(g, options);
  expect_valid_plan(g, plan);
  ASSERT_EQ(plan.columns.size(), 2u) << plan::describe_plan(g, plan);
  const int64_t narrow = 8 * 32 * 24 * 4;
  for (const plan::Column& c : plan.columns) {
    EXPECT_EQ(c.ops.size(), 3u) << plan::describe_plan(g, plan);
    EXPECT_EQ(c.ops.back().channels, 8) << plan::describe_plan(g, plan);
    EXPECT_EQ(c.bytes_to_memory, narrow) << plan::describe_plan(g, plan);
  }
  EXPECT_EQ(plan.depthwise_bytes, 2 * narrow) << plan::describe_plan(g, plan);
}

// A Conv whose weight runs through the sparse kernels streams its packed non-zeros, not the
// dense weight, and needs no im2col (the zero-padded input rows only).
TEST(TileOps, SparseConvStreamsItsNonZerosAndNeedsNoIm2col) {
  GraphBuilder b;
  const int x = b.input("x", {-1, 32, 12, 10});
  Tensor w = random_tensor({32, 32, 3, 3}, 3);
  for (int64_t i = 0; i < w.numel(); ++i) {
    if (i % 10 != 0) w.data<float>()[i] = 0.0f;  // 90% zeros
  }
  const int y = b.node("Conv", {x, b.constant("w", w)}, {{"pads", kPad1}});
  const graph::Graph g = prepared(b.finish({y}), {1, 32, 12, 10});
  std::string why;
  const std::optional<plan::TileOp> sparse = plan::make_tile_op(g, 0, &why);
  const std::optional<plan::TileOp> dense = plan::make_tile_op(g, 0, &why, kernels::kAlwaysDense);
  ASSERT_TRUE(sparse && dense) << why;
  EXPECT_TRUE(sparse->sparse);
  EXPECT_FALSE(dense->sparse);
  const int64_t nnz = (w.numel() + 9) / 10;
  EXPECT_EQ(dense->weight_bytes, w.numel() * 4);
  EXPECT_EQ(sparse->weight_bytes, nnz * 8 + 33 * 4);
  // Per output row of 10 pixels x 32 channels: 32 x 9 multiply-adds each, only the non-zeros'
  // when sparse.
  EXPECT_EQ(dense->flops_per_row, 2 * 10 * 32 * 32 * 9);
  EXPECT_EQ(sparse->flops_per_row, 2 * 10 * nnz);
  // im2col: 32 channels x 9 taps per pixel; sparse: 32 padded input rows and 32 output rows,
  // each 12 wide.
  EXPECT_EQ(dense->scratch_bytes_per_row, 32 * 9 * 10 * 4);
  EXPECT_EQ(sparse->scratch_bytes_per_row, (32 + 32) * 12 * 4);
}

// Token sequences: a linear layer (a constant weight) and a layer norm or softmax over the
// features map each token to itself; a product of two activations and a transpose read every
// token, so they need the whole tensor.
TEST(TileOps, TokenOpsPassTokensThrough) {
  const graph::Graph g = prepared(token_net(), {2, 128, 24});
  int linear = 0;
  for (std::size_t n = 0; n < g.nodes.size(); ++n) {
    const graph::Node& node = g.nodes[n];
    std::string why;
    const std::optional<plan::TileOp> op = plan::make_tile_op(g, static_cast<int>(n), &why);
    const graph::Value& b =
        g.values[static_cast<std::size_t>(node.input(1) < 0 ? 0 : node.input(1))];
    if (node.op_type == "Transpose") {
      EXPECT_FALSE(op) << "its output's tokens are the input's features";
      continue;
    }
    if (node.op_type == "MatMul" && !b.constant) {
      EXPECT_FALSE(op) << node.name;
      EXPECT_NE(why.find("whole tensor"), std::string::npos) << why;
      continue;
    }
    ASSERT_TRUE(op) << node.name << ": " << why;
    EXPECT_TRUE(op->tokens);
    EXPECT_EQ(op->inputs[0].kind, RowMap::Kind::kSame) << node.name;
    EXPECT_EQ(op->batch, 2);
    EXPECT_EQ(op->channels, 1);
    EXPECT_EQ(op->rows, 128);
    if (node.op_type != "MatMul") continue;
    // The pruned layers stream their non-zeros (one K block: a row pointer per feature) and
    // transpose a block of tokens; the dense one streams its weight and packs the tile's tokens.
    const Tensor& w = *b.constant;
    const int64_t k = w.dim(0), features = w.dim(1);
    EXPECT_EQ(op->width, features);
    const int64_t nnz = w.numel() - std::count(w.data<float>(), w.data<float>() + w.numel(), 0.0f);
    if (++linear < 3) {
      EXPECT_TRUE(op->sparse) << node.name;
      EXPECT_EQ(op->weight_bytes, nnz * 8 + (features + 1) * 4);
      EXPECT_EQ(op->scratch_bytes_per_row, kernels::sparse_linear_scratch_floats(k) * 4);
      EXPECT_EQ(op->scratch_cap_bytes, op->scratch_bytes_per_row);
    } else {
      EXPECT_FALSE(op->sparse) << node.name;
      EXPECT_EQ(op->weight_bytes, k * features * 4);
      EXPECT_EQ(op->scratch_bytes_per_row, k * 4);
    }
  }
  EXPECT_EQ(linear, 3);
}

// A scalar constant (rank 0) against a sequence one feature wide: broadcast, read on no tile.
// (The per-feature test once read the last dimension of the scalar's empty shape.)
TEST(TileOps, ScalarOperandOfAOneFeatureSequence) {
  GraphBuilder b;
  const int x = b.input("x", {-1, 1});
  const int y = b.node("Relu", {b.node("Mul", {x, b.constant("two", scalar(2.0f))})});
  const graph::Graph g = prepared(b.finish({y}), {5, 1});
  std::string why;
  const std::optional<plan::TileOp> op = plan::make_tile_op(g, 0, &why);
  ASSERT_TRUE(op) << why;
  EXPECT_TRUE(op->tokens);
  EXPECT_EQ(op->width, 1);
  EXPECT_EQ(op->rows, 5);
  EXPECT_EQ(op->inputs[0].kind, RowMap::Kind::kSame);
  EXPECT_EQ(op->inputs[1].kind, RowMap::Kind::kNone);
}

// Two ops whose values are both read after them (the first is also a graph output) would keep
// nothing in cache as a column: they run whole, and the report says why.
TEST(Partition, ColumnsThatKeepNothingInCacheRunWhole) {
  GraphBuilder b;
  const int x = b.input("x", {-1, 64, 16});
  const int y = b.node("MatMul", {x, b.constant("w", random_tensor({16, 16}, 1))});
  const int z = b.node("Relu", {y});
  const graph::Graph g = prepared(b.finish({z, y}), {2, 64, 16});
  plan::PlanOptions options;
  options.cache_budget_bytes = 1 << 20;
  const plan::TilePlan plan = plan::plan_columns(g, options);
  EXPECT_TRUE(plan.columns.empty()) << plan::describe_plan(g, plan);
  EXPECT_EQ(plan.why_whole[0].rfind("its column would keep nothing in cache", 0), 0u)
      << plan.why_whole[0];
}

// The token ops form one column, ended by the product of two activations; the layer norm, read
// after it by the transpose, is one of its outputs. The FFN's hidden activation passes between
// its two sparse layers in feature blocks when every tile holds whole blocks of kSpmmTokenBlock
// tokens (the chosen whole-sequence tiles, 64-token tiles), never when a tile would cut one.
TEST(Partition, TokenColumnsPassTheFfnInFeatureBlocks) {
  const graph::Graph g = prepared(token_net(), {2, 128, 24});
  for (int64_t rows : {0, 7, 64}) {
    plan::PlanOptions options;
    options.cache_budget_bytes = 4 << 20;
    options.tile_rows = rows;
    const plan::TilePlan plan = plan::plan_columns(g, options);
    expect_valid_plan(g, plan);
    const std::string report = plan::describe_plan(g, plan);
    ASSERT_EQ(plan.columns.size(), 1u) << report;
    const plan::Column& c = plan.columns[0];
    ASSERT_EQ(c.ops.size(), 6u) << report;
    EXPECT_EQ(c.tile_rows, rows == 0 ? 128 : rows);
    EXPECT_EQ(c.outputs.size(), 2u) << "the softmax (anchor) and the layer norm";
    const bool whole_blocks = c.tile_rows % kernels::kSpmmTokenBlock == 0;
    for (std::size_t i = 0; i < c.ops.size(); ++i) {
      EXPECT_EQ(c.feature_blocks[i], i == 0 && whole_blocks) << "op " << i << ", " << rows;
    }
    EXPECT_EQ(report.find("passed on in feature blocks") != std::string::npos, whole_blocks);
    EXPECT_NE(report.find("tokens per tile"), std::string::npos) << report;
    for (std::size_t n = 0; n < g.nodes.size(); ++n) {
      if (g.nodes[n].op_type == "Transpose") {
        EXPECT_EQ(plan.column_of[n], -1);
      }
      if (g.nodes[n].op_type == "MatMul" && g.nodes[n].input(1) >= 0 &&
          !g.values[static_cast<std::size_t>(g.nodes[n].input(1))].constant) {
        EXPECT_EQ(plan.column_of[n], -1) << "a product of two activations";
      }
    }
  }
}

// The FFN's second sparse layer starts no column: whole, the two layers pass the hidden
// activation in feature blocks; a column of the second would read it token-major, transposing
// it per tile. Swept over budgets, including those where it alone (with what follows) fits.
TEST(Partition, TheFfnsSecondSparseLayerStartsNoColumn) {
  const graph::Graph g = prepared(token_net(512), {2, 128, 24});
  const std::vector<std::size_t> ffn = ffn_matmuls(g);
  ASSERT_EQ(ffn.size(), 2u);
  int refused = 0;
  for (int64_t budget : swept_budgets()) {
    const plan::TilePlan plan = plan_under_budget(g, budget);
    expect_valid_plan(g, plan);
    const int second = plan.column_of[ffn[1]];
    EXPECT_TRUE(second < 0 || second == plan.column_of[ffn[0]]) << "budget " << budget << "\n"
                                                                << plan::describe_plan(g, plan);
    refused += plan.why_whole[ffn[1]].find("feature blocks") != std::string::npos;
  }
  EXPECT_GT(refused, 0) << "no budget let the second layer start a column: rule not exercised";
}

TEST(Partition, ForcedTileRowsApplyToEveryColumn) {
  const graph::Graph g = prepared(residual_cnn(), {2, 3, 32, 24});
  for (int64_t rows : {1, 5, 1000}) {
    plan::PlanOptions options;
    options.tile_rows = rows;
    const plan::TilePlan plan = plan::plan_columns(g, options);
    expect_valid_plan(g, plan);
    for (const plan::Column& c : plan.columns) {
      EXPECT_EQ(c.tile_rows, std::min(rows, c.ops.back().rows));
    }
  }
}

// At batch 1 the planner cuts each image into enough tiles to feed every thread.
TEST(Partition, SmallBatchGetsTilesForEveryThread) {
  const graph::Graph g = prepared(residual_cnn(), {1, 3, 32, 24});
  plan::PlanOptions options;
  options.threads = 4;
  options.cache_budget_bytes = 64 << 20;
  const plan::TilePlan plan = plan::plan_columns(g, options);
  for (const plan::Column& c : plan.columns) {
    EXPECT_GE(c.tiles_per_image, std::min<int64_t>(8, c.ops.back().rows));
  }
}

// A few tiles must be shared evenly by the threads (one idle for a whole tile otherwise): at a
// small batch every column's tile count is a multiple of the threads or at least four per
// thread, under any budget; ops that cannot be tiled so run whole.
TEST(Partition, FewTilesAreSharedEvenlyByTheThreads) {
  for (const int64_t batch : {1, 2, 3}) {
    const graph::Graph g = prepared(residual_cnn(), {batch, 3, 32, 24});
    for (const int threads : {2, 3, 4}) {
      for (const int64_t budget : swept_budgets()) {
        const plan::TilePlan plan = plan_under_budget(g, budget, threads);
        expect_valid_plan(g, plan);
        for (const plan::Column& c : plan.columns) {
          const int64_t tiles = batch * c.tiles_per_image;
          EXPECT_TRUE(tiles >= 4 * threads || tiles % threads == 0)
              << tiles << " tiles on " << threads << " threads, budget " << budget << "\n"
              << plan::describe_plan(g, plan);
        }
      }
    }
  }
}

// A chosen tile height splits an image's rows evenly, into as many tiles as that height makes
// (heights differ by a row at most, the tallest being the column's tile_rows): with a short last
// tile, the thread that runs it at batch 1 has less work than the others. A forced height is
// kept, the last tile taking what is left.
TEST(Partition, ChosenTilesSplitTheRowsEvenlyAndForcedOnesKeepTheirHeight) {
  const graph::Graph g = prepared(residual_cnn(), {1, 3, 32, 24});
  int uneven = 0;  // chosen columns whose rows do not divide: the split is exercised
  for (const int64_t forced : {0, 5}) {
    for (const int threads : {2, 3}) {
      for (const int64_t budget : swept_budgets()) {
        const plan::TilePlan plan = plan_under_budget(g, budget, threads, forced);
        expect_valid_plan(g, plan);
        for (const plan::Column& c : plan.columns) {
          const int64_t rows = c.ops.back().rows;
          const std::string where = fmt::format("forced {}, {} threads, budget {}\n{}", forced,
                                                threads, budget, plan::describe_plan(g, plan));
          int64_t next = 0, shortest = rows, tallest = 0;
          for (std::size_t t = 0; t < c.rows.size(); ++t) {
            const RowRange anchor = c.rows[t].back();
            EXPECT_EQ(anchor.begin, next) << "tile " << t << ", " << where;
            next = anchor.end;
            shortest = std::min(shortest, anchor.size());
            tallest = std::max(tallest, anchor.size());
            if (forced > 0 && t + 1 < c.rows.size()) {
              EXPECT_EQ(anchor.size(), std::min(forced, rows)) << "tile " << t << ", " << where;
            }
          }
          EXPECT_EQ(next, rows) << where;
          EXPECT_EQ(tallest, c.tile_rows) << where;
          if (forced == 0) {
            EXPECT_LE(tallest - shortest, 1) << where;
            uneven += rows % c.tiles_per_image != 0;
          }
        }
      }
    }
  }
  EXPECT_GT(uneven, 0) << "no chosen column had rows its tiles do not divide: split not exercised";
}

// The graph's nodes from the first up to the first that cannot run on a tile, as tile ops.
std::vector<plan::TileOp> leading_tile_ops(const graph::Graph& g) {
  std::vector<plan::TileOp> ops;
  std::string why;
  for (int n = 0; n < static_cast<int>(g.nodes.size()); ++n) {
    const std::optional<plan::TileOp> op = plan::make_tile_op(g, n, &why);
    if (!op) break;
    ops.push_back(*op);
  }
  return ops;
}

// Rolling buffers (PlanOptions::rolling): a buffer that keeps rows for the next tile shares its
// bytes with no other buffer of the column, so the arena the working set counts is at least the
// halo recomputation's, where buffers share once their readers are done.
TEST(Partition, RollingBuffersThatKeepRowsShareNoBytes) {
  const graph::Graph g = prepared(residual_chain(), {1, 16, 32, 24});
  for (int64_t rows : {1, 3, 7}) {
    const std::vector<plan::TileOp> ops = leading_tile_ops(g);
    ASSERT_GE(ops.size(), 4u);
    const std::optional<plan::Column> halo = plan::layout_column(g, ops, rows, false);
    const std::optional<plan::Column> rolling = plan::layout_column(g, ops, rows, true);
    ASSERT_TRUE(halo && rolling);
    EXPECT_GE(rolling->arena_bytes, halo->arena_bytes);
    const plan::Column& c = *rolling;
    auto extent = [&](std::size_t k) {
      int64_t max_rows = 0;
      for (const auto& tile : c.rows) max_rows = std::max(max_rows, tile[k].size());
      return std::pair{c.buffer_offset[k], c.buffer_offset[k] + max_rows * c.ops[k].row_bytes()};
    };
    int keeping = 0;
    for (std::size_t k = 0; k + 1 < c.ops.size(); ++k) {
      bool kept = false;
      for (std::size_t t = 1; t < c.rows.size(); ++t) {
        kept = kept || !plan::kept_rows(c.rows[t - 1][k], c.rows[t][k]).empty();
      }
      if (!kept) continue;
      ++keeping;
      const auto [begin, end] = extent(k);
      EXPECT_LE(end, c.arena_bytes);
      for (std::size_t j = 0; j + 1 < c.ops.size(); ++j) {
        if (j == k) continue;
        const auto [b, e] = extent(j);
        EXPECT_TRUE(e <= begin || b >= end)
            << "buffer " << k << " keeps rows but shares bytes with " << j << " at " << rows;
      }
    }
    EXPECT_GT(keeping, 0) << "3x3 convs keep rows between tiles of " << rows;
  }
}

// A block's 1x1 convolution shares its residual's tile buffer (plan::share_residual_buffers)
// where its kernel may write over it and every tile computes the same rows of both: with whole-
// image tiles each block's 1x1 writes over the block's input, which the chain hands on from the
// stem's buffer; with row tiles the block inputs also hold the 3x3's halo rows, and nothing is
// shared. Shared or not, buffers live at the same time never share bytes.
TEST(Partition, ResidualBuffersAreSharedWhereEveryTileComputesTheSameRows) {
  const graph::Graph g = prepared(residual_chain(), {1, 16, 32, 24});
  const std::vector<plan::TileOp> ops = leading_tile_ops(g);
  ASSERT_EQ(ops.size(), 9u) << "the stem, then a 3x3 and a 1x1 + Add + Relu per block";
  const std::vector<bool> all(ops.size(), true);
  for (bool rolling : {false, true}) {
    std::optional<plan::Column> c = plan::layout_column(g, ops, 32, rolling);
    ASSERT_TRUE(c);
    const plan::Column before = *c;
    EXPECT_EQ(plan::share_residual_buffers(g, *c, std::vector<bool>(ops.size(), false)), 0);
    EXPECT_EQ(c->buffer_offset, before.buffer_offset);

    ASSERT_EQ(plan::share_residual_buffers(g, *c, all), 3) << "rolling " << rolling;
    EXPECT_EQ(c->written_over, (std::vector<int>{-1, -1, 0, -1, 0, -1, 0, -1, -1}));
    for (std::size_t i : {2, 4, 6}) EXPECT_EQ(c->buffer_offset[i], c->buffer_offset[0]);
    EXPECT_LT(c->arena_bytes, before.arena_bytes);
    EXPECT_EQ(before.working_set_bytes - c->working_set_bytes, before.arena_bytes - c->arena_bytes);
    const std::vector<plan::BufferRequest>& r = c->buffer_requests;
    for (std::size_t a = 0; a < r.size(); ++a) {
      EXPECT_LE(c->buffer_offset[a] + r[a].size, c->arena_bytes);
      for (std::size_t b = a + 1; b < r.size(); ++b) {
        if (r[a].size == 0 || r[b].size == 0 || !plan::lifetimes_overlap(r[a], r[b])) continue;
        EXPECT_TRUE(c->buffer_offset[a] + r[a].size <= c->buffer_offset[b] ||
                    c->buffer_offset[b] + r[b].size <= c->buffer_offset[a])
            << "buffers " << a << " and " << b << " are live at once and share bytes";
      }
    }
  }
  for (int64_t rows : {4, 7}) {
    std::optional<plan::Column> c = plan::layout_column(g, ops, rows, true);
    ASSERT_TRUE(c);
    EXPECT_EQ(plan::share_residual_buffers(g, *c, all), 0) << rows << "-row tiles";
    EXPECT_EQ(c->written_over, std::vector<int>(ops.size(), -1));
  }
}

// Where the threads would need tiles narrower than a kernel tile (64 pixels) to each get some
// at batch 1, the small planes run whole (each op split across the threads); a batch with an
// image per thread, or a tile height the user forces, tiles them.
TEST(Partition, SmallPlanesRunWholeWhenTheThreadsNeedNarrowTiles) {
  auto plan_at = [](int64_t batch, int64_t tile_rows) {
    const graph::Graph g = prepared(residual_cnn(), {batch, 3, 32, 24});
    plan::PlanOptions options;
    options.threads = 4;
    options.cache_budget_bytes = 64 << 20;
    options.tile_rows = tile_rows;
    const plan::TilePlan plan = plan::plan_columns(g, options);
    expect_valid_plan(g, plan);
    return std::pair{g, plan};
  };
  // Batch 1, 4 threads: 8 tiles per image. The 32x24 stem and block: 4-row tiles of 96 pixels;
  // the strided conv's 16x12 plane: 2-row tiles of 24 pixels, or 4-row tiles of 48 with one
  // tile per thread, too narrow either way; the pool's 8x6 plane too.
  const auto [g, small] = plan_at(1, 0);
  const auto pool = static_cast<std::size_t>(
      std::find_if(g.nodes.begin(), g.nodes.end(),
                   [](const graph::Node& n) { return n.op_type == "MaxPool"; }) -
      g.nodes.begin());
  ASSERT_EQ(g.nodes[pool - 1].op_type, "Conv");
  EXPECT_GE(small.column_of[0], 0) << plan::describe_plan(g, small);
  for (std::size_t n : {pool - 1, pool}) {
    EXPECT_EQ(small.column_of[n], -1) << plan::describe_plan(g, small);
    EXPECT_EQ(small.why_whole[n], "4 threads at batch 1 would need tiles under 64 pixels");
  }
  for (const plan::Column& c : small.columns) {
    EXPECT_GE(c.tile_rows * c.ops.back().width, 64) << plan::describe_plan(g, small);
  }
  // An image per thread: the strided conv is tiled again.
  const auto [g4, batch4] = plan_at(4, 0);
  EXPECT_GE(batch4.column_of[pool - 1], 0) << plan::describe_plan(g4, batch4);
  // A forced tile height is the user's call: no op runs whole for being narrow.
  const auto [g1, forced] = plan_at(1, 1);
  for (std::size_t n = 0; n < g1.nodes.size(); ++n) {
    EXPECT_EQ(forced.why_whole[n].find("pixels"), std::string::npos)
        << plan::describe_plan(g1, forced);
  }
}

// At a batch of several images, dense ops on planes of at most kStackedPlanePixels run whole
// (layer by layer stacks their images); sparse ones and a batch of one still form columns.
TEST(Partition, SmallDensePlanesRunWholeAtSeveralImages) {
  auto plan_at = [](int64_t batch, int threads, double sparse_threshold) {
    const graph::Graph g = prepared(small_plane_cnn(), {batch, 16, 8, 8});
    plan::PlanOptions options;
    options.threads = threads;
    options.cache_budget_bytes = 64 << 20;
    options.sparse_threshold = sparse_threshold;
    const plan::TilePlan plan = plan::plan_columns(g, options);
    expect_valid_plan(g, plan);
    return std::pair{g, plan};
  };
  const auto [g, dense] = plan_at(4, 2, kernels::kAlwaysDense);
  EXPECT_TRUE(dense.columns.empty()) << plan::describe_plan(g, dense);
  EXPECT_EQ(dense.why_whole[0], "at batch 4, layer by layer stacks its whole 8x8 images");
  // One image (on one thread, whose tiles are wide enough): columns.
  const auto [g1, one] = plan_at(1, 1, kernels::kAlwaysDense);
  EXPECT_FALSE(one.columns.empty()) << plan::describe_plan(g1, one);
  // Every weight through the sparse kernels: columns.
  const auto [gs, sparse] = plan_at(4, 2, 0.0);
  EXPECT_FALSE(sparse.columns.empty()) << plan::describe_plan(gs, sparse);
  // The last conv's weight is 90% zeros: with the default threshold it runs sparse, and the
  // column that ends on it holds the dense ones before it too.
  const auto [gd, mixed] = plan_at(4, 2, -1.0);
  ASSERT_EQ(mixed.columns.size(), 1u) << plan::describe_plan(gd, mixed);
  EXPECT_EQ(mixed.columns[0].ops.back().node, static_cast<int>(gd.nodes.size()) - 1);
}

// An intermediate read inside the column and again after it is written to memory by the tiles
// that own its rows.
TEST(Partition, IntermediateReadAfterTheColumnIsAnOutput) {
  GraphBuilder b;
  const int x = b.input("x", {-1, 2, 11, 7});
  const int a =
      b.node("Conv", {x, b.constant("w1", random_tensor({4, 2, 3, 3}, 1))}, {{"pads", kPad1}});
  const int c = b.node("Conv", {a, b.constant("w2", random_tensor({4, 4, 3, 3}, 2))},
                       {{"pads", kPad1}, {"strides", std::vector<int64_t>{2, 2}}});
  const int gap_a = b.node("GlobalAveragePool", {a});
  const graph::Graph g = prepared(b.finish({c, gap_a}), {1, 2, 11, 7});
  std::vector<plan::TileOp> ops;
  std::string why;
  for (int n : {0, 1}) {
    ops.push_back(*plan::make_tile_op(g, n, &why));
    ASSERT_EQ(g.nodes[static_cast<std::size_t>(n)].op_type, "Conv");
  }
  const std::optional<plan::Column> column = plan::layout_column(g, ops, 2);
  ASSERT_TRUE(column);
  plan::TilePlan plan;
  plan.columns = {*column};
  plan.column_of = {0, 0, -1};
  plan.why_whole = {"", "", "GAP"};
  expect_valid_plan(g, plan);
  EXPECT_EQ(column->outputs, (std::vector<int>{ops[1].output, ops[0].output}));
  EXPECT_TRUE(column->is_output(0));
  // Without a reader inside the column, the first conv alone cannot lead a two-op column.
  EXPECT_FALSE(plan::layout_column(g, {ops[1], ops[0]}, 2));
}

TEST(Partition, ReportNamesColumnsAndTheByteReduction) {
  const graph::Graph g = prepared(residual_cnn(), {2, 3, 32, 24});
  const std::string report = plan::describe_plan(g, plan::plan_columns(g, {}));
  EXPECT_NE(report.find("column 0 (L2):"), std::string::npos) << report;
  EXPECT_NE(report.find("halo overhead"), std::string::npos) << report;
  EXPECT_NE(report.find("layer by layer"), std::string::npos) << report;
  EXPECT_NE(report.find("whole   GlobalAveragePool"), std::string::npos) << report;
  // An L3 that holds the activations layer by layer: the report says the tier is off.
  plan::PlanOptions roomy;
  roomy.shared_cache_bytes = 64 << 20;
  const plan::TilePlan plan = plan::plan_columns(g, roomy);
  EXPECT_FALSE(plan.l3_tier);
  const std::string off = plan::describe_plan(g, plan);
  EXPECT_NE(off.find("no L3 tier (the activations fit half the 64.0 MiB L3 layer by layer)"),
            std::string::npos)
      << off;
}

}  // namespace
}  // namespace sparsecol::testing
