// Softmax and layer norm compiled for the baseline ISA, and the ISA dispatch (the best compiled
// variant no higher than the requested and the active ISA): see norm.h.
#include "f32-norm/norm.h"
#include "f32-norm/norm_impl.h"

namespace sparsecol::kernels {
namespace detail {

void softmax_rows_avx2(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows,
                       int64_t n);
void layer_norm_rows_avx2(const float* src, int64_t src_ld, float* dst, int64_t dst_ld,
                          int64_t rows, int64_t n, const float* gamma, const float* beta,
                          float epsilon);

void softmax_rows_avx512(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows,
                         int64_t n);
void layer_norm_rows_avx512(const float* src, int64_t src_ld, float* dst, int64_t dst_ld,
                            int64_t rows, int64_t n, const float* gamma, const float* beta,
                            float epsilon);

}  // namespace detail

void softmax_rows(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows,
                  int64_t n, Isa isa) {
  switch (effective_isa(isa)) {
    case Isa::kAvx512:
      return detail::softmax_rows_avx512(src, src_ld, dst, dst_ld, rows, n);
    case Isa::kAvx2:
      return detail::softmax_rows_avx2(src, src_ld, dst, dst_ld, rows, n);
    case Isa::kPortable:
      return softmax_rows_impl(src, src_ld, dst, dst_ld, rows, n);
  }
}

void layer_norm_rows(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows,
                     int64_t n, const float* gamma, const float* beta, float epsilon, Isa isa) {
  switch (effective_isa(isa)) {
    case Isa::kAvx512:
      return detail::layer_norm_rows_avx512(src, src_ld, dst, dst_ld, rows, n, gamma, beta,
                                            epsilon);
    case Isa::kAvx2:
      return detail::layer_norm_rows_avx2(src, src_ld, dst, dst_ld, rows, n, gamma, beta, epsilon);
    case Isa::kPortable:
      return layer_norm_rows_impl(src, src_ld, dst, dst_ld, rows, n, gamma, beta, epsilon);
  }
}

}  // namespace sparsecol::kernels
