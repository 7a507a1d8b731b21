// The AVX-512 micro-kernels, f32_gemm_<MR>x<NR>__avx512 (see ukernels.h for the choice of tile).
//
// Layout: A packed k-major in MR-row panels (one k step = MR consecutive floats, each broadcast
// with vbroadcastss), B read in place as rows of NR floats at stride ldb, C's MR x NR tile held
// in MR * NR / 16 zmm accumulators for the whole depth. Column tails use __mmask16 masked loads
// and stores (masked-off lanes neither fault nor write); row tails compute the zero-padded panel
// rows and skip their stores. The epilogue runs on the accumulators before the single store.
// Only called when active_isa() is kAvx512 (this file is compiled with -mavx512f/bw/vl/dq).
#include <immintrin.h>

#include <cstdint>

// GCC 12 warns that the merge operand of the unmasked min/max intrinsics (_mm512_undefined_ps)
// "may be used uninitialized" once inlined (GCC bug 105593); it is not read.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "f32-gemm/ukernels.h"

namespace sparsecol::kernels {
namespace {

__m512 erf_avx512(__m512 x) {
  const __m512 xc =
      _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-kErfClamp)), _mm512_set1_ps(kErfClamp));
  const __m512 t = _mm512_mul_ps(xc, xc);
  __m512 p = _mm512_set1_ps(kErfP[5]);
  __m512 q = _mm512_set1_ps(kErfQ[5]);
  for (int i = 4; i >= 0; --i) {
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(kErfP[i]));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(kErfQ[i]));
  }
  return _mm512_mul_ps(xc, _mm512_div_ps(p, q));
}

inline __m512 activate(Activation act, __m512 x, __m512 clip_min, __m512 clip_max) {
  switch (act) {
    case Activation::kNone:
      return x;
    case Activation::kRelu:
      return _mm512_max_ps(x, _mm512_setzero_ps());  // NaN -> 0, as x > 0 ? x : 0
    case Activation::kClip:
      return _mm512_min_ps(_mm512_max_ps(x, clip_min), clip_max);
    case Activation::kGelu: {
      const __m512 erf = erf_avx512(_mm512_mul_ps(x, _mm512_set1_ps(0.70710678118654752f)));
      return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), x),
                           _mm512_add_ps(_mm512_set1_ps(1.0f), erf));
    }
  }
  return x;
}

// acc += A panel x B rows over k steps. kFullN: all NR columns valid (plain loads).
template <int kMr, int kNv, bool kFullN>
inline void multiply_accumulate(__m512 (&acc)[kMr][kNv], const float* a, const float* b, int64_t k,
                                int64_t ldb, const __mmask16 (&mask)[kNv]) {
  for (int64_t p = 0; p < k; ++p, a += kMr, b += ldb) {
    __m512 bv[kNv];
#pragma GCC unroll 8
    for (int v = 0; v < kNv; ++v) {
      bv[v] = kFullN ? _mm512_loadu_ps(b + 16 * v) : _mm512_maskz_loadu_ps(mask[v], b + 16 * v);
    }
#pragma GCC unroll 16
    for (int i = 0; i < kMr; ++i) {
      const __m512 ai = _mm512_set1_ps(a[i]);
#pragma GCC unroll 8
      for (int v = 0; v < kNv; ++v) acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
    }
  }
}

template <int kMr, int kNv>
void ukernel_avx512(const GemmUkernelArgs& args) {
  constexpr int kNr = 16 * kNv;
  __mmask16 mask[kNv];
  for (int v = 0; v < kNv; ++v) {
    const int64_t left = args.n - 16 * v;
    mask[v] =
        left >= 16 ? __mmask16(0xFFFF) : (left <= 0 ? __mmask16(0) : __mmask16((1u << left) - 1));
  }
  __m512 acc[kMr][kNv];
#pragma GCC unroll 16
  for (int i = 0; i < kMr; ++i) {
#pragma GCC unroll 8
    for (int v = 0; v < kNv; ++v) acc[i][v] = _mm512_setzero_ps();
  }
  const bool full_n = args.n == kNr;
  if (full_n) {
    multiply_accumulate<kMr, kNv, true>(acc, args.a, args.b, args.k, args.ldb, mask);
  } else {
    multiply_accumulate<kMr, kNv, false>(acc, args.a, args.b, args.k, args.ldb, mask);
  }

  const Epilogue* e = args.epilogue;
  __m512 col_bias[kNv];
  __m512 clip_min = _mm512_setzero_ps(), clip_max = _mm512_setzero_ps();
  if (e != nullptr) {
    clip_min = _mm512_set1_ps(e->clip_min);
    clip_max = _mm512_set1_ps(e->clip_max);
    for (int v = 0; v < kNv; ++v) {
      col_bias[v] = e->col_bias != nullptr ? _mm512_maskz_loadu_ps(mask[v], e->col_bias + 16 * v)
                                           : _mm512_setzero_ps();
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < kMr; ++i) {
    if (i >= args.m) break;
    float* c = args.c + i * args.ldc;
#pragma GCC unroll 8
    for (int v = 0; v < kNv; ++v) {
      __m512 x = acc[i][v];
      if (args.accumulate) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(mask[v], c + 16 * v));
      if (e != nullptr) {
        if (e->row_bias != nullptr) x = _mm512_add_ps(x, _mm512_set1_ps(e->row_bias[i]));
        x = _mm512_add_ps(x, col_bias[v]);
        x = activate(e->pre_residual, x, clip_min, clip_max);
        if (e->residual != nullptr) {
          x = _mm512_add_ps(
              x, _mm512_maskz_loadu_ps(mask[v], e->residual + i * e->residual_ld + 16 * v));
        }
        x = activate(e->post_residual, x, clip_min, clip_max);
      }
      if (full_n) {
        _mm512_storeu_ps(c + 16 * v, x);
      } else {
        _mm512_mask_storeu_ps(c + 16 * v, mask[v], x);
      }
    }
  }
}

}  // namespace

void f32_gemm_8x32__avx512(const GemmUkernelArgs& args) { ukernel_avx512<8, 2>(args); }
void f32_gemm_6x64__avx512(const GemmUkernelArgs& args) { ukernel_avx512<6, 4>(args); }

}  // namespace sparsecol::kernels
