// The f32 GEMM paths against gemm_reference: every micro-kernel in ukernels.h that this CPU can
// run, swept over every M in 1..2MR+1 and N in 1..2NR+1 (below, at and above each tile size) and
// K in {1, 2, 3, 7, 16, 17, 64, 300} (300 spans two blocks of K), with leading dimensions wider
// than the matrices, unaligned pointers, and each epilogue variant in turn. C sits inside a
// buffer of canary values that must come back untouched.
//
// Tolerance: |c - ref| <= 2 (K + 4) u * S + 1e-6, u = 2^-24 the float unit roundoff and
// S = sum_k |a||b| + |biases| + |residual| + 1: the forward error bound of a K-term float dot
// product (plus the epilogue's additions) with a factor 2 of slack; 1e-6 covers the GELU's
// rational erf (max abs error 4.5e-7, checked on its own below).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "f32-gemm/gemm.h"
#include "f32-gemm/ukernels.h"
#include "isa.h"
#include "per_isa_test.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol::kernels {
namespace {

constexpr float kCanary = -7777.25f;
constexpr int64_t kGuard = 37;  // canary floats before and after C

struct EpilogueVariant {
  const char* name;
  bool row_bias, col_bias, residual;
  Activation pre, post;
};

constexpr EpilogueVariant kVariants[] = {
    {"none", false, false, false, Activation::kNone, Activation::kNone},
    {"row_bias+relu", true, false, false, Activation::kRelu, Activation::kNone},
    {"col_bias+gelu", false, true, false, Activation::kGelu, Activation::kNone},
    {"row_bias+residual+relu", true, false, true, Activation::kNone, Activation::kRelu},
    {"both_bias+clip", true, true, false, Activation::kClip, Activation::kNone},
    {"col_bias+gelu+residual", false, true, true, Activation::kGelu, Activation::kNone},
    {"row_bias+clip+residual+clip", true, false, true, Activation::kClip, Activation::kClip},
    {"residual+gelu", false, false, true, Activation::kNone, Activation::kGelu},
};

// One randomized problem: operands at random offsets inside larger buffers, wide strides (B's
// row stride `ldb` where one is given).
class Problem {
 public:
  Problem(int64_t m, int64_t n, int64_t k, const EpilogueVariant& variant, std::mt19937& rng,
          int64_t ldb = 0)
      : m_(m), n_(n), k_(k) {
    std::uniform_int_distribution<int64_t> pad(0, 5), offset(0, 15);
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    auto fill = [&](std::vector<float>& v, int64_t size) {
      v.resize(size);
      for (float& x : v) x = value(rng);
    };
    lda_ = k + pad(rng);
    ldb_ = ldb > 0 ? ldb : n + pad(rng);
    ldc_ = n + pad(rng);
    a_offset_ = offset(rng);
    b_offset_ = offset(rng);
    c_offset_ = kGuard + offset(rng);
    fill(a_, a_offset_ + (m - 1) * lda_ + std::max<int64_t>(k, 1));
    fill(b_, b_offset_ + std::max<int64_t>(k - 1, 0) * ldb_ + n);
    c_size_ = c_offset_ + (m - 1) * ldc_ + n + kGuard;
    if (variant.row_bias) fill(row_bias_, m);
    if (variant.col_bias) fill(col_bias_, n);
    if (variant.residual) {
      const int64_t ld = n + pad(rng);
      fill(residual_, (m - 1) * ld + n);
      epilogue_.residual = residual_.data();
      epilogue_.residual_ld = ld;
    }
    epilogue_.row_bias = variant.row_bias ? row_bias_.data() : nullptr;
    epilogue_.col_bias = variant.col_bias ? col_bias_.data() : nullptr;
    epilogue_.pre_residual = variant.pre;
    epilogue_.post_residual = variant.post;
    epilogue_.clip_min = -0.75f;
    epilogue_.clip_max = 1.5f;
  }

  GemmShape shape() const { return {m_, n_, k_}; }
  const float* a() const { return a_.data() + a_offset_; }
  const float* b() const { return b_.data() + b_offset_; }
  int64_t lda() const { return lda_; }
  int64_t ldb() const { return ldb_; }
  int64_t ldc() const { return ldc_; }
  const Epilogue& epilogue() const { return epilogue_; }

  // A C buffer full of canaries; the matrix starts at c_offset().
  std::vector<float> fresh_c() const { return std::vector<float>(c_size_, kCanary); }
  int64_t c_offset() const { return c_offset_; }

  // Checks `c` (from fresh_c) against the reference; returns "" or a description of the first
  // mismatch or overwritten canary.
  std::string check(const std::vector<float>& c) const {
    std::vector<float> expected = fresh_c();
    gemm_reference(shape(), a(), lda_, b(), ldb_, expected.data() + c_offset_, ldc_, epilogue_);
    // sum_k |a||b| for every element, by the reference itself on |A| and |B| (as a loop here it
    // was most of this test's time in the sanitizer build, whose test code is not optimized).
    const std::vector<float> abs_a = absolute(a_), abs_b = absolute(b_);
    std::vector<float> abs_products(static_cast<std::size_t>(m_ * n_));
    gemm_reference(shape(), abs_a.data() + a_offset_, lda_, abs_b.data() + b_offset_, ldb_,
                   abs_products.data(), n_, Epilogue{});
    for (int64_t idx = 0; idx < c_size_; ++idx) {
      const int64_t rel = idx - c_offset_;
      const int64_t i = rel >= 0 ? rel / ldc_ : -1, j = rel >= 0 ? rel % ldc_ : -1;
      const bool inside = rel >= 0 && i < m_ && j < n_;
      if (!inside) {
        if (c[idx] != kCanary) return "canary overwritten at offset " + std::to_string(rel);
        continue;
      }
      const double tol =
          2.0 * (k_ + 4) * std::ldexp(1.0, -24) * scale(i, j, abs_products[i * n_ + j]) + 1e-6;
      if (!(std::fabs(c[idx] - expected[idx]) <= tol)) {
        return "C[" + std::to_string(i) + "][" + std::to_string(j) +
               "] = " + std::to_string(c[idx]) + ", reference " + std::to_string(expected[idx]) +
               ", tolerance " + std::to_string(tol);
      }
    }
    return "";
  }

 private:
  static std::vector<float> absolute(std::vector<float> v) {
    for (float& x : v) x = std::fabs(x);
    return v;
  }

  // S of the tolerance (top of the file) for element (i, j), given its sum_k |a||b|.
  double scale(int64_t i, int64_t j, double abs_product) const {
    double s = 1.0 + abs_product;
    if (epilogue_.row_bias != nullptr) s += std::fabs(epilogue_.row_bias[i]);
    if (epilogue_.col_bias != nullptr) s += std::fabs(epilogue_.col_bias[j]);
    if (epilogue_.residual != nullptr) {
      s += std::fabs(epilogue_.residual[i * epilogue_.residual_ld + j]);
    }
    return s;
  }

  int64_t m_, n_, k_;
  int64_t lda_, ldb_, ldc_, a_offset_, b_offset_, c_offset_, c_size_;
  std::vector<float> a_, b_, row_bias_, col_bias_, residual_;
  Epilogue epilogue_;
};

std::string describe(const GemmShape& s, const EpilogueVariant& v) {
  return "M=" + std::to_string(s.m) + " N=" + std::to_string(s.n) + " K=" + std::to_string(s.k) +
         " epilogue=" + v.name;
}

class GemmUkernelTest : public ::testing::TestWithParam<int> {
 protected:
  const GemmUkernel& ukernel() const { return gemm_ukernels()[GetParam()]; }
  void SetUp() override {
    if (!isa_available(ukernel().isa)) {
      GTEST_SKIP() << ukernel().name << ": " << isa_reason();
    }
  }
};

TEST_P(GemmUkernelTest, MatchesReferenceOnEveryTileBoundaryShape) {
  const GemmUkernel& u = ukernel();
  std::mt19937 rng(1234);
  std::vector<float> scratch;
  int failures = 0, case_index = 0;
  for (int64_t k : {1, 2, 3, 7, 16, 17, 64, 300}) {
    for (int64_t m = 1; m <= 2 * u.mr + 1; ++m) {
      for (int64_t n = 1; n <= 2 * u.nr + 1; ++n, ++case_index) {
        const EpilogueVariant& variant = kVariants[case_index % std::size(kVariants)];
        const Problem problem(m, n, k, variant, rng);
        std::vector<float> c = problem.fresh_c();
        gemm_with_ukernel(u, problem.shape(), problem.a(), problem.lda(), problem.b(),
                          problem.ldb(), c.data() + problem.c_offset(), problem.ldc(),
                          problem.epilogue(), scratch);
        const std::string error = problem.check(c);
        if (!error.empty() && ++failures <= 5) {
          ADD_FAILURE() << u.name << " " << describe(problem.shape(), variant) << ": " << error;
        }
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST_P(GemmUkernelTest, EveryEpilogueVariantOnLayerLikeShapes) {
  const GemmUkernel& u = ukernel();
  std::mt19937 rng(99);
  std::vector<float> scratch;
  // Several blocks of M, N and K at once (the driver's MC, NC and KC loops), with tails; and
  // BERT's attention regions (both operands activations, B small).
  const GemmShape shapes[] = {{67, 200, 576},  {300, 49, 129}, {5, 1100, 40},
                              {20, 1500, 300}, {64, 128, 64},  {64, 64, 128}};
  for (const GemmShape& shape : shapes) {
    for (const EpilogueVariant& variant : kVariants) {
      const Problem problem(shape.m, shape.n, shape.k, variant, rng);
      std::vector<float> c = problem.fresh_c();
      gemm_with_ukernel(u, problem.shape(), problem.a(), problem.lda(), problem.b(), problem.ldb(),
                        c.data() + problem.c_offset(), problem.ldc(), problem.epilogue(), scratch);
      EXPECT_EQ(problem.check(c), "") << u.name << " " << describe(shape, variant);
    }
  }
}

// B rows a multiple of 2 KiB apart are packed into strips per call (the other strides are read in
// place, as in the tests above): both ways give the reference's results.
TEST_P(GemmUkernelTest, BPackedWhereItsRowsWouldShareCacheSets) {
  const GemmUkernel& u = ukernel();
  std::mt19937 rng(7);
  std::vector<float> scratch;
  const struct {
    GemmShape shape;
    int64_t ldb;
  } cases[] = {{{20, 300, 70}, 512}, {{67, 1100, 300}, 2048}, {{2 * u.mr + 1, 33, 5}, 1024}};
  for (const auto& [shape, ldb] : cases) {
    const EpilogueVariant& variant = kVariants[4];
    const Problem problem(shape.m, shape.n, shape.k, variant, rng, ldb);
    std::vector<float> c = problem.fresh_c();
    gemm_with_ukernel(u, problem.shape(), problem.a(), problem.lda(), problem.b(), problem.ldb(),
                      c.data() + problem.c_offset(), problem.ldc(), problem.epilogue(), scratch);
    EXPECT_EQ(problem.check(c), "") << u.name << " " << describe(shape, variant) << " ldb " << ldb;
  }
}

// B given transposed (gemm_transposed_b: an attention product's K^T read from K) gives the
// reference's results on the plain B: tile-boundary shapes, several blocks of K and N, and a
// transposed row stride wider than K.
TEST_P(GemmUkernelTest, TransposedBMatchesReferenceOnThePlainB) {
  const GemmUkernel& u = ukernel();
  std::mt19937 rng(31);
  std::vector<float> scratch;
  std::vector<GemmShape> shapes = {{128, 128, 64}, {67, 1100, 300}, {300, 49, 129}};
  for (int64_t k : {1, 7, 17}) {
    for (int64_t m : {int64_t{1}, int64_t{u.mr}, int64_t{2 * u.mr + 1}}) {
      for (int64_t n = 1; n <= 2 * u.nr + 1; n += 3) shapes.push_back({m, n, k});
    }
  }
  int case_index = 0;
  for (const GemmShape& shape : shapes) {
    const EpilogueVariant& variant = kVariants[case_index++ % std::size(kVariants)];
    const Problem problem(shape.m, shape.n, shape.k, variant, rng);
    const int64_t ldbt = shape.k + case_index % 3;
    std::vector<float> bt(static_cast<std::size_t>(shape.n * ldbt), kCanary);
    for (int64_t p = 0; p < shape.k; ++p) {
      for (int64_t j = 0; j < shape.n; ++j) bt[j * ldbt + p] = problem.b()[p * problem.ldb() + j];
    }
    std::vector<float> c = problem.fresh_c();
    gemm_transposed_b_with_ukernel(u, problem.shape(), problem.a(), problem.lda(), bt.data(), ldbt,
                                   c.data() + problem.c_offset(), problem.ldc(), problem.epilogue(),
                                   scratch);
    EXPECT_EQ(problem.check(c), "")
        << u.name << " " << describe(shape, variant) << " ldbt " << ldbt;
  }
}

TEST_P(GemmUkernelTest, ZeroDepthGivesTheEpilogueOfZero) {
  std::mt19937 rng(5);
  std::vector<float> scratch;
  const Problem problem(3, 19, 0, kVariants[4], rng);
  std::vector<float> c = problem.fresh_c();
  gemm_with_ukernel(ukernel(), problem.shape(), problem.a(), problem.lda(), problem.b(),
                    problem.ldb(), c.data() + problem.c_offset(), problem.ldc(), problem.epilogue(),
                    scratch);
  EXPECT_EQ(problem.check(c), "");
}

INSTANTIATE_TEST_SUITE_P(AllUkernels, GemmUkernelTest,
                         ::testing::Range(0, static_cast<int>(gemm_ukernels().size())),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(gemm_ukernels()[info.param].name);
                         });

using GemmPackedTest = sparsecol::testing::PerIsaTest;

TEST_P(GemmPackedTest, PackedWeightsMatchReference) {
  const Isa isa = GetParam();
  std::mt19937 rng(42);
  std::uniform_int_distribution<int64_t> dim(1, 90);
  for (int trial = 0; trial < 40; ++trial) {
    const EpilogueVariant& variant = kVariants[trial % std::size(kVariants)];
    const Problem problem(dim(rng), dim(rng), dim(rng) * 3, variant, rng);
    const GemmShape s = problem.shape();
    const PackedA packed(problem.a(), s.m, s.k, problem.lda(), isa);
    EXPECT_EQ(packed.isa(), isa);
    EXPECT_EQ(packed.rows(), s.m);
    EXPECT_EQ(packed.depth(), s.k);
    std::vector<float> c = problem.fresh_c();
    gemm_packed(packed, problem.b(), problem.ldb(), c.data() + problem.c_offset(), problem.ldc(),
                s.n, problem.epilogue());
    EXPECT_EQ(problem.check(c), "") << to_string(isa) << " " << describe(s, variant);
  }
}

// Rows of a packed A split at panel boundaries (the layer-by-layer schedule's blocks of output
// channels): each part computes its rows of C with the bits of the whole product; a part that
// does not start a panel is refused.
TEST_P(GemmPackedTest, RowRangesGiveTheBitsOfTheWhole) {
  const Isa isa = GetParam();
  std::mt19937 rng(44);
  std::uniform_int_distribution<int64_t> dim(1, 90);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t m = 2 + dim(rng), k = dim(rng) * 5, n = dim(rng);
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n));
    for (float& x : a) x = value(rng);
    for (float& x : b) x = value(rng);
    const PackedA packed(a.data(), m, k, k, isa);
    const int64_t panel = packed.panel_rows();
    std::vector<float> whole(static_cast<std::size_t>(m * n)), parts(whole.size(), -1.0f);
    gemm_packed(packed, b.data(), n, whole.data(), n, n, {});
    const int64_t split = std::min(m, panel * (1 + static_cast<int64_t>(rng() % 3)));
    for (const auto& [r0, r1] : {std::pair{int64_t{0}, split}, std::pair{split, m}}) {
      const PackedA part = packed.row_range(r0, r1);
      EXPECT_EQ(part.rows(), r1 - r0);
      gemm_packed(part, b.data(), n, parts.data() + r0 * n, n, n, {});
    }
    ASSERT_EQ(parts, whole) << to_string(isa) << " m " << m << " k " << k << " n " << n
                            << " split at " << split;
    if (panel > 1) {
      EXPECT_THROW(packed.row_range(1, m), Error);
    }
    EXPECT_THROW(packed.row_range(0, m + 1), Error);
  }
}

// A pre-packed B (a linear layer's weight) over the whole width and over two column regions
// split at a strip, with several blocks of K and column tails: the reference's results, and the
// split gives the bits of the whole.
TEST_P(GemmPackedTest, PackedBMatchesReferenceOverColumnRegions) {
  const Isa isa = GetParam();
  std::mt19937 rng(43);
  std::uniform_int_distribution<int64_t> dim(1, 90);
  std::vector<float> scratch;
  for (int trial = 0; trial < 40; ++trial) {
    const EpilogueVariant& variant = kVariants[trial % std::size(kVariants)];
    const int64_t k = trial % 4 == 0 ? 300 + dim(rng) * 4 : dim(rng);  // some past one K block
    const Problem problem(dim(rng), dim(rng) * 2, k, variant, rng);
    const GemmShape s = problem.shape();
    const PackedB packed(problem.b(), s.k, s.n, problem.ldb(), isa);
    EXPECT_EQ(packed.isa(), isa);
    EXPECT_EQ(packed.depth(), s.k);
    EXPECT_EQ(packed.columns(), s.n);
    EXPECT_GE(packed.packed_bytes(), s.k * s.n * static_cast<int64_t>(sizeof(float)));
    std::vector<float> whole = problem.fresh_c();
    gemm_packed_b(s, problem.a(), problem.lda(), packed, 0, whole.data() + problem.c_offset(),
                  problem.ldc(), problem.epilogue(), scratch);
    EXPECT_EQ(problem.check(whole), "") << to_string(isa) << " " << describe(s, variant);
    const int64_t split = s.n / 2 / packed.strip_width() * packed.strip_width();
    if (split == 0) continue;
    std::vector<float> parts = problem.fresh_c();
    float* c = parts.data() + problem.c_offset();
    gemm_packed_b({s.m, split, s.k}, problem.a(), problem.lda(), packed, 0, c, problem.ldc(),
                  problem.epilogue(), scratch);
    Epilogue right = problem.epilogue();
    if (right.col_bias != nullptr) right.col_bias += split;
    if (right.residual != nullptr) right.residual += split;
    gemm_packed_b({s.m, s.n - split, s.k}, problem.a(), problem.lda(), packed, split, c + split,
                  problem.ldc(), right, scratch);
    EXPECT_EQ(whole, parts) << to_string(isa) << " " << describe(s, variant) << ", split at "
                            << split;
  }
}

// B written into strips block by block of rows (a convolution's im2col: a few rows at a time,
// from plain blocks at their own stride), then multiplied by a packed A: the reference's
// results, over column tails and several blocks of K; and the same bits as PackedB, whose
// strips are the same layout.
TEST_P(GemmPackedTest, StripsPackedByRowBlocksMatchReference) {
  const Isa isa = GetParam();
  std::mt19937 rng(44);
  std::uniform_int_distribution<int64_t> dim(1, 90), block_rows(1, 20);
  std::vector<float> scratch;
  const int64_t width = gemm_strip_width(isa);
  for (int trial = 0; trial < 40; ++trial) {
    const EpilogueVariant& variant = kVariants[trial % std::size(kVariants)];
    const int64_t k = trial % 4 == 0 ? 300 + dim(rng) * 4 : dim(rng);
    const Problem problem(dim(rng), dim(rng) * 2, k, variant, rng);
    const GemmShape s = problem.shape();
    std::vector<float> strips(static_cast<std::size_t>(s.k * ((s.n + width - 1) / width) * width));
    for (int64_t row0 = 0; row0 < s.k;) {
      const int64_t rows = std::min(s.k - row0, block_rows(rng));
      pack_b_strip_rows(problem.b() + row0 * problem.ldb(), problem.ldb(), rows, s.n, row0, s.k,
                        strips.data(), isa);
      row0 += rows;
    }
    const PackedA packed_a(problem.a(), s.m, s.k, problem.lda(), isa);
    std::vector<float> c = problem.fresh_c();
    gemm_packed_strips(packed_a, strips.data(), c.data() + problem.c_offset(), problem.ldc(), s.n,
                       problem.epilogue());
    EXPECT_EQ(problem.check(c), "") << to_string(isa) << " " << describe(s, variant);
    const PackedB packed_b(problem.b(), s.k, s.n, problem.ldb(), isa);
    EXPECT_EQ(packed_b.strip_width(), width);
    std::vector<float> via_packed_b = problem.fresh_c();
    gemm_packed_b(s, problem.a(), problem.lda(), packed_b, 0,
                  via_packed_b.data() + problem.c_offset(), problem.ldc(), problem.epilogue(),
                  scratch);
    EXPECT_EQ(c, via_packed_b) << to_string(isa) << " " << describe(s, variant);
  }
}

// An indirect B (a convolution's taps read from its phase planes): every row of the problem's B
// copied to its own offset of a pool, in shuffled order and at any alignment, the pool's other
// floats poison. The reference's results over column tails and several blocks of K, the bits of
// gemm_packed on the plain B, and a refusal when the offsets do not match A's depth.
TEST_P(GemmPackedTest, IndirectRowsMatchReferenceAndThePlainB) {
  const Isa isa = GetParam();
  std::mt19937 rng(45);
  std::uniform_int_distribution<int64_t> dim(1, 90), gap(0, 17);
  for (int trial = 0; trial < 40; ++trial) {
    const EpilogueVariant& variant = kVariants[trial % std::size(kVariants)];
    const int64_t k = trial % 4 == 0 ? 300 + dim(rng) * 4 : dim(rng);
    const Problem problem(dim(rng), dim(rng) * 2, k, variant, rng);
    const GemmShape s = problem.shape();
    std::vector<int64_t> order(static_cast<std::size_t>(s.k));
    for (int64_t p = 0; p < s.k; ++p) order[p] = p;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<float> pool;
    std::vector<int64_t> offsets(order.size());
    for (const int64_t p : order) {
      pool.resize(pool.size() + gap(rng), std::nanf(""));
      offsets[p] = static_cast<int64_t>(pool.size());
      const float* row = problem.b() + p * problem.ldb();
      pool.insert(pool.end(), row, row + s.n);
    }
    pool.resize(pool.size() + gap(rng), std::nanf(""));
    const PackedA packed(problem.a(), s.m, s.k, problem.lda(), isa);
    std::vector<float> c = problem.fresh_c();
    gemm_packed_row_offsets(packed, pool.data(), offsets, c.data() + problem.c_offset(),
                            problem.ldc(), s.n, problem.epilogue());
    EXPECT_EQ(problem.check(c), "") << to_string(isa) << " " << describe(s, variant);
    std::vector<float> plain = problem.fresh_c();
    gemm_packed(packed, problem.b(), problem.ldb(), plain.data() + problem.c_offset(),
                problem.ldc(), s.n, problem.epilogue());
    EXPECT_EQ(c, plain) << to_string(isa) << " " << describe(s, variant);
    offsets.pop_back();
    EXPECT_THROW(gemm_packed_row_offsets(packed, pool.data(), offsets, c.data(), problem.ldc(), s.n,
                                         problem.epilogue()),
                 Error);
  }
}

TEST_P(GemmPackedTest, PackedBRefusesRegionsItDoesNotHold) {
  const Isa isa = GetParam();
  const std::vector<float> b(8 * 40, 1.0f), a(4 * 8, 1.0f);
  std::vector<float> c(4 * 40), scratch;
  const PackedB packed(b.data(), 8, 40, 40, isa);
  const Epilogue none;
  // Not at a strip, past the columns, another depth.
  EXPECT_THROW(gemm_packed_b({4, 8, 8}, a.data(), 8, packed, 1, c.data(), 40, none, scratch),
               Error);
  EXPECT_THROW(gemm_packed_b({4, 41, 8}, a.data(), 8, packed, 0, c.data(), 40, none, scratch),
               Error);
  EXPECT_THROW(gemm_packed_b({4, 8, 7}, a.data(), 8, packed, 0, c.data(), 40, none, scratch),
               Error);
}

SPARSECOL_EVERY_ISA(GemmPackedTest);

TEST(GemmTest, DefaultPathMatchesReferenceAndReusesScratch) {
  std::mt19937 rng(7);
  std::vector<float> scratch;
  for (const GemmShape& s : {GemmShape{128, 96, 77}, GemmShape{1, 1, 1}, GemmShape{33, 17, 5}}) {
    const Problem problem(s.m, s.n, s.k, kVariants[5], rng);
    std::vector<float> c = problem.fresh_c();
    gemm(problem.shape(), problem.a(), problem.lda(), problem.b(), problem.ldb(),
         c.data() + problem.c_offset(), problem.ldc(), problem.epilogue(), scratch);
    EXPECT_EQ(problem.check(c), "") << describe(s, kVariants[5]);
  }
}

TEST(GemmTest, PackingForAnUnavailableIsaThrows) {
  if (isa_available(Isa::kAvx512)) GTEST_SKIP() << "every ISA is available here";
  const float a[4] = {1, 2, 3, 4};
  EXPECT_THROW(PackedA(a, 2, 2, 2, Isa::kAvx512), Error);
}

TEST(GemmTest, RationalErfIsWithinOneMicroOfStdErf) {
  double worst = 0.0;
  for (int i = -200000; i <= 200000; ++i) {
    const float x = static_cast<float>(i) * 5e-5f;  // [-10, 10]
    worst = std::max(worst, std::fabs(static_cast<double>(erf_rational(x)) - std::erf(double(x))));
  }
  EXPECT_LT(worst, 1e-6);
}

TEST(GemmTest, ActivationsFollowTheirDefinitions) {
  EXPECT_EQ(apply_activation(Activation::kNone, -2.5f, 0, 0), -2.5f);
  EXPECT_EQ(apply_activation(Activation::kRelu, -2.5f, 0, 0), 0.0f);
  EXPECT_EQ(apply_activation(Activation::kRelu, 2.5f, 0, 0), 2.5f);
  EXPECT_EQ(apply_activation(Activation::kClip, 9.0f, -1.0f, 6.0f), 6.0f);
  EXPECT_EQ(apply_activation(Activation::kClip, -9.0f, -1.0f, 6.0f), -1.0f);
  EXPECT_EQ(apply_activation(Activation::kClip, 0.5f, -1.0f, 6.0f), 0.5f);
  // GELU(1) = 0.5 (1 + erf(1 / sqrt 2)) = 0.8413447...
  EXPECT_NEAR(apply_activation(Activation::kGelu, 1.0f, 0, 0), 0.8413447460685429, 1e-7);
}

TEST(IsaTest, ReasonNamesTheActiveIsa) {
  const std::string reason = isa_reason();
  const std::string name = to_string(active_isa());
  EXPECT_EQ(reason.rfind(name + ":", 0), 0u) << reason;
  EXPECT_TRUE(isa_available(Isa::kPortable));
}

TEST(IsaTest, EveryIsaHasADefaultUkernelOfThatIsa) {
  for (Isa isa : {Isa::kPortable, Isa::kAvx2, Isa::kAvx512}) {
    EXPECT_EQ(default_gemm_ukernel(isa).isa, isa) << to_string(isa);
  }
}

TEST(IsaTest, EffectiveIsaIsTheLowerOfRequestedAndActive) {
  for (Isa isa : {Isa::kPortable, Isa::kAvx2, Isa::kAvx512}) {
    const Isa expected = isa_available(isa) ? isa : active_isa();
    EXPECT_EQ(effective_isa(isa), expected) << to_string(isa);
    EXPECT_LE(static_cast<int>(effective_isa(isa)), static_cast<int>(isa)) << to_string(isa);
  }
  EXPECT_EQ(effective_isa(Isa::kPortable), Isa::kPortable);
}

TEST(IsaTest, RunnableIsasAreTheAvailableOnesBestFirst) {
  const std::vector<Isa> isas = runnable_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), active_isa());
  EXPECT_EQ(isas.back(), Isa::kPortable);
  for (std::size_t i = 1; i < isas.size(); ++i) {
    EXPECT_LT(static_cast<int>(isas[i]), static_cast<int>(isas[i - 1]));
  }
  for (Isa isa : {Isa::kPortable, Isa::kAvx2, Isa::kAvx512}) {
    EXPECT_EQ(std::count(isas.begin(), isas.end(), isa), isa_available(isa) ? 1 : 0);
  }
}

}  // namespace
}  // namespace sparsecol::kernels
