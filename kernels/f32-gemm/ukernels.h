// The f32 GEMM micro-kernels: the one list that selection, tests and benchmarks all read.
//
// A micro-kernel computes one MR x NR tile of C from an A panel packed k-major (k steps of MR
// consecutive floats, rows past the matrix zero-padded, see pack_a_panels) and NR-wide rows of
// B read in place at stride ldb. It handles a partial tile (m < MR rows, n < NR columns) itself,
// writing only the valid part, and applies the epilogue to its registers before the store.
// The driver in gemm.cc blocks K, M and N around it for the caches.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "epilogue.h"
#include "f32-gemm/gemm.h"
#include "isa.h"

namespace sparsecol::kernels {

// The most columns past a tile's vectors that a micro-kernel with extra columns computes by
// broadcasts (GemmUkernelArgs::extra): a strip's last vector holding 1 to 4 valid columns (the
// 4 left of a 196-pixel 14x14 plane after 6 strips of 32, the 1 of a 49-pixel 7x7 plane after
// 3 vectors) cost as much as a full one, its MR broadcasts and MR FMAs per k step mostly
// computing lanes past the matrix.
inline constexpr int kMaxExtraColumns = 4;

struct GemmUkernelArgs {
  int64_t k = 0;             // depth of this call (one block of K; may be 0)
  const float* a = nullptr;  // packed panel: k steps of MR floats
  const float* b = nullptr;  // k rows of at least n valid floats, ldb apart
  int64_t ldb = 0;
  float* c = nullptr;  // the tile's top-left element
  int64_t ldc = 0;
  int64_t m = 0, n = 0;                // valid rows (<= MR) and columns (<= NR)
  bool accumulate = false;             // add C's current contents (every block of K but the first)
  const Epilogue* epilogue = nullptr;  // applied when set (last block of K); its pointers already
                                       // address this tile's first row and column
  // A convolution's B read in place (gemm_packed_taps), when taps > 0: the k steps run tap by
  // tap, k / taps input channels each; tap t reads row c at b + tap_offset[t] + c * ldb, only
  // the columns whose bit of tap_masks[t] is set (bit j: column j; the others count as zeros and
  // are never read, so their addresses may lie outside the input).
  int64_t taps = 0;
  const int64_t* tap_offset = nullptr;
  const uint64_t* tap_masks = nullptr;
  // An indirect B (gemm_packed_row_offsets), when set and taps == 0: k step p reads B's row at
  // b + b_row_offsets[p] (ldb unused).
  const int64_t* b_row_offsets = nullptr;
  // Extra columns (GemmUkernel::extra_columns > 0 only; not with b_row_offsets): the tile's
  // columns [n, n + extra) too, n then a multiple of the vector width (n may be NR), read from
  // the same rows of B as the others (b + n + e, ldb apart; never from strips); with taps, their
  // mask bits are the strip's bits n + e (past NR: the next strip's word, tap_masks[taps + t],
  // bit n + e - NR).
  int64_t extra = 0;
};

using GemmUkernelFn = void (*)(const GemmUkernelArgs& args);
// Packs columns [0, n) of rows [0, k) of B (ldb apart) into ceil(n / NR) strips of k x NR floats
// (the copy of B that a micro-kernel reads at ldb = NR), strip s at dst + s * strip_stride:
// k * NR for the driver's block, more for rows of a deeper strip (gemm.h, pack_b_strip_rows).
using GemmPackBFn = void (*)(const float* b, int64_t ldb, int64_t k, int64_t n, float* dst,
                             int64_t strip_stride);

struct GemmUkernel {
  const char* name;
  Isa isa;
  int mr, nr;
  int lanes;          // floats per vector
  int extra_columns;  // the most GemmUkernelArgs::extra it takes (0: none)
  GemmUkernelFn fn;
  GemmPackBFn pack_b;
  // The same strips from a B given transposed: element (p, j) at b[j * ldb + p].
  GemmPackBFn pack_b_transposed;
};

// name, ISA, MR, NR, vector lanes, extra columns (0 or kMaxExtraColumns). Within an ISA the first
// entry is the one selection uses; the others are alternatives kept tested and benchmarked
// (bench/gemm_bench.cc compares them).
//  - 8x32 avx512: 16 zmm accumulators, 2 FMA pipes x 4-cycle latency (Zen 5) need >= 8 in flight;
//    a KC=256 B strip (256 x 32 floats = 32 KiB) stays in the 48 KiB L1 across the A panels.
//    With extra columns: + the panel vector, 4 sums and a broadcast, 25 of the 32 registers.
//  - 6x64 avx512: 24 accumulators, fewer loads per FMA (10 per 24 instead of 10 per 16), but its
//    B strip needs KC <= 128 to fit L1 and it wastes more on narrow N tails. No extra columns:
//    its 29 registers leave no room for them (nor do the AVX2 kernels' 15 and 16 of 16).
//  - 6x16 avx2: AVX2 has 16 ymm registers: 12 accumulators + 2 B vectors + 1 broadcast = 15.
//    Zen 3 has 2 FMA pipes x 4-cycle latency, so >= 8 independent FMAs must be in flight; 12
//    are. Per k step: 2 B loads + 6 broadcasts for 12 FMAs (8 loads per 6 FMA cycles, within
//    Zen 3's 3 loads per cycle). 16-column strips waste least on narrow N (49, 196 pixels).
//  - 4x24 avx2: also 12 accumulators + 3 B vectors + 1 broadcast = 16, fewer loads (7 per 12
//    FMAs) but 24-column strips waste more on N tails and M=64 is 16 panels instead of 11.
//  - 4x8 portable: x86-64-v2 has 16 xmm registers: 8 accumulators + 2 B vectors + a broadcast.
#define SPARSECOL_F32_GEMM_UKERNELS(X)                 \
  X(f32_gemm_8x32__avx512, Isa::kAvx512, 8, 32, 16, 4) \
  X(f32_gemm_6x64__avx512, Isa::kAvx512, 6, 64, 16, 0) \
  X(f32_gemm_6x16__avx2, Isa::kAvx2, 6, 16, 8, 0)      \
  X(f32_gemm_4x24__avx2, Isa::kAvx2, 4, 24, 8, 0)      \
  X(f32_gemm_4x8__portable, Isa::kPortable, 4, 8, 4, 0)

#define SPARSECOL_DECLARE_UKERNEL(name, isa, mr, nr, lanes, extra) \
  void name(const GemmUkernelArgs& args);
SPARSECOL_F32_GEMM_UKERNELS(SPARSECOL_DECLARE_UKERNEL)
#undef SPARSECOL_DECLARE_UKERNEL

// Every micro-kernel, in list order.
std::span<const GemmUkernel> gemm_ukernels();
// The micro-kernel selection uses for `isa` (the first of that ISA in the list).
const GemmUkernel& default_gemm_ukernel(Isa isa);

// Packs rows [0, m) of A (m x k, row-major, lda) into ceil(m / mr) panels of k x mr floats,
// zero-padding the last panel; dst holds packed_a_size(m, k, mr) floats.
int64_t packed_a_size(int64_t m, int64_t k, int mr);
void pack_a_panels(const float* a, int64_t m, int64_t k, int64_t lda, int mr, float* dst);

// C = epilogue(A * B) through one given micro-kernel (tests and benchmarks; `gemm` picks
// default_gemm_ukernel(active_isa())). A is packed into `scratch`.
void gemm_with_ukernel(const GemmUkernel& ukernel, const GemmShape& shape, const float* a,
                       int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                       const Epilogue& epilogue, std::vector<float>& scratch);
// The same with B given transposed: B[p][j] = bt[j * ldbt + p] (gemm_transposed_b).
void gemm_transposed_b_with_ukernel(const GemmUkernel& ukernel, const GemmShape& shape,
                                    const float* a, int64_t lda, const float* bt, int64_t ldbt,
                                    float* c, int64_t ldc, const Epilogue& epilogue,
                                    std::vector<float>& scratch);
// The blocked driver over A already packed for `ukernel`.
void gemm_packed_with_ukernel(const GemmUkernel& ukernel, const float* packed_a, int64_t m,
                              int64_t k, const float* b, int64_t ldb, float* c, int64_t ldc,
                              int64_t n, const Epilogue& epilogue);

// erf(x) for the GELU epilogue: x * P(x^2) / Q(x^2) on [-kErfClamp, kErfClamp], +-1 beyond
// (erf(3.92) = 1 - 3e-8). Coefficients fitted (weighted least squares, iterated towards minimax)
// for this file; max abs error 4.5e-7 evaluated in float (tests check it against std::erf).
inline constexpr float kErfClamp = 3.92f;
inline constexpr float kErfP[6] = {1.128378987312317f,    0.19273582100868225f,
                                   0.05305678769946098f,  0.003867123508825898f,
                                   0.000287453003693372f, 2.0349607439129613e-06f};
inline constexpr float kErfQ[6] = {1.0f,
                                   0.5041393637657166f,
                                   0.11507298052310944f,
                                   0.015169893391430378f,
                                   0.0011878241784870625f,
                                   3.807160464930348e-05f};

// The scalar form of the same approximation (the portable path; vectorizes under -O3).
inline float erf_rational(float x) {
  const float xc = x < -kErfClamp ? -kErfClamp : (x > kErfClamp ? kErfClamp : x);
  const float t = xc * xc;
  float p = kErfP[5], q = kErfQ[5];
  for (int i = 4; i >= 0; --i) {
    p = p * t + kErfP[i];
    q = q * t + kErfQ[i];
  }
  return xc * p / q;
}

}  // namespace sparsecol::kernels
