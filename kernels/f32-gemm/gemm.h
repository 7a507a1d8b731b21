// f32 GEMM with a fused epilogue: C[M x N] = epilogue(A[M x K] * B[K x N]), row-major.
//
// The one dense matrix kernel: 1x1 convolutions (A = weights [OC x IC], B = activations
// [IC x H*W] in NCHW), KxK convolutions after im2col, and linear layers / MatMul
// (A = activations [tokens x K], B = weights [K x N]). A kernel computes whatever sub-matrix
// it is handed, so a caller computes a region (a range of C's columns = pixels, or rows =
// tokens) by offsetting the pointers: that is the region interface the schedules share.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "epilogue.h"
#include "isa.h"

namespace sparsecol::kernels {

// A weight matrix (the A operand) packed once at load into the layout the active ISA's
// micro-kernel streams. Immutable after packing: shared by all threads.
class PackedA {
 public:
  // Packs for active_isa().
  PackedA(const float* a, int64_t m, int64_t k, int64_t lda);
  // Packs for a given ISA (tests run every path); throws Error(kInvalidArgument) if this CPU
  // cannot run it.
  PackedA(const float* a, int64_t m, int64_t k, int64_t lda, Isa isa);
  int64_t rows() const { return m_; }
  int64_t depth() const { return k_; }
  const float* data() const { return data_.get(); }
  Isa isa() const { return isa_; }
  // Rows are packed in panels of this many (the micro-kernel's MR).
  int64_t panel_rows() const;
  // Rows [begin, end) as a PackedA of their own, sharing this one's memory: begin a multiple of
  // panel_rows() or rows() (Error(kInvalidArgument) otherwise), so that threads splitting a
  // product's rows each stream only their part of the weights.
  PackedA row_range(int64_t begin, int64_t end) const;

 private:
  int64_t m_, k_;
  Isa isa_;
  std::shared_ptr<float[]> data_;
};

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
};

// A weight matrix as the B operand (a linear layer's [K x N], A being its activations) packed
// once at load: strips of the micro-kernel's NR columns, each K rows of NR floats, the last one
// zero-padded. gemm() reads a plain B in place, or packs it into such strips on every call (per
// block of K and N) where its row stride would map the rows onto one or two cache sets
// (gemm.cc); a call on a PackedB reads the strips in place, for any block of K and any columns
// that start a strip.
// Immutable after packing: shared by all threads.
class PackedB {
 public:
  // Packs for active_isa().
  PackedB(const float* b, int64_t k, int64_t n, int64_t ldb);
  // Packs for a given ISA; throws Error(kInvalidArgument) if this CPU cannot run it.
  PackedB(const float* b, int64_t k, int64_t n, int64_t ldb, Isa isa);
  int64_t depth() const { return k_; }
  int64_t columns() const { return n_; }
  int64_t strip_width() const { return nr_; }
  Isa isa() const { return isa_; }
  int64_t packed_bytes() const;
  // The strip that starts at column `column` (a multiple of strip_width()).
  const float* strip(int64_t column) const;

 private:
  int64_t k_, n_, nr_;
  Isa isa_;
  std::shared_ptr<float[]> data_;
};

// C = epilogue(A * B) with A pre-packed. Single-threaded: callers split regions across threads.
void gemm_packed(const PackedA& a, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t n,
                 const Epilogue& epilogue);
// Whether gemm_packed over depth k with A packed for `isa` writes each element of C once, in a
// single block of K: no partial sums are stored in C before the epilogue reads the residual, so
// the residual may be C itself (PackedConv::may_overwrite_residual).
bool gemm_packed_writes_c_once(int64_t k, Isa isa);

// C = epilogue(A * B) over columns [col_begin, col_begin + shape.n) of a pre-packed B
// (shape.k = b.depth(), col_begin a multiple of b.strip_width(); throws Error(kInvalidArgument)
// otherwise), A plain row-major and packed on the fly into `scratch`. Single-threaded.
void gemm_packed_b(const GemmShape& shape, const float* a, int64_t lda, const PackedB& b,
                   int64_t col_begin, float* c, int64_t ldc, const Epilogue& epilogue,
                   std::vector<float>& scratch);

// B in PackedB's layout in the caller's memory, so that a producer (a convolution's im2col)
// writes it block by block of rows instead of a plain matrix the GEMM would copy again: strips
// of gemm_strip_width(isa) columns, strip s at s * k * width, each k rows of width floats (the
// last strip's columns past n are never read).
int64_t gemm_strip_width(Isa isa);
// Rows [row0, row0 + rows) of such a B of depth k and n columns, from a plain block (ldb apart).
void pack_b_strip_rows(const float* b, int64_t ldb, int64_t rows, int64_t n, int64_t row0,
                       int64_t k, float* strips, Isa isa);
// C = epilogue(A * B) over columns [0, n) of a B in strips (depth a.depth(), packed for a.isa()).
// Single-threaded.
void gemm_packed_strips(const PackedA& a, const float* strips, float* c, int64_t ldc, int64_t n,
                        const Epilogue& epilogue);

// C = epilogue(A * B) over columns [0, n) of an indirect B: row p is n floats from
// b + row_offsets[p] (a.depth() offsets; rows may overlap). A convolution reads its taps so from
// zero-padded planes, one offset per (channel, tap), without an im2col (f32-conv/conv.cc).
// Single-threaded.
void gemm_packed_row_offsets(const PackedA& a, const float* b, std::span<const int64_t> row_offsets,
                             float* c, int64_t ldc, int64_t n, const Epilogue& epilogue);

// A convolution's B operand read in place from planes of its input (an implicit GEMM, no
// im2col): the input's own planes (stride 1) or its stride phases (plane (a, b) holding input
// rows i * stride_h + a, columns j * stride_w + b), rows `width` floats apart, `width` being the
// output's width. Row (c, t) of B at column p, the output pixel at row y = p / width and column
// x = p % width of the computed region, is channel c's plane of tap t at row
// first_row + y + row_shift, column x + col_shift, or zero where that lies outside the plane's
// [0, rows) x [0, columns). A's depth is channels x taps, packed block by block of
// block_channels input channels, tap by tap within a block, channel by channel within a tap
// (conv.cc, order_for_taps): a micro-kernel call runs one block.
struct ConvTap {
  int64_t phase = 0;  // which plane of a channel
  int64_t row_shift = 0, col_shift = 0;
  int64_t rows = 0, columns = 0;
};
struct ConvTaps {
  const float* data = nullptr;  // channel 0, plane 0, row first_row (may lie outside the buffer:
                                // only in-plane addresses are read)
  int64_t channel_stride = 0, phase_stride = 0;
  int64_t channels = 0, block_channels = 0;
  int64_t width = 0, first_row = 0;
  // When > 0, the planes hold images of this many rows one after another (conv.h,
  // conv2d_images): a tap reads row (first_row + y) % image_rows + row_shift of the pixel's own
  // image, never a neighbour's.
  int64_t image_rows = 0;
  std::span<const ConvTap> taps;
};

// C = epilogue(A * B) over columns [0, n) of such a B. Single-threaded.
void gemm_packed_taps(const PackedA& a, const ConvTaps& b, float* c, int64_t ldc, int64_t n,
                      const Epilogue& epilogue);

// C = epilogue(A * B) with A and B both plain row-major (A packed on the fly into `scratch`,
// which grows as needed). Single-threaded.
void gemm(const GemmShape& shape, const float* a, int64_t lda, const float* b, int64_t ldb,
          float* c, int64_t ldc, const Epilogue& epilogue, std::vector<float>& scratch);

// C = epilogue(A * B) with B given transposed: B[p][j] = bt[j * ldbt + p] (an attention
// product's K^T read in place from K's rows), packed per block of K and N like a plain B.
// Single-threaded.
void gemm_transposed_b(const GemmShape& shape, const float* a, int64_t lda, const float* bt,
                       int64_t ldbt, float* c, int64_t ldc, const Epilogue& epilogue,
                       std::vector<float>& scratch);

// The naive reference every path is tested against (double accumulation).
void gemm_reference(const GemmShape& shape, const float* a, int64_t lda, const float* b,
                    int64_t ldb, float* c, int64_t ldc, const Epilogue& epilogue);

// Shared by every kernel family: the activation functions of kernels::Activation.
float apply_activation(Activation act, float x, float clip_min, float clip_max);

}  // namespace sparsecol::kernels
