// The 2-D transpose of eltwise.h (x86-64-v2 baseline: built without per-ISA flags).
#include <immintrin.h>

#include "f32-eltwise/eltwise.h"

namespace sparsecol::kernels {

void transpose_2d(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                  int64_t ldd) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    const float* s = src + r * lds;
    int64_t c = 0;
    for (; c + 4 <= cols; c += 4) {
      __m128 a = _mm_loadu_ps(s + c), b = _mm_loadu_ps(s + lds + c);
      __m128 e = _mm_loadu_ps(s + 2 * lds + c), f = _mm_loadu_ps(s + 3 * lds + c);
      _MM_TRANSPOSE4_PS(a, b, e, f);
      _mm_storeu_ps(dst + c * ldd + r, a);
      _mm_storeu_ps(dst + (c + 1) * ldd + r, b);
      _mm_storeu_ps(dst + (c + 2) * ldd + r, e);
      _mm_storeu_ps(dst + (c + 3) * ldd + r, f);
    }
    for (; c < cols; ++c) {
      for (int64_t i = 0; i < 4; ++i) dst[c * ldd + r + i] = s[i * lds + c];
    }
  }
  for (; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
  }
}

}  // namespace sparsecol::kernels
