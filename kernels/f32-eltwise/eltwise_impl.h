// The element-wise bodies, compiled once per ISA by eltwise_portable.cc, eltwise_avx2.cc and
// eltwise_avx512.cc (see simd.h for why one body serves all three).
#pragma once

#include <immintrin.h>
#include <algorithm>

#include "f32-eltwise/eltwise.h"
#include "f32-eltwise/simd.h"

namespace sparsecol::kernels {
namespace {

inline Vec vsqrt(Vec x) {
#ifdef __AVX512F__
  // The intrinsic, not a GCC builtin: clang builds (fuzz, TSan) too. The zero-masked form with a
  // full mask, because _mm512_sqrt_ps's _mm512_undefined_ps() trips GCC 12's
  // -Wmaybe-uninitialized.
  return _mm512_maskz_sqrt_ps(0xFFFF, x);
#elif defined(__AVX2__)
  return _mm256_sqrt_ps(x);
#else
  return _mm_sqrt_ps(x);  // SSE: the portable path's 4 lanes
#endif
}

// Applies `fn` to every kLanes-value chunk of a row of n values; the last chunk may be partial.
template <typename Fn>
inline void for_each_chunk(int64_t n, Fn&& fn) {
  for (int64_t i = 0; i < n; i += kLanes) fn(i, n - i < kLanes ? n - i : kLanes);
}

inline Vec operand_chunk(const float* row, bool contiguous, int64_t i, int64_t count) {
  if (!contiguous) return splat(row[0]);
  return count == kLanes ? load(row + i) : load_partial(row + i, count);
}

template <BinaryKind kKind>
inline Vec binary_op(Vec a, Vec b) {
  if constexpr (kKind == BinaryKind::kAdd) return a + b;
  if constexpr (kKind == BinaryKind::kSub) return a - b;
  if constexpr (kKind == BinaryKind::kMul) return a * b;
  if constexpr (kKind == BinaryKind::kDiv) return a / b;
}

template <BinaryKind kKind>
inline void binary_rows_for(const RowOperand& a, const RowOperand& b, float* dst, int64_t dst_ld,
                            int64_t rows, int64_t n) {
  const bool a_contiguous = a.column_stride != 0, b_contiguous = b.column_stride != 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* a_row = a.data + r * a.row_stride;
    const float* b_row = b.data + r * b.row_stride;
    float* y = dst + r * dst_ld;
    for_each_chunk(n, [&](int64_t i, int64_t count) {
      const Vec v = binary_op<kKind>(operand_chunk(a_row, a_contiguous, i, count),
                                     operand_chunk(b_row, b_contiguous, i, count));
      if (count == kLanes) {
        store(y + i, v);
      } else {
        store_partial(y + i, v, count);
      }
    });
  }
}

inline void binary_rows_impl(BinaryKind kind, const RowOperand& a, const RowOperand& b, float* dst,
                             int64_t dst_ld, int64_t rows, int64_t n) {
  switch (kind) {
    case BinaryKind::kAdd:
      return binary_rows_for<BinaryKind::kAdd>(a, b, dst, dst_ld, rows, n);
    case BinaryKind::kSub:
      return binary_rows_for<BinaryKind::kSub>(a, b, dst, dst_ld, rows, n);
    case BinaryKind::kMul:
      return binary_rows_for<BinaryKind::kMul>(a, b, dst, dst_ld, rows, n);
    case BinaryKind::kDiv:
      return binary_rows_for<BinaryKind::kDiv>(a, b, dst, dst_ld, rows, n);
  }
}

template <typename Fn>
inline void unary_rows_for(const float* src, int64_t src_ld, float* dst, int64_t dst_ld,
                           int64_t rows, int64_t n, Fn fn) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = src + r * src_ld;
    float* y = dst + r * dst_ld;
    for_each_chunk(n, [&](int64_t i, int64_t count) {
      if (count == kLanes) {
        store(y + i, fn(load(x + i)));
      } else {
        store_partial(y + i, fn(load_partial(x + i, count)), count);
      }
    });
  }
}

inline void unary_rows_impl(UnaryKind kind, const float* src, int64_t src_ld, float* dst,
                            int64_t dst_ld, int64_t rows, int64_t n, float lo, float hi) {
  auto run = [&](auto fn) { unary_rows_for(src, src_ld, dst, dst_ld, rows, n, fn); };
  switch (kind) {
    case UnaryKind::kRelu:
      return run([](Vec x) { return vmax(x, splat(0.0f)); });
    case UnaryKind::kClip:
      return run([lo, hi](Vec x) { return vmin(vmax(x, splat(lo)), splat(hi)); });
    case UnaryKind::kGelu:
      return run([](Vec x) { return vgelu(x); });
    case UnaryKind::kSigmoid:
      return run([](Vec x) { return vsigmoid(x); });
    case UnaryKind::kTanh:
      return run([](Vec x) { return vtanh(x); });
    case UnaryKind::kErf:
      return run([](Vec x) { return verf(x); });
    case UnaryKind::kExp:
      return run([](Vec x) { return vexp(x); });
    case UnaryKind::kSqrt:
      return run([](Vec x) { return vsqrt(x); });
    case UnaryKind::kNeg:
      return run([](Vec x) { return -x; });
  }
}

// Stride 2 reads 2 * count - 1 floats per row: whole vector pairs while they stay within them,
// then masked loads of what is left.
inline void gather_row(const float* in, int64_t stride, int64_t count, float* out) {
  int64_t x = 0;
  if (stride == 1) {
    for (; x + kLanes <= count; x += kLanes) store(out + x, load(in + x));
    if (x < count) store_partial(out + x, load_partial(in + x, count - x), count - x);
    return;
  }
  if (stride == 2) {
    for (; x + kLanes < count; x += kLanes) {
      store(out + x, even_lanes(load(in + 2 * x), load(in + 2 * x + kLanes)));
    }
    const int64_t left = count - x, reads = 2 * left - 1;  // 1 <= left <= kLanes
    if (left > 0) {
      const Vec lo = reads >= kLanes ? load(in + 2 * x) : load_partial(in + 2 * x, reads);
      const Vec hi =
          reads > kLanes ? load_partial(in + 2 * x + kLanes, reads - kLanes) : splat(0.0f);
      if (left == kLanes) {
        store(out + x, even_lanes(lo, hi));
      } else {
        store_partial(out + x, even_lanes(lo, hi), left);
      }
    }
    return;
  }
  for (; x < count; ++x) out[x] = in[x * stride];
}

inline void gather_rows_impl(const float* in, int64_t in_ld, int64_t stride, int64_t rows,
                             int64_t first, int64_t last, int64_t width, float* out,
                             int64_t out_ld) {
  for (int64_t r = 0; r < rows; ++r, in += in_ld, out += out_ld) {
    for (int64_t x = 0; x < first; ++x) out[x] = 0.0f;
    if (last > first) gather_row(in, stride, last - first, out + first);
    for (int64_t x = std::max(first, last); x < width; ++x) out[x] = 0.0f;
  }
}

// The kLanes values at t .. t + kLanes - 1 of a row of n floats, zeros where t + i lies outside
// [0, n).
inline Vec load_window(const float* row, int64_t t, int64_t n) {
  const int64_t lo = std::clamp<int64_t>(-t, 0, kLanes), hi = std::clamp<int64_t>(n - t, 0, kLanes);
  if (lo == 0 && hi == kLanes) return load(row + t);
  if (hi <= lo) return splat(0.0f);
  return load_lanes(row + t + lo, lo, hi);
}

inline void split_column_phases_impl(const float* in, int64_t in_ld, int64_t in_w, int64_t shift,
                                     int64_t rows, int64_t width, float* even, float* odd,
                                     int64_t out_ld) {
  for (int64_t r = 0; r < rows; ++r, in += in_ld, even += out_ld, odd += out_ld) {
    for (int64_t x = 0; x < width; x += kLanes) {
      const int64_t t = 2 * x - shift;
      const Vec a = load_window(in, t, in_w), b = load_window(in, t + kLanes, in_w);
      if (width - x >= kLanes) {
        store(even + x, even_lanes(a, b));
        store(odd + x, odd_lanes(a, b));
      } else {
        store_partial(even + x, even_lanes(a, b), width - x);
        store_partial(odd + x, odd_lanes(a, b), width - x);
      }
    }
  }
}

}  // namespace
}  // namespace sparsecol::kernels
