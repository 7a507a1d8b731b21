// f32 sparse x dense matrix products: C[rows x n] = epilogue(A * B) where A is a pruned weight
// packed once at load (CSR-like) and B is dense activations, n the vector axis (pixels of an NCHW
// plane, or tokens of a linear layer).
//
// Why this shape: with unstructured sparsity the non-zeros of two output rows share no pattern,
// so nothing is gained by holding several output rows together; what every non-zero does share
// is the run of n outputs it feeds. A micro-kernel therefore holds one output row x a tile of
// columns (several vectors) in registers, walks that row's non-zeros, broadcasts each weight and
// FMAs it into the vectors loaded at `src + offset` (XNNPACK's spmm idea, MR pixels x 1
// channel). Offsets are element offsets into B, precomputed at packing for the layout the caller
// will hand in, so one kernel serves every lowering:
//   - 1x1 convolution:              B row c = input plane c          (offset = c * plane_stride)
//   - any other convolution:        over a zero-padded copy of the needed input rows, split by
//                                   stride phase (space-to-depth, f32-conv/conv.cc), e.g. stride
//                                   1: offset = c * plane + ky * dh * padded_w + kx * dw
//   - linear layer / MatMul:        Y^T = W^T X^T over a transposed block of tokens
//                                   (offset = k * kSpmmTokenBlock), see SparseLinear.
// A kernel computes any sub-range of rows (offset the row pointers) and of columns (offset src
// and dst), with the same Epilogue as the dense kernels: the region interface of gemm.h.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "epilogue.h"
#include "isa.h"

namespace sparsecol::kernels {

// A weight matrix A [rows x depth] with its exact zeros dropped: per row, the non-zeros in
// increasing column order (so that B is walked forward), each with its value, the B row it
// multiplies and that row's element offset in the layout the matrix was packed for.
// Rows may be split into `groups` equal blocks (grouped convolution): group g's column k
// multiplies B row g * depth + k. Immutable after packing: shared by all threads.
//
// Shifted packing (`lanes` > 1, the 3x3 convolutions on phase planes, f32-conv/conv.cc): each
// B row's offset splits into an aligned base (a multiple of `lanes`: the vector width, whose
// loads from B's line-aligned planes then start on vectors, or half of it, see
// sparse_phase_pitch in f32-conv/conv.cc) and a shift, offset % lanes, below kMaxSpmmShifts. A
// row's non-zeros are grouped by shift (shifts() groups, in increasing shift, each in increasing
// column order) and offsets() holds their bases: the kernel sums each group over aligned loads in
// registers of its own and shifts the sums into place once per row (see SpmmArgs::shifts), instead
// of loading every shifted B row across two cache lines.
class SparseMatrix {
 public:
  // Element (r, k) of A is a[r * row_stride + k * col_stride]. `b_row_offsets` holds the element
  // offset of every B row (groups * depth entries). Throws Error(kInvalidArgument) on bad sizes,
  // when an offset does not fit in 32 bits, or when a shift (lanes > 1) reaches kMaxSpmmShifts.
  SparseMatrix(const float* a, int64_t rows, int64_t depth, int64_t row_stride, int64_t col_stride,
               int64_t groups, std::span<const int64_t> b_row_offsets, int64_t lanes = 1);

  int64_t rows() const { return rows_; }
  int64_t depth() const { return depth_; }
  int64_t groups() const { return groups_; }
  // Shift groups per row: 1 + the largest shift of any B row (1 unless packed shifted).
  int64_t shifts() const { return shifts_; }
  int64_t nnz() const { return static_cast<int64_t>(values_.size()); }
  // Fraction of exact zeros of A (1 for an empty matrix).
  double sparsity() const;
  // Shift group s of row r is [row_ptr()[r * shifts() + s], row_ptr()[r * shifts() + s + 1]) in
  // values() and offsets() (one group per row unless packed shifted).
  const int32_t* row_ptr() const { return row_ptr_.data(); }
  const float* values() const { return values_.data(); }
  const int32_t* offsets() const { return offsets_.data(); }
  // The B row of each non-zero (group g's column k: g * depth() + k).
  const int32_t* b_rows() const { return b_rows_.data(); }
  // Bytes the kernels stream: values, offsets and row pointers.
  int64_t packed_bytes() const;
  // The offsets for another layout of B (the same B rows at other element offsets), e.g. a tile
  // buffer with another plane stride. Unshifted packing only.
  void offsets_for(std::span<const int64_t> b_row_offsets, std::vector<int32_t>& out) const;

 private:
  int64_t rows_, depth_, groups_, shifts_ = 1;
  std::vector<int32_t> row_ptr_;  // rows * shifts + 1
  std::vector<float> values_;     // nnz
  std::vector<int32_t> b_rows_;   // nnz: the B row of each non-zero
  std::vector<int32_t> offsets_;  // nnz: its element offset (base) in the packed-for layout
};

// Shifts a shifted SparseMatrix may hold: 0, 1, 2 (a 3x3 stride-1 layer's column taps; 0 and 1
// for stride 2). Each group keeps a tile of accumulators in registers: 8 + 9 + 9 of AVX-512's 32.
inline constexpr int64_t kMaxSpmmShifts = 3;

// Fraction of exact zeros among `count` floats.
double zero_fraction(const float* w, int64_t count);

// The default sparsity at or above which a weight runs through the sparse kernels (below it the
// dense GEMM wins), per layer kind, from bench/spmm_bench.cc on the development machine (AMD EPYC
// Zen 3, AVX2, one thread, sparse and dense of each shape side by side, medians of 3; the machine
// was shared, so ratios are +-20%). Dense time / sparse time:
//  - ResNet-50 1x1 and 3x3 convolutions (12 shapes): at 50% 0.59-1.98x (7 of 12 slower), at 70%
//    1.18-3.45x (all faster), at 80% 1.57-4.99x, at 90% 2.5-8.3x, at 95% 3.8-12.4x.
//  - BERT-base linear layers, 128 tokens (768x768, 768x3072, 3072x768): at 50% 0.64-1.05x,
//    at 70% 1.08-1.58x, at 80% 1.70-2.09x, at 90% 3.2-4.2x, at 95% 4.9-6.7x.
// Both cross over between 50% and 70%: 0.7 is the lowest measured sparsity at which every shape
// ran faster sparse.
inline constexpr double kConvSparseThreshold = 0.7;
inline constexpr double kLinearSparseThreshold = 0.7;
// A threshold no weight reaches: always dense.
inline constexpr double kAlwaysDense = 2.0;

enum class SparseLayerKind { kConv, kLinear };
// `option` (Options::sparse_threshold) when it is not negative, otherwise the default above.
double resolve_sparse_threshold(double option, SparseLayerKind kind);

// ---- The micro-kernels: the one list that selection, tests and benchmarks read ----

// One call computes a whole region: `rows` output rows x `n` columns.
struct SpmmArgs {
  int64_t rows = 0, n = 0;
  const int32_t* row_ptr = nullptr;  // rows + 1 entries, positions in values/offsets
  const float* values = nullptr;
  const int32_t* offsets = nullptr;  // element offsets from src
  const float* src = nullptr;        // B's column 0 of the region (offsets added to it)
  float* dst = nullptr;              // the region's first row, column 0
  int64_t ldd = 0;
  const Epilogue* epilogue = nullptr;  // nullptr: none; its pointers address the region's origin
  // Whether the products add to what dst holds (a partial sum over earlier columns of A, see
  // K-blocks of f32-conv/conv.cc) instead of starting from zero. The sum continues in the same
  // order, so a product split by columns gives the same bits as one call.
  bool accumulate = false;
  // Shift groups per row (SparseMatrix::shifts): row_ptr has rows * shifts + 1 entries and a
  // non-zero of group s reads B columns from offset + s on. With shifts > 1 the kernel reads
  // every B row from its aligned base in whole vectors, up to 2 * kSpmmMaxLanes - 2 floats past
  // the last column the product needs (the caller leaves that slack; those lanes only feed
  // columns it does not store). The sum per element runs group by group, each in order.
  int64_t shifts = 1;
  // Whether the sum per element may run in another order (unshifted packing, n == 1 only): then
  // a row's non-zeros go a vector at a time, their inputs gathered, into a vector of partial sums
  // added at the row's end, instead of one chain of FMAs on vectors of which one lane counts. A
  // linear layer on one token (a CNN's classifier at batch 1): see sparse_linear.
  bool reassociate = false;
  // B's value for non-zero j of column c is src[(offsets[j] >> offset_shift) + c] (with
  // reassociate, a linear layer's offsets, which address a transposed block of kSpmmTokenBlock
  // tokens, read its one token from its own row instead).
  int offset_shift = 0;
};

// The widest vector of any kernel, in floats (AVX-512).
inline constexpr int64_t kSpmmMaxLanes = 16;

using SpmmUkernelFn = void (*)(const SpmmArgs& args);

struct SpmmUkernel {
  const char* name;
  Isa isa;
  int tile;  // columns held in registers per output row
  SpmmUkernelFn fn;
};

// name, ISA, tile (columns). Every kernel holds one output row x 8 vectors of columns in 8
// accumulators and walks the row's non-zeros: per non-zero, one offset load, one broadcast and 8
// FMAs with their B loads folded in (10 loads per 8 FMAs, within Zen 3's 3 loads per cycle);
// 8 independent chains cover the FMA latency x throughput (4 cycles x 2 pipes on Zen 3 and on
// AVX-512 cores). A wide tile matters because a row's fixed cost (its loop exit, usually a
// mispredicted branch since rows differ in length, and the epilogue) is paid once per tile:
// measured on ResNet-50's 1x1 64->64 at 90% (6.4 non-zeros a row), 4 vectors in two chains ran
// at 10.7 GFLOP/s on the non-zeros, 8 vectors in one chain at 12.4, and with the weight
// broadcast from memory and the epilogue's branches hoisted out of the vector loop at 25.9
// (bench/spmm_bench.cc, AVX2, Zen 3). Where depth x tile exceeds L1 (ResNet-50's 1024- and
// 2048-deep 1x1 layers), every non-zero streams its B row from L2 (32 B/cycle on Zen 3) and the
// kernels run at ~20-25 GFLOP/s on the non-zeros, a quarter of the dense GEMM's FMA rate.
// Measured per non-zero (8 FMAs) with this loop on the bench shapes, thread CPU time, Zen 3:
// ~2 ns over long rows with B in L1, ~3.7 ns with B in L2, ~4.8 ns in L3; rows of ~6 non-zeros
// (1x1 layers 64 deep at 90%) ~3.5 ns even with B in L1 and every row the same length, so
// neither branch misses nor B's cache level explain those. Tried and not kept (no gain or
// slower, +-10% noise): two rows interleaved (2 x 4, 6, 7 or 8 vectors), tiles of 4 vectors,
// the non-zero loop unrolled by 2, software prefetch of the next tile's B rows, rows sorted by
// length, B tiles copied contiguous, and K-blocks of 1x1 layers (their rows split into blocks
// of ~6 non-zeros: the per-row cost outweighs L1 hits). The 3x3 lowering, whose rows are 9x
// longer, does use K-blocks (f32-conv/conv.cc).
// The ceiling of this loop, measured on Zen 3 (a standalone loop, operands in L1, 2026-11-22):
// FMAs whose B operand is a load ran at ~0.21 ns each (8, 10 or 12 accumulators alike), against
// 0.16 ns with register operands: about 1.5 256-bit loads per cycle, so 8 FMAs per non-zero
// cost >= ~1.7 ns even in L1, ~1.3x the dense GEMM's time per FMA at its peak; with B in L2
// (every layer deeper than ~100 channels at 64 pixels) it is ~3.7 ns. Against a dense GEMM at
// 0.7 of peak (~1.8 ns per 8 FMAs), ten times fewer FMAs at 90% allow ~10x with B in L1 but
// ~5x with B in L2, before the rows' fixed costs: the kernel measures 4.2x. Planes of 112x112
// add L1 set conflicts: their B rows are 50176 bytes apart, which maps every row onto one of 4
// groups of sets, so a 32-channel layer puts 8 rows on each set's 8 ways, the output none left.
// On Zen 5 (AVX-512, 48 KiB L1, 2026-11-24, a standalone copy of this loop, 128 columns) a
// non-zero costs ~1.4-1.7 ns with B in L1 and ~2.2-2.6 ns with B in L2 when B's rows start on
// cache lines, but ~3.5 ns when they do not (a 64-byte load that straddles two lines costs two
// of L1's loads): every caller hands the kernel line-aligned B rows (kernels/scratch.h; the 1x1
// and phase lowerings in f32-conv/conv.cc, sparse_linear below), which made ResNet-50's 14x14
// and 7x7 1x1 layers and BERT's linear layers 1.1-1.5x faster. A 3x3 layer's taps shift B by
// 1 or 2 columns, so two thirds of its loads straddled lines even from aligned planes: the
// shifted packing (SparseMatrix, SpmmArgs::shifts) loads every tap aligned and shifts the sums
// instead, ResNet-50's stride-1 3x3 layers 1.2-1.25x faster at 90% (bench/spmm_bench.cc, one
// thread, Zen 5; 1.14x in the network, layer by layer at batch 16).
// A column tail of up to 4 vectors joins the last full tile (up to 12 vectors; shifted, on AVX2
// and the portable path, 2 past 4); a longer one gets a tile of its own. Every width sums each
// element in the same order, so results do not depend on how a caller splits the columns.
// Merging the shifted tails too (Zen 4, the thirty-second session): ResNet-50's 3x3 layers
// on 28x28 planes run their chunks of 6 rows (192 columns) as one tile of 12 vectors instead
// of 8 + 4, whose 4 accumulators left the FMAs waiting on their latency: 1.07-1.1x faster at
// 90% and 95% (bench/spmm_bench.cc, one thread, alternated runs).
// On AVX-512 most pruned convolutions run instead in code generated for their weight, which takes
// each B row once for 28 output rows (spmm_jit.h); these kernels take what it leaves.
#define SPARSECOL_F32_SPMM_UKERNELS(X)         \
  X(f32_spmm_128x1__avx512, Isa::kAvx512, 128) \
  X(f32_spmm_64x1__avx2, Isa::kAvx2, 64)       \
  X(f32_spmm_32x1__portable, Isa::kPortable, 32)

#define SPARSECOL_DECLARE_SPMM_UKERNEL(name, isa, tile) void name(const SpmmArgs& args);
SPARSECOL_F32_SPMM_UKERNELS(SPARSECOL_DECLARE_SPMM_UKERNEL)
#undef SPARSECOL_DECLARE_SPMM_UKERNEL

// The naive reference every kernel is tested against (double accumulation, same arguments).
void f32_spmm__reference(const SpmmArgs& args);

std::span<const SpmmUkernel> spmm_ukernels();
// The kernel selection uses for `isa` (the first of that ISA in the list).
const SpmmUkernel& default_spmm_ukernel(Isa isa);
// Throws Error(kInvalidArgument) when this process cannot run `isa`.
void require_spmm_isa(Isa isa);

// C = epilogue(A * B) over rows [row_begin, row_end) of A and n columns. `offsets` are A's
// offsets (a.offsets() or a re-mapping from offsets_for()); `dst` and the epilogue's pointers
// address row row_begin. Single-threaded.
// With `accumulate`, the products add to what dst holds (see SpmmArgs::accumulate).
void spmm(const SparseMatrix& a, const int32_t* offsets, int64_t row_begin, int64_t row_end,
          const float* src, int64_t n, float* dst, int64_t ldd, const Epilogue& epilogue,
          Isa isa = active_isa(), bool accumulate = false);

// ---- Linear layers: Y[T x N] = epilogue(X[T x K] * W[K x N]) with W constant and pruned ----

// Tokens are the vector axis of Y^T = W^T X^T: a block of up to kSpmmTokenBlock tokens of X is
// transposed into scratch (K rows of kSpmmTokenBlock floats: W^T's offsets are k * this), the
// kernel computes Y^T for the block, and the block is transposed back with the epilogue applied
// on the way out. 64 = one AVX-512 tile, two AVX2 tiles.
inline constexpr int64_t kSpmmTokenBlock = 64;

// W^T is cut into blocks of at most this many K rows (equal sizes), run one after the other with
// `accumulate`, so that the part of the transposed block a non-zero reads (256 x 64 floats =
// 64 KiB) stays near the core while every feature streams past it; the sum per element keeps
// its order, so results are the same bits as with one block. Measured on BERT-base's linear
// layers at 90%, one thread, AVX2, Zen 3, thread CPU time, one block vs blocks of 256 in one
// process (medians of 21 interleaved runs, 3 runs of the whole comparison; 7 runs at 1024):
// 128 tokens: 768x768 0.90-0.97x, 768x3072 0.85-0.90x, 3072x768 0.60-0.74x of the time of one
// block (whose 3072 x 64 floats = 768 KiB exceed the 512 KiB L2); 1024 tokens 0.87x, 0.89x,
// 0.70x. Blocks of 128-384 rows were within ~10% of 256; 64-96 rows were slower than one block
// (a row's fixed costs, paid once per block, outweigh the L1 hits), also with 64-feature chunks
// of Y^T so that the chunk and the block of X^T both fit L1. Software prefetch of the B row of
// the non-zero 4-16 ahead did not pay on 256-row blocks (+-5%).
inline constexpr int64_t kSpmmLinearDepthBlock = 256;

class SparseLinear {
 public:
  // W's element (k, n) is w[k * k_stride + n * n_stride] (MatMul's B: k_stride = N, n_stride = 1;
  // Gemm's B with transB: k_stride = 1, n_stride = K). `depth_block`: the most K rows per block
  // (see kSpmmLinearDepthBlock; tests use small ones).
  SparseLinear(const float* w, int64_t k, int64_t n, int64_t k_stride, int64_t n_stride,
               int64_t depth_block = kSpmmLinearDepthBlock);
  int64_t depth() const { return depth_; }
  int64_t features() const { return features_; }
  // W^T's K blocks in order: block b holds K rows [b * block_depth(), ...).
  const std::vector<SparseMatrix>& blocks() const { return blocks_; }
  int64_t block_depth() const { return block_depth_; }
  int64_t nnz() const;
  int64_t packed_bytes() const;

 private:
  int64_t depth_, features_, block_depth_;
  std::vector<SparseMatrix> blocks_;  // W^T [N x block] per K block
};

// How a linear layer's activation [tokens x features] is laid out in memory: token-major (the
// ONNX layout), or in feature blocks: blocks of kSpmmTokenBlock tokens, each feature-major
// [features x kSpmmTokenBlock], which is how the kernel computes Y^T and reads X^T. Two sparse
// linear layers in a row pass their activation in feature blocks (runtime/layerwise/steps.cc):
// a block is copied out of the first and into the second instead of transposed.
enum class TokenLayout { kTokenMajor, kFeatureBlocks };

struct LinearLayouts {
  TokenLayout x = TokenLayout::kTokenMajor, y = TokenLayout::kTokenMajor;
};
// What an implementation string adds for `layouts`: "" when both are token-major, else e.g.
// " (input in feature blocks)".
std::string describe(LinearLayouts layouts);

// The element offset of (token t, feature f) in an activation of `ld` features per token. In
// feature blocks every block holds kSpmmTokenBlock tokens' room, the last one too (the kernel
// reads and writes whole blocks; what it writes past the last token is unspecified).
inline int64_t token_feature_offset(TokenLayout layout, int64_t t, int64_t f, int64_t ld) {
  if (layout == TokenLayout::kTokenMajor) return t * ld + f;
  return t / kSpmmTokenBlock * ld * kSpmmTokenBlock + f * kSpmmTokenBlock + t % kSpmmTokenBlock;
}

// Features [feature_begin, feature_end) of tokens [0, tokens): x addresses token 0 and y and the
// epilogue's pointers (token 0, feature_begin), in their layouts (in feature blocks token 0 must
// start a block); ldx and ldy are the features per token of the whole tensors. The epilogue's
// col_bias is per feature and row_bias must be null; an output in feature blocks takes no
// residual and no activation after it. y must not overlap x or the residual (the result is
// transposed into y before the residual is added). Single-threaded; `scratch` grows as needed.
// The floats of `scratch` sparse_linear uses for a W of `depth` K rows, whatever the tokens: a
// transposed block of X and a chunk of Y^T (the depth-wise planner counts it in a tile's working
// set).
int64_t sparse_linear_scratch_floats(int64_t depth);

// `one_token_tensor`: the layer's whole input is this one token (a CNN's classifier at batch 1),
// so every schedule calls it so alike; each output then sums its non-zeros in partial sums
// (SpmmArgs::reassociate), in another order than a call on more tokens would.
void sparse_linear(const SparseLinear& w, const float* x, int64_t ldx, int64_t tokens,
                   int64_t feature_begin, int64_t feature_end, float* y, int64_t ldy,
                   const Epilogue& epilogue, std::vector<float>& scratch, Isa isa = active_isa(),
                   LinearLayouts layouts = {}, bool one_token_tensor = false);

}  // namespace sparsecol::kernels
