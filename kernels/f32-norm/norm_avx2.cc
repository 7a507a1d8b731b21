// Softmax and layer norm compiled for AVX2 + FMA (ymm): see norm.h.
#include "f32-norm/norm_impl.h"

namespace sparsecol::kernels::detail {

void softmax_rows_avx2(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows,
                       int64_t n) {
  softmax_rows_impl(src, src_ld, dst, dst_ld, rows, n);
}

void layer_norm_rows_avx2(const float* src, int64_t src_ld, float* dst, int64_t dst_ld,
                          int64_t rows, int64_t n, const float* gamma, const float* beta,
                          float epsilon) {
  layer_norm_rows_impl(src, src_ld, dst, dst_ld, rows, n, gamma, beta, epsilon);
}

}  // namespace sparsecol::kernels::detail
