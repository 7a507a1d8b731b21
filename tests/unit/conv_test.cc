// The fast convolution (kernels/f32-conv, with f32-dwconv and f32-gemm underneath) against the
// naive reference convolution, over the layer shapes of ResNet-50 and MobileNetV2 and over
// randomized geometries (kernel, stride, padding, dilation, groups), fused epilogues, and
// output row ranges computed both into whole tensors and into tile buffers that hold only the
// rows a tile needs (the depth-wise schedule's case).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "../test_util.h"
#include "conv_oracle.h"
#include "f32-conv/conv.h"
#include "f32-conv/conv_transpose.h"
#include "f32-dwconv/dwconv.h"
#include "f32-gemm/gemm.h"
#include "f32-gemm/ukernels.h"
#include "f32-spmm/spmm.h"
#include "per_isa_test.h"
#include "reference/conv.h"
#include "scratch.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol::testing {
namespace {

using kernels::Activation;
using kernels::ConvGeometry;
using kernels::Epilogue;
using kernels::PlaneView;

std::vector<float> random_vector(std::size_t n, float scale, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A conv layer's data and its expected output (reference conv, then the epilogue in float).
struct Problem {
  ConvGeometry g;
  std::vector<float> src, weight, bias, residual, expected;
  Epilogue epilogue;
  bool has_residual = false;

  Problem(const ConvGeometry& geometry, const Epilogue& e, bool with_residual, std::mt19937& rng)
      : g(geometry), epilogue(e), has_residual(with_residual) {
    const int64_t depth = g.in_c / g.groups * g.kernel_h * g.kernel_w;
    src = random_vector(g.in_c * g.in_h * g.in_w, 1.0f, rng);
    weight = random_vector(g.out_c * depth, 1.0f / std::sqrt(static_cast<float>(depth)), rng);
    bias = random_vector(g.out_c, 0.5f, rng);
    residual = random_vector(g.out_c * g.out_h * g.out_w, 1.0f, rng);
    expected = expected_conv(g, src.data(), weight.data(), bias.data(),
                             has_residual ? residual.data() : nullptr, e);
  }
};

// Copies planes' rows [first, last) of a [channels x rows x width] tensor into a tile buffer.
std::vector<float> copy_rows(const std::vector<float>& t, int64_t channels, int64_t rows,
                             int64_t width, int64_t first, int64_t last) {
  std::vector<float> tile(channels * (last - first) * width);
  for (int64_t c = 0; c < channels; ++c) {
    std::copy_n(t.begin() + (c * rows + first) * width, (last - first) * width,
                tile.begin() + c * (last - first) * width);
  }
  return tile;
}

constexpr float kSentinel = -12345.0f;

// Computes rows [r0, r1) through whole-tensor views and through tile buffers, and checks both
// against the expectation; rows outside the range must be left untouched.
void check_rows(const kernels::PackedConv& conv, const Problem& p, int64_t r0, int64_t r1) {
  const ConvGeometry& g = p.g;
  const int64_t out_plane = g.out_h * g.out_w;
  std::vector<float> scratch;
  const float tol_scale =
      2e-5f * std::sqrt(static_cast<float>(g.in_c / g.groups * g.kernel_h * g.kernel_w)) + 1e-5f;
  auto expect_row_range = [&](const float* got, int64_t got_row0, int64_t plane_stride,
                              const char* how) {
    for (int64_t c = 0; c < g.out_c; ++c) {
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t x = 0; x < g.out_w; ++x) {
          const float want = p.expected[c * out_plane + r * g.out_w + x];
          const float have = got[c * plane_stride + (r - got_row0) * g.out_w + x];
          ASSERT_NEAR(have, want, tol_scale * (1.0f + std::abs(want)))
              << how << " rows [" << r0 << ", " << r1 << ") at c=" << c << " y=" << r << " x=" << x
              << " impl " << conv.implementation();
        }
      }
    }
  };

  // Whole tensors.
  std::vector<float> dst(p.expected.size(), kSentinel);
  const PlaneView src_view{const_cast<float*>(p.src.data()), 0, g.in_h * g.in_w};
  const PlaneView dst_view{dst.data(), 0, out_plane};
  const PlaneView res_view{const_cast<float*>(p.residual.data()), 0, out_plane};
  kernels::conv2d_rows(conv, src_view, dst_view, r0, r1, p.epilogue,
                       p.has_residual ? &res_view : nullptr, scratch);
  expect_row_range(dst.data(), 0, out_plane, "whole tensor");
  for (int64_t c = 0; c < g.out_c; ++c) {
    for (int64_t i = 0; i < out_plane; ++i) {
      const int64_t r = i / g.out_w;
      if (r >= r0 && r < r1) continue;
      ASSERT_EQ(dst[c * out_plane + i], kSentinel) << "wrote outside its rows at c=" << c;
    }
  }

  // Tile buffers holding only the needed rows, with row0 > 0 wherever the range allows.
  int64_t first = 0, last = 0;
  kernels::conv_input_rows(g, r0, r1, &first, &last);
  std::vector<float> src_tile = copy_rows(p.src, g.in_c, g.in_h, g.in_w, first, last);
  std::vector<float> res_tile = copy_rows(p.residual, g.out_c, g.out_h, g.out_w, r0, r1);
  std::vector<float> dst_tile(g.out_c * (r1 - r0) * g.out_w, kSentinel);
  const PlaneView src_tile_view{src_tile.data(), first, (last - first) * g.in_w};
  const PlaneView dst_tile_view{dst_tile.data(), r0, (r1 - r0) * g.out_w};
  const PlaneView res_tile_view{res_tile.data(), r0, (r1 - r0) * g.out_w};
  kernels::conv2d_rows(conv, src_tile_view, dst_tile_view, r0, r1, p.epilogue,
                       p.has_residual ? &res_tile_view : nullptr, scratch);
  expect_row_range(dst_tile.data(), r0, (r1 - r0) * g.out_w, "tile buffer");

  // Over the residual itself, where the implementation allows it: the same results, and the
  // residual's other rows as they were.
  if (!p.has_residual || !conv.may_overwrite_residual()) return;
  std::vector<float> over = p.residual;
  const PlaneView over_view{over.data(), 0, out_plane};
  kernels::conv2d_rows(conv, src_view, over_view, r0, r1, p.epilogue, &over_view, scratch);
  expect_row_range(over.data(), 0, out_plane, "over the residual");
  for (int64_t i = 0; i < static_cast<int64_t>(over.size()); ++i) {
    const int64_t r = i % out_plane / g.out_w;
    if (r < r0 || r >= r1) {
      ASSERT_EQ(over[i], p.residual[i]) << "changed the residual at " << i;
    }
  }
}

Epilogue random_epilogue(std::mt19937& rng, bool* with_residual) {
  const Activation acts[] = {Activation::kNone, Activation::kRelu, Activation::kClip,
                             Activation::kGelu};
  Epilogue e;
  e.pre_residual = acts[rng() % 4];
  e.post_residual = acts[rng() % 3];
  e.clip_min = 0.0f;
  e.clip_max = 6.0f;
  *with_residual = rng() % 2 == 0;
  return e;
}

// Row ranges that matter: all rows, the first row alone, the last row alone, and a random
// interior range.
std::vector<std::pair<int64_t, int64_t>> row_ranges(int64_t out_h, std::mt19937& rng) {
  std::vector<std::pair<int64_t, int64_t>> ranges = {{0, out_h}, {0, 1}, {out_h - 1, out_h}};
  const int64_t a = static_cast<int64_t>(rng() % out_h);
  const int64_t b = static_cast<int64_t>(rng() % out_h);
  ranges.emplace_back(std::min(a, b), std::max(a, b) + 1);
  return ranges;
}

class ModelConvTest : public ::testing::TestWithParam<ConvCase> {};

TEST_P(ModelConvTest, MatchesReferenceOnEveryRowRange) {
  std::mt19937 rng(42);
  const ConvGeometry g = make_geometry(GetParam());
  bool with_residual = false;
  for (int trial = 0; trial < 2; ++trial) {
    const Epilogue e = random_epilogue(rng, &with_residual);
    const Problem p(g, e, with_residual || trial == 0, rng);
    const kernels::PackedConv conv(g, p.weight.data(), p.bias.data());
    for (const auto& [r0, r1] : row_ranges(g.out_h, rng)) check_rows(conv, p, r0, r1);
  }
}

// Layer shapes from ResNet-50 and MobileNetV2 (channels cut where the full count only adds
// run time, spatial sizes kept small enough for the double-precision reference).
INSTANTIATE_TEST_SUITE_P(
    Models, ModelConvTest,
    ::testing::Values(ConvCase{"resnet_stem_7x7_s2_p3", 3, 64, 56, 56, 7, 2, 3, 1, 1},
                      ConvCase{"resnet_3x3_s1", 64, 64, 14, 14, 3, 1, 1, 1, 1},
                      ConvCase{"resnet_3x3_s2", 64, 64, 28, 28, 3, 2, 1, 1, 1},
                      ConvCase{"resnet_1x1_s1_reduce", 256, 64, 14, 14, 1, 1, 0, 1, 1},
                      ConvCase{"resnet_1x1_s1_expand", 64, 256, 7, 7, 1, 1, 0, 1, 1},
                      ConvCase{"resnet_1x1_s2_downsample", 128, 256, 14, 14, 1, 2, 0, 1, 1},
                      ConvCase{"mobilenet_dw_3x3_s1", 32, 32, 28, 28, 3, 1, 1, 1, 32},
                      ConvCase{"mobilenet_dw_3x3_s2", 96, 96, 28, 28, 3, 2, 1, 1, 96},
                      ConvCase{"mobilenet_dw_3x3_s1_7x7", 64, 64, 7, 7, 3, 1, 1, 1, 64},
                      ConvCase{"mobilenet_dw_3x3_s2_wide", 16, 16, 112, 112, 3, 2, 1, 1, 16},
                      ConvCase{"mobilenet_stem_3x3_s2", 3, 32, 32, 32, 3, 2, 1, 1, 1},
                      ConvCase{"mobilenet_project_1x1", 96, 24, 28, 28, 1, 1, 0, 1, 1}),
    [](const ::testing::TestParamInfo<ConvCase>& info) { return info.param.name; });

TEST(ConvTest, RandomGeometriesMatchReference) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 150; ++trial) {
    ConvCase c;
    c.kernel = 1 + static_cast<int64_t>(rng() % 5);
    c.stride = 1 + static_cast<int64_t>(rng() % 3);
    c.dilation = 1 + static_cast<int64_t>(rng() % 2);
    c.pad = static_cast<int64_t>(rng() % (c.kernel + 1));
    const int64_t kinds = rng() % 3;  // dense, grouped, depthwise
    c.groups = kinds == 0 ? 1 : 1 + static_cast<int64_t>(rng() % 4);
    c.in_c = c.groups * (1 + static_cast<int64_t>(rng() % 6));
    c.out_c = kinds == 2 ? c.in_c : c.groups * (1 + static_cast<int64_t>(rng() % 6));
    if (kinds == 2) c.groups = c.in_c;
    const int64_t span = c.dilation * (c.kernel - 1) + 1;
    c.in_h = std::max<int64_t>(span - 2 * c.pad, 1) + static_cast<int64_t>(rng() % 20);
    c.in_w = std::max<int64_t>(span - 2 * c.pad, 1) + static_cast<int64_t>(rng() % 40);
    const ConvGeometry g = make_geometry(c);
    SCOPED_TRACE(fmt::format("trial {}: c {}->{} {}x{} k{} s{} p{} d{} groups {}", trial, c.in_c,
                             c.out_c, c.in_h, c.in_w, c.kernel, c.stride, c.pad, c.dilation,
                             c.groups));
    bool with_residual = false;
    const Epilogue e = random_epilogue(rng, &with_residual);
    const Problem p(g, e, with_residual, rng);
    const kernels::PackedConv conv(g, p.weight.data(), p.bias.data());
    for (const auto& [r0, r1] : row_ranges(g.out_h, rng)) {
      check_rows(conv, p, r0, r1);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(ConvTest, PicksImplementationByGeometry) {
  std::vector<float> w(64 * 64 * 9, 0.1f);
  auto impl = [&](const ConvCase& c) {
    return kernels::PackedConv(make_geometry(c), w.data(), nullptr).implementation();
  };
  EXPECT_EQ(impl({"", 64, 64, 8, 8, 1, 1, 0, 1, 1}).rfind("gemm-1x1/", 0), 0u);
  EXPECT_EQ(impl({"", 64, 64, 8, 8, 1, 2, 0, 1, 1}).rfind("gemm-1x1-gathered/", 0), 0u);
  EXPECT_EQ(impl({"", 64, 64, 8, 8, 1, 2, 1, 1, 1}).rfind("implicit-gemm-1x1/", 0), 0u);  // pad
  EXPECT_EQ(impl({"", 64, 64, 8, 8, 3, 1, 1, 1, 1}).rfind("implicit-gemm-3x3/", 0), 0u);
  EXPECT_EQ(impl({"", 64, 64, 8, 8, 3, 2, 1, 1, 1}).rfind("implicit-gemm-3x3/", 0), 0u);
  EXPECT_EQ(impl({"", 64, 64, 8, 8, 3, 1, 0, 1, 1}).rfind("im2col-gemm-3x3/", 0), 0u);  // narrower
  EXPECT_EQ(impl({"", 64, 64, 9, 9, 3, 2, 0, 1, 1}).rfind("im2col-gemm-3x3/", 0), 0u);  // 5 > 4
  EXPECT_EQ(impl({"", 64, 64, 8, 8, 3, 1, 1, 1, 2}).rfind("im2col-gemm-3x3/", 0), 0u);  // grouped
  EXPECT_EQ(impl({"", 3, 64, 8, 8, 3, 1, 1, 1, 1}).rfind("phase-gemm-3x3/", 0), 0u);    // 3 in
  EXPECT_EQ(impl({"", 8, 16, 8, 8, 3, 2, 1, 1, 2}).rfind("phase-gemm-3x3/", 0), 0u);
  EXPECT_EQ(impl({"", 64, 64, 8, 8, 3, 1, 1, 1, 64}).rfind("depthwise-3x3/", 0), 0u);
}

// Writing over the residual is claimed where one pass writes each output after reading its
// residual element, and nowhere else (check_rows tests every claim on every shape it runs).
TEST(ConvTest, MayOverwriteTheResidualOnlyWhereEachOutputIsWrittenOnce) {
  auto may = [](const ConvCase& c, double sparsity, double threshold,
                kernels::Isa isa = kernels::active_isa()) {
    const ConvGeometry g = make_geometry(c);
    std::mt19937 rng(5);
    std::vector<float> w = random_vector(g.out_c * g.in_c / g.groups * c.kernel * c.kernel, 1, rng);
    for (std::size_t i = 0; i < w.size(); ++i) {
      if (static_cast<double>(i % 100) < 100 * sparsity) w[i] = 0.0f;
    }
    return kernels::PackedConv(g, w.data(), nullptr, threshold, isa).may_overwrite_residual();
  };
  EXPECT_TRUE(may({"", 64, 32, 8, 8, 1, 1, 0, 1, 1}, 0.0, kernels::kAlwaysDense));
  EXPECT_FALSE(may({"", 4096, 16, 4, 4, 1, 1, 0, 1, 1}, 0.0, kernels::kAlwaysDense));  // K blocks
  EXPECT_FALSE(may({"", 64, 32, 8, 8, 3, 1, 1, 1, 1}, 0.0, kernels::kAlwaysDense));
  EXPECT_TRUE(may({"", 64, 32, 8, 8, 1, 1, 0, 1, 1}, 0.9, 0.5));
  EXPECT_TRUE(may({"", 64, 32, 8, 8, 3, 1, 1, 1, 1}, 0.9, 0.5));  // phase planes, scratch
  // A sparse 1x1 layer in K-blocks of channels writes its output once per block; its generated
  // code (AVX-512, spmm_jit.h) runs it in one.
  const bool jit = kernels::active_isa() == kernels::Isa::kAvx512;
  EXPECT_EQ(may({"", 2048, 16, 8, 8, 1, 1, 0, 1, 1}, 0.5, 0.4), jit);
  // Without that code, layers like ResNet-50's 256 -> 1024 at 90% (conv.cc, pack_sparse): a
  // block holds as many channels as the L1 budget (max(L1 / 2, L1 - 16 KiB) of B) holds of a
  // kernel's tile of pixels, and at least the 240 that keep the 24 non-zeros a row the blocks
  // need. Where the 240 are more than the L1 budget holds anyway and the whole tile of B
  // (channels x tile floats) fits a quarter of L2, the layer takes one block. On a 32 KiB L1 and
  // AVX2's tile of 64 pixels: 64 channels fit, so 256 channels and 1024 channels (on a 1 MiB L2)
  // take one block; on a 48 KiB L1 and the portable tile of 32 pixels 256 fit: 256 channels in
  // one block, 1024 in four.
  const kernels::CoreCaches& caches = kernels::core_caches();
  const int64_t l1_budget_floats = std::max(caches.l1d / 2, caches.l1d - 16 * 1024) / 4;
  auto one_block = [&](int64_t channels, int64_t tile) {
    const int64_t fit = l1_budget_floats / tile;
    return channels <= std::max<int64_t>(240, fit) ||
           (fit < 240 && caches.l2 / 4 >= channels * tile * 4);
  };
  for (const kernels::Isa isa : {kernels::Isa::kPortable, kernels::Isa::kAvx2}) {
    if (!kernels::isa_available(isa)) continue;
    SCOPED_TRACE(to_string(isa));
    const int64_t tile = kernels::default_spmm_ukernel(isa).tile;
    EXPECT_FALSE(may({"", 2048, 16, 8, 8, 1, 1, 0, 1, 1}, 0.5, 0.4, isa));
    EXPECT_EQ(may({"", 256, 64, 16, 16, 1, 1, 0, 1, 1}, 0.9, 0.5, isa), one_block(256, tile));
    EXPECT_EQ(may({"", 1024, 64, 16, 16, 1, 1, 0, 1, 1}, 0.9, 0.5, isa), one_block(1024, tile));
    // On 14x14 planes the same layers sum their input in halves (conv.h,
    // kInputHalvesMaxPixels): the sums into scratch, then one pass over the output.
    EXPECT_TRUE(may({"", 1024, 64, 14, 14, 1, 1, 0, 1, 1}, 0.9, 0.5, isa));
  }
  const int64_t tile = kernels::default_spmm_ukernel(kernels::active_isa()).tile;
  EXPECT_EQ(may({"", 1024, 64, 16, 16, 1, 1, 0, 1, 1}, 0.9, 0.5), jit || one_block(1024, tile));
}

TEST(ConvTest, RefusesInvalidGeometry) {
  std::vector<float> w(64, 0.1f);
  ConvGeometry g = make_geometry({"", 6, 4, 8, 8, 1, 1, 0, 1, 4});  // 6 channels, 4 groups
  EXPECT_THROW(kernels::PackedConv(g, w.data(), nullptr), Error);
  g = make_geometry({"", 4, 4, 8, 8, 1, 1, 0, 1, 1});
  g.stride_h = 0;
  EXPECT_THROW(kernels::PackedConv(g, w.data(), nullptr), Error);
}

TEST(ConvTest, InputRowsFollowTheTileAlgebra) {
  const ConvGeometry g = make_geometry({"", 1, 1, 20, 20, 3, 2, 1, 1, 1});  // out 10 rows
  int64_t first = 0, last = 0;
  kernels::conv_input_rows(g, 0, 1, &first, &last);  // rows -1..1, clamped
  EXPECT_EQ(first, 0);
  EXPECT_EQ(last, 2);
  kernels::conv_input_rows(g, 3, 5, &first, &last);  // rows 5..9
  EXPECT_EQ(first, 5);
  EXPECT_EQ(last, 10);
  kernels::conv_input_rows(g, 9, 10, &first, &last);  // rows 17..19
  EXPECT_EQ(first, 17);
  EXPECT_EQ(last, 20);
}

// The im2col chunk: never under 64 pixels (unless the image is smaller), never past the image
// or twice the budget's rows, and a whole number of the GEMM's strips where the budget's choice
// left a mostly empty last strip (ResNet-50's 3x3 layer at 28x28: 3 rows = 84 pixels, 5 strips
// and 4 columns of 16; at 8 columns per strip, 10 strips and 4).
TEST(ConvTest, Im2colChunksFillTheGemmStrips) {
  for (const ConvCase& c :
       {ConvCase{"", 128, 128, 28, 28, 3, 1, 1, 1, 1},
        ConvCase{"", 256, 256, 14, 14, 3, 1, 1, 1, 1}, ConvCase{"", 64, 64, 56, 56, 3, 1, 1, 1, 1},
        ConvCase{"", 512, 512, 7, 7, 3, 1, 1, 1, 1}, ConvCase{"", 3, 64, 224, 224, 7, 2, 3, 1, 1},
        ConvCase{"", 256, 512, 56, 56, 1, 2, 0, 1, 1}, ConvCase{"", 8, 8, 5, 9, 3, 1, 1, 1, 2}}) {
    const ConvGeometry g = make_geometry(c);
    const int64_t depth = g.in_c / g.groups * g.kernel_h * g.kernel_w;
    const int64_t least = std::min(g.out_h, (64 + g.out_w - 1) / g.out_w);
    const int64_t budget =
        std::clamp(kernels::kIm2colBudgetFloats / (depth * g.out_w), least, g.out_h);
    for (const kernels::Isa isa : {kernels::Isa::kPortable, kernels::Isa::kAvx2}) {
      const int64_t rows = kernels::im2col_chunk_rows(g, isa);
      EXPECT_GE(rows, least) << c.in_c << "x" << g.out_w;
      EXPECT_LE(rows, std::min(g.out_h, 2 * budget)) << c.in_c << "x" << g.out_w;
    }
  }
  const ConvGeometry layer2 = make_geometry({"", 128, 128, 28, 28, 3, 1, 1, 1, 1});
  for (const kernels::Isa isa : {kernels::Isa::kPortable, kernels::Isa::kAvx2}) {
    const int64_t width = kernels::gemm_strip_width(isa);
    EXPECT_EQ(kernels::im2col_chunk_rows(layer2, isa) * layer2.out_w % width, 0)
        << to_string(isa) << ", strips of " << width;
  }
}

// A uniformly drawn integer in [lo, hi].
int64_t draw_between(std::mt19937& rng, int64_t lo, int64_t hi) {
  return lo + static_cast<int64_t>(rng() % (hi - lo + 1));
}

// A random output row range [r0, r1) of p's geometry, read from a tile buffer holding exactly its
// input rows (so that a read past them is an ASan error) and written into a whole tensor of
// sentinels, which check() compares with the expectation inside the range and with the
// sentinel outside it.
struct RandomRows {
  int64_t r0 = 0, r1 = 0;
  std::vector<float> src_tile, got;
  PlaneView src, dst, residual;

  RandomRows(const Problem& p, std::mt19937& rng) {
    const ConvGeometry& g = p.g;
    const int64_t a = static_cast<int64_t>(rng() % g.out_h),
                  b = static_cast<int64_t>(rng() % g.out_h);
    r0 = std::min(a, b);
    r1 = std::max(a, b) + 1;
    int64_t first = 0, last = 0;
    kernels::conv_input_rows(g, r0, r1, &first, &last);
    src_tile = copy_rows(p.src, g.in_c, g.in_h, g.in_w, first, last);
    got.assign(p.expected.size(), kSentinel);
    src = {src_tile.data(), first, (last - first) * g.in_w};
    dst = {got.data(), 0, g.out_h * g.out_w};
    residual = {const_cast<float*>(p.residual.data()), 0, g.out_h * g.out_w};
  }
  const PlaneView* residual_or_null(const Problem& p) const {
    return p.has_residual ? &residual : nullptr;
  }
  void check(const Problem& p, float tol) const {
    for (std::size_t i = 0; i < p.expected.size(); ++i) {
      const int64_t r = static_cast<int64_t>(i) % (p.g.out_h * p.g.out_w) / p.g.out_w;
      if (r < r0 || r >= r1) {
        ASSERT_EQ(got[i], kSentinel) << "wrote outside rows [" << r0 << ", " << r1 << ") at " << i;
      } else {
        ASSERT_NEAR(got[i], p.expected[i], tol * (1.0f + std::abs(p.expected[i]))) << i;
      }
    }
  }
};

// Dense layers of one kind ("implicit-gemm", "phase-gemm" or "gemm-1x1-gathered") on one ISA
// tier, over random geometries: kernel sizes and dilations per axis (1x1 only for the gathered
// kind, always strided), strides up to 3 per axis, paddings drawn apart on every side (the left
// one anywhere in the taps' width), widths around the micro-kernels' strips (8 to 64 columns);
// the channels and groups come from `set_channels`. A random row range is read from a tile
// buffer holding exactly its input rows (a read past them is an ASan error on the portable
// tier) and written into a whole tensor whose other rows must stay untouched. The implicit GEMM
// takes stride phases only where no phase row is wider than an output row, so `phase_rows_fit`
// draws until that holds, and a strided 1x1 layer without padding is gathered, so it draws
// again there.
void expect_random_dense_convs_match(
    kernels::Isa isa, const char* kind, bool phase_rows_fit, int trials, std::mt19937& rng,
    const std::function<void(ConvGeometry&, int trial)>& set_channels) {
  auto draw = [&](int64_t lo, int64_t hi) { return draw_between(rng, lo, hi); };
  const bool gathered = std::string_view(kind) == "gemm-1x1-gathered";
  for (int trial = 0; trial < trials; ++trial) {
    ConvGeometry g;
    set_channels(g, trial);
    const bool strided = gathered || trial % 2 == 1;
    int64_t pad_bottom = 0;
    do {
      g.kernel_h = gathered ? 1 : draw(1, 5);
      g.kernel_w = gathered ? 1 : g.kernel_h == 1 && !strided ? draw(2, 5) : draw(1, 5);
      g.stride_h = strided ? draw(1, 3) : 1;
      g.stride_w = strided ? (g.stride_h == 1 ? draw(2, 3) : draw(1, 3)) : 1;
      g.dilation_h = draw(1, 2);
      g.dilation_w = draw(1, 2);
      const int64_t span_h = (g.kernel_h - 1) * g.dilation_h + 1;
      const int64_t span_w = (g.kernel_w - 1) * g.dilation_w + 1;
      g.pad_top = draw(0, span_h - 1);
      g.pad_left = draw(0, span_w - 1);
      pad_bottom = draw(0, span_h - 1);
      const int64_t pad_right = strided ? draw(0, span_w - 1) : span_w - 1 - g.pad_left;
      g.in_h = std::max<int64_t>(span_h - g.pad_top - pad_bottom, 1) + draw(0, 12);
      g.in_w = std::max<int64_t>(span_w - g.pad_left - pad_right, 1) + draw(0, 70);
      g.out_h = (g.in_h + g.pad_top + pad_bottom - span_h) / g.stride_h + 1;
      g.out_w = (g.in_w + g.pad_left + pad_right - span_w) / g.stride_w + 1;
    } while ((phase_rows_fit && strided && (g.in_w + g.stride_w - 1) / g.stride_w > g.out_w) ||
             (!gathered && kernels::gathers_strided_pointwise(g)));
    SCOPED_TRACE(
        fmt::format("trial {}: c {}->{} groups {} {}x{} k{}x{} s{}x{} d{}x{} pads top {} left {} "
                    "bottom {} -> {}x{}",
                    trial, g.in_c, g.out_c, g.groups, g.in_h, g.in_w, g.kernel_h, g.kernel_w,
                    g.stride_h, g.stride_w, g.dilation_h, g.dilation_w, g.pad_top, g.pad_left,
                    pad_bottom, g.out_h, g.out_w));
    bool with_residual = false;
    const Epilogue e = random_epilogue(rng, &with_residual);
    const Problem p(g, e, with_residual, rng);
    const kernels::PackedConv conv(g, p.weight.data(), p.bias.data(), kernels::kAlwaysDense, isa);
    ASSERT_EQ(conv.implementation(),
              gathered ? fmt::format("{}/{}", kind, to_string(isa))
                       : fmt::format("{}-{}x{}/{}", kind, g.kernel_h, g.kernel_w, to_string(isa)));
    RandomRows rows(p, rng);
    std::vector<float> scratch;
    kernels::conv2d_rows(conv, rows.src, rows.dst, rows.r0, rows.r1, e, rows.residual_or_null(p),
                         scratch);
    rows.check(
        p,
        2e-5f * std::sqrt(static_cast<float>(g.in_c / g.groups * g.kernel_h * g.kernel_w)) + 1e-5f);
  }
}

using DenseConvIsaTest = PerIsaTest;

// Channel counts from 16 on, some past one block of L1.
TEST_P(DenseConvIsaTest, ImplicitGemmMatchesReferenceOnRandomGeometries) {
  std::mt19937 rng(53);
  expect_random_dense_convs_match(
      GetParam(), "implicit-gemm", true, 80, rng, [&](ConvGeometry& g, int trial) {
        g.in_c = draw_between(rng, trial % 10 == 0 ? 90 : 16, trial % 10 == 0 ? 200 : 40);
        g.out_c = draw_between(rng, 1, 20);
      });
}

// Under 16 input channels (stems), 1 to 3 groups, output channels around the micro-kernels
// panels.
TEST_P(DenseConvIsaTest, PhaseGemmMatchesReferenceOnRandomGeometries) {
  std::mt19937 rng(54);
  expect_random_dense_convs_match(
      GetParam(), "phase-gemm", false, 80, rng, [&](ConvGeometry& g, int) {
        g.groups = draw_between(rng, 1, 3);
        g.in_c = g.groups * draw_between(rng, 1, 15 / g.groups);
        g.out_c = g.groups * draw_between(rng, 2, 40 / g.groups);  // never depthwise
      });
}

// Strided 1x1 layers, 1 to 3 groups, channels past one GEMM panel and short of one.
TEST_P(DenseConvIsaTest, GatheredGemm1x1MatchesReferenceOnRandomGeometries) {
  std::mt19937 rng(55);
  expect_random_dense_convs_match(GetParam(), "gemm-1x1-gathered", false, 60, rng,
                                  [&](ConvGeometry& g, int) {
                                    g.groups = draw_between(rng, 1, 3);
                                    g.in_c = g.groups * draw_between(rng, 1, 40);
                                    g.out_c = g.groups * draw_between(rng, 1, 30);
                                  });
}

SPARSECOL_EVERY_ISA(DenseConvIsaTest);

// conv2d_images on each ISA tier: whole images of small planes stacked into one product (1x1
// layers dense and 90% sparse; dense implicit GEMMs, stride 1 and over stride phases, whose taps
// reach past an image's top and bottom rows, i.e. into the next image of the stack unless
// masked; input rows exactly stride_h per output row, as stacking needs), for a random range of
// output channels, must give the bits that conv2d_region gives image by image, match the
// reference, and leave the other channels untouched.
using StackedConvIsaTest = PerIsaTest;

TEST_P(StackedConvIsaTest, StackedImagesMatchImageByImageBitForBit) {
  const kernels::Isa isa = GetParam();
  std::mt19937 rng(71);
  auto draw = [&](int64_t lo, int64_t hi) { return draw_between(rng, lo, hi); };
  for (int trial = 0; trial < 80; ++trial) {
    const int kind = trial % 4;  // 0: 1x1 dense, 1: 1x1 sparse, 2: KxK dense, 3: strided dense
    ConvGeometry g;
    // The first trial of each kind: more stacked output than one chunk (1100 channels of 5
    // images of 64 pixels, kStackChunkFloats in conv.cc).
    const bool chunks = trial < 4;
    g.in_c = chunks ? 16 : draw(16, 48);
    g.out_c = chunks ? 1100 : draw(1, 40);
    g.out_h = chunks ? 8 : draw(1, 8);
    g.out_w = chunks ? 8 : draw(1, 8);
    if (kind == 2) {
      g.kernel_h = draw(2, 5);
      g.kernel_w = draw(1, 5);
      g.dilation_h = draw(1, 2);
      g.pad_top = draw(0, (g.kernel_h - 1) * g.dilation_h);  // and as much less at the bottom
      g.pad_left = draw(0, g.kernel_w - 1);                  // likewise on the right
    } else if (kind == 3) {
      g.stride_h = draw(2, 3);
      g.stride_w = draw(1, 3);
      g.kernel_h = draw(1, 4);
      g.kernel_w = draw(1, 4);
      g.pad_top = draw(0, g.kernel_h - 1);  // the bottom's follows from out_h
      g.pad_left = draw(0, g.kernel_w - 1);
    }
    g.in_h = g.out_h * g.stride_h;
    // Phase rows no wider than an output row (the implicit GEMM's condition for phases).
    g.in_w = std::max<int64_t>(1, g.out_w * g.stride_w - draw(0, g.stride_w - 1));
    const int64_t images = chunks ? 5 : draw(1, 5);
    SCOPED_TRACE(
        fmt::format("trial {}: {} images, c {}->{} {}x{} k{}x{} s{}x{} d{} pads top {} left {} "
                    "-> {}x{}",
                    trial, images, g.in_c, g.out_c, g.in_h, g.in_w, g.kernel_h, g.kernel_w,
                    g.stride_h, g.stride_w, g.dilation_h, g.pad_top, g.pad_left, g.out_h, g.out_w));
    const int64_t depth = g.in_c * g.kernel_h * g.kernel_w;
    const int64_t in_image = g.in_c * g.in_h * g.in_w, out_image = g.out_c * g.out_h * g.out_w;
    std::vector<float> weight =
        random_vector(g.out_c * depth, 1.0f / std::sqrt(static_cast<float>(depth)), rng);
    if (kind == 1) {
      for (float& w : weight) w = rng() % 10 == 0 ? w : 0.0f;
    }
    const std::vector<float> bias = random_vector(g.out_c, 0.5f, rng);
    const std::vector<float> src = random_vector(images * in_image, 1.0f, rng);
    const std::vector<float> residual = random_vector(images * out_image, 1.0f, rng);
    bool with_residual = false;
    const Epilogue e = random_epilogue(rng, &with_residual);
    const kernels::PackedConv conv(g, weight.data(), bias.data(),
                                   kind == 1 ? -1.0 : kernels::kAlwaysDense, isa);
    ASSERT_TRUE(conv.stacks_images()) << conv.implementation();
    if (kind >= 2) {
      ASSERT_EQ(
          conv.implementation().rfind(
              kernels::gathers_strided_pointwise(g) ? "gemm-1x1-gathered/" : "implicit-gemm-", 0),
          0u);
    }
    const int64_t granule = conv.channel_granule();
    const int64_t blocks = (g.out_c + granule - 1) / granule;
    const int64_t oc_begin = draw(0, blocks - 1) * granule;
    const int64_t oc_end = std::min(g.out_c, draw(oc_begin / granule + 1, blocks) * granule);

    std::vector<float> stacked(images * out_image, kSentinel), one_by_one = stacked;
    std::vector<float> scratch;
    kernels::conv2d_images(conv, src.data(), stacked.data(), images, oc_begin, oc_end, e,
                           with_residual ? residual.data() : nullptr, scratch);
    // The same from a stack that two callers filled in two channel ranges (the layer-by-layer
    // step's threads): conv2d_images' bits.
    std::vector<float> stack_buffer;
    float* stack =
        kernels::aligned_scratch(stack_buffer, g.in_c * kernels::stacked_plane_floats(g, images));
    const int64_t split_channel = draw(0, g.in_c);
    kernels::stack_channels(g, src.data(), images, split_channel, g.in_c, stack);
    kernels::stack_channels(g, src.data(), images, 0, split_channel, stack);
    std::vector<float> shared(images * out_image, kSentinel);
    kernels::conv2d_stacked(conv, stack, shared.data(), images, oc_begin, oc_end, e,
                            with_residual ? residual.data() : nullptr, scratch);
    ASSERT_EQ(shared, stacked) << "from a shared stack split at channel " << split_channel;
    const int64_t out_plane = g.out_h * g.out_w;
    for (int64_t i = 0; i < images; ++i) {
      const PlaneView res{const_cast<float*>(residual.data()) + i * out_image, 0, out_plane};
      kernels::conv2d_region(conv,
                             {const_cast<float*>(src.data()) + i * in_image, 0, g.in_h * g.in_w},
                             {one_by_one.data() + i * out_image, 0, out_plane}, 0, g.out_h,
                             oc_begin, oc_end, e, with_residual ? &res : nullptr, scratch);
    }
    const float tol = 2e-5f * std::sqrt(static_cast<float>(depth)) + 1e-5f;
    for (int64_t i = 0; i < images; ++i) {
      const std::vector<float> want =
          expected_conv(g, src.data() + i * in_image, weight.data(), bias.data(),
                        with_residual ? residual.data() + i * out_image : nullptr, e);
      for (int64_t j = 0; j < out_image; ++j) {
        const float got = stacked[i * out_image + j];
        const int64_t oc = j / out_plane;
        ASSERT_EQ(std::bit_cast<uint32_t>(got),
                  std::bit_cast<uint32_t>(one_by_one[i * out_image + j]))
            << "image " << i << " element " << j << ": " << got << " stacked, "
            << one_by_one[i * out_image + j] << " image by image";
        if (oc < oc_begin || oc >= oc_end) {
          ASSERT_EQ(got, kSentinel)
              << "wrote outside channels [" << oc_begin << ", " << oc_end << ") in image " << i;
        } else {
          ASSERT_NEAR(got, want[j], tol * (1.0f + std::abs(want[j])))
              << "image " << i << " element " << j;
        }
      }
    }
  }
}

// Planes past kStackedPlanePixels and lowerings that cannot stack run image by image: the same
// call, the same results.
TEST(StackedConvTest, OnlySmallPlanesOfStackableLowerings) {
  auto geometry = [](int64_t hw, int64_t kernel, int64_t stride, int64_t groups) {
    ConvGeometry g;
    g.in_c = g.out_c = 32;
    g.groups = groups;
    g.in_h = g.in_w = hw;
    g.kernel_h = g.kernel_w = kernel;
    g.stride_h = g.stride_w = stride;
    g.pad_top = g.pad_left = (kernel - 1) / 2;
    g.out_h = g.out_w = (hw + 2 * g.pad_top - kernel) / stride + 1;
    return g;
  };
  auto stacks = [](const ConvGeometry& g) {
    const std::vector<float> weight(
        static_cast<std::size_t>(g.out_c * g.in_c / g.groups * g.kernel_h * g.kernel_w), 0.5f);
    return kernels::PackedConv(g, weight.data(), nullptr, kernels::kAlwaysDense).stacks_images();
  };
  EXPECT_TRUE(stacks(geometry(7, 1, 1, 1)));
  EXPECT_TRUE(stacks(geometry(8, 3, 1, 1)));    // 64 pixels
  EXPECT_FALSE(stacks(geometry(9, 3, 1, 1)));   // 81 pixels: less to gain than the copies cost
  EXPECT_TRUE(stacks(geometry(16, 3, 2, 1)));   // stride phases, 16 rows in for 8 out
  EXPECT_FALSE(stacks(geometry(15, 3, 2, 1)));  // 15 rows in for 8 out
  ConvGeometry valid = geometry(8, 3, 1, 1);
  valid.pad_top = valid.pad_left = 0;
  valid.out_h = valid.out_w = 6;
  EXPECT_FALSE(stacks(valid));  // 6 rows out of 8: the images' rows would not line up
  EXPECT_FALSE(stacks(geometry(8, 3, 1, 32)));  // depthwise
  EXPECT_FALSE(stacks(geometry(8, 3, 1, 2)));   // grouped
  // conv2d_stacked takes only a convolution that stacks.
  const ConvGeometry big = geometry(9, 3, 1, 1);
  const std::vector<float> weight(static_cast<std::size_t>(32 * 32 * 9), 0.5f), src(32 * 81 * 2);
  const kernels::PackedConv image_by_image(big, weight.data(), nullptr, kernels::kAlwaysDense);
  std::vector<float> dst(32 * 81 * 2), scratch;
  EXPECT_THROW(kernels::conv2d_stacked(image_by_image, src.data(), dst.data(), 2, 0, 32, {},
                                       nullptr, scratch),
               Error);
}

SPARSECOL_EVERY_ISA(StackedConvIsaTest);

// The depthwise kernel called directly on each ISA tier; a tier this machine cannot run is
// skipped with the reason. Widths below, at and above the vector width of every tier and the
// four-vector block of window_row (4, 8, 16 lanes; 16, 32, 64 outputs).
using DepthwiseConvTest = PerIsaTest;

TEST_P(DepthwiseConvTest, MatchesReference) {
  const kernels::Isa isa = GetParam();
  std::mt19937 rng(11);
  for (const ConvCase& c :
       {ConvCase{"", 8, 8, 17, 33, 3, 1, 1, 1, 8}, ConvCase{"", 8, 8, 17, 33, 3, 2, 1, 1, 8},
        ConvCase{"", 4, 4, 9, 70, 5, 2, 2, 2, 4}, ConvCase{"", 4, 4, 7, 7, 3, 1, 1, 1, 4},
        ConvCase{"", 3, 3, 5, 8, 3, 1, 1, 1, 3}, ConvCase{"", 3, 3, 5, 9, 3, 1, 1, 1, 3},
        ConvCase{"", 3, 3, 5, 32, 3, 1, 1, 1, 3}, ConvCase{"", 3, 3, 5, 65, 3, 1, 1, 1, 3},
        ConvCase{"", 3, 3, 6, 34, 3, 2, 1, 1, 3}, ConvCase{"", 3, 3, 6, 66, 3, 2, 1, 1, 3}}) {
    const ConvGeometry g = make_geometry(c);
    bool with_residual = false;
    const Epilogue e = random_epilogue(rng, &with_residual);
    const Problem p(g, e, with_residual, rng);
    std::vector<float> dst(p.expected.size(), kSentinel);
    std::vector<float> scratch;
    const int64_t out_plane = g.out_h * g.out_w;
    const PlaneView src_view{const_cast<float*>(p.src.data()), 0, g.in_h * g.in_w};
    const PlaneView dst_view{dst.data(), 0, out_plane};
    const PlaneView res_view{const_cast<float*>(p.residual.data()), 0, out_plane};
    kernels::dwconv2d_rows(g, p.weight.data(), p.bias.data(), src_view, dst_view, 0, g.out_h, e,
                           with_residual ? &res_view : nullptr, scratch, isa);
    for (std::size_t i = 0; i < dst.size(); ++i) {
      ASSERT_NEAR(dst[i], p.expected[i], 1e-4f * (1.0f + std::abs(p.expected[i])))
          << to_string(isa) << " at " << i;
    }
  }
}

// The per-plane depthwise kernel on geometry g with a random epilogue, over a random row range
// read from a tile buffer holding exactly its input rows (so an over-read past them is an ASan
// error) and written into a whole tensor whose other rows must stay untouched.
void check_planes_on_random_rows(const ConvGeometry& g, kernels::Isa isa, std::mt19937& rng) {
  bool with_residual = false;
  const Epilogue e = random_epilogue(rng, &with_residual);
  const Problem p(g, e, with_residual, rng);
  RandomRows rows(p, rng);
  std::vector<float> scratch;
  kernels::dwconv2d_rows(g, p.weight.data(), p.bias.data(), rows.src, rows.dst, rows.r0, rows.r1, e,
                         rows.residual_or_null(p), scratch, isa, kernels::DwconvMethod::kPlanes);
  rows.check(p, 1e-4f);
}

// The per-plane kernel on random geometries: kernel sizes 1-5 per axis, stride and dilation 1-2
// per axis, top/left and bottom/right padding drawn apart from 0 to the kernel size (ONNX puts no
// bound on pads; SAME_UPPER pads only the end; pads wider than the kernel's reach make the flat
// stride-1 layout's rows overlap), widths around the vector length, a random row range read from
// a tile buffer holding exactly its input rows (so an over-read past them is an ASan error) and
// written into a whole tensor whose other rows must stay untouched.
TEST_P(DepthwiseConvTest, PlanesMatchReferenceOnRandomGeometries) {
  const kernels::Isa isa = GetParam();
  std::mt19937 rng(31);
  auto draw = [&](int64_t lo, int64_t hi) { return draw_between(rng, lo, hi); };
  for (int trial = 0; trial < 150; ++trial) {
    ConvGeometry g;
    g.in_c = g.out_c = g.groups = draw(1, 12);
    g.kernel_h = draw(1, 5);
    g.kernel_w = draw(1, 5);
    g.stride_h = draw(1, 2);
    g.stride_w = draw(1, 2);
    g.dilation_h = draw(1, 2);
    g.dilation_w = draw(1, 2);
    g.pad_top = draw(0, g.kernel_h);
    g.pad_left = draw(0, g.kernel_w);
    const int64_t pad_bottom = draw(0, g.kernel_h), pad_right = draw(0, g.kernel_w);
    const int64_t span_h = (g.kernel_h - 1) * g.dilation_h + 1;
    const int64_t span_w = (g.kernel_w - 1) * g.dilation_w + 1;
    g.in_h = std::max<int64_t>(span_h - g.pad_top - pad_bottom, 1) + draw(0, 10);
    g.in_w = std::max<int64_t>(span_w - g.pad_left - pad_right, 1) + draw(0, 40);
    g.out_h = (g.in_h + g.pad_top + pad_bottom - span_h) / g.stride_h + 1;
    g.out_w = (g.in_w + g.pad_left + pad_right - span_w) / g.stride_w + 1;
    SCOPED_TRACE(fmt::format("trial {}: c {} {}x{} k{}x{} s{}x{} d{}x{} pads {} {} {} {}", trial,
                             g.in_c, g.in_h, g.in_w, g.kernel_h, g.kernel_w, g.stride_h, g.stride_w,
                             g.dilation_h, g.dilation_w, g.pad_top, g.pad_left, pad_bottom,
                             pad_right));
    check_planes_on_random_rows(g, isa, rng);
  }
}

// The flat 3x3 kernels (stride 1 and 2, one row and column of padding before the image: the
// per-plane path's lowering for them, dwconv3x3_flat) on widths around whole vectors of every
// tier (a row's padding then fills a whole vector of its pitch; odd widths leave stride 2 a
// last tap past the image), and heights past one L1 chunk of rows at the widest (its chunks
// re-copy their halo rows).
TEST_P(DepthwiseConvTest, FlatTapsMatchReferenceAcrossWidthsAndChunks) {
  const kernels::Isa isa = GetParam();
  std::mt19937 rng(37);
  for (const int64_t stride : {1, 2}) {
    for (const int64_t width : {2, 3, 4, 7, 8, 9, 15, 16, 17, 31, 32, 33, 57, 112, 127, 128, 129}) {
      const int64_t height = width >= 100 ? draw_between(rng, 20, 80) : draw_between(rng, 1, 20);
      const int64_t channels = draw_between(rng, 1, 5);
      const ConvGeometry g =
          make_geometry(ConvCase{"", channels, channels, height, width, 3, stride, 1, 1, channels});
      SCOPED_TRACE(fmt::format("stride {}: c {} {}x{}", stride, channels, height, width));
      check_planes_on_random_rows(g, isa, rng);
    }
  }
}

// The channel-lane 3x3 kernel against the per-plane one, bit for bit (both accumulate bias, then
// the taps in the same order, so the depth-wise and layer-wise schedules agree whichever kernel
// a tile gets), and against the reference: random 3x3 geometries with channel counts that leave
// a tail for the per-plane fallback, widths around the vector length, paddings 0..2, a random
// row range read from a tile buffer holding only its input rows and written into a whole tensor
// (rows outside the range must stay untouched).
TEST_P(DepthwiseConvTest, ChannelLanesMatchPlanesBitForBit) {
  const kernels::Isa isa = GetParam();
  std::mt19937 rng(23);
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t channels[] = {1, 7, 8, 13, 16, 20, 35, 48};
    const int64_t c_count = channels[rng() % 8];
    const int64_t stride = 1 + static_cast<int64_t>(rng() % 2);
    const int64_t pad = static_cast<int64_t>(rng() % 3);
    const int64_t in_h = std::max<int64_t>(3 - 2 * pad, 1) + static_cast<int64_t>(rng() % 16);
    const int64_t in_w = std::max<int64_t>(3 - 2 * pad, 1) + static_cast<int64_t>(rng() % 40);
    const ConvGeometry g =
        make_geometry(ConvCase{"", c_count, c_count, in_h, in_w, 3, stride, pad, 1, c_count});
    SCOPED_TRACE(
        fmt::format("trial {}: c {} {}x{} s{} p{}", trial, c_count, in_h, in_w, stride, pad));
    bool with_residual = false;
    const Epilogue e = random_epilogue(rng, &with_residual);
    const Problem p(g, e, with_residual, rng);
    const int64_t a = static_cast<int64_t>(rng() % g.out_h);
    const int64_t b = static_cast<int64_t>(rng() % g.out_h);
    const int64_t r0 = std::min(a, b), r1 = std::max(a, b) + 1;
    int64_t first = 0, last = 0;
    kernels::conv_input_rows(g, r0, r1, &first, &last);
    std::vector<float> src_tile = copy_rows(p.src, g.in_c, g.in_h, g.in_w, first, last);
    const PlaneView src_view{src_tile.data(), first, (last - first) * g.in_w};
    const int64_t out_plane = g.out_h * g.out_w;
    const PlaneView res_view{const_cast<float*>(p.residual.data()), 0, out_plane};
    std::vector<float> got[2];
    const kernels::DwconvMethod methods[] = {kernels::DwconvMethod::kPlanes,
                                             kernels::DwconvMethod::kChannelLanes};
    for (int m = 0; m < 2; ++m) {
      got[m].assign(p.expected.size(), kSentinel);
      std::vector<float> scratch;
      kernels::dwconv2d_rows(g, p.weight.data(), p.bias.data(), src_view,
                             {got[m].data(), 0, out_plane}, r0, r1, e,
                             with_residual ? &res_view : nullptr, scratch, isa, methods[m]);
    }
    for (std::size_t i = 0; i < p.expected.size(); ++i) {
      const int64_t r = static_cast<int64_t>(i) % out_plane / g.out_w;
      if (r < r0 || r >= r1) {
        for (int m = 0; m < 2; ++m) {
          ASSERT_EQ(got[m][i], kSentinel)
              << "method " << m << " wrote outside rows [" << r0 << ", " << r1 << ") at " << i;
        }
        continue;
      }
      ASSERT_NEAR(got[1][i], p.expected[i], 1e-4f * (1.0f + std::abs(p.expected[i]))) << i;
      ASSERT_EQ(std::bit_cast<uint32_t>(got[1][i]), std::bit_cast<uint32_t>(got[0][i])) << i;
    }
  }
}

// One activation and no residual, in either slot: the executors put a Conv's Relu or Clip in the
// first (pre_residual) where no Add comes before it, and the kernels then store through one clamp
// (lanes_impl.h, store_mode). Clip's bounds sit inside the outputs' range and are set for Relu
// too, which must ignore them. Both kernels, stride 1 and 2, planes narrower and wider than a
// vector.
TEST_P(DepthwiseConvTest, OneActivationInEitherSlotMatchesReference) {
  const kernels::Isa isa = GetParam();
  std::mt19937 rng(41);
  for (const int64_t width : {7, 20}) {
    for (const int64_t stride : {1, 2}) {
      const ConvGeometry g = make_geometry(ConvCase{"", 19, 19, 9, width, 3, stride, 1, 1, 19});
      for (const Activation act : {Activation::kRelu, Activation::kClip}) {
        for (const bool first_slot : {true, false}) {
          Epilogue e;
          (first_slot ? e.pre_residual : e.post_residual) = act;
          e.clip_min = -0.5f;
          e.clip_max = 0.5f;
          const Problem p(g, e, false, rng);
          for (const kernels::DwconvMethod method :
               {kernels::DwconvMethod::kPlanes, kernels::DwconvMethod::kChannelLanes}) {
            SCOPED_TRACE(fmt::format("width {} stride {} {} in the {} slot, method {}", width,
                                     stride, act == Activation::kRelu ? "Relu" : "Clip",
                                     first_slot ? "first" : "second", static_cast<int>(method)));
            std::vector<float> dst(p.expected.size(), kSentinel);
            std::vector<float> scratch;
            const int64_t out_plane = g.out_h * g.out_w;
            kernels::dwconv2d_rows(g, p.weight.data(), p.bias.data(),
                                   {const_cast<float*>(p.src.data()), 0, g.in_h * g.in_w},
                                   {dst.data(), 0, out_plane}, 0, g.out_h, e, nullptr, scratch, isa,
                                   method);
            for (std::size_t i = 0; i < dst.size(); ++i) {
              ASSERT_NEAR(dst[i], p.expected[i], 1e-4f * (1.0f + std::abs(p.expected[i]))) << i;
            }
          }
        }
      }
    }
  }
}

SPARSECOL_EVERY_ISA(DepthwiseConvTest);

// ---- ConvTranspose ----

// PackedConvTranspose on each ISA tier, dense and pruned (90% of the weights zero: the sparse
// kernel where the layer has one group), over random geometries: kernel sizes, strides, dilations
// and pads per axis (negative begin pads too), output padding, 1 to 3 groups, with and without
// bias; every tenth trial wide and tall enough that cols runs in many chunks of input rows. A
// random range of output channels must match the reference and leave the other channels untouched.
using ConvTransposeIsaTest = PerIsaTest;

TEST_P(ConvTransposeIsaTest, MatchesReferenceOnRandomGeometries) {
  const kernels::Isa isa = GetParam();
  std::mt19937 rng(91);
  auto draw = [&](int64_t lo, int64_t hi) { return draw_between(rng, lo, hi); };
  for (int trial = 0; trial < 60; ++trial) {
    const bool sparse = trial % 2 == 1, large = trial % 10 == 0;
    ConvGeometry g;
    g.groups = draw(1, 3);
    g.in_c = g.groups * draw(1, large ? 12 : 24);
    g.out_c = g.groups * draw(1, large ? 12 : 20);
    g.in_h = large ? draw(40, 60) : draw(1, 12);
    g.in_w = large ? draw(50, 70) : draw(1, 40);
    g.kernel_h = draw(1, 5);
    g.kernel_w = draw(1, 5);
    g.stride_h = draw(1, 3);
    g.stride_w = draw(1, 3);
    g.dilation_h = draw(1, 2);
    g.dilation_w = draw(1, 2);
    const int64_t reach_h = (g.kernel_h - 1) * g.dilation_h,
                  reach_w = (g.kernel_w - 1) * g.dilation_w;
    // Negative begin pads too: what an output_shape larger than the taps reach gives.
    g.pad_top = draw(-2, reach_h);
    g.pad_left = draw(-2, reach_w);
    // The end pads (leaving at least one output) and the output padding (less than the stride)
    // only change the output's size.
    const int64_t full_h = (g.in_h - 1) * g.stride_h + reach_h + 1 - g.pad_top;
    const int64_t full_w = (g.in_w - 1) * g.stride_w + reach_w + 1 - g.pad_left;
    g.out_h = full_h - draw(0, std::min(reach_h, full_h - 1)) + draw(0, g.stride_h - 1);
    g.out_w = full_w - draw(0, std::min(reach_w, full_w - 1)) + draw(0, g.stride_w - 1);
    SCOPED_TRACE(
        fmt::format("trial {}: c {}->{} groups {} {}x{} -> {}x{} k{}x{} s{}x{} d{}x{} "
                    "pads top {} left {}{}",
                    trial, g.in_c, g.out_c, g.groups, g.in_h, g.in_w, g.out_h, g.out_w, g.kernel_h,
                    g.kernel_w, g.stride_h, g.stride_w, g.dilation_h, g.dilation_w, g.pad_top,
                    g.pad_left, sparse ? ", 90% sparse" : ""));
    const int64_t taps = g.kernel_h * g.kernel_w;
    const int64_t depth = g.in_c / g.groups * taps;
    std::vector<float> weight =
        random_vector(g.in_c * g.out_c / g.groups * taps, 1.0f / std::sqrt(float(depth)), rng);
    if (sparse) {
      for (float& w : weight) w = rng() % 10 == 0 ? w : 0.0f;
    }
    const std::vector<float> bias = random_vector(g.out_c, 0.5f, rng);
    const float* b = trial % 3 == 0 ? nullptr : bias.data();
    const std::vector<float> src = random_vector(g.in_c * g.in_h * g.in_w, 1.0f, rng);
    const kernels::PackedConvTranspose conv(g, weight.data(), b,
                                            sparse ? -1.0 : kernels::kAlwaysDense, isa);
    ASSERT_EQ(
        conv.implementation(),
        fmt::format("{}-col2im/{}", sparse && g.groups == 1 ? "spmm" : "gemm", to_string(isa)));

    kernels::reference::ConvShape shape;
    shape.in_channels = g.in_c;
    shape.out_channels = g.out_c;
    shape.groups = g.groups;
    shape.window.rank = 2;
    shape.window.in_size = {g.in_h, g.in_w};
    shape.window.out_size = {g.out_h, g.out_w};
    shape.window.kernel = {g.kernel_h, g.kernel_w};
    shape.window.stride = {g.stride_h, g.stride_w};
    shape.window.dilation = {g.dilation_h, g.dilation_w};
    shape.window.pad_begin = {g.pad_top, g.pad_left};
    const int64_t out_plane = g.out_h * g.out_w;
    std::vector<float> want(static_cast<std::size_t>(g.out_c * out_plane));
    kernels::reference::conv_transpose_reference(src.data(), weight.data(), b, want.data(), shape);

    const int64_t granule = conv.channel_granule();
    const int64_t blocks = (g.out_c + granule - 1) / granule;
    const int64_t oc_begin = draw(0, blocks - 1) * granule;
    const int64_t oc_end = std::min(g.out_c, draw(oc_begin / granule + 1, blocks) * granule);
    std::vector<float> got(want.size(), kSentinel), scratch;
    kernels::conv_transpose2d_image(conv, src.data(), got.data(), oc_begin, oc_end, scratch);
    const float tolerance = 2e-5f * std::sqrt(static_cast<float>(depth)) + 1e-5f;
    for (int64_t c = 0; c < g.out_c; ++c) {
      const bool inside = c >= oc_begin && c < oc_end;
      for (int64_t i = 0; i < out_plane; ++i) {
        const auto at = static_cast<std::size_t>(c * out_plane + i);
        if (!inside) {
          ASSERT_EQ(got[at], kSentinel) << "channel " << c << " outside [" << oc_begin << ", "
                                        << oc_end << ") written at " << i;
        } else {
          ASSERT_NEAR(got[at], want[at], tolerance) << "channel " << c << ", pixel " << i;
        }
      }
    }
  }
}

TEST(ConvTransposeTest, RefusesChannelRangesOffItsGranuleAndBadGeometries) {
  ConvGeometry g{8, 4, 4, 6, 8, 8, 3, 3, 2, 2, 1, 1, 1, 1, 1};
  const std::vector<float> weight(8 * 6 * 9, 0.5f);
  const kernels::PackedConvTranspose conv(g, weight.data(), nullptr, kernels::kAlwaysDense);
  std::vector<float> src(8 * 16), dst(6 * 64), scratch;
  const int64_t granule = conv.channel_granule();
  // 9 taps: the fewest channels whose taps fill whole panels of the GEMM's rows: panels of 6
  // (AVX2) need 2 channels, of 8 (AVX-512) 8, of 4 (portable) 4.
  const int64_t panel = kernels::default_gemm_ukernel(kernels::active_isa()).mr;
  ASSERT_EQ(granule, panel / std::gcd(panel, int64_t{9})) << conv.implementation();
  test::expect_error(
      [&] { kernels::conv_transpose2d_image(conv, src.data(), dst.data(), 1, 6, scratch); },
      ErrorCode::kInvalidArgument, {"[1, 6)", fmt::format("steps of {}", granule)});
  ConvGeometry grouped = g;
  grouped.groups = 4;  // 6 output channels do not split into 4 groups
  test::expect_error([&] { kernels::PackedConvTranspose(grouped, weight.data(), nullptr); },
                     ErrorCode::kInvalidArgument, {"6 in 4 groups"});
}

SPARSECOL_EVERY_ISA(ConvTransposeIsaTest);

}  // namespace
}  // namespace sparsecol::testing
