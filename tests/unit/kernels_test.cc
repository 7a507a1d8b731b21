// The fast non-GEMM kernels (pooling, softmax, layer norm, element-wise) against the naive
// references in kernels/reference, over randomized shapes, row ranges, strided rows and tile
// buffers that hold only some rows. Every test runs once per ISA tier (portable, avx2, avx512);
// a tier this machine cannot run is skipped with the reason, never passed silently. Row lengths
// sweep below, at and above each tier's vector width (4, 8, 16 lanes) and its multiples.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "conv_oracle.h"
#include "f32-conv/conv.h"
#include "f32-eltwise/eltwise.h"
#include "f32-norm/norm.h"
#include "f32-pool/pool.h"
#include "per_isa_test.h"
#include "reference/elementwise.h"
#include "reference/normalization.h"
#include "reference/pool.h"
#include "reference/softmax.h"

namespace sparsecol::testing {
namespace {

using kernels::Isa;
using kernels::PlaneView;

using PoolTest = PerIsaTest;
using SoftmaxTest = PerIsaTest;
using LayerNormTest = PerIsaTest;
using EltwiseTest = PerIsaTest;

SPARSECOL_EVERY_ISA(PoolTest);
SPARSECOL_EVERY_ISA(SoftmaxTest);
SPARSECOL_EVERY_ISA(LayerNormTest);
SPARSECOL_EVERY_ISA(EltwiseTest);

std::vector<float> random_vector(std::size_t n, float lo, float hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

int64_t random_int(std::mt19937& rng, int64_t lo, int64_t hi) {  // in [lo, hi]
  return lo + static_cast<int64_t>(rng() % static_cast<uint32_t>(hi - lo + 1));
}

// ---- pooling ----

struct PoolCase {
  kernels::PoolGeometry g;
  kernels::PoolKind kind;
};

kernels::reference::PoolShape reference_shape(const kernels::PoolGeometry& g) {
  kernels::reference::PoolShape s;
  s.channels = g.channels;
  s.count_include_pad = g.count_include_pad;
  s.window = reference_window(g);
  s.window.pad_end = {g.pad_bottom, g.pad_right, 0};
  return s;
}

// Output size along one axis, floor or ceil mode; with ceil, the last window must still start
// inside the input or its leading padding (ONNX and PyTorch drop it otherwise).
int64_t pool_out(int64_t in, int64_t k, int64_t s, int64_t d, int64_t pb, int64_t pe, bool ceil) {
  const int64_t span = d * (k - 1) + 1;
  const int64_t room = in + pb + pe - span;
  int64_t out = (ceil ? (room + s - 1) / s : room / s) + 1;
  if (ceil && (out - 1) * s >= in + pb) --out;
  return out;
}

void check_pool(const PoolCase& pc, Isa isa, std::mt19937& rng) {
  const kernels::PoolGeometry& g = pc.g;
  const std::vector<float> src = random_vector(g.channels * g.in_h * g.in_w, -2.0f, 2.0f, rng);
  std::vector<float> expected(g.channels * g.out_h * g.out_w);
  if (pc.kind == kernels::PoolKind::kMax) {
    kernels::reference::max_pool_reference(src.data(), expected.data(), reference_shape(g));
  } else {
    kernels::reference::average_pool_reference(src.data(), expected.data(), reference_shape(g));
  }
  std::vector<std::pair<int64_t, int64_t>> ranges = {{0, g.out_h}, {0, 1}, {g.out_h - 1, g.out_h}};
  const int64_t a = random_int(rng, 0, g.out_h - 1), b = random_int(rng, 0, g.out_h - 1);
  ranges.emplace_back(std::min(a, b), std::max(a, b) + 1);
  std::vector<float> scratch;
  for (const auto& [r0, r1] : ranges) {
    // The input as a tile buffer of just the rows the range needs, the output as a tile too.
    int64_t first = 0, last = 0;
    kernels::pool_input_rows(g, r0, r1, &first, &last);
    std::vector<float> src_tile(g.channels * (last - first) * g.in_w);
    for (int64_t c = 0; c < g.channels; ++c) {
      std::copy_n(src.begin() + (c * g.in_h + first) * g.in_w, (last - first) * g.in_w,
                  src_tile.begin() + c * (last - first) * g.in_w);
    }
    std::vector<float> dst_tile(g.channels * (r1 - r0) * g.out_w, -1.0f);
    kernels::pool2d_rows(pc.kind, g, PlaneView{src_tile.data(), first, (last - first) * g.in_w},
                         PlaneView{dst_tile.data(), r0, (r1 - r0) * g.out_w}, r0, r1, scratch, isa);
    for (int64_t c = 0; c < g.channels; ++c) {
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t x = 0; x < g.out_w; ++x) {
          const float want = expected[(c * g.out_h + r) * g.out_w + x];
          const float have = dst_tile[(c * (r1 - r0) + r - r0) * g.out_w + x];
          ASSERT_NEAR(have, want, 1e-5f * (1.0f + std::abs(want)))
              << to_string(isa) << " rows [" << r0 << ", " << r1 << ") c=" << c << " y=" << r
              << " x=" << x;
        }
      }
    }
  }
}

kernels::PoolGeometry pool_geometry(int64_t channels, int64_t in, int64_t k, int64_t s, int64_t p,
                                    bool include_pad) {
  kernels::PoolGeometry g;
  g.channels = channels;
  g.in_h = g.in_w = in;
  g.kernel_h = g.kernel_w = k;
  g.stride_h = g.stride_w = s;
  g.pad_top = g.pad_left = g.pad_bottom = g.pad_right = p;
  g.count_include_pad = include_pad;
  g.out_h = g.out_w = pool_out(in, k, s, 1, p, p, false);
  return g;
}

TEST_P(PoolTest, ModelShapesMatchReference) {
  std::mt19937 rng(3);
  const PoolCase cases[] = {
      // ResNet-50's stem max pool, 3x3 s2 p1 (channels and size cut for the test).
      {pool_geometry(8, 56, 3, 2, 1, false), kernels::PoolKind::kMax},
      {pool_geometry(4, 112, 3, 2, 1, false), kernels::PoolKind::kMax},
      // Enough channels for the channel-lane kernel (a 3x3 max) on every vector ISA, and a few
      // more that go by plane; stride 1 and 2, an odd width.
      {pool_geometry(21, 56, 3, 2, 1, false), kernels::PoolKind::kMax},
      {pool_geometry(35, 13, 3, 1, 1, false), kernels::PoolKind::kMax},
      {pool_geometry(8, 14, 2, 2, 0, false), kernels::PoolKind::kMax},
      {pool_geometry(8, 28, 3, 1, 1, false), kernels::PoolKind::kAverage},
      {pool_geometry(8, 28, 3, 1, 1, true), kernels::PoolKind::kAverage},
      {pool_geometry(8, 7, 7, 1, 0, false), kernels::PoolKind::kAverage},
  };
  const Isa isa = GetParam();
  for (const PoolCase& pc : cases) {
    check_pool(pc, isa, rng);
    if (HasFatalFailure()) return;
  }
}

TEST_P(PoolTest, RandomGeometriesMatchReference) {
  std::mt19937 rng(5);
  const Isa isa = GetParam();
  for (int trial = 0; trial < 120; ++trial) {
    kernels::PoolGeometry g;
    g.channels = random_int(rng, 1, 20);
    g.kernel_h = random_int(rng, 1, 4);
    g.kernel_w = random_int(rng, 1, 4);
    g.stride_h = random_int(rng, 1, 3);
    g.stride_w = random_int(rng, 1, 3);
    g.dilation_h = random_int(rng, 1, 2);
    g.dilation_w = random_int(rng, 1, 2);
    // ONNX requires pads smaller than the kernel, so no window lies wholly in padding.
    g.pad_top = random_int(rng, 0, g.kernel_h - 1);
    g.pad_left = random_int(rng, 0, g.kernel_w - 1);
    g.pad_bottom = random_int(rng, 0, g.kernel_h - 1);
    g.pad_right = random_int(rng, 0, g.kernel_w - 1);
    g.count_include_pad = rng() % 2 == 0;
    const bool ceil = rng() % 2 == 0;
    g.in_h = g.dilation_h * (g.kernel_h - 1) + 1 + random_int(rng, 0, 15);
    g.in_w = g.dilation_w * (g.kernel_w - 1) + 1 + random_int(rng, 0, 40);
    g.out_h = pool_out(g.in_h, g.kernel_h, g.stride_h, g.dilation_h, g.pad_top, g.pad_bottom, ceil);
    g.out_w = pool_out(g.in_w, g.kernel_w, g.stride_w, g.dilation_w, g.pad_left, g.pad_right, ceil);
    const auto kind = rng() % 2 == 0 ? kernels::PoolKind::kMax : kernels::PoolKind::kAverage;
    SCOPED_TRACE(fmt::format("trial {}: {}x{} k {}x{} s {}x{} d {}x{} pads {},{},{},{} ceil {}",
                             trial, g.in_h, g.in_w, g.kernel_h, g.kernel_w, g.stride_h, g.stride_w,
                             g.dilation_h, g.dilation_w, g.pad_top, g.pad_left, g.pad_bottom,
                             g.pad_right, ceil));
    check_pool({g, kind}, isa, rng);
    if (HasFatalFailure()) return;
  }
}

TEST_P(PoolTest, GlobalAveragePoolMatchesReference) {
  std::mt19937 rng(9);
  const Isa isa = GetParam();
  for (const int64_t plane : {1, 7, 15, 16, 17, 49, 196, 3136}) {
    const int64_t channels = 5, stride = plane + 3;  // planes need not be adjacent
    const std::vector<float> src = random_vector(channels * stride, -1.0f, 3.0f, rng);
    std::vector<float> dense(channels * plane);
    for (int64_t c = 0; c < channels; ++c) {
      std::copy_n(src.begin() + c * stride, plane, dense.begin() + c * plane);
    }
    std::vector<float> want(channels), have(channels);
    kernels::reference::global_average_pool_reference(dense.data(), want.data(), channels, plane);
    kernels::global_average_pool(src.data(), stride, plane, channels, have.data(), isa);
    for (int64_t c = 0; c < channels; ++c) {
      EXPECT_NEAR(have[c], want[c], 1e-5f * (1.0f + std::abs(want[c])))
          << to_string(isa) << " plane " << plane;
    }
  }
}

// ---- softmax and layer norm: rows [r0, r1) of a strided matrix ----

struct RowsProblem {
  int64_t rows, n, ld;
  std::vector<float> src;
};

RowsProblem rows_problem(int64_t rows, int64_t n, float lo, float hi, std::mt19937& rng) {
  const int64_t ld = n + 3;  // rows not adjacent: the kernels must honour the leading dimension
  return {rows, n, ld, random_vector(rows * ld, lo, hi, rng)};
}

std::vector<float> dense_rows(const RowsProblem& p) {
  std::vector<float> dense(p.rows * p.n);
  for (int64_t r = 0; r < p.rows; ++r) {
    std::copy_n(p.src.begin() + r * p.ld, p.n, dense.begin() + r * p.n);
  }
  return dense;
}

const int64_t kRowSizes[] = {1,  3,  4,  5,  7,  8,  9,   15,  16,  17,
                             23, 24, 31, 32, 33, 64, 128, 768, 1000};

TEST_P(SoftmaxTest, RowRangesMatchReference) {
  std::mt19937 rng(13);
  const Isa isa = GetParam();
  for (const int64_t n : kRowSizes) {
    // A wide range of logits: the max subtraction must keep exp from overflowing.
    const RowsProblem p = rows_problem(6, n, -60.0f, 60.0f, rng);
    const std::vector<float> dense = dense_rows(p);
    std::vector<float> want(dense.size());
    kernels::reference::softmax_reference(dense.data(), want.data(), {p.rows, n, 1});
    for (const auto& [r0, r1] : {std::pair<int64_t, int64_t>{0, 6}, {0, 1}, {5, 6}, {2, 4}}) {
      std::vector<float> dst(p.rows * p.ld, -1.0f);
      kernels::softmax_rows(p.src.data() + r0 * p.ld, p.ld, dst.data() + r0 * p.ld, p.ld, r1 - r0,
                            n, isa);
      for (int64_t r = 0; r < p.rows; ++r) {
        for (int64_t j = 0; j < p.ld; ++j) {
          const float have = dst[r * p.ld + j];
          if (r < r0 || r >= r1 || j >= n) {
            ASSERT_EQ(have, -1.0f) << "wrote outside its region";
            continue;
          }
          const float w = want[r * n + j];
          ASSERT_NEAR(have, w, 2e-6f + 1e-5f * w) << to_string(isa) << " n " << n;
        }
      }
    }
  }
}

TEST_P(SoftmaxTest, InPlaceAndLargeValuesStayFinite) {
  std::vector<float> x = {1000.0f, 999.0f, -1000.0f, 1000.0f, 0.0f};
  kernels::softmax_rows(x.data(), 5, x.data(), 5, 1, 5, GetParam());
  float sum = 0.0f;
  for (float v : x) {
    EXPECT_TRUE(std::isfinite(v));
    sum += v;
  }
  EXPECT_NEAR(sum, 1.0f, 1e-6f);
  EXPECT_NEAR(x[0], x[3], 1e-7f);
}

TEST_P(LayerNormTest, RowRangesMatchReference) {
  std::mt19937 rng(17);
  const Isa isa = GetParam();
  for (const int64_t n : kRowSizes) {
    for (const bool with_beta : {true, false}) {
      // An offset far from zero: E[x^2] - E[x]^2 would cancel catastrophically here.
      const RowsProblem p = rows_problem(5, n, 100.0f, 102.0f, rng);
      const std::vector<float> gamma = random_vector(n, 0.5f, 1.5f, rng);
      const std::vector<float> beta = random_vector(n, -1.0f, 1.0f, rng);
      const std::vector<float> dense = dense_rows(p);
      std::vector<float> want(dense.size());
      kernels::reference::layer_norm_reference(dense.data(), gamma.data(),
                                               with_beta ? beta.data() : nullptr, want.data(),
                                               nullptr, nullptr, p.rows, n, 1e-5f);
      for (const auto& [r0, r1] : {std::pair<int64_t, int64_t>{0, 5}, {0, 1}, {4, 5}, {1, 3}}) {
        std::vector<float> dst(p.rows * p.ld, -7.0f);
        kernels::layer_norm_rows(p.src.data() + r0 * p.ld, p.ld, dst.data() + r0 * p.ld, p.ld,
                                 r1 - r0, n, gamma.data(), with_beta ? beta.data() : nullptr, 1e-5f,
                                 isa);
        for (int64_t r = 0; r < p.rows; ++r) {
          for (int64_t j = 0; j < p.ld; ++j) {
            const float have = dst[r * p.ld + j];
            if (r < r0 || r >= r1 || j >= n) {
              ASSERT_EQ(have, -7.0f) << "wrote outside its region";
              continue;
            }
            // Inputs near 100 carry float rounding of ~4e-6 relative to a spread of ~0.6.
            ASSERT_NEAR(have, want[r * n + j], 5e-4f) << to_string(isa) << " n " << n;
          }
        }
      }
    }
  }
}

// ---- element-wise ----

// How operand b (or a) is broadcast over a rows x n region.
enum class Broadcast { kSame, kRowVector, kScalar, kPerRow };

struct Operand {
  std::vector<float> data;
  std::vector<int64_t> shape;  // as the reference sees it
  kernels::RowOperand view;
};

Operand make_operand(Broadcast b, int64_t rows, int64_t n, float lo, float hi, std::mt19937& rng) {
  Operand o;
  switch (b) {
    case Broadcast::kSame:
      o.shape = {rows, n};
      break;
    case Broadcast::kRowVector:
      o.shape = {n};
      break;
    case Broadcast::kScalar:
      o.shape = {};
      break;
    case Broadcast::kPerRow:
      o.shape = {rows, 1};
      break;
  }
  int64_t count = 1;
  for (int64_t d : o.shape) count *= d;
  o.data = random_vector(count, lo, hi, rng);
  const int64_t row_stride = b == Broadcast::kSame ? n : b == Broadcast::kPerRow ? 1 : 0;
  const int64_t column_stride = b == Broadcast::kSame || b == Broadcast::kRowVector ? 1 : 0;
  o.view = {o.data.data(), row_stride, column_stride};
  return o;
}

TEST_P(EltwiseTest, BinaryBroadcastsMatchReference) {
  using kernels::BinaryKind;
  using kernels::reference::BinaryOp;
  const std::pair<BinaryKind, BinaryOp> ops[] = {{BinaryKind::kAdd, BinaryOp::kAdd},
                                                 {BinaryKind::kSub, BinaryOp::kSub},
                                                 {BinaryKind::kMul, BinaryOp::kMul},
                                                 {BinaryKind::kDiv, BinaryOp::kDiv}};
  const Broadcast kinds[] = {Broadcast::kSame, Broadcast::kRowVector, Broadcast::kScalar,
                             Broadcast::kPerRow};
  std::mt19937 rng(19);
  const Isa isa = GetParam();
  for (const auto& [kind, ref_op] : ops) {
    for (const Broadcast ab : kinds) {
      for (const Broadcast bb : kinds) {
        const int64_t rows = random_int(rng, 1, 5), n = random_int(rng, 1, 70);
        const Operand a = make_operand(ab, rows, n, -3.0f, 3.0f, rng);
        const Operand b = make_operand(bb, rows, n, 0.5f, 2.0f, rng);  // no division by ~0
        const std::vector<int64_t> out_shape = {rows, n};
        std::vector<float> want(rows * n);
        kernels::reference::binary<float>(ref_op, a.data.data(), a.shape, b.data.data(), b.shape,
                                          want.data(), out_shape);
        // Rows [r0, rows): the caller offsets each operand by its row stride.
        const int64_t r0 = random_int(rng, 0, rows - 1);
        kernels::RowOperand av = a.view, bv = b.view;
        av.data += r0 * av.row_stride;
        bv.data += r0 * bv.row_stride;
        std::vector<float> dst(rows * n, -9.0f);
        kernels::binary_rows(kind, av, bv, dst.data() + r0 * n, n, rows - r0, n, isa);
        for (int64_t i = 0; i < rows * n; ++i) {
          if (i < r0 * n) {
            ASSERT_EQ(dst[i], -9.0f);
          } else {
            ASSERT_NEAR(dst[i], want[i], 1e-6f * (1.0f + std::abs(want[i])))
                << to_string(isa) << " op " << static_cast<int>(kind) << " broadcasts "
                << static_cast<int>(ab) << "," << static_cast<int>(bb);
          }
        }
      }
    }
  }
}

TEST_P(EltwiseTest, BinaryInPlaceOnSameShapeOperand) {
  std::vector<float> a = {1, 2, 3, 4, 5, 6}, bias = {10, 20, 30};
  kernels::binary_rows(kernels::BinaryKind::kAdd, {a.data(), 3, 1}, {bias.data(), 0, 1}, a.data(),
                       3, 2, 3, GetParam());
  EXPECT_EQ(a, (std::vector<float>{11, 22, 33, 14, 25, 36}));
}

TEST_P(EltwiseTest, UnaryMatchesReference) {
  using kernels::UnaryKind;
  using kernels::reference::UnaryOp;
  struct Case {
    UnaryKind kind;
    float lo, hi, abs_tol;
  };
  const Case cases[] = {{UnaryKind::kRelu, -3, 3, 0},       {UnaryKind::kClip, -8, 8, 0},
                        {UnaryKind::kGelu, -6, 6, 2e-6f},   {UnaryKind::kSigmoid, -20, 20, 1e-6f},
                        {UnaryKind::kTanh, -10, 10, 1e-6f}, {UnaryKind::kErf, -4, 4, 1e-6f},
                        {UnaryKind::kExp, -80, 80, 0},      {UnaryKind::kSqrt, 0, 50, 0},
                        {UnaryKind::kNeg, -3, 3, 0}};
  std::mt19937 rng(23);
  const Isa isa = GetParam();
  for (const Case& c : cases) {
    const int64_t rows = 3, n = 37, ld = 40;
    const std::vector<float> src = random_vector(rows * ld, c.lo, c.hi, rng);
    std::vector<float> dst(rows * ld, -5.0f);
    kernels::unary_rows(c.kind, src.data(), ld, dst.data(), ld, rows, n, 0.0f, 6.0f, isa);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < ld; ++j) {
        const float have = dst[r * ld + j];
        if (j >= n) {
          ASSERT_EQ(have, -5.0f) << "wrote past the row";
          continue;
        }
        const double x = src[r * ld + j];
        double want = 0.0;
        switch (c.kind) {
          case UnaryKind::kRelu:
            want = std::max(x, 0.0);
            break;
          case UnaryKind::kClip:
            want = std::clamp(x, 0.0, 6.0);
            break;
          case UnaryKind::kGelu:
            want = 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
            break;
          case UnaryKind::kSigmoid:
            want = 1.0 / (1.0 + std::exp(-x));
            break;
          case UnaryKind::kTanh:
            want = std::tanh(x);
            break;
          case UnaryKind::kErf:
            want = std::erf(x);
            break;
          case UnaryKind::kExp:
            want = std::exp(x);
            break;
          case UnaryKind::kSqrt:
            want = std::sqrt(x);
            break;
          case UnaryKind::kNeg:
            want = -x;
            break;
        }
        ASSERT_NEAR(have, want, c.abs_tol + 2e-6 * std::abs(want))
            << to_string(isa) << " kind " << static_cast<int>(c.kind) << " x " << x;
      }
    }
  }
}

// The strided row gather: strides 1-3 (1 and 2 have vector paths, 2 with masked last vectors),
// counts around every vector width, zero edges of 0-3 columns. Reads past the last element the
// gather may touch would show under the sanitizers: each row's input ends where its reads do.
TEST_P(EltwiseTest, GatherRowsMatchIndexArithmetic) {
  std::mt19937 rng(67);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t stride = 1 + static_cast<int64_t>(rng() % 3);
    const int64_t rows = 1 + static_cast<int64_t>(rng() % 4);
    const int64_t first = static_cast<int64_t>(rng() % 4);
    const int64_t count = static_cast<int64_t>(rng() % 70);
    const int64_t last = first + count;
    const int64_t width = last + static_cast<int64_t>(rng() % 4);
    const int64_t in_ld =
        std::max<int64_t>(1, (count - 1) * stride + 1) + static_cast<int64_t>(rng() % 3);
    const int64_t out_ld = width + static_cast<int64_t>(rng() % 3);
    // The last row's input ends at its last read: a read beyond it would be out of bounds.
    std::vector<float> in(static_cast<std::size_t>((rows - 1) * in_ld +
                                                   std::max<int64_t>(1, (count - 1) * stride + 1)));
    for (float& v : in) v = dist(rng);
    std::vector<float> out(static_cast<std::size_t>(rows * out_ld), 7.0f);
    kernels::gather_rows(in.data(), in_ld, stride, rows, first, last, width, out.data(), out_ld,
                         GetParam());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t x = 0; x < out_ld; ++x) {
        const float want = x >= width ? 7.0f
                           : x < first || x >= last
                               ? 0.0f
                               : in[static_cast<std::size_t>(r * in_ld + (x - first) * stride)];
        ASSERT_EQ(out[static_cast<std::size_t>(r * out_ld + x)], want)
            << to_string(GetParam()) << " stride " << stride << " first " << first << " last "
            << last << " width " << width << " at " << r << ", " << x;
      }
    }
  }
}

// The two column phases of stride-2 rows: widths and row lengths around every vector width,
// shifts 0-3 (the padding left of the row), phases wider than the row reaches (zero columns past
// its end). The last row's input ends where its in_w columns do, so that a read past them would
// show under the sanitizers; every output element past `width` must stay untouched.
TEST_P(EltwiseTest, SplitColumnPhasesMatchIndexArithmetic) {
  std::mt19937 rng(68);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t rows = 1 + static_cast<int64_t>(rng() % 4);
    const int64_t in_w = 1 + static_cast<int64_t>(rng() % 70);
    const int64_t shift = static_cast<int64_t>(rng() % 4);
    const int64_t width = 1 + static_cast<int64_t>(rng() % 40);
    const int64_t in_ld = in_w + static_cast<int64_t>(rng() % 3);
    const int64_t out_ld = width + static_cast<int64_t>(rng() % 3);
    std::vector<float> in(static_cast<std::size_t>((rows - 1) * in_ld + in_w));
    for (float& v : in) v = dist(rng);
    std::vector<float> even(static_cast<std::size_t>(rows * out_ld), 7.0f), odd = even;
    kernels::split_column_phases(in.data(), in_ld, in_w, shift, rows, width, even.data(),
                                 odd.data(), out_ld, GetParam());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t x = 0; x < out_ld; ++x) {
        for (int64_t phase = 0; phase < 2; ++phase) {
          const int64_t column = 2 * x + phase - shift;
          const float want = x >= width ? 7.0f
                             : column < 0 || column >= in_w
                                 ? 0.0f
                                 : in[static_cast<std::size_t>(r * in_ld + column)];
          const std::vector<float>& got = phase == 0 ? even : odd;
          ASSERT_EQ(got[static_cast<std::size_t>(r * out_ld + x)], want)
              << to_string(GetParam()) << " in_w " << in_w << " shift " << shift << " width "
              << width << " phase " << phase << " at " << r << ", " << x;
        }
      }
    }
  }
}

// The 2-D transpose between strided views: every shape around the 4 x 4 blocks (edges of 0-3
// rows or columns) and the 16 x 16 tiles, padded strides, and strides of 4 KiB (which change the
// tiling, see transpose.cc); elements outside the block must stay untouched.
TEST(Transpose2d, RandomBlocksMatchIndexArithmetic) {
  std::mt19937 rng(61);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t rows = rng() % 41, cols = rng() % 41;
    const int64_t lds = trial % 5 == 0 ? 1024 : cols + static_cast<int64_t>(rng() % 5);
    const int64_t ldd = trial % 5 == 1 ? 1024 : rows + static_cast<int64_t>(rng() % 5);
    std::vector<float> src(static_cast<std::size_t>(std::max<int64_t>(1, rows * lds)));
    for (float& v : src) v = dist(rng);
    std::vector<float> dst(static_cast<std::size_t>(std::max<int64_t>(1, cols * ldd)), 7.0f);
    kernels::transpose_2d(src.data(), lds, rows, cols, dst.data(), ldd);
    for (int64_t c = 0; c < cols; ++c) {
      for (int64_t r = 0; r < ldd; ++r) {
        const float want = r < rows ? src[static_cast<std::size_t>(r * lds + c)] : 7.0f;
        ASSERT_EQ(dst[static_cast<std::size_t>(c * ldd + r)], want)
            << rows << " x " << cols << " at " << r << ", " << c;
      }
    }
  }
}

}  // namespace
}  // namespace sparsecol::testing
