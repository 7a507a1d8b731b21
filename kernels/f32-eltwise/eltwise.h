// f32 element-wise kernels over a range of rows: binary arithmetic with the broadcasts that
// occur in the models (same shape, scalar, vector along the last axis, one value per row) and
// unary activations.
//
// Layout: a region is `rows` rows of `n` values; dst rows are `dst_ld` apart. Each operand is a
// pointer plus two strides that express its broadcast without materializing it:
//   same shape             {p, row_stride = ld, column_stride = 1}
//   vector along last axis {p, row_stride = 0,  column_stride = 1}   (bias, attention mask row)
//   scalar                 {p, row_stride = 0,  column_stride = 0}
//   one value per row      {p, row_stride = 1,  column_stride = 0}
// The executor maps an ONNX broadcast onto rows x n (n = the last dims the operands share) and
// offsets the pointers to the first row of its region.
#pragma once

#include <cstdint>

#include "isa.h"

namespace sparsecol::kernels {

enum class BinaryKind { kAdd, kSub, kMul, kDiv };

struct RowOperand {
  const float* data = nullptr;
  int64_t row_stride = 0;     // floats between rows; 0 repeats one row
  int64_t column_stride = 1;  // 1 (contiguous) or 0 (one value repeated along the row)
};

// dst[r][j] = a[r][j] op b[r][j]. dst may alias a same-shape operand. `isa` is capped at
// active_isa().
void binary_rows(BinaryKind kind, const RowOperand& a, const RowOperand& b, float* dst,
                 int64_t dst_ld, int64_t rows, int64_t n, Isa isa = active_isa());

enum class UnaryKind { kRelu, kClip, kGelu, kSigmoid, kTanh, kErf, kExp, kSqrt, kNeg };

// dst[r][j] = f(src[r][j]); kClip uses [lo, hi]. kGelu is the erf form (PyTorch nn.GELU()).
void unary_rows(UnaryKind kind, const float* src, int64_t src_ld, float* dst, int64_t dst_ld,
                int64_t rows, int64_t n, float lo = 0.0f, float hi = 0.0f, Isa isa = active_isa());

// Rows of a strided gather into zero-padded rows: for r in [0, rows), out row r (out_ld apart)
// is in[r * in_ld + (x - first) * stride] at columns x in [first, last) and zero at columns
// [0, first) and [last, width).
// The strided gathers of the convolutions' im2col, phase planes (but stride 2's, see
// split_column_phases) and strided 1x1 layers
// (f32-conv/conv.cc), a whole block of rows per call. Stride 2 takes the even lanes of two vector
// loads per vector of outputs, the last vector of a row through masked loads and stores; reads
// stay within in[r * in_ld + (last - first - 1) * stride]. `isa` is capped at active_isa().
// The scalar loop was a quarter of ResNet-50's stem (perf, one thread); SSE even lanes (4 per
// step) made the stems 1.14-1.17x faster, and a zmm step of 16 (one vpermt2ps) MobileNetV2's stem
// 1.07x more, where the copy had grown to a third of its time (bench/conv_bench.cc, 16 images, one
// thread, Zen 5). One row per call (28 outputs: one vector and 12 scalar copies, the dispatch and
// the zero edges per row) was 40% of ResNet-50's stride-2 3x3 layer at 90% sparsity.
void gather_rows(const float* in, int64_t in_ld, int64_t stride, int64_t rows, int64_t first,
                 int64_t last, int64_t width, float* out, int64_t out_ld, Isa isa = active_isa());

// The two column phases of stride-2 rows, from one read of each row: for r in [0, rows) and x in
// [0, width), even row r (out_ld apart, odd likewise) is in[r * in_ld + 2 * x - shift] and odd
// row r is in[r * in_ld + 2 * x + 1 - shift], zero where that column lies outside [0, in_w) (the
// padding left of the row, for shift > 0, or past its end). Reads only columns [0, in_w) of each
// row. The phase planes of a stride-2 convolution (f32-conv/conv.cc, fill_phases): gather_rows
// per phase read every input row twice, the even half for one plane and the odd for the other,
// and zeroed each row's edges element by element: with this ResNet-50's stride-2 3x3 layers ran
// 1.11-1.19x (layer 2) and 1.06-1.07x (layer 4) faster at 90% sparsity, 1.14-1.19x and 1.04-1.11x
// at 95%, its 7x7 stem 1.05-1.06x on one image (bench/, one thread, Zen 4, old and new binary
// alternated twice).
void split_column_phases(const float* in, int64_t in_ld, int64_t in_w, int64_t shift, int64_t rows,
                         int64_t width, float* even, float* odd, int64_t out_ld,
                         Isa isa = active_isa());

// dst[c * ldd + r] = src[r * lds + c] for a rows x cols block (a 2-D transpose between strided
// views): 4 x 4 blocks transposed in SSE registers (the x86-64-v2 baseline) within 16 x 16
// tiles (see transpose.cc), scalar edges.
// A scalar element-by-element transpose cost a third of the sparse kernel's time on BERT's
// 768x768 layer at 95% (bench/spmm_bench.cc). One body for every ISA. src and dst must not
// overlap.
void transpose_2d(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                  int64_t ldd);

}  // namespace sparsecol::kernels
