// The softmax and layer-norm bodies, compiled once per ISA by norm_portable.cc, norm_avx2.cc
// and norm_avx512.cc (see f32-eltwise/simd.h for why one body serves all three).
#pragma once

#include <cmath>
#include <limits>

#include "f32-eltwise/simd.h"

namespace sparsecol::kernels {
namespace {

// Loads the kLanes values at x[i] (fewer at the row's end, the rest `fill`).
inline Vec load_tail(const float* x, int64_t i, int64_t n, float fill) {
  return n - i >= kLanes ? load(x + i) : keep_first(load_partial(x + i, n - i), n - i, fill);
}
inline void store_tail(float* y, int64_t i, int64_t n, Vec v) {
  if (n - i >= kLanes) {
    store(y + i, v);
  } else {
    store_partial(y + i, v, n - i);
  }
}

inline void softmax_row(const float* x, float* y, int64_t n) {
  const float inf = std::numeric_limits<float>::infinity();
  Vec m = splat(-inf);
  for (int64_t i = 0; i < n; i += kLanes) m = vmax(m, load_tail(x, i, n, -inf));
  const float max = reduce_max(m);
  Vec sum = splat(0.0f);
  for (int64_t i = 0; i < n; i += kLanes) {
    // Lanes past the row's end become 0 so that they add nothing.
    const Vec e = keep_first(vexp(load_tail(x, i, n, 0.0f) - max), n - i, 0.0f);
    sum += e;
    store_tail(y, i, n, e);
  }
  const float inv = 1.0f / reduce_add(sum);
  for (int64_t i = 0; i < n; i += kLanes) store_tail(y, i, n, load_tail(y, i, n, 0.0f) * inv);
}

inline void softmax_rows_impl(const float* src, int64_t src_ld, float* dst, int64_t dst_ld,
                              int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) softmax_row(src + r * src_ld, dst + r * dst_ld, n);
}

inline void layer_norm_rows_impl(const float* src, int64_t src_ld, float* dst, int64_t dst_ld,
                                 int64_t rows, int64_t n, const float* gamma, const float* beta,
                                 float epsilon) {
  if (n <= 0) return;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = src + r * src_ld;
    float* y = dst + r * dst_ld;
    Vec sum = splat(0.0f);
    for (int64_t i = 0; i < n; i += kLanes) sum += load_tail(x, i, n, 0.0f);
    const float mean = reduce_add(sum) / static_cast<float>(n);
    Vec sq = splat(0.0f);
    for (int64_t i = 0; i < n; i += kLanes) {
      const Vec d = keep_first(load_tail(x, i, n, 0.0f) - mean, n - i, 0.0f);
      sq = fmadd(d, d, sq);
    }
    const float inv_std = 1.0f / std::sqrt(reduce_add(sq) / static_cast<float>(n) + epsilon);
    for (int64_t i = 0; i < n; i += kLanes) {
      Vec v = (load_tail(x, i, n, 0.0f) - mean) * inv_std * load_tail(gamma, i, n, 0.0f);
      if (beta != nullptr) v += load_tail(beta, i, n, 0.0f);
      store_tail(y, i, n, v);
    }
  }
}

}  // namespace
}  // namespace sparsecol::kernels
