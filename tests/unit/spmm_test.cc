// The sparse x dense kernels (kernels/f32-spmm) against their naive reference, and the sparse
// lowerings of convolution and linear layers against the reference convolution and GEMM:
// randomized shapes at 0-99% sparsity, empty rows, all-zero weights, column tails that are not
// a multiple of any vector width, every epilogue, row and column sub-regions with strides.
// Every kernel of the list runs; one this machine cannot run is skipped with the reason.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "conv_oracle.h"
#include "f32-conv/conv.h"
#include "f32-gemm/gemm.h"
#include "f32-spmm/spmm.h"
#include "f32-spmm/spmm_jit.h"
#include "per_isa_test.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol::testing {
namespace {

using kernels::Activation;
using kernels::Epilogue;
using kernels::SparseMatrix;

constexpr float kSentinel = -12345.0f;
const double kSparsities[] = {0.0, 0.5, 0.8, 0.9, 0.95, 0.99};

std::vector<float> random_vector(int64_t n, float scale, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// Zeroes each element with probability `sparsity` (unstructured, as magnitude pruning leaves).
void prune(std::vector<float>& w, double sparsity, std::mt19937& rng) {
  std::bernoulli_distribution zero(sparsity);
  for (float& x : w) {
    if (zero(rng)) x = 0.0f;
  }
}

// A random epilogue: every activation in both positions, biases and residual on or off.
struct EpilogueData {
  std::vector<float> row_bias, col_bias, residual;
  Epilogue epilogue;
};

EpilogueData random_epilogue(int64_t rows, int64_t cols, int64_t residual_ld, std::mt19937& rng) {
  const Activation acts[] = {Activation::kNone, Activation::kRelu, Activation::kClip,
                             Activation::kGelu};
  EpilogueData d;
  d.row_bias = random_vector(rows, 0.5f, rng);
  d.col_bias = random_vector(cols, 0.5f, rng);
  d.residual = random_vector(rows * residual_ld, 1.0f, rng);
  Epilogue& e = d.epilogue;
  if (rng() % 2 == 0) e.row_bias = d.row_bias.data();
  if (rng() % 2 == 0) e.col_bias = d.col_bias.data();
  e.pre_residual = acts[rng() % 4];
  e.post_residual = acts[rng() % 4];
  e.clip_min = -0.25f;
  e.clip_max = 0.5f;
  if (rng() % 2 == 0) {
    e.residual = d.residual.data();
    e.residual_ld = residual_ld;
  }
  return d;
}

class SpmmKernelTest : public ::testing::TestWithParam<kernels::SpmmUkernel> {
 protected:
  void SetUp() override {
    if (!kernels::isa_available(GetParam().isa)) {
      GTEST_SKIP() << GetParam().name << " cannot run here: " << kernels::isa_reason();
    }
  }
};

// One problem: A (rows x depth, `sparsity`) over B (depth rows at a random stride), a region of
// rows [r0, r1) x columns [c0, c0 + n) into a dst with a wider stride, starting from zero or
// (accumulate) from random partial sums in the region; the kernel and the reference run on the
// same arguments, and nothing outside the region may be written.
// With `shifts` > 1 the matrix is packed shifted (SparseMatrix, `lanes` the kernel's vector
// width): B rows a whole number of vectors apart, each from a random shift below `shifts`, and
// the slack past B that such a product may read.
// With `offset_shift` >= 0 the product is one column, reassociated (SpmmArgs::reassociate), its
// offsets scaled up by 2^offset_shift (SpmmArgs::offset_shift).
void check_region(const kernels::SpmmUkernel& ukernel, int64_t rows, int64_t depth, int64_t n,
                  double sparsity, std::mt19937& rng, int64_t shifts = 1, int offset_shift = -1) {
  const int64_t lanes = ukernel.tile / 8;
  const int64_t ldb = (n + 3 + static_cast<int64_t>(rng() % 40) + lanes - 1) / lanes * lanes;
  const int64_t c0 = static_cast<int64_t>(rng() % 3);
  const int64_t cols = c0 + n;
  std::vector<float> a = random_vector(rows * depth, 1.0f, rng);
  prune(a, sparsity, rng);
  if (rows > 2) std::fill_n(a.begin() + depth, depth, 0.0f);  // an empty row
  std::vector<int64_t> b_rows(static_cast<std::size_t>(depth));
  for (int64_t k = 0; k < depth; ++k) {
    b_rows[static_cast<std::size_t>(k)] = (k * ldb + static_cast<int64_t>(rng() % shifts))
                                          << std::max(offset_shift, 0);
  }
  const SparseMatrix m(a.data(), rows, depth, depth, 1, 1, b_rows, shifts > 1 ? lanes : 1);
  const std::vector<float> b = random_vector(depth * ldb + 2 * kernels::kSpmmMaxLanes, 1.0f, rng);
  const int64_t ldd = cols + 5;
  EpilogueData ed = random_epilogue(rows, cols, ldd, rng);
  const int64_t r0 = rows > 1 ? static_cast<int64_t>(rng() % 2) : 0;
  const int64_t r1 = rows - (rows > 3 ? static_cast<int64_t>(rng() % 2) : 0);

  // The epilogue's pointers at the region's origin (row r0, column c0).
  Epilogue e = ed.epilogue;
  if (e.row_bias != nullptr) e.row_bias += r0;
  if (e.col_bias != nullptr) e.col_bias += c0;
  if (e.residual != nullptr) e.residual += r0 * e.residual_ld + c0;
  kernels::SpmmArgs args;
  args.rows = r1 - r0;
  args.n = n;
  args.row_ptr = m.row_ptr() + r0 * m.shifts();
  args.shifts = m.shifts();
  args.values = m.values();
  args.offsets = m.offsets();
  args.src = b.data() + c0;
  args.ldd = ldd;
  args.epilogue = &e;
  args.accumulate = rng() % 2 == 0;
  args.reassociate = offset_shift >= 0;
  args.offset_shift = std::max(offset_shift, 0);
  std::vector<float> want(static_cast<std::size_t>(rows * ldd), kSentinel);
  if (args.accumulate) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = c0; c < cols; ++c) {
        want[static_cast<std::size_t>(r * ldd + c)] = static_cast<float>(rng() % 17) - 8.0f;
      }
    }
  }
  std::vector<float> have = want;
  args.dst = want.data() + r0 * ldd + c0;
  kernels::f32_spmm__reference(args);
  args.dst = have.data() + r0 * ldd + c0;
  ukernel.fn(args);

  const float tolerance = 1e-5f * std::sqrt(static_cast<float>(depth)) + 1e-6f;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < ldd; ++c) {
      const float w = want[static_cast<std::size_t>(r * ldd + c)];
      const float h = have[static_cast<std::size_t>(r * ldd + c)];
      if (w == kSentinel) {
        ASSERT_EQ(h, kSentinel) << "wrote outside the region at row " << r << " column " << c;
      } else {
        ASSERT_NEAR(h, w, tolerance * (1.0f + std::abs(w))) << "row " << r << " column " << c;
      }
    }
  }
}

TEST_P(SpmmKernelTest, MatchesReferenceOnRandomRegions) {
  std::mt19937 rng(1234);
  const int tile = GetParam().tile;
  // Column counts below, at and above every vector width and the tile, and tails that join the
  // last full tile (up to 4 vectors past it) or do not (5). Shifted, a tile ending 2 or more lanes
  // before its last vector's end (6, 14, 30) needs no sums from past it, one ending 1 lane
  // before (7, 15, 31) does for shift 2.
  const int64_t lanes = tile / 8;
  std::vector<int64_t> widths = {1,  3,  4,  5,  6,  7,  8,  9,  14, 15,  16,
                                 17, 30, 31, 32, 33, 47, 63, 64, 65, 100, 129};
  for (const int64_t past : {lanes + 1, 4 * lanes, 4 * lanes + 1, tile + 3 * lanes - 1}) {
    widths.push_back(tile + past);
  }
  for (const int64_t shifts : {int64_t{1}, int64_t{2}, kernels::kMaxSpmmShifts}) {
    for (const double sparsity : kSparsities) {
      for (const int64_t n : widths) {
        const int64_t rows = 1 + static_cast<int64_t>(rng() % 9);
        const int64_t depth = 1 + static_cast<int64_t>(rng() % 200);
        SCOPED_TRACE(fmt::format("{}: {} x {} at {:.0f}%, {} columns (tile {}), shifts {}",
                                 GetParam().name, rows, depth, 100 * sparsity, n, tile, shifts));
        check_region(GetParam(), rows, depth, n, sparsity, rng, shifts);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// One column, reassociated (a linear layer on one token): rows of 0 to ~300 non-zeros, so that
// every count of partial sums and a row's tail occur, with offsets scaled or not.
TEST_P(SpmmKernelTest, ReassociatedColumnMatchesReference) {
  std::mt19937 rng(77);
  for (const int offset_shift : {0, 6}) {
    for (const double sparsity : kSparsities) {
      for (int trial = 0; trial < 4; ++trial) {
        const int64_t rows = 1 + static_cast<int64_t>(rng() % 9);
        const int64_t depth = 1 + static_cast<int64_t>(rng() % 300);
        SCOPED_TRACE(fmt::format("{}: {} x {} at {:.0f}%, offsets << {}", GetParam().name, rows,
                                 depth, 100 * sparsity, offset_shift));
        check_region(GetParam(), rows, depth, 1, sparsity, rng, 1, offset_shift);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST_P(SpmmKernelTest, AllZeroWeightsGiveTheEpilogueOfZero) {
  std::mt19937 rng(5);
  check_region(GetParam(), 5, 37, 45, 1.0, rng);
  // Nothing but the bias: every output equals its row bias.
  const std::vector<float> a(6 * 10, 0.0f);
  const std::vector<int64_t> b_rows(10, 0);
  const SparseMatrix m(a.data(), 6, 10, 10, 1, 1, b_rows);
  EXPECT_EQ(m.nnz(), 0);
  EXPECT_EQ(m.sparsity(), 1.0);
  const std::vector<float> b(64, 1.0f), bias = {1, 2, 3, 4, 5, 6};
  std::vector<float> dst(6 * 33, kSentinel);
  Epilogue e;
  e.row_bias = bias.data();
  kernels::SpmmArgs args{6, 33, m.row_ptr(), m.values(), m.offsets(), b.data(), dst.data(), 33, &e};
  GetParam().fn(args);
  for (int64_t i = 0; i < 6 * 33; ++i) ASSERT_EQ(dst[static_cast<std::size_t>(i)], bias[i / 33]);
}

// Every element is summed in the same order whatever the tile it falls in, so splitting the
// columns of a call (as the schedules do by thread count) never changes a bit; packed plain or
// shifted.
TEST_P(SpmmKernelTest, ColumnSplitsGiveIdenticalBits) {
  std::mt19937 rng(9);
  const int64_t rows = 7, depth = 150, n = 203, lanes = GetParam().tile / 8;
  const int64_t ldb = (n + lanes - 1) / lanes * lanes;
  std::vector<float> a = random_vector(rows * depth, 1.0f, rng);
  prune(a, 0.7, rng);
  for (const int64_t shifts : {int64_t{1}, kernels::kMaxSpmmShifts}) {
    std::vector<int64_t> b_rows(depth);
    for (int64_t k = 0; k < depth; ++k) b_rows[static_cast<std::size_t>(k)] = k * ldb + k % shifts;
    const SparseMatrix m(a.data(), rows, depth, depth, 1, 1, b_rows, shifts > 1 ? lanes : 1);
    ASSERT_EQ(m.shifts(), shifts);
    const std::vector<float> b = random_vector(depth * ldb + 2 * kernels::kSpmmMaxLanes, 1.0f, rng);
    std::vector<float> whole(rows * n), split(rows * n);
    kernels::SpmmArgs args{rows,         n, m.row_ptr(), m.values(), m.offsets(), b.data(),
                           whole.data(), n, nullptr};
    args.shifts = m.shifts();
    GetParam().fn(args);
    for (int64_t c0 = 0; c0 < n;) {
      const int64_t c1 = std::min(n, c0 + 1 + static_cast<int64_t>(rng() % 40));
      args.n = c1 - c0;
      args.src = b.data() + c0;
      args.dst = split.data() + c0;
      GetParam().fn(args);
      c0 = c1;
    }
    EXPECT_EQ(whole, split) << "shifts " << shifts;
  }
}

// A product split by columns of A (depth), the later blocks accumulating and the last applying
// the epilogue, gives the bits of one call: what the K-blocks of the sparse convolutions rely on.
TEST_P(SpmmKernelTest, DepthSplitsGiveIdenticalBits) {
  std::mt19937 rng(11);
  const int64_t rows = 9, depth = 230, n = 150;
  std::vector<float> a = random_vector(rows * depth, 1.0f, rng);
  prune(a, 0.8, rng);
  std::vector<int64_t> b_rows(depth);
  for (int64_t k = 0; k < depth; ++k) b_rows[static_cast<std::size_t>(k)] = k * n;
  const SparseMatrix m(a.data(), rows, depth, depth, 1, 1, b_rows);
  const std::vector<float> b = random_vector(depth * n, 1.0f, rng);
  EpilogueData ed = random_epilogue(rows, n, n, rng);
  ed.epilogue.row_bias = ed.row_bias.data();
  ed.epilogue.post_residual = Activation::kRelu;
  std::vector<float> whole(rows * n), split(rows * n);
  kernels::SpmmArgs args{rows,         n, m.row_ptr(), m.values(), m.offsets(), b.data(),
                         whole.data(), n, &ed.epilogue};
  GetParam().fn(args);
  const int64_t cuts[] = {0, 1, 77, 78, 200, depth};  // blocks of 1, 76, 1, 122 and 30 columns
  args.dst = split.data();
  const Epilogue none;
  for (std::size_t i = 0; i + 1 < std::size(cuts); ++i) {
    const int64_t k0 = cuts[i], k1 = cuts[i + 1];
    const SparseMatrix block(a.data() + k0, rows, k1 - k0, depth, 1, 1,
                             std::span<const int64_t>(b_rows).subspan(
                                 static_cast<std::size_t>(k0), static_cast<std::size_t>(k1 - k0)));
    args.row_ptr = block.row_ptr();
    args.values = block.values();
    args.offsets = block.offsets();
    args.accumulate = i > 0;
    args.epilogue = k1 == depth ? &ed.epilogue : &none;
    GetParam().fn(args);
  }
  EXPECT_EQ(whole, split);
}

INSTANTIATE_TEST_SUITE_P(EveryKernel, SpmmKernelTest,
                         ::testing::ValuesIn(kernels::spmm_ukernels().begin(),
                                             kernels::spmm_ukernels().end()),
                         [](const ::testing::TestParamInfo<kernels::SpmmUkernel>& info) {
                           return std::string(info.param.name);
                         });

// B row k's offset where B holds a 3x3 layer's column taps (kx = k % 3) of input row k / 3 in
// planes `pitch` floats apart, a whole number of lines: at stride 1 the taps lie 0, 1 and 2
// floats into the row's plane; at stride 2 kx = 0 and 2 lie 0 and 1 float into its even-column
// phase plane and kx = 1 at the start of the odd one. The generated code reads the shifted
// taps out of aligned pairs of vectors.
int64_t tap_offset(int64_t k, int64_t pitch, int stride) {
  const int64_t row = k / 3, kx = k % 3;
  return stride == 1 ? row * pitch + kx : row * 2 * pitch + (kx == 1 ? pitch : kx / 2);
}

// Code generated for a weight (spmm_jit.h) against the spmm kernel of this machine: the same
// bits, and nothing written outside the region, over random shapes of 12 rows (at 80%, the
// fewest for which there is code) to 3 blocks and a part, 0-80% sparsity, every epilogue the code
// takes (and GELU or a column bias, which fall back to the kernel), row ranges that start and end
// inside blocks, column tails, and B rows at a random stride, in the layout of the packing or
// in another one the code was made for, or laid out as a 3x3 layer's taps.
TEST(SpmmJitTest, GivesTheKernelsBitsOnRandomRegions) {
  if (kernels::active_isa() != kernels::Isa::kAvx512) {
    GTEST_SKIP() << "generated code needs AVX-512: " << kernels::isa_reason();
  }
  std::mt19937 rng(31);
  for (const double sparsity : {0.0, 0.5, 0.8}) {
    for (int trial = 0; trial < 16; ++trial) {
      const int64_t rows = 12 + static_cast<int64_t>(rng() % (3 * kernels::kSpmmJitRows));
      const int64_t depth = 1 + static_cast<int64_t>(rng() % 300);
      const int64_t n = 1 + static_cast<int64_t>(rng() % 400);
      SCOPED_TRACE(fmt::format("{} x {} at {:.0f}%, {} columns", rows, depth, 100 * sparsity, n));
      std::vector<float> a = random_vector(rows * depth, 1.0f, rng);
      prune(a, sparsity, rng);
      if (rows > 2) std::fill_n(a.begin() + depth, depth, 0.0f);  // an empty row
      // Packed for B rows `packed_ld` apart, run on B rows `ld` apart half the time; or, a
      // third of the time, for a 3x3 layer's taps at stride 1 or 2 (tap_offset) over planes
      // `packed_ld` apart.
      const int taps = rng() % 3 == 0 ? 1 + static_cast<int>(rng() % 2) : 0;
      const int64_t packed_ld =
          taps > 0 ? (n + 2 + 15) / 16 * 16 : n + static_cast<int64_t>(rng() % 20);
      const int64_t ld = rng() % 2 == 0 ? packed_ld : n + static_cast<int64_t>(rng() % 40);
      auto row_offset = [&](int64_t k, int64_t pitch) {
        return taps > 0 ? tap_offset(k, pitch, taps) : k * pitch;
      };
      std::vector<int64_t> packed_rows(depth), b_rows(depth);
      for (int64_t k = 0; k < depth; ++k) {
        packed_rows[static_cast<std::size_t>(k)] = row_offset(k, packed_ld);
        b_rows[static_cast<std::size_t>(k)] = row_offset(k, ld);
      }
      const SparseMatrix m(a.data(), rows, depth, depth, 1, 1, packed_rows);
      // Code for the layout B is in: the packing's (named by its offsets half the time, by
      // none the other half), or the other one.
      const bool packed = ld == packed_ld;
      const auto jit = packed && rng() % 2 == 0 ? kernels::SpmmJit::generate(m)
                                                : kernels::SpmmJit::generate(m, b_rows);
      ASSERT_NE(jit, nullptr);
      if (taps > 0 && depth > 2 && packed) {
        EXPECT_TRUE(jit->reads_pairs());
      }
      std::vector<int32_t> remapped;
      m.offsets_for(b_rows, remapped);
      const int32_t* offsets = ld == packed_ld ? m.offsets() : remapped.data();
      const std::vector<float> b =
          random_vector(*std::max_element(b_rows.begin(), b_rows.end()) + n, 1.0f, rng);

      // Rows from the first or a random one, to the last or a random one: most ranges hold a
      // whole block, which the code computes (the rest run through the kernel).
      const int64_t r0 = rng() % 2 == 0 ? 0 : static_cast<int64_t>(rng() % rows);
      const int64_t r1 = rng() % 2 == 0 ? rows : r0 + 1 + static_cast<int64_t>(rng() % (rows - r0));
      const int64_t ldd = n + 3;
      EpilogueData ed = random_epilogue(rows, n, ldd, rng);
      if (rng() % 4 != 0) {  // mostly an epilogue the code takes
        ed.epilogue.col_bias = nullptr;
        for (Activation* act : {&ed.epilogue.pre_residual, &ed.epilogue.post_residual}) {
          if (*act == Activation::kGelu) *act = Activation::kRelu;
        }
      }
      Epilogue e = ed.epilogue;
      if (e.row_bias != nullptr) e.row_bias += r0;
      if (e.residual != nullptr) e.residual += r0 * e.residual_ld;
      std::vector<float> want(static_cast<std::size_t>(rows * ldd), kSentinel), have = want;
      kernels::spmm(m, offsets, r0, r1, b.data(), n, want.data() + r0 * ldd, ldd, e);
      jit->run(m, offsets, r0, r1, b.data(), n, have.data() + r0 * ldd, ldd, e);
      ASSERT_EQ(have, want) << "rows [" << r0 << ", " << r1 << "), B rows " << ld << " apart";
    }
  }
}

// Floats placed against a page that nothing may read or write, just before the first one or
// just after the last: a load or store one element outside them faults. ASan does not see into
// the generated code; this does, for accesses that leave the arrays they were given.
class GuardedFloats {
 public:
  enum class Guard { kBefore, kAfter };
  GuardedFloats(const std::vector<float>& init, Guard guard) : count_(init.size()) {
    const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    const std::size_t bytes = (count_ * sizeof(float) + page - 1) / page * page;
    mapped_ = bytes + 2 * page;
    void* base = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) throw std::runtime_error("mmap failed");
    base_ = static_cast<char*>(base);
    if (mprotect(base_, page, PROT_NONE) != 0 ||
        mprotect(base_ + page + bytes, page, PROT_NONE) != 0) {
      munmap(base_, mapped_);
      throw std::runtime_error("mprotect failed");
    }
    char* first =
        guard == Guard::kBefore ? base_ + page : base_ + page + bytes - count_ * sizeof(float);
    data_ = reinterpret_cast<float*>(first);
    std::copy(init.begin(), init.end(), data_);
  }
  GuardedFloats(const GuardedFloats&) = delete;
  GuardedFloats& operator=(const GuardedFloats&) = delete;
  ~GuardedFloats() { munmap(base_, mapped_); }
  float* data() { return data_; }
  std::vector<float> values() const { return {data_, data_ + count_}; }

 private:
  std::size_t count_, mapped_ = 0;
  char* base_ = nullptr;
  float* data_ = nullptr;
};

// B, the output region, the residual and the row bias each exactly as large as the product
// reads or writes them (B rows and output rows n apart, so that the last column of the last row
// ends the array), with no-access pages around them: the code (and the kernel it hands rows
// to) runs without a fault and gives the kernel's bits. Column tails (n not a multiple of 16)
// are where a load or store without its mask would cross into the page after.
TEST(SpmmJitTest, TouchesNothingOutsideItsArrays) {
  if (kernels::active_isa() != kernels::Isa::kAvx512) {
    GTEST_SKIP() << "generated code needs AVX-512: " << kernels::isa_reason();
  }
  using Guard = GuardedFloats::Guard;
  std::mt19937 rng(57);
  for (int trial = 0; trial < 16; ++trial) {
    const int64_t rows = kernels::kSpmmJitRows * (1 + static_cast<int64_t>(rng() % 3)) +
                         static_cast<int64_t>(rng() % 5);
    const int64_t depth = 8 + static_cast<int64_t>(rng() % 200);
    const int64_t n = 1 + static_cast<int64_t>(rng() % 300);
    // Two trials in three, B rows as a 3x3 layer's taps at stride 1 or 2 (tap_offset), read out
    // of aligned pairs; B ends with the row that reaches furthest.
    const int taps = trial % 3;
    SCOPED_TRACE(fmt::format("{} x {}, {} columns, taps at stride {}", rows, depth, n, taps));
    std::vector<float> a = random_vector(rows * depth, 1.0f, rng);
    prune(a, 0.7, rng);
    const int64_t pitch = (n + 2 + 15) / 16 * 16;
    std::vector<int64_t> b_rows(static_cast<std::size_t>(depth));
    for (int64_t k = 0; k < depth; ++k) {
      b_rows[static_cast<std::size_t>(k)] = taps > 0 ? tap_offset(k, pitch, taps) : k * n;
    }
    const SparseMatrix m(a.data(), rows, depth, depth, 1, 1, b_rows);
    const auto jit = kernels::SpmmJit::generate(m);
    ASSERT_NE(jit, nullptr);
    if (taps > 0) {
      EXPECT_TRUE(jit->reads_pairs());
    }
    const int64_t r0 = static_cast<int64_t>(rng() % 3);
    const int64_t r1 = rows - static_cast<int64_t>(rng() % 3);
    const std::vector<float> b =
        random_vector(*std::max_element(b_rows.begin(), b_rows.end()) + n, 1.0f, rng);
    const std::vector<float> row_bias = random_vector(r1 - r0, 0.5f, rng);
    const std::vector<float> residual = random_vector((r1 - r0) * n, 1.0f, rng);
    Epilogue e;
    e.row_bias = row_bias.data();
    e.residual = residual.data();
    e.residual_ld = n;
    e.pre_residual = Activation::kClip;
    e.post_residual = Activation::kRelu;
    e.clip_min = -0.25f;
    e.clip_max = 0.5f;
    std::vector<float> want(static_cast<std::size_t>((r1 - r0) * n));
    kernels::spmm(m, m.offsets(), r0, r1, b.data(), n, want.data(), n, e);
    for (const Guard guard : {Guard::kBefore, Guard::kAfter}) {
      GuardedFloats guarded_b(b, guard), guarded_bias(row_bias, guard),
          guarded_residual(residual, guard), dst(std::vector<float>(want.size(), kSentinel), guard);
      Epilogue g = e;
      g.row_bias = guarded_bias.data();
      g.residual = guarded_residual.data();
      jit->run(m, m.offsets(), r0, r1, guarded_b.data(), n, dst.data(), n, g);
      EXPECT_EQ(dst.values(), want) << (guard == Guard::kBefore ? "guard before" : "guard after");
    }
  }
}

// Where the code would not pay (sparser than SpmmJit::kMinNonZerosPerLoad allows) or cannot
// run the packing (shift groups) or address B, there is none.
TEST(SpmmJitTest, GeneratesNothingWhereItWouldNotPayOrCannotRun) {
  std::mt19937 rng(8);
  const int64_t rows = 64, depth = 200;
  std::vector<float> a = random_vector(rows * depth, 1.0f, rng);
  std::vector<int64_t> b_rows(depth);
  for (int64_t k = 0; k < depth; ++k) b_rows[static_cast<std::size_t>(k)] = k * 64 + k % 3;
  const bool avx512 = kernels::active_isa() == kernels::Isa::kAvx512;
  EXPECT_EQ(kernels::SpmmJit::generate(SparseMatrix(a.data(), rows, depth, depth, 1, 1, b_rows)) !=
                nullptr,
            avx512);
  EXPECT_EQ(kernels::SpmmJit::generate(
                SparseMatrix(a.data(), rows, depth, depth, 1, 1, b_rows, kernels::kSpmmMaxLanes)),
            nullptr);
  // A layout whose B rows lie beyond a 32-bit displacement: none; one of the wrong size: an
  // error.
  const SparseMatrix m(a.data(), rows, depth, depth, 1, 1, b_rows);
  std::vector<int64_t> far(b_rows);
  far.back() = int64_t{1} << 30;
  EXPECT_EQ(kernels::SpmmJit::generate(m, far), nullptr);
  far.pop_back();
  if (avx512) {
    EXPECT_THROW(kernels::SpmmJit::generate(m, far), Error);
  }
  prune(a, 0.97, rng);  // 28 rows x 3% = 0.84 non-zeros per B row and block
  EXPECT_EQ(kernels::SpmmJit::generate(SparseMatrix(a.data(), rows, depth, depth, 1, 1, b_rows)),
            nullptr);
}

TEST(SparseMatrixTest, PacksNonZerosInColumnOrderWithTheirOffsets) {
  // Two groups of two rows over depth 3: group 1's column k is B row 3 + k.
  const std::vector<float> a = {0,     2, 0,  //
                                1,     0, 3,  //
                                0,     0, 0,  //
                                -0.0f, 4, 5};
  const std::vector<int64_t> b_rows = {0, 10, 20, 30, 40, 50};
  const SparseMatrix m(a.data(), 4, 3, 3, 1, 2, b_rows);
  EXPECT_EQ(m.nnz(), 5);
  EXPECT_DOUBLE_EQ(m.sparsity(), 7.0 / 12.0);
  EXPECT_EQ(std::vector<int32_t>(m.row_ptr(), m.row_ptr() + 5),
            (std::vector<int32_t>{0, 1, 3, 3, 5}));
  EXPECT_EQ(std::vector<float>(m.values(), m.values() + 5), (std::vector<float>{2, 1, 3, 4, 5}));
  EXPECT_EQ(std::vector<int32_t>(m.offsets(), m.offsets() + 5),
            (std::vector<int32_t>{10, 0, 20, 40, 50}));
  std::vector<int32_t> remapped;
  m.offsets_for(std::vector<int64_t>{0, 1, 2, 3, 4, 5}, remapped);
  EXPECT_EQ(remapped, (std::vector<int32_t>{1, 0, 2, 4, 5}));
  EXPECT_EQ(m.packed_bytes(), 5 * 4 + 5 * 4 + 5 * 4);
}

// Shifted packing: each row's non-zeros grouped by their B row's offset % lanes, in column order
// within a group, offsets cut to the aligned base; a shift past kMaxSpmmShifts is refused, and
// so is re-mapping the offsets.
TEST(SparseMatrixTest, ShiftedPackingGroupsNonZerosByShift) {
  const std::vector<float> a = {1, 2, 3, 4,  //
                                0, 5, 0, 6};
  const std::vector<int64_t> b_rows = {32, 17, 2, 48};  // shifts 0, 1, 2, 0 at 16 lanes
  const SparseMatrix m(a.data(), 2, 4, 4, 1, 1, b_rows, 16);
  ASSERT_EQ(m.shifts(), 3);
  EXPECT_EQ(std::vector<int32_t>(m.row_ptr(), m.row_ptr() + 7),
            (std::vector<int32_t>{0, 2, 3, 4, 5, 6, 6}));
  EXPECT_EQ(std::vector<float>(m.values(), m.values() + 6), (std::vector<float>{1, 4, 2, 3, 6, 5}));
  EXPECT_EQ(std::vector<int32_t>(m.offsets(), m.offsets() + 6),
            (std::vector<int32_t>{32, 48, 16, 0, 48, 16}));
  std::vector<int32_t> out;
  EXPECT_THROW(m.offsets_for(b_rows, out), Error);
  EXPECT_THROW(SparseMatrix(a.data(), 2, 4, 4, 1, 1, std::vector<int64_t>{0, 3, 0, 0}, 16), Error);
  EXPECT_EQ(SparseMatrix(a.data(), 2, 4, 4, 1, 1, std::vector<int64_t>{0, 3, 0, 0}).shifts(), 1);
}

TEST(SparseMatrixTest, RefusesBadShapesAndOffsetsBeyond32Bits) {
  const std::vector<float> a(12, 1.0f);
  EXPECT_THROW(SparseMatrix(a.data(), 4, 3, 3, 1, 1, std::vector<int64_t>(2, 0)), Error);
  EXPECT_THROW(SparseMatrix(a.data(), 3, 4, 4, 1, 2, std::vector<int64_t>(8, 0)), Error);
  EXPECT_THROW(SparseMatrix(a.data(), 4, 3, 3, 1, 1, std::vector<int64_t>{0, 1, int64_t{1} << 33}),
               Error);
  const SparseMatrix m(a.data(), 4, 3, 3, 1, 1, std::vector<int64_t>{0, 1, 2});
  std::vector<int32_t> out;
  EXPECT_THROW(m.offsets_for(std::vector<int64_t>{0, 1}, out), Error);
}

TEST(SparseThresholdTest, OptionOverridesTheMeasuredDefault) {
  using kernels::SparseLayerKind;
  EXPECT_EQ(kernels::resolve_sparse_threshold(-1.0, SparseLayerKind::kConv),
            kernels::kConvSparseThreshold);
  EXPECT_EQ(kernels::resolve_sparse_threshold(-1.0, SparseLayerKind::kLinear),
            kernels::kLinearSparseThreshold);
  EXPECT_EQ(kernels::resolve_sparse_threshold(0.3, SparseLayerKind::kConv), 0.3);
  const std::vector<float> w = {0, 1, 0, 0};
  EXPECT_DOUBLE_EQ(kernels::zero_fraction(w.data(), 4), 0.75);
}

// ---- Sparse convolution vs the reference convolution ----

struct ConvProblem {
  kernels::ConvGeometry g;
  std::vector<float> src, weight, bias, residual, expected;
  Epilogue epilogue;
  bool has_residual;

  ConvProblem(const kernels::ConvGeometry& geometry, double sparsity, std::mt19937& rng)
      : g(geometry) {
    const int64_t depth = g.in_c / g.groups * g.kernel_h * g.kernel_w;
    src = random_vector(g.in_c * g.in_h * g.in_w, 1.0f, rng);
    weight = random_vector(g.out_c * depth, 1.0f / std::sqrt(static_cast<float>(depth)), rng);
    prune(weight, sparsity, rng);
    bias = random_vector(g.out_c, 0.5f, rng);
    residual = random_vector(g.out_c * g.out_h * g.out_w, 1.0f, rng);
    const Activation acts[] = {Activation::kNone, Activation::kRelu, Activation::kClip,
                               Activation::kGelu};
    epilogue.pre_residual = acts[rng() % 4];
    epilogue.post_residual = acts[rng() % 4];
    epilogue.clip_min = 0.0f;
    epilogue.clip_max = 6.0f;
    has_residual = rng() % 2 == 0;
    expected = expected_conv(g, src.data(), weight.data(), bias.data(),
                             has_residual ? residual.data() : nullptr, epilogue);
  }
};

// Copies rows [first, last) of each plane of a [channels x rows x width] tensor (a tile buffer).
std::vector<float> copy_rows(const std::vector<float>& t, int64_t channels, int64_t rows,
                             int64_t width, int64_t first, int64_t last) {
  std::vector<float> tile(static_cast<std::size_t>(channels * (last - first) * width));
  for (int64_t c = 0; c < channels; ++c) {
    std::copy_n(t.begin() + (c * rows + first) * width, (last - first) * width,
                tile.begin() + c * (last - first) * width);
  }
  return tile;
}

// Output rows [r0, r1) x channels [c0, c1) through tile buffers holding only the needed input
// rows (row0 > 0, another plane stride: the depth-wise schedule's case), checked against the
// reference; nothing outside the region may be written.
void check_conv_region(const kernels::PackedConv& conv, const ConvProblem& p, int64_t r0,
                       int64_t r1, int64_t c0, int64_t c1) {
  const kernels::ConvGeometry& g = p.g;
  int64_t first = 0, last = 0;
  kernels::conv_input_rows(g, r0, r1, &first, &last);
  std::vector<float> src_tile = copy_rows(p.src, g.in_c, g.in_h, g.in_w, first, last);
  std::vector<float> res_tile = copy_rows(p.residual, g.out_c, g.out_h, g.out_w, r0, r1);
  const int64_t out_plane = (r1 - r0) * g.out_w;
  std::vector<float> dst(static_cast<std::size_t>(g.out_c * out_plane), kSentinel);
  const kernels::PlaneView src_view{src_tile.data(), first, (last - first) * g.in_w};
  const kernels::PlaneView dst_view{dst.data(), r0, out_plane};
  const kernels::PlaneView res_view{res_tile.data(), r0, out_plane};
  std::vector<float> scratch;
  kernels::conv2d_region(conv, src_view, dst_view, r0, r1, c0, c1, p.epilogue,
                         p.has_residual ? &res_view : nullptr, scratch);
  const float tolerance =
      2e-5f * std::sqrt(static_cast<float>(g.in_c / g.groups * g.kernel_h * g.kernel_w)) + 1e-5f;
  for (int64_t c = 0; c < g.out_c; ++c) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t x = 0; x < g.out_w; ++x) {
        const float have = dst[static_cast<std::size_t>(c * out_plane + (r - r0) * g.out_w + x)];
        if (c < c0 || c >= c1) {
          ASSERT_EQ(have, kSentinel)
              << "wrote channel " << c << " outside [" << c0 << ", " << c1 << ")";
          continue;
        }
        const float want = p.expected[static_cast<std::size_t>((c * g.out_h + r) * g.out_w + x)];
        ASSERT_NEAR(have, want, tolerance * (1.0f + std::abs(want)))
            << conv.implementation() << " rows [" << r0 << ", " << r1 << ") at c=" << c
            << " y=" << r << " x=" << x;
      }
    }
  }
  // Over the residual's own tile, where the implementation allows it: the same bits in the
  // region, the residual's other channels as they were.
  if (!p.has_residual || !conv.may_overwrite_residual()) return;
  std::vector<float> over = res_tile;
  const kernels::PlaneView over_view{over.data(), r0, out_plane};
  kernels::conv2d_region(conv, src_view, over_view, r0, r1, c0, c1, p.epilogue, &over_view,
                         scratch);
  for (std::size_t i = 0; i < over.size(); ++i) {
    const auto c = static_cast<int64_t>(i) / out_plane;
    ASSERT_EQ(over[i], c < c0 || c >= c1 ? res_tile[i] : dst[i])
        << conv.implementation() << " over the residual, channel " << c;
  }
}

using SparseConvTest = PerIsaTest;

TEST_P(SparseConvTest, MatchesReferenceConvolution) {
  const kernels::Isa isa = GetParam();
  std::mt19937 rng(77);
  const ConvCase cases[] = {
      {"1x1", 24, 20, 9, 13, 1, 1, 0, 1, 1},
      {"1x1_grouped", 24, 20, 7, 11, 1, 1, 0, 1, 4},
      // Enough input channels for K-blocks of a 1x1 layer at the lower sparsities.
      {"1x1_k_blocks", 300, 8, 5, 7, 1, 1, 0, 1, 1},
      // More input than output channels on 70-200 pixels: summed in two halves of its input
      // channels (conv.h, kInputHalvesMaxPixels), the halves 64 and 36 channels.
      {"1x1_input_halves", 100, 24, 10, 14, 1, 1, 0, 1, 1},
      // Strided 1x1: gathered (conv.h, gathers_strided_pointwise), unless a tap can fall in the
      // padding (phase planes).
      {"1x1_stride2", 16, 24, 9, 13, 1, 2, 0, 1, 1},
      {"1x1_stride3_grouped", 16, 24, 10, 11, 1, 3, 0, 1, 2},
      {"1x1_stride2_pad1", 16, 24, 9, 13, 1, 2, 1, 1, 1},
      {"3x3_s1_p1", 16, 24, 11, 37, 3, 1, 1, 1, 1},
      {"3x3_s1_p0", 8, 12, 9, 9, 3, 1, 0, 1, 1},
      {"3x3_s1_dilation2", 8, 12, 12, 19, 3, 1, 2, 2, 1},
      {"3x3_s1_grouped", 12, 18, 10, 10, 3, 1, 1, 1, 3},
      {"3x3_s2_p1", 16, 24, 14, 23, 3, 2, 1, 1, 1},
      {"3x3_s2_grouped", 8, 16, 9, 9, 3, 2, 1, 1, 2},
      {"5x5_s1_p2", 6, 10, 8, 70, 5, 1, 2, 1, 1},
      // Phase rows of 16 floats whose taps reach 4 columns: too far for the shifted packing.
      {"5x5_s1_16_float_rows", 6, 10, 8, 12, 5, 1, 2, 1, 1},
      {"7x7_s2_p3_stem", 3, 16, 21, 21, 7, 2, 3, 1, 1},
      // Rows of 9 floats sharing their padding column with the next: 8 apart (conv.cc,
      // phase_row_overlap), half of AVX-512's vector; and, at stride 2, rows of 8.
      {"3x3_s1_7x7_image_shifted", 32, 40, 7, 7, 3, 1, 1, 1, 1},
      {"3x3_s2_14_wide_shifted", 16, 12, 6, 14, 3, 2, 1, 1, 1},
      // Enough input channels that the phase path splits them into K-blocks at every ISA's
      // tile (conv.cc, sparse_l1_budget_floats): several blocks below 99%, the channel count
      // not dividing.
      {"3x3_s1_k_blocks", 145, 6, 5, 21, 3, 1, 1, 1, 1},
      // Phase rows that pad to a whole number of vectors at every ISA (16 and 32 floats, 56 in
      // at stride 2: 29 -> 32): the shifted packing (conv.cc, sparse_phase_pitch), also in
      // K-blocks.
      {"3x3_s1_14_wide_shifted", 24, 20, 9, 14, 3, 1, 1, 1, 1},
      {"3x3_s1_30_wide_shifted", 16, 12, 6, 30, 3, 1, 1, 1, 1},
      {"3x3_s2_56_wide_shifted", 16, 12, 6, 56, 3, 2, 1, 1, 1},
      {"3x3_s1_k_blocks_shifted", 145, 6, 5, 14, 3, 1, 1, 1, 1},
  };
  for (const ConvCase& c : cases) {
    for (const double sparsity : kSparsities) {
      SCOPED_TRACE(fmt::format("{} at {:.0f}%", c.name, 100 * sparsity));
      const kernels::ConvGeometry g = make_geometry(c);
      const ConvProblem p(g, sparsity, rng);
      const kernels::PackedConv conv(g, p.weight.data(), p.bias.data(), 0.0, isa);
      ASSERT_STREQ(conv.weight_format(), "sparse-csr");
      ASSERT_EQ(conv.channel_granule(), 1);
      // Where the code is generated for the weight (AVX-512, spmm_jit.h) nothing is shifted,
      // nor on AVX2 (conv.h, sparse_phases_shifted).
      const bool jit = conv.implementation().find("-jit") != std::string::npos;
      ASSERT_EQ(conv.input_split() > 0, std::string_view(c.name) == "1x1_input_halves");
      ASSERT_EQ(conv.implementation().ends_with(" in input halves"), conv.input_split() > 0)
          << conv.implementation();
      if (std::string_view(c.name).ends_with("_shifted")) {
        ASSERT_EQ(conv.implementation().find("-shifted") != std::string::npos,
                  !jit && kernels::sparse_phases_shifted(isa))
            << conv.implementation();
      }
      // All rows and channels; the first and last row; an interior block of rows and channels.
      check_conv_region(conv, p, 0, g.out_h, 0, g.out_c);
      check_conv_region(conv, p, 0, 1, 0, g.out_c);
      check_conv_region(conv, p, g.out_h - 1, g.out_h, 0, g.out_c);
      const int64_t r0 = static_cast<int64_t>(rng() % g.out_h);
      const int64_t c0 = static_cast<int64_t>(rng() % g.out_c);
      check_conv_region(conv, p, r0, std::min(g.out_h, r0 + 3), c0,
                        std::min(g.out_c, c0 + 1 + static_cast<int64_t>(rng() % 9)));
      if (HasFatalFailure()) return;
    }
  }
}

// The 1x1 lowering reads B in place where its planes are whole cache lines apart (with the
// packed offsets, or offsets for a tile buffer's stride: kept for the first such stride, made
// per call for another; generated code reads the B rows' offsets instead), the columns before the
// region's first line boundary in a product of their own where it starts off a line, and from an
// aligned copy where the planes are not lines apart (conv.cc, sparse_conv_rows); with enough
// channels for several K-blocks. Every way must give the bits of the whole aligned image, which
// must match the reference.
TEST_P(SparseConvTest, PointwiseGivesTheSameBitsWhereverBLies) {
  std::mt19937 rng(78);
  // 8 x 12 planes: 96 floats, six lines; rows start on a line every fourth row.
  const kernels::ConvGeometry g = make_geometry({"1x1", 400, 24, 8, 12, 1, 1, 0, 1, 1});
  const int64_t plane = g.in_h * g.in_w, out_plane = g.out_h * g.out_w;
  ConvProblem p(g, 0.5, rng);
  p.has_residual = true;
  p.expected =
      expected_conv(g, p.src.data(), p.weight.data(), p.bias.data(), p.residual.data(), p.epilogue);
  const kernels::PackedConv conv(g, p.weight.data(), p.bias.data(), 0.0, GetParam());
  ASSERT_STREQ(conv.weight_format(), "sparse-csr");

  // Line-aligned room for a copy of the input planes `stride` apart, from `first` floats past
  // the line (0: aligned).
  std::vector<float> storage;
  auto place = [&](int64_t row_begin, int64_t row_end, int64_t stride, int64_t first) {
    storage.assign(static_cast<std::size_t>(g.in_c * stride + first + 16), 0.0f);
    float* base = storage.data();
    while (reinterpret_cast<uintptr_t>(base) % 64 != 0) ++base;
    base += first;
    for (int64_t c = 0; c < g.in_c; ++c) {
      std::copy_n(p.src.begin() + c * plane + row_begin * g.in_w, (row_end - row_begin) * g.in_w,
                  base + c * stride);
    }
    return kernels::PlaneView{base, row_begin, stride};
  };
  std::vector<float> scratch;
  auto run = [&](const kernels::PlaneView& src, int64_t r0, int64_t r1) {
    std::vector<float> out(static_cast<std::size_t>(g.out_c * out_plane), kSentinel);
    const kernels::PlaneView dst{out.data(), 0, out_plane};
    const kernels::PlaneView res{p.residual.data(), 0, out_plane};
    kernels::conv2d_region(conv, src, dst, r0, r1, 0, g.out_c, p.epilogue, &res, scratch);
    return out;
  };
  const std::vector<float> whole = run(place(0, g.in_h, plane, 0), 0, g.in_h);  // in place
  const float tolerance = 2e-5f * std::sqrt(static_cast<float>(g.in_c)) + 1e-5f;
  for (std::size_t i = 0; i < whole.size(); ++i) {
    ASSERT_NEAR(whole[i], p.expected[i], tolerance * (1.0f + std::abs(p.expected[i]))) << i;
  }
  struct Way {
    const char* name;
    int64_t r0, r1, tile_first, tile_last, stride, first;
  };
  const Way ways[] = {
      {"rows on a line, in place", 4, 8, 0, g.in_h, plane, 0},
      {"tile buffer with other aligned planes", 2, 6, 2, 6, 4 * g.in_w, 0},
      {"misaligned tensor", 0, g.in_h, 0, g.in_h, plane, 1},
      {"first row off a line", 1, 6, 0, g.in_h, plane, 0},
      {"one row, shorter than the columns up to the next line", 0, 1, 0, g.in_h, plane, 1},
      {"tile buffer, first row off a line", 3, 6, 2, 6, 4 * g.in_w, 0},
      {"tile buffer with planes further apart", 2, 6, 2, 6, 4 * g.in_w + 16, 0},
      {"planes off lines", 3, 7, 3, 7, 4 * g.in_w + 4, 0},
  };
  for (const Way& way : ways) {
    SCOPED_TRACE(way.name);
    const std::vector<float> got =
        run(place(way.tile_first, way.tile_last, way.stride, way.first), way.r0, way.r1);
    for (int64_t c = 0; c < g.out_c; ++c) {
      for (int64_t i = 0; i < out_plane; ++i) {
        const std::size_t at = static_cast<std::size_t>(c * out_plane + i);
        const bool inside = i >= way.r0 * g.out_w && i < way.r1 * g.out_w;
        ASSERT_EQ(got[at], inside ? whole[at] : kSentinel) << "channel " << c << " pixel " << i;
      }
    }
  }
}

// A layer summed in input halves, in the two steps a caller may run on two threads: each
// half's sums over any rows and channels, then their sum with the epilogue, give conv2d_region's
// bits; both steps refuse a layer that sums its input in one piece.
TEST_P(SparseConvTest, InputHalvesInTwoStepsGiveTheBitsOfOneCall) {
  std::mt19937 rng(79);
  const kernels::ConvGeometry g = make_geometry({"1x1", 150, 40, 12, 14, 1, 1, 0, 1, 1});
  const int64_t out_plane = g.out_h * g.out_w;
  ConvProblem p(g, 0.8, rng);
  p.has_residual = true;
  p.epilogue.pre_residual = Activation::kRelu;
  p.epilogue.post_residual = Activation::kClip;
  p.epilogue.clip_min = -1.0f;
  p.epilogue.clip_max = 2.0f;
  const kernels::PackedConv conv(g, p.weight.data(), p.bias.data(), 0.0, GetParam());
  ASSERT_EQ(conv.input_split(), 80);  // 75 rounded up to a multiple of 16
  const kernels::PlaneView src{p.src.data(), 0, out_plane};
  const kernels::PlaneView res{p.residual.data(), 0, out_plane};
  std::vector<float> scratch;
  std::vector<float> one(static_cast<std::size_t>(g.out_c * out_plane), kSentinel);
  kernels::conv2d_region(conv, src, {one.data(), 0, out_plane}, 0, g.out_h, 0, g.out_c, p.epilogue,
                         &res, scratch);
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t r0 = static_cast<int64_t>(rng() % g.out_h),
                  c0 = static_cast<int64_t>(rng() % g.out_c);
    const int64_t r1 = r0 + 1 + static_cast<int64_t>(rng() % (g.out_h - r0));
    const int64_t c1 = c0 + 1 + static_cast<int64_t>(rng() % (g.out_c - c0));
    SCOPED_TRACE(fmt::format("rows [{}, {}), channels [{}, {})", r0, r1, c0, c1));
    std::vector<float> sums[2], out(one.size(), kSentinel);
    for (int half = 0; half < 2; ++half) {
      sums[half].assign(one.size(), kSentinel);
      kernels::conv2d_input_half(conv, half, src, {sums[half].data(), 0, out_plane}, r0, r1, c0, c1,
                                 scratch);
    }
    kernels::add_input_halves(conv, {sums[0].data(), 0, out_plane}, {sums[1].data(), 0, out_plane},
                              {out.data(), 0, out_plane}, r0, r1, c0, c1, p.epilogue, &res);
    for (int64_t c = 0; c < g.out_c; ++c) {
      for (int64_t i = 0; i < out_plane; ++i) {
        const std::size_t at = static_cast<std::size_t>(c * out_plane + i);
        const bool inside = c >= c0 && c < c1 && i >= r0 * g.out_w && i < r1 * g.out_w;
        ASSERT_EQ(out[at], inside ? one[at] : kSentinel) << "channel " << c << " pixel " << i;
      }
    }
  }
  const kernels::PackedConv whole(make_geometry({"1x1", 40, 150, 12, 14, 1, 1, 0, 1, 1}),
                                  random_vector(150 * 40, 1, rng).data(), nullptr, 0.0, GetParam());
  EXPECT_EQ(whole.input_split(), 0);  // fewer input than output channels
  EXPECT_THROW(kernels::conv2d_input_half(whole, 0, src, src, 0, 1, 0, 1, scratch), Error);
  EXPECT_THROW(kernels::add_input_halves(whole, src, src, src, 0, 1, 0, 1, p.epilogue, nullptr),
               Error);
  EXPECT_THROW(kernels::conv2d_input_half(conv, 2, src, src, 0, 1, 0, 1, scratch), Error);
}

SPARSECOL_EVERY_ISA(SparseConvTest);

TEST(SparseConvSelectionTest, ThresholdPicksTheFormat) {
  std::mt19937 rng(3);
  const kernels::ConvGeometry g3 = make_geometry({"", 16, 16, 8, 8, 3, 1, 1, 1, 1});
  const kernels::ConvGeometry g1 = make_geometry({"", 16, 16, 8, 8, 1, 1, 0, 1, 1});
  const kernels::ConvGeometry gs = make_geometry({"", 16, 16, 8, 8, 3, 2, 1, 1, 1});
  const kernels::ConvGeometry gd = make_geometry({"", 16, 16, 8, 8, 3, 1, 1, 1, 16});
  std::vector<float> w = random_vector(16 * 16 * 9, 1.0f, rng);
  // 85% zeros, unstructured: every 16-row layer then has 2.4 non-zeros per B row on average,
  // enough for generated code (SpmmJit::kMinNonZerosPerLoad).
  prune(w, 0.85, rng);
  auto impl = [&](const kernels::ConvGeometry& g, double threshold) {
    return kernels::PackedConv(g, w.data(), nullptr, threshold).implementation();
  };
  const std::string isa = to_string(kernels::active_isa());
  // On AVX-512 a sparse layer runs in code generated for its weight (spmm_jit.h).
  const std::string jit = kernels::active_isa() == kernels::Isa::kAvx512 ? "-jit" : "";
  EXPECT_EQ(impl(g1, 0.8), "spmm-1x1" + jit + "/" + isa);
  // Without generated code, 8-wide rows take the shifted packing where the vector is narrow
  // enough to pad them (the portable path's 4 lanes; see sparse_phase_pitch).
  const std::string shifted = isa == "portable" ? "-shifted" : "";
  EXPECT_EQ(impl(g3, 0.8), "spmm-3x3" + (jit.empty() ? shifted : jit) + "/" + isa);
  EXPECT_EQ(impl(gs, 0.8), "spmm-3x3-strided" + jit + "/" + isa);
  const kernels::ConvGeometry g1s = make_geometry({"", 16, 16, 8, 8, 1, 2, 0, 1, 1});
  EXPECT_EQ(impl(g1s, 0.8), "spmm-1x1-gathered" + jit + "/" + isa);
  EXPECT_EQ(impl(g3, 0.9).rfind("implicit-gemm-3x3/", 0), 0u);
  EXPECT_EQ(impl(g3, kernels::kAlwaysDense).rfind("implicit-gemm-3x3/", 0), 0u);
  EXPECT_EQ(impl(gd, 0.0).rfind("depthwise-3x3/", 0), 0u);  // depthwise stays dense
  // The packing alone (generated code, on AVX-512, takes more than the weight: spmm_jit.h).
  const kernels::PackedConv sparse(g3, w.data(), nullptr, 0.8,
                                   std::min(kernels::active_isa(), kernels::Isa::kAvx2));
  const kernels::PackedConv dense(g3, w.data(), nullptr, kernels::kAlwaysDense);
  EXPECT_NEAR(sparse.weight_sparsity(), 0.85, 0.03);
  EXPECT_STREQ(dense.weight_format(), "dense");
  EXPECT_LT(sparse.packed_bytes(), dense.packed_bytes() / 3);
  // A dense GEMM computes whole panels of channels; a depthwise convolution whole vectors of
  // them (the channel-lane kernel's groups).
  std::vector<float> src(16 * 64), dst(16 * 64), scratch;
  EXPECT_THROW(kernels::conv2d_region(dense, {src.data(), 0, 64}, {dst.data(), 0, 64}, 0, 8, 1, 8,
                                      {}, nullptr, scratch),
               Error);
  const kernels::PackedConv depthwise(gd, w.data(), nullptr);
  EXPECT_EQ(depthwise.channel_granule(), 16);
  EXPECT_THROW(kernels::conv2d_region(depthwise, {src.data(), 0, 64}, {dst.data(), 0, 64}, 0, 8, 0,
                                      8, {}, nullptr, scratch),
               Error);
}

// The dense GEMM lowerings and the depthwise kernels split by output channels (the
// layer-by-layer schedule's blocks of channels for the deep layers at batch 1): every block of
// whole granules, and the last partial one, matches the reference and writes nothing outside
// its channels. The depthwise cases cover the flat (21 wide; 34 wide at stride 2, on AVX-512),
// channel-lane (7 wide, 30 wide at stride 2) kernels.
TEST(DenseConvRegionTest, BlocksOfChannelsMatchReference) {
  std::mt19937 rng(19);
  const ConvCase cases[] = {
      {"1x1", 24, 44, 5, 7, 1, 1, 0, 1, 1},
      {"3x3_s1_p1", 16, 37, 7, 9, 3, 1, 1, 1, 1},
      {"3x3_s2_p1", 12, 50, 9, 11, 3, 2, 1, 1, 1},
      {"depthwise_3x3_21_wide", 40, 40, 9, 21, 3, 1, 1, 1, 40},
      {"depthwise_3x3_7_wide", 48, 48, 7, 7, 3, 1, 1, 1, 48},
      {"depthwise_3x3_s2", 37, 37, 11, 30, 3, 2, 1, 1, 37},
      {"depthwise_3x3_s2_34_wide", 37, 37, 11, 34, 3, 2, 1, 1, 37},
  };
  for (const ConvCase& c : cases) {
    SCOPED_TRACE(c.name);
    const kernels::ConvGeometry g = make_geometry(c);
    const ConvProblem p(g, 0.0, rng);
    const kernels::PackedConv conv(g, p.weight.data(), p.bias.data(), kernels::kAlwaysDense);
    const int64_t granule = conv.channel_granule();
    ASSERT_GT(granule, 1);
    ASSERT_LT(granule, g.out_c);
    for (int64_t c0 = 0; c0 < g.out_c; c0 += granule) {
      const int64_t c1 = std::min(g.out_c, c0 + granule * (1 + static_cast<int64_t>(rng() % 2)));
      check_conv_region(conv, p, 0, g.out_h, c0, c1);
      check_conv_region(conv, p, 1, g.out_h - 1, c0, c1);
      if (HasFatalFailure()) return;
    }
  }
}

// ---- Sparse linear layers vs the reference GEMM ----

using SparseLinearTest = PerIsaTest;

TEST_P(SparseLinearTest, MatchesReferenceGemm) {
  std::mt19937 rng(21);
  const int64_t token_counts[] = {1, 7, 63, 64, 65, 130};
  for (const double sparsity : kSparsities) {
    for (const int64_t tokens : token_counts) {
      const int64_t k = 1 + static_cast<int64_t>(rng() % 150);
      const int64_t n = 1 + static_cast<int64_t>(rng() % 90);
      const bool transposed = rng() % 2 == 0;  // Gemm's transB: W stored [N x K]
      SCOPED_TRACE(fmt::format("{} tokens, K {} N {}, {:.0f}%, transposed {}", tokens, k, n,
                               100 * sparsity, transposed));
      std::vector<float> w = random_vector(k * n, 1.0f, rng);
      prune(w, sparsity, rng);
      std::vector<float> w_kn = w;  // [K x N] for the reference
      if (transposed) {
        for (int64_t i = 0; i < k; ++i) {
          for (int64_t j = 0; j < n; ++j) w_kn[i * n + j] = w[j * k + i];
        }
      }
      // Blocks of K rows: some layers in one block, others in several, with a K tail.
      const int64_t depth_block =
          rng() % 2 == 0 ? kernels::kSpmmLinearDepthBlock : 1 + static_cast<int64_t>(rng() % 40);
      SCOPED_TRACE(fmt::format("K blocks of {}", depth_block));
      const kernels::SparseLinear sparse =
          transposed ? kernels::SparseLinear(w.data(), k, n, 1, k, depth_block)
                     : kernels::SparseLinear(w.data(), k, n, n, 1, depth_block);
      const kernels::SparseLinear one_block = transposed
                                                  ? kernels::SparseLinear(w.data(), k, n, 1, k, k)
                                                  : kernels::SparseLinear(w.data(), k, n, n, 1, k);
      EXPECT_EQ(sparse.nnz(), one_block.nnz());
      const int64_t ldx = k + 2, ldy = n + 3;
      const std::vector<float> x = random_vector(tokens * ldx, 1.0f, rng);
      EpilogueData ed = random_epilogue(tokens, n, ldy, rng);
      ed.epilogue.row_bias = nullptr;  // a linear layer's bias is per feature (column)
      // Features [f0, f1): the region's pointers at (token 0, f0).
      const int64_t f0 = static_cast<int64_t>(rng() % n);
      const int64_t f1 = f0 + 1 + static_cast<int64_t>(rng() % (n - f0));
      for (const auto& [begin, end] : {std::pair<int64_t, int64_t>{0, n}, {f0, f1}}) {
        Epilogue e = ed.epilogue;
        if (e.col_bias != nullptr) e.col_bias += begin;
        if (e.residual != nullptr) e.residual += begin;
        std::vector<float> want(tokens * ldy, kSentinel), have = want, scratch;
        kernels::gemm_reference({tokens, end - begin, k}, x.data(), ldx, w_kn.data() + begin, n,
                                want.data() + begin, ldy, e);
        kernels::sparse_linear(sparse, x.data(), ldx, tokens, begin, end, have.data() + begin, ldy,
                               e, scratch, GetParam());
        for (std::size_t i = 0; i < want.size(); ++i) {
          ASSERT_NEAR(have[i], want[i], 1e-4f * (1.0f + std::abs(want[i])))
              << "features [" << begin << ", " << end << ") at " << i / ldy << ", " << i % ldy;
        }
        // K blocks continue each element's sum in order: the same bits as one block.
        std::vector<float> whole(tokens * ldy, kSentinel);
        kernels::sparse_linear(one_block, x.data(), ldx, tokens, begin, end, whole.data() + begin,
                               ldy, e, scratch, GetParam());
        ASSERT_EQ(0, std::memcmp(whole.data(), have.data(), have.size() * sizeof(float)));
        // A tensor of one token sums in partial sums (SpmmArgs::reassociate): near, not the bits.
        if (tokens == 1) {
          for (const kernels::SparseLinear* layer : {&sparse, &one_block}) {
            std::vector<float> single(ldy, kSentinel);
            kernels::sparse_linear(*layer, x.data(), ldx, 1, begin, end, single.data() + begin, ldy,
                                   e, scratch, GetParam(), {}, /*one_token_tensor=*/true);
            for (std::size_t i = 0; i < want.size(); ++i) {
              ASSERT_NEAR(single[i], want[i], 1e-4f * (1.0f + std::abs(want[i])))
                  << "one-token tensor, features [" << begin << ", " << end << ") at " << i;
            }
          }
        }
      }
    }
  }
}

// Feature blocks (two sparse linear layers in a row): reading X and writing Y in feature blocks
// gives the bits of the token-major call, for whole blocks and for a last block with room to
// spare, over all features and over a feature range.
TEST_P(SparseLinearTest, FeatureBlocksGiveTheTokenMajorBits) {
  using kernels::TokenLayout;
  constexpr int64_t kBlock = kernels::kSpmmTokenBlock;
  std::mt19937 rng(23);
  for (const int64_t tokens : {int64_t{64}, int64_t{128}, int64_t{100}}) {
    const int64_t k = 1 + static_cast<int64_t>(rng() % 300);
    const int64_t n = 1 + static_cast<int64_t>(rng() % 300);
    SCOPED_TRACE(fmt::format("{} tokens, K {} N {}", tokens, k, n));
    std::vector<float> w = random_vector(k * n, 1.0f, rng);
    prune(w, 0.9, rng);
    const kernels::SparseLinear sparse(w.data(), k, n, n, 1, 1 + static_cast<int64_t>(rng() % 200));
    const int64_t room = (tokens + kBlock - 1) / kBlock * kBlock;
    // Token-major X, and the same in feature blocks.
    const std::vector<float> x = random_vector(tokens * k, 1.0f, rng);
    std::vector<float> x_blocks(room * k, 0.0f);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t f = 0; f < k; ++f) {
        x_blocks[kernels::token_feature_offset(TokenLayout::kFeatureBlocks, t, f, k)] =
            x[t * k + f];
      }
    }
    // What a feature-blocks output may take: the bias and the activation before the residual.
    EpilogueData ed = random_epilogue(tokens, n, n, rng);
    Epilogue e;
    e.col_bias = ed.col_bias.data();
    e.pre_residual = Activation::kGelu;
    const int64_t f0 = static_cast<int64_t>(rng() % n);
    const int64_t f1 = f0 + 1 + static_cast<int64_t>(rng() % (n - f0));
    for (const auto& [begin, end] : {std::pair<int64_t, int64_t>{0, n}, {f0, f1}}) {
      Epilogue region = e;
      region.col_bias += begin;
      std::vector<float> want(tokens * n, kSentinel), scratch;
      kernels::sparse_linear(sparse, x.data(), k, tokens, begin, end, want.data() + begin, n,
                             region, scratch, GetParam());
      for (const TokenLayout x_layout : {TokenLayout::kTokenMajor, TokenLayout::kFeatureBlocks}) {
        for (const TokenLayout y_layout : {TokenLayout::kTokenMajor, TokenLayout::kFeatureBlocks}) {
          const bool xb = x_layout == TokenLayout::kFeatureBlocks;
          const bool yb = y_layout == TokenLayout::kFeatureBlocks;
          SCOPED_TRACE(fmt::format("features [{}, {}), X {}, Y {}", begin, end,
                                   xb ? "blocks" : "token-major", yb ? "blocks" : "token-major"));
          std::vector<float> y((yb ? room : tokens) * n, kSentinel);
          kernels::sparse_linear(sparse, xb ? x_blocks.data() : x.data(), k, tokens, begin, end,
                                 y.data() + kernels::token_feature_offset(y_layout, 0, begin, n), n,
                                 region, scratch, GetParam(), {x_layout, y_layout});
          for (int64_t t = 0; t < tokens; ++t) {
            for (int64_t f = 0; f < n; ++f) {
              const float have = y[kernels::token_feature_offset(y_layout, t, f, n)];
              ASSERT_EQ(have, want[t * n + f]) << "token " << t << ", feature " << f;
            }
          }
        }
      }
    }
  }
}

TEST_P(SparseLinearTest, RefusesAResidualOnAnOutputInFeatureBlocks) {
  const std::vector<float> w(12, 1.0f), x(3 * 64, 1.0f), residual(4 * 64, 1.0f);
  std::vector<float> y(4 * 64), scratch;
  const kernels::SparseLinear sparse(w.data(), 3, 4, 4, 1);
  const kernels::LinearLayouts blocks{kernels::TokenLayout::kTokenMajor,
                                      kernels::TokenLayout::kFeatureBlocks};
  Epilogue e;
  e.residual = residual.data();
  e.residual_ld = 4;
  EXPECT_THROW(kernels::sparse_linear(sparse, x.data(), 3, 64, 0, 4, y.data(), 4, e, scratch,
                                      GetParam(), blocks),
               Error);
  e.residual = nullptr;
  e.post_residual = Activation::kRelu;
  EXPECT_THROW(kernels::sparse_linear(sparse, x.data(), 3, 64, 0, 4, y.data(), 4, e, scratch,
                                      GetParam(), blocks),
               Error);
}

TEST_P(SparseLinearTest, RefusesARowBiasAndBadFeatureRanges) {
  const std::vector<float> w(12, 1.0f), x(12, 1.0f), bias(4, 1.0f);
  std::vector<float> y(16), scratch;
  const kernels::SparseLinear sparse(w.data(), 3, 4, 4, 1);
  Epilogue e;
  e.row_bias = bias.data();
  EXPECT_THROW(kernels::sparse_linear(sparse, x.data(), 3, 4, 0, 4, y.data(), 4, e, scratch),
               Error);
  EXPECT_THROW(kernels::sparse_linear(sparse, x.data(), 3, 4, 0, 5, y.data(), 4, {}, scratch),
               Error);
}

SPARSECOL_EVERY_ISA(SparseLinearTest);

}  // namespace
}  // namespace sparsecol::testing
