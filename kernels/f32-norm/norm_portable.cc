// Softmax and layer norm compiled for the baseline ISA, and the ISA dispatch: see norm.h.
#include "f32-norm/norm.h"
#include "f32-norm/norm_impl.h"

namespace sparsecol::kernels {
namespace detail {

void softmax_rows_avx512(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows,
                         int64_t n);
void layer_norm_rows_avx512(const float* src, int64_t src_ld, float* dst, int64_t dst_ld,
                            int64_t rows, int64_t n, const float* gamma, const float* beta,
                            float epsilon);

}  // namespace detail

void softmax_rows(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows,
                  int64_t n, Isa isa) {
  if (isa == Isa::kAvx512 && active_isa() == Isa::kAvx512) {
    detail::softmax_rows_avx512(src, src_ld, dst, dst_ld, rows, n);
  } else {
    softmax_rows_impl(src, src_ld, dst, dst_ld, rows, n);
  }
}

void layer_norm_rows(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows,
                     int64_t n, const float* gamma, const float* beta, float epsilon, Isa isa) {
  if (isa == Isa::kAvx512 && active_isa() == Isa::kAvx512) {
    detail::layer_norm_rows_avx512(src, src_ld, dst, dst_ld, rows, n, gamma, beta, epsilon);
  } else {
    layer_norm_rows_impl(src, src_ld, dst, dst_ld, rows, n, gamma, beta, epsilon);
  }
}

}  // namespace sparsecol::kernels
