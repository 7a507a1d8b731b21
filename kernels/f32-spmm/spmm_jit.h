// Sparse x dense products in code generated per weight at load time (AVX-512, x86-64).
//
// Why: the spmm micro-kernel (spmm_impl.h) holds one output row x 8 vectors of columns in
// registers and loads, for every non-zero, that non-zero's B row: 512 bytes. Where a tile of B
// outgrows L1 (a 1x1 layer deeper than 64 channels at 128 columns), those loads come from L2,
// whose bandwidth bounds the kernel (docs/BENCHMARKS.md, the thirty-second session). The
// generated code turns the loop inside out: it holds kSpmmJitRows output rows x one vector of
// columns in registers, walks the block's non-zeros by B row, loads each B row once per block
// and FMAs it into the accumulator of every row that has a non-zero there. A register cannot be
// chosen at run time, so which accumulator each non-zero feeds is baked into the code, as is
// each non-zero's place in a copy of the values laid out in the code's order, and each B row's
// place in B: the code is straight-line, one FMA per non-zero (7 bytes), without a branch. A B
// row's address as a displacement, rather than one read from a table of offsets per B row,
// saves a load per B row, a third of the loads at 90% sparsity: ResNet-50's layers at 80-90%
// 1.02-1.18x faster (one thread, Intel Emerald Rapids; docs/BENCHMARKS.md, the fiftieth
// session). So the code serves the one layout of B it was made for. Each block's code runs over a
// chunk of columns, one vector at a time, before the next block's. A block's code cut into
// segments of B rows, each run over all blocks while its part of B stays in L1 (the sums stored
// and reloaded between segments), ran a synthetic product 1.2-1.4x faster but ResNet-50's layers
// 0.8-1.03x (Intel Emerald Rapids; docs/BENCHMARKS.md, the fiftieth session): not kept.
// ResNet-50's layers at 70-90% (bench/spmm_bench.cc, one thread, Zen 4): 1.1-2.1x faster than
// the kernels (docs/BENCHMARKS.md, the thirty-fifth session). The cost is code: 10-14 bytes per
// non-zero, fetched like data, so it pays only where it stays near the core (see generate).
//
// A 3x3 layer's column taps read B rows 0, 1 and 2 floats past a vector boundary (the phase
// planes of f32-conv/conv.cc start on cache lines), so two of every three loads straddled two
// lines. B rows next to each other in the packing (or with one other row between them: a
// stride-2 layer's tap kx = 1, in the other phase plane than kx = 0 and 2) whose offsets lie
// within kMaxPairShift lanes past one boundary are read out of that aligned pair of vectors,
// loaded once, each row shifted out of it (valignd): ResNet-50's stride-1 3x3 layers at
// 90% 1.2-1.4x faster (bench/ spmm_bench.cc, one thread, Intel Emerald Rapids; docs/BENCHMARKS.md,
// the forty-eighth session). The masks keep every load within the lanes the rows themselves read.
//
// Each output element still sums its row's non-zeros in increasing column order, one FMA after
// another from zero, and the epilogue runs in the kernels' order: the bits are the spmm kernels'
// (and a product split between the two, by rows or columns, gives the same bits as either).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "epilogue.h"
#include "f32-spmm/spmm.h"

namespace sparsecol::kernels {

// Output rows per generated block: accumulators zmm0-27; zmm28-30 hold 0, clip_min and clip_max,
// zmm31 the B row.
inline constexpr int64_t kSpmmJitRows = 28;
// B rows whose offsets lie at most this many lanes past a vector boundary, next to each other in
// the packing (a 3x3 layer's column taps), are read out of one aligned pair of vectors.
inline constexpr int kMaxPairShift = 3;

class SpmmJit {
 public:
  // Code for `a` (packed unshifted, one group) reading B row k `b_row_offsets[k]` floats after
  // the src it is handed (a.depth() entries; empty: the layout `a` was packed for), or null where
  // it would not pay (fewer than kMinNonZerosPerLoad non-zeros per B row and block, or code
  // larger than the core's L2), where this process cannot run AVX-512 (active_isa(), so
  // SPARSECOL_MAX_ISA turns it off too), where an offset does not fit a 32-bit displacement, or
  // where the system refuses executable memory.
  static std::shared_ptr<const SpmmJit> generate(const SparseMatrix& a,
                                                 std::span<const int64_t> b_row_offsets = {});

  SpmmJit(const SpmmJit&) = delete;
  SpmmJit& operator=(const SpmmJit&) = delete;
  ~SpmmJit();

  // The code and the data it reads: the values in its order.
  int64_t bytes() const {
    return static_cast<int64_t>(code_bytes_ + values_.size() * sizeof(float));
  }

  // Whether the generated code applies this epilogue (every part but GELU and a column bias).
  static bool handles(const Epilogue& epilogue);

  // spmm(a, offsets, row_begin, row_end, src, n, dst, ldd, epilogue) without accumulate, where
  // `a` is the matrix the code was generated for, src holds B in the layout it was generated
  // for, and `offsets` are the kernels' offsets for that layout (a.offsets() for the packed one):
  // rows outside whole blocks of kSpmmJitRows, and an epilogue the code does not handle, run
  // through the spmm kernel with them, giving the same bits. Single-threaded.
  void run(const SparseMatrix& a, const int32_t* offsets, int64_t row_begin, int64_t row_end,
           const float* src, int64_t n, float* dst, int64_t ldd, const Epilogue& epilogue) const;

  // Whether some B rows are read out of aligned pairs of vectors (kMaxPairShift).
  bool reads_pairs() const { return reads_pairs_; }

  // The fewest non-zeros per B row and block, on average, for which generate() makes code.
  static constexpr double kMinNonZerosPerLoad = 2.0;

 private:
  SpmmJit() = default;

  void* code_ = nullptr;
  std::size_t size_ = 0;  // mapped: whole pages
  std::size_t code_bytes_ = 0;
  int64_t rows_ = 0;
  std::vector<std::size_t> block_entry_;  // byte offset of each block's function in code_
  std::vector<float> values_;             // the non-zeros in the order the code reads them
  bool reads_pairs_ = false;              // some B rows are read out of aligned pairs
};

}  // namespace sparsecol::kernels
