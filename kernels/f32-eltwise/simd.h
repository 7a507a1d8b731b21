// f32 vector helpers (GCC/Clang generic vectors) shared by the non-GEMM kernel families.
//
// Why generic vectors: one kernel body serves every ISA path. A `*_avx512.cc` file compiles it
// with 16 lanes to zmm instructions, a `*_avx2.cc` file with 8 lanes to ymm (AVX2 + FMA), and a
// `*_portable.cc` file (x86-64-v2) compiles the same source with 4 lanes to SSE. Every line of a
// kernel body is lane-count generic, so the paths every machine can test exercise the logic the
// AVX-512 path runs. Everything here (and
// in every `*_impl.h` that includes it) lives in an anonymous namespace: each translation unit
// gets its own copy compiled with its own flags, and the linker can never hand the portable path
// an AVX-512 body (an ODR trap otherwise).
// Include only from .cc files.
#pragma once

#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "epilogue.h"
#include "f32-gemm/gemm.h"

namespace sparsecol::kernels {
namespace {

// A zmm register on the AVX-512 path, a ymm register on the AVX2 one, an xmm register on the
// portable one (a wider generic vector there would be split anyway, and GCC warns that passing
// it changes the ABI).
#if defined(__AVX512F__)
constexpr int64_t kLanes = 16;
#elif defined(__AVX2__)
constexpr int64_t kLanes = 8;
#else
constexpr int64_t kLanes = 4;
#endif
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t IVec __attribute__((vector_size(kLanes * sizeof(float))));

inline Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }
// Even and odd lanes of the 2 * kLanes values a:b, for stride-2 phase splitting (one
// vpermt2ps on AVX-512).
inline Vec even_lanes(Vec a, Vec b) {
#ifdef __AVX512F__
  return __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
#elif defined(__AVX2__)
  return __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14);
#else
  return __builtin_shufflevector(a, b, 0, 2, 4, 6);
#endif
}
inline Vec odd_lanes(Vec a, Vec b) {
#ifdef __AVX512F__
  return __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
#elif defined(__AVX2__)
  return __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15);
#else
  return __builtin_shufflevector(a, b, 1, 3, 5, 7);
#endif
}

// Lanes K .. K + kLanes - 1 of the 2 * kLanes values a:b (one valignd on AVX-512): the vector
// that starts K values after a, built from two aligned loads instead of a third, unaligned one
// (the depthwise kernels, the shifted sparse product).
template <int K, std::size_t... I>
inline Vec shift_lanes(Vec a, Vec b, std::index_sequence<I...>) {
  return __builtin_shufflevector(a, b, (I + K)...);
}
template <int K>
inline Vec shift_lanes(Vec a, Vec b) {
#ifdef __AVX512F__
  // GCC lowers the generic shuffle to vpermt2ps, which overwrites an operand (extra copies).
  // The masked form with every lane selected: GCC 12's plain _mm512_alignr_epi32 draws a
  // spurious maybe-uninitialized warning from its undefined pass-through operand.
  const __m512i lo = _mm512_castps_si512(a);
  return _mm512_castsi512_ps(_mm512_mask_alignr_epi32(lo, 0xFFFF, _mm512_castps_si512(b), lo, K));
#else
  return shift_lanes<K>(a, b, std::make_index_sequence<kLanes>{});
#endif
}

// The first `count` lanes (0 < count < kLanes) from p, zeros elsewhere, never touching memory
// past them (masked loads do not fault on masked-off lanes).
inline Vec load_partial(const float* p, int64_t count) {
#if defined(__AVX512F__)
  return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << count) - 1), p);
#elif defined(__AVX2__)
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)),
                                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return _mm256_maskload_ps(p, mask);
#else
  Vec v = {};
  std::memcpy(&v, p, static_cast<std::size_t>(count) * sizeof(float));
  return v;
#endif
}
inline void store_partial(float* p, Vec v, int64_t count) {
#if defined(__AVX512F__)
  _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << count) - 1), v);
#elif defined(__AVX2__)
  // Whole stores of 4, 2 and 1 floats instead of a masked store (vmaskmovps), which cost ~15
  // cycles each on Zen 3 (a standalone loop: 4.3-4.6 ns a store against 1.0-1.4 ns). A sparse
  // product stores a tail vector per output row: CNN classifiers at batch 1 (one column) ran
  // 1.2-1.46x faster, ResNet-50's 7x7 layers at 90% and 95% 1.05-1.13x (bench/spmm_bench.cc, one
  // thread, best of 10 runs each). The channel-lane depthwise kernel, whose 7x7 planes end every
  // row so, made its own such stores before.
  __m128 part = _mm256_castps256_ps128(v);
  if (count & 4) {
    _mm_storeu_ps(p, part);
    part = _mm256_extractf128_ps(v, 1);
    p += 4;
  }
  if (count & 2) {
    _mm_storel_pi(reinterpret_cast<__m64*>(p), part);
    part = _mm_movehl_ps(part, part);
    p += 2;
  }
  if (count & 1) _mm_store_ss(p, part);
#else
  std::memcpy(p, &v, static_cast<std::size_t>(count) * sizeof(float));
#endif
}

// Lanes [lo, hi) (0 <= lo < hi <= kLanes) from first[0 .. hi - lo), zeros elsewhere: a vector
// that starts before a row (or ends past it) filled from the part inside, without forming an
// address outside it (vexpandps on AVX-512; a copy through the stack elsewhere).
inline Vec load_lanes(const float* first, int64_t lo, int64_t hi) {
#if defined(__AVX512F__)
  const auto mask = static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1));
  return _mm512_maskz_expandloadu_ps(mask, first);
#else
  float lanes[kLanes] = {};
  std::memcpy(lanes + lo, first, static_cast<std::size_t>(hi - lo) * sizeof(float));
  return load(lanes);
#endif
}
// Lanes [0, count) (0 < count <= kLanes) of base[index[i] >> shift], zeros elsewhere, never
// touching index past count (a masked vgatherdps on AVX-512 and AVX2).
inline Vec gather_partial(const float* base, const int32_t* index, int shift, int64_t count) {
#if defined(__AVX512F__)
  const auto mask = static_cast<__mmask16>((1u << count) - 1);
  const IVec at = reinterpret_cast<IVec>(_mm512_maskz_loadu_epi32(mask, index)) >> shift;
  return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), mask, reinterpret_cast<__m512i>(at), base,
                                  4);
#elif defined(__AVX2__)
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)),
                                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const IVec at = reinterpret_cast<IVec>(_mm256_maskload_epi32(index, mask)) >> shift;
  return _mm256_mask_i32gather_ps(_mm256_setzero_ps(), base, reinterpret_cast<__m256i>(at),
                                  _mm256_castsi256_ps(mask), 4);
#else
  Vec v = {};
  for (int64_t i = 0; i < count; ++i) v[i] = base[index[i] >> shift];
  return v;
#endif
}
// *p in every lane, straight from memory (vbroadcastss m32): splat() of a loaded float compiles
// to an add and a register broadcast on the kernels' critical path of issued uops.
inline Vec broadcast(const float* p) {
#if defined(__AVX512F__)
  return _mm512_set1_ps(*p);
#elif defined(__AVX2__)
  return _mm256_broadcast_ss(p);
#else
  return _mm_load1_ps(p);
#endif
}
inline Vec splat(float x) { return Vec{} + x; }
// v with lanes `count` and above replaced by `fill`.
inline Vec keep_first(Vec v, int64_t count, float fill) {
  IVec lane;
  for (int i = 0; i < kLanes; ++i) lane[i] = i;
  return lane < static_cast<int32_t>(count) ? v : splat(fill);
}
// a * b + c, fused where the ISA has FMA. Written out where it matters: GCC 12 contracts a plain
// a * b + c into an FMA in some places and not in others, even in ISO C++ mode (layer norm's
// scale and shift came out differently in two instantiations of one template).
inline Vec fmadd(Vec a, Vec b, Vec c) {
#if defined(__AVX512F__)
  return __builtin_ia32_vfmaddps512_mask(a, b, c, -1, 4);
#elif defined(__AVX2__) && defined(__FMA__)
  return _mm256_fmadd_ps(a, b, c);
#else
  return a * b + c;
#endif
}
// The same for one float: fused where the vector one is.
inline float fmadd(float a, float b, float c) {
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}
inline Vec vmax(Vec a, Vec b) { return a > b ? a : b; }
inline Vec vmin(Vec a, Vec b) { return a < b ? a : b; }
// The sum of the lanes, halving: lane i + lane i + kLanes / 2, and so on down to one (a few
// shuffles and adds instead of a chain of kLanes - 1 adds on extracted lanes).
inline float reduce_add(Vec v) {
#if defined(__AVX512F__)
  // The same halving on the vector's halves and quarters (no _mm512_reduce_add_ps: GCC 12's
  // _mm*_undefined_* in it trip -Wmaybe-uninitialized).
  typedef float Half __attribute__((vector_size(32)));
  typedef float Quarter __attribute__((vector_size(16)));
  const Half h = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                 __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const Quarter q =
      __builtin_shufflevector(h, h, 0, 1, 2, 3) + __builtin_shufflevector(h, h, 4, 5, 6, 7);
  return (q[0] + q[2]) + (q[1] + q[3]);
#else
  float lanes[kLanes];
  std::memcpy(lanes, &v, sizeof v);
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int i = 0; i < width; ++i) lanes[i] += lanes[i + width];
  }
  return lanes[0];
#endif
}
inline float reduce_max(Vec v) {
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

// exp(x): x = n ln2 + r with |r| <= ln2/2 (Cody-Waite: ln2 split in a high part exact in float
// and a low correction), exp(r) by its degree-6 Taylor polynomial (truncation error r^7/7! <
// 1.3e-7 relative), 2^n built in the exponent bits. Inputs are clamped to [-87.3, 88.3], where
// 2^n stays a normal float: below, the result is ~1e-38 instead of a denormal or 0.
inline Vec vexp(Vec x) {
  x = vmin(vmax(x, splat(-87.3f)), splat(88.3f));
  // Round x / ln2 to nearest: adding 1.5 * 2^23 pushes the fraction bits out.
  const Vec shifter = splat(12582912.0f);
  const Vec n = (x * 1.44269504088896341f + shifter) - shifter;
  const Vec r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  Vec p = splat(1.0f / 720.0f);
  p = fmadd(p, r, splat(1.0f / 120.0f));
  p = fmadd(p, r, splat(1.0f / 24.0f));
  p = fmadd(p, r, splat(1.0f / 6.0f));
  p = fmadd(p, r, splat(0.5f));
  p = fmadd(p, r, splat(1.0f));
  p = fmadd(p, r, splat(1.0f));
  const IVec bits = (__builtin_convertvector(n, IVec) + 127) << 23;
  return p * std::bit_cast<Vec>(bits);
}

// erf(x), Abramowitz & Stegun 7.1.26: |error| <= 1.5e-7 absolute, odd symmetry.
inline Vec verf(Vec x) {
  const Vec ax = vmax(x, -x);
  const Vec t = 1.0f / (1.0f + 0.3275911f * ax);
  Vec p = splat(1.061405429f);
  p = fmadd(p, t, splat(-1.453152027f));
  p = fmadd(p, t, splat(1.421413741f));
  p = fmadd(p, t, splat(-0.284496736f));
  p = fmadd(p, t, splat(0.254829592f));
  const Vec y = 1.0f - p * t * vexp(-ax * ax);
  return x < 0.0f ? -y : y;
}

inline Vec vgelu(Vec x) { return 0.5f * x * (1.0f + verf(x * 0.70710678118654752f)); }
inline Vec vsigmoid(Vec x) { return 1.0f / (1.0f + vexp(-x)); }
// tanh(x) = 1 - 2 / (exp(2x) + 1): absolute error ~1e-7 (relative error grows as x -> 0).
inline Vec vtanh(Vec x) { return 1.0f - 2.0f / (vexp(2.0f * x) + 1.0f); }

inline Vec vactivation(Activation act, Vec x, float lo, float hi) {
  switch (act) {
    case Activation::kNone:
      return x;
    case Activation::kRelu:
      return vmax(x, splat(0.0f));
    case Activation::kClip:
      return vmin(vmax(x, splat(lo)), splat(hi));
    case Activation::kGelu:
      return vgelu(x);
  }
  return x;
}

// The conv epilogue on one output row whose accumulators (bias included) are in `acc`, padded
// to a multiple of kLanes: dst = post(residual + pre(acc)). `residual` may be nullptr.
inline void epilogue_row(const float* acc, int64_t n, const Epilogue& e, const float* residual,
                         float* dst) {
  for (int64_t x = 0; x < n; x += kLanes) {
    const int64_t count = n - x < kLanes ? n - x : kLanes;
    Vec v = vactivation(e.pre_residual, load(acc + x), e.clip_min, e.clip_max);
    if (residual != nullptr) {
      v += count == kLanes ? load(residual + x) : load_partial(residual + x, count);
    }
    v = vactivation(e.post_residual, v, e.clip_min, e.clip_max);
    if (count == kLanes) {
      store(dst + x, v);
    } else {
      store_partial(dst + x, v, count);
    }
  }
}

}  // namespace
}  // namespace sparsecol::kernels
