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

// kRows rows at once, their passes interleaved: a row's passes depend on each other (its max,
// then its exponentials and their sum, then the scaling), and one row at a time left the core
// waiting on those chains (the exponential alone is ~12 dependent operations). BERT's scores,
// 128 rows of 128 (bench/norm_bench.cc, one core of the Intel VM, two alternated builds, medians
// of 9): one row at a time 12.5 and 10.6 us, four at once 10.6 and 7.5 us. Eight at once was
// no faster than four. Each row's arithmetic is unchanged: the same results, bit for bit.
template <int kRows>
inline void softmax_row_group(const float* x, int64_t x_ld, float* y, int64_t y_ld, int64_t n) {
  const float inf = std::numeric_limits<float>::infinity();
  Vec m[kRows];
  for (int r = 0; r < kRows; ++r) m[r] = splat(-inf);
  for (int64_t i = 0; i < n; i += kLanes) {
    for (int r = 0; r < kRows; ++r) m[r] = vmax(m[r], load_tail(x + r * x_ld, i, n, -inf));
  }
  float max[kRows];
  Vec sum[kRows];
  for (int r = 0; r < kRows; ++r) {
    max[r] = reduce_max(m[r]);
    sum[r] = splat(0.0f);
  }
  for (int64_t i = 0; i < n; i += kLanes) {
    for (int r = 0; r < kRows; ++r) {
      // Lanes past the row's end become 0 so that they add nothing.
      const Vec e = keep_first(vexp(load_tail(x + r * x_ld, i, n, 0.0f) - max[r]), n - i, 0.0f);
      sum[r] += e;
      store_tail(y + r * y_ld, i, n, e);
    }
  }
  float inv[kRows];
  for (int r = 0; r < kRows; ++r) inv[r] = 1.0f / reduce_add(sum[r]);
  for (int64_t i = 0; i < n; i += kLanes) {
    for (int r = 0; r < kRows; ++r) {
      float* row = y + r * y_ld;
      store_tail(row, i, n, load_tail(row, i, n, 0.0f) * inv[r]);
    }
  }
}

// Rows in groups of kRowGroup through `group` (a template over the rows it takes), the rest one
// by one.
constexpr int kRowGroup = 4;
template <typename Group>
inline void in_row_groups(int64_t rows, Group group) {
  int64_t r = 0;
  for (; r + kRowGroup <= rows; r += kRowGroup) group.template operator()<kRowGroup>(r);
  for (; r < rows; ++r) group.template operator()<1>(r);
}

inline void softmax_rows_impl(const float* src, int64_t src_ld, float* dst, int64_t dst_ld,
                              int64_t rows, int64_t n) {
  in_row_groups(rows, [&]<int kRows>(int64_t r) {
    softmax_row_group<kRows>(src + r * src_ld, src_ld, dst + r * dst_ld, dst_ld, n);
  });
}

// kRows rows at once, as softmax_row_group and for the same reason: each row's sum and sum of
// squares is one chain of dependent additions (48 on BERT's 768 features). BERT's 128 x 768
// (bench/norm_bench.cc, one core of the Intel VM, two alternated builds, medians of 9, CPU time:
// a CI run shared the machine): one row at a time 30.8 and 32.3 us, four at once 19.8 and 17.7
// us. A row's results do not depend on the rows beside it (a depth-wise tile of one token and a
// layer-by-layer task of many agree bit for bit).
template <int kRows>
inline void layer_norm_row_group(const float* x, int64_t x_ld, float* y, int64_t y_ld, int64_t n,
                                 const float* gamma, const float* beta, float epsilon) {
  Vec sum[kRows], sq[kRows];
  for (int r = 0; r < kRows; ++r) sum[r] = sq[r] = splat(0.0f);
  for (int64_t i = 0; i < n; i += kLanes) {
    for (int r = 0; r < kRows; ++r) sum[r] += load_tail(x + r * x_ld, i, n, 0.0f);
  }
  float mean[kRows], inv_std[kRows];
  for (int r = 0; r < kRows; ++r) mean[r] = reduce_add(sum[r]) / static_cast<float>(n);
  for (int64_t i = 0; i < n; i += kLanes) {
    for (int r = 0; r < kRows; ++r) {
      const Vec d = keep_first(load_tail(x + r * x_ld, i, n, 0.0f) - mean[r], n - i, 0.0f);
      sq[r] = fmadd(d, d, sq[r]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    inv_std[r] = 1.0f / std::sqrt(reduce_add(sq[r]) / static_cast<float>(n) + epsilon);
  }
  for (int64_t i = 0; i < n; i += kLanes) {
    const Vec g = load_tail(gamma, i, n, 0.0f);
    const Vec b = beta != nullptr ? load_tail(beta, i, n, 0.0f) : splat(0.0f);
    for (int r = 0; r < kRows; ++r) {
      // An explicit FMA where there is a beta: left to the compiler, v * g + b was contracted
      // into one in some instantiations of this template and not in others (the results of a
      // row then depended on the rows beside it).
      const Vec v = (load_tail(x + r * x_ld, i, n, 0.0f) - mean[r]) * inv_std[r];
      store_tail(y + r * y_ld, i, n, beta != nullptr ? fmadd(v, g, b) : v * g);
    }
  }
}

inline void layer_norm_rows_impl(const float* src, int64_t src_ld, float* dst, int64_t dst_ld,
                                 int64_t rows, int64_t n, const float* gamma, const float* beta,
                                 float epsilon) {
  if (n <= 0) return;
  in_row_groups(rows, [&]<int kRows>(int64_t r) {
    layer_norm_row_group<kRows>(src + r * src_ld, src_ld, dst + r * dst_ld, dst_ld, n, gamma, beta,
                                epsilon);
  });
}

}  // namespace
}  // namespace sparsecol::kernels
