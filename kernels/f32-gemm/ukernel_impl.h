// The one body of the x86 vector GEMM micro-kernels, f32_gemm_<MR>x<NR>__<isa>, written over a
// small ISA descriptor so that gemm_avx2.cc (ymm, 8 lanes) and gemm_avx512.cc (zmm, 16 lanes)
// instantiate the same logic, each compiled with its own flags. Include only from those files:
// everything is in an anonymous namespace (see f32-eltwise/simd.h for the ODR reason).
//
// Layout: A packed k-major in MR-row panels (one k step = MR consecutive floats, each broadcast),
// B read in place as rows of NR floats at stride ldb, C's MR x NR tile held in MR x NV vector
// accumulators (NV = NR / lanes) for the whole depth. Column tails use masked loads and stores
// (masked-off lanes neither fault nor write); row and column tails only run the rows and the B
// vectors that hold valid results (see multiply_accumulate_part) and skip the other stores. The
// epilogue runs on the accumulators before the single store.
//
// An ISA descriptor provides: Vec, Mask, kLanes, mask_first(count) (lanes [0, count), count in
// [0, kLanes]), splat, zero, load, load_masked (zero in masked-off lanes), store, store_masked,
// fmadd(a, b, c) = a * b + c fused, add, mul, div, min and max (max(x, 0) gives 0 for a NaN x,
// as the x86 instructions do with the NaN first).
#pragma once

#include <cstdint>

#include "f32-gemm/ukernels.h"

namespace sparsecol::kernels {
namespace {

// erf(x) by the rational approximation of ukernels.h (kErfP / kErfQ), lane-wise.
template <typename V>
inline typename V::Vec erf_rational_vec(typename V::Vec x) {
  const auto xc = V::min(V::max(x, V::splat(-kErfClamp)), V::splat(kErfClamp));
  const auto t = V::mul(xc, xc);
  auto p = V::splat(kErfP[5]);
  auto q = V::splat(kErfQ[5]);
  for (int i = 4; i >= 0; --i) {
    p = V::fmadd(p, t, V::splat(kErfP[i]));
    q = V::fmadd(q, t, V::splat(kErfQ[i]));
  }
  return V::mul(xc, V::div(p, q));
}

template <typename V>
inline typename V::Vec activate(Activation act, typename V::Vec x, typename V::Vec clip_min,
                                typename V::Vec clip_max) {
  switch (act) {
    case Activation::kNone:
      return x;
    case Activation::kRelu:
      return V::max(x, V::zero());  // NaN -> 0, as x > 0 ? x : 0
    case Activation::kClip:
      return V::min(V::max(x, clip_min), clip_max);
    case Activation::kGelu: {
      const auto erf = erf_rational_vec<V>(V::mul(x, V::splat(0.70710678118654752f)));
      return V::mul(V::mul(V::splat(0.5f), x), V::add(V::splat(1.0f), erf));
    }
  }
  return x;
}

// acc[0, kRows)[0, kActive) += A panel x B rows over k steps. kFullN: every column of those
// vectors is valid (plain loads); otherwise mask[v] says which are.
template <typename V, int kMr, int kNv, int kRows, int kActive, bool kFullN>
inline void multiply_accumulate(typename V::Vec (&acc)[kMr][kNv], const float* a, const float* b,
                                int64_t k, int64_t ldb, const typename V::Mask (&mask)[kNv]) {
  for (int64_t p = 0; p < k; ++p, a += kMr, b += ldb) {
    typename V::Vec bv[kActive];
#pragma GCC unroll 8
    for (int v = 0; v < kActive; ++v) {
      bv[v] = kFullN ? V::load(b + V::kLanes * v) : V::load_masked(b + V::kLanes * v, mask[v]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) {
      const auto ai = V::splat(a[i]);
#pragma GCC unroll 8
      for (int v = 0; v < kActive; ++v) acc[i][v] = V::fmadd(ai, bv[v], acc[i][v]);
    }
  }
}

// Runs only the first `rows` rows of the panel and the first `active` B vectors (those holding
// a valid column), both chosen at compile time so that the accumulators stay in registers: a
// 6x16 tile with 1 row and 1 column left does 1 FMA per k step, not 12 (the classifier of a
// CNN at batch 1 is such a GEMM, M = 1).
template <typename V, int kMr, int kNv, bool kFullN, int kRows = kMr, int kActive = kNv>
inline void multiply_accumulate_part(typename V::Vec (&acc)[kMr][kNv], const GemmUkernelArgs& args,
                                     int rows, int active, const typename V::Mask (&mask)[kNv]) {
  if constexpr (kRows > 1) {
    if (rows < kRows) {
      return multiply_accumulate_part<V, kMr, kNv, kFullN, kRows - 1, kActive>(acc, args, rows,
                                                                               active, mask);
    }
  }
  if constexpr (kActive > 1 && !kFullN) {
    if (active < kActive) {
      return multiply_accumulate_part<V, kMr, kNv, kFullN, kRows, kActive - 1>(acc, args, rows,
                                                                               active, mask);
    }
  }
  multiply_accumulate<V, kMr, kNv, kRows, kActive, kFullN>(acc, args.a, args.b, args.k, args.ldb,
                                                           mask);
}

template <typename V, int kMr, int kNv>
void ukernel(const GemmUkernelArgs& args) {
  using Vec = typename V::Vec;
  constexpr int kLanes = V::kLanes;
  constexpr int kNr = kLanes * kNv;
  typename V::Mask mask[kNv];
  for (int v = 0; v < kNv; ++v) {
    const int64_t left = args.n - kLanes * v;
    mask[v] = V::mask_first(static_cast<int>(left < 0 ? 0 : (left > kLanes ? kLanes : left)));
  }
  Vec acc[kMr][kNv];
#pragma GCC unroll 16
  for (int i = 0; i < kMr; ++i) {
#pragma GCC unroll 8
    for (int v = 0; v < kNv; ++v) acc[i][v] = V::zero();
  }
  const bool full_n = args.n == kNr;
  // Vector v of a row of n valid columns: a plain load when the tile is full.
  auto load_columns = [&](const float* row, int v) {
    return full_n ? V::load(row + kLanes * v) : V::load_masked(row + kLanes * v, mask[v]);
  };
  const int rows = static_cast<int>(args.m < kMr ? args.m : kMr);
  if (full_n) {
    multiply_accumulate_part<V, kMr, kNv, true>(acc, args, rows, kNv, mask);
  } else {
    const int active = static_cast<int>((args.n + kLanes - 1) / kLanes);
    multiply_accumulate_part<V, kMr, kNv, false>(acc, args, rows, active, mask);
  }

  const Epilogue* e = args.epilogue;
  const bool has_col_bias = e != nullptr && e->col_bias != nullptr;
  Vec col_bias[kNv];
  for (int v = 0; v < kNv; ++v)
    col_bias[v] = has_col_bias ? load_columns(e->col_bias, v) : V::zero();
  const Vec clip_min = V::splat(e != nullptr ? e->clip_min : 0.0f);
  const Vec clip_max = V::splat(e != nullptr ? e->clip_max : 0.0f);
#pragma GCC unroll 16
  for (int i = 0; i < kMr; ++i) {
    if (i >= args.m) break;
    float* c = args.c + i * args.ldc;
#pragma GCC unroll 8
    for (int v = 0; v < kNv; ++v) {
      if (!full_n && kLanes * v >= args.n) break;  // no valid column in this vector
      Vec x = acc[i][v];
      if (args.accumulate) x = V::add(x, load_columns(c, v));
      if (e != nullptr) {
        if (e->row_bias != nullptr) x = V::add(x, V::splat(e->row_bias[i]));
        if (has_col_bias) x = V::add(x, col_bias[v]);
        x = activate<V>(e->pre_residual, x, clip_min, clip_max);
        if (e->residual != nullptr) {
          x = V::add(x, load_columns(e->residual + i * e->residual_ld, v));
        }
        x = activate<V>(e->post_residual, x, clip_min, clip_max);
      }
      if (full_n) {
        V::store(c + kLanes * v, x);
      } else {
        V::store_masked(c + kLanes * v, mask[v], x);
      }
    }
  }
}

}  // namespace
}  // namespace sparsecol::kernels
