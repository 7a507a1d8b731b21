// Element-wise kernels compiled for AVX2 + FMA (ymm): see eltwise.h.
#include "f32-eltwise/eltwise_impl.h"

namespace sparsecol::kernels::detail {

void binary_rows_avx2(BinaryKind kind, const RowOperand& a, const RowOperand& b, float* dst,
                      int64_t dst_ld, int64_t rows, int64_t n) {
  binary_rows_impl(kind, a, b, dst, dst_ld, rows, n);
}

void unary_rows_avx2(UnaryKind kind, const float* src, int64_t src_ld, float* dst, int64_t dst_ld,
                     int64_t rows, int64_t n, float lo, float hi) {
  unary_rows_impl(kind, src, src_ld, dst, dst_ld, rows, n, lo, hi);
}

void gather_rows_avx2(const float* in, int64_t in_ld, int64_t stride, int64_t rows, int64_t first,
                      int64_t last, int64_t width, float* out, int64_t out_ld) {
  gather_rows_impl(in, in_ld, stride, rows, first, last, width, out, out_ld);
}

void split_column_phases_avx2(const float* in, int64_t in_ld, int64_t in_w, int64_t shift,
                              int64_t rows, int64_t width, float* even, float* odd,
                              int64_t out_ld) {
  split_column_phases_impl(in, in_ld, in_w, shift, rows, width, even, odd, out_ld);
}

}  // namespace sparsecol::kernels::detail
