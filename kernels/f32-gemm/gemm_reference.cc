// The naive GEMM every fast path is tested against: dot products summed in double, then the
// epilogue in the order kernels/epilogue.h defines, through the shared apply_activation.
#include "f32-gemm/gemm.h"

namespace sparsecol::kernels {

void gemm_reference(const GemmShape& shape, const float* a, int64_t lda, const float* b,
                    int64_t ldb, float* c, int64_t ldc, const Epilogue& e) {
  for (int64_t i = 0; i < shape.m; ++i) {
    for (int64_t j = 0; j < shape.n; ++j) {
      double acc = 0.0;
      for (int64_t p = 0; p < shape.k; ++p) {
        acc += static_cast<double>(a[i * lda + p]) * static_cast<double>(b[p * ldb + j]);
      }
      if (e.row_bias != nullptr) acc += e.row_bias[i];
      if (e.col_bias != nullptr) acc += e.col_bias[j];
      float x = apply_activation(e.pre_residual, static_cast<float>(acc), e.clip_min, e.clip_max);
      if (e.residual != nullptr) x += e.residual[i * e.residual_ld + j];
      c[i * ldc + j] = apply_activation(e.post_residual, x, e.clip_min, e.clip_max);
    }
  }
}

}  // namespace sparsecol::kernels
