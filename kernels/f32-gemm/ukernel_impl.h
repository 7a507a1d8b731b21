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
// [0, kLanes]), mask_bits(bits) (lane i where bit i is set), splat, zero, load, load_masked (zero
// in masked-off lanes), store, store_masked, fmadd(a, b, c) = a * b + c fused, add, mul, div, min
// and max (max(x, 0) gives 0 for a NaN x, as the x86 instructions do with the NaN first).
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

// The columns past a tile's vectors (GemmUkernelArgs::extra), each computed as one broadcast of
// its B element per k step against the vector of the panel's MR values of that step (lanes =
// rows), so that a strip's last few columns cost a few FMAs per step instead of a vector of MR
// FMAs and MR broadcasts that computes mostly nothing. Every output is still one chain of
// fused multiply-adds over k in order from zero, as in the vector part: the bits do not depend
// on which way a column was computed. kExtra (1 to kMaxExtraColumns, = args.extra) is a
// compile-time count: a zero column read instead would cost its FMAs, and a pointer per column
// ran out of general registers (the k loop's counter spilled; ResNet-50's 49-pixel GEMMs ran
// 4-6% slower than without extra columns).
template <typename V, int kExtra>
struct ExtraColumns {
  typename V::Vec acc[kExtra];  // lane i: row i of the panel
  const float* b = nullptr;     // column args.n's B element of the current k step (ldb apart)
};

// Adds k steps of the extra columns from b (steps ldb apart, columns consecutive) to `sums`.
template <typename V, int kMr, int kExtra>
[[gnu::always_inline]] inline void multiply_accumulate_extra(typename V::Vec (&sums)[kExtra],
                                                             const float* a, const float* b,
                                                             int64_t k, int64_t ldb) {
  const typename V::Mask panel_mask = V::mask_first(kMr);
  for (int64_t p = 0; p < k; ++p, a += kMr, b += ldb) {
    const auto panel = kMr == V::kLanes ? V::load(a) : V::load_masked(a, panel_mask);
#pragma GCC unroll 4
    for (int e = 0; e < kExtra; ++e) sums[e] = V::fmadd(panel, V::splat(b[e]), sums[e]);
  }
}

// Where the k steps' B rows are: ldb apart, a convolution's taps (multiply_accumulate_taps), or
// at per-step offsets (GemmUkernelArgs::b_row_offsets).
enum class BRows { kStrided, kTaps, kIndirect };

// acc[0, kRows)[0, kActive) += A panel x B rows over k steps. kFullN: every column of those
// vectors is valid (plain loads); otherwise mask[v] says which are. `offsets` (kIndirect only):
// step p's row is at b + offsets[p].
// kExtra > 0: also the extra columns of `x`, in the same k loop (their FMA chains' latency
// hidden behind the vectors').
template <typename V, int kMr, int kNv, int kRows, int kActive, bool kFullN, bool kIndirect = false,
          int kExtra = 0>
[[gnu::always_inline]] inline void multiply_accumulate(typename V::Vec (&acc)[kMr][kNv],
                                                       const float* a, const float* b, int64_t k,
                                                       int64_t ldb,
                                                       const typename V::Mask (&mask)[kNv],
                                                       const int64_t* offsets = nullptr,
                                                       ExtraColumns<V, kExtra>* x = nullptr) {
  [[maybe_unused]] const typename V::Mask panel_mask = V::mask_first(kMr);
  [[maybe_unused]] const float* extra_b = kExtra > 0 ? x->b : nullptr;
  // Unrolled 4 deep: the loop's own increments and branch share Zen 3's 6-wide dispatch with the
  // 12 FMAs and 8 loads of a 6x16 step. Measured 1.00-1.27x over the plain loop on the
  // bench/gemm_bench.cc shapes (medians of 3 interleaved runs, thread CPU time).
#pragma GCC unroll 4
  for (int64_t p = 0; p < k; ++p, a += kMr, b += ldb) {
    const float* row = kIndirect ? b + offsets[p] : b;
    typename V::Vec bv[kActive];
#pragma GCC unroll 8
    for (int v = 0; v < kActive; ++v) {
      bv[v] = kFullN ? V::load(row + V::kLanes * v) : V::load_masked(row + V::kLanes * v, mask[v]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) {
      const auto ai = V::splat(a[i]);
#pragma GCC unroll 8
      for (int v = 0; v < kActive; ++v) acc[i][v] = V::fmadd(ai, bv[v], acc[i][v]);
    }
    if constexpr (kExtra > 0) {
      const auto panel = kMr == V::kLanes ? V::load(a) : V::load_masked(a, panel_mask);
#pragma GCC unroll 4
      for (int e = 0; e < kExtra; ++e) x->acc[e] = V::fmadd(panel, V::splat(extra_b[e]), x->acc[e]);
      extra_b += ldb;
    }
  }
}

// The same over a convolution's taps (GemmUkernelArgs::taps): every B load masked by its tap's
// columns, so that the taps of a tile's edge pixels that fall outside the image read nothing.
// With kExtra > 0, tap t's extra column e (tile column args.n + e) counts where the tap's mask
// bit for that column is set (in the next strip's word past NR: see GemmUkernelArgs::extra):
// in the vectors' loop where it is for all of them, in a loop of its own for the few taps where
// only some are (a plane's edge), not at all where none are.
template <typename V, int kMr, int kNv, int kRows, int kActive, int kExtra = 0>
[[gnu::always_inline]] inline void multiply_accumulate_taps(typename V::Vec (&acc)[kMr][kNv],
                                                            const GemmUkernelArgs& args,
                                                            ExtraColumns<V, kExtra>* x = nullptr) {
  constexpr int64_t kNr = V::kLanes * kNv;
  const int64_t depth = args.k / args.taps;
  const float* a = args.a;
  constexpr uint64_t kLaneBits = (uint64_t{1} << V::kLanes) - 1;
  for (int64_t t = 0; t < args.taps; ++t, a += depth * kMr) {
    typename V::Mask mask[kNv];
#pragma GCC unroll 8
    for (int v = 0; v < kNv; ++v) {
      mask[v] =
          V::mask_bits(static_cast<uint32_t>(args.tap_masks[t] >> (V::kLanes * v) & kLaneBits));
    }
    const float* b = args.b + args.tap_offset[t];
    if constexpr (kExtra > 0) {
      unsigned valid = 0;
#pragma GCC unroll 4
      for (int e = 0; e < kExtra; ++e) {
        const int64_t column = args.n + e;
        const uint64_t word = column < kNr ? args.tap_masks[t] : args.tap_masks[args.taps + t];
        valid |= static_cast<unsigned>(word >> (column % kNr) & 1) << e;
      }
      if (valid == (1u << kExtra) - 1) {
        x->b = b + args.n;
        multiply_accumulate<V, kMr, kNv, kRows, kActive, false, false, kExtra>(
            acc, a, b, depth, args.ldb, mask, nullptr, x);
        continue;
      }
#pragma GCC unroll 4
      for (int e = 0; e < kExtra; ++e) {
        if ((valid >> e & 1) != 0) {
          typename V::Vec sum[1] = {x->acc[e]};
          multiply_accumulate_extra<V, kMr, 1>(sum, a, b + args.n + e, depth, args.ldb);
          x->acc[e] = sum[0];
        }
      }
    }
    multiply_accumulate<V, kMr, kNv, kRows, kActive, false>(acc, a, b, depth, args.ldb, mask);
  }
}

// Runs only the first `rows` rows of the panel and the first `active` B vectors (those holding
// a valid column), both chosen at compile time so that the accumulators stay in registers: a
// 6x16 tile with 1 row and 1 column left does 1 FMA per k step, not 12 (the classifier of a
// CNN at batch 1 is such a GEMM, M = 1).
// kRowsOf: where B's rows are, a compile-time choice so that each variant's accumulators stay in
// registers.
// kExtra > 0: also the extra columns of `x` (the panel's whole MR rows, zeros past its valid
// ones).
template <typename V, int kMr, int kNv, bool kFullN, BRows kRowsOf, int kExtra = 0, int kRows = kMr,
          int kActive = kNv>
[[gnu::always_inline]] inline void multiply_accumulate_part(typename V::Vec (&acc)[kMr][kNv],
                                                            const GemmUkernelArgs& args, int rows,
                                                            int active,
                                                            const typename V::Mask (&mask)[kNv],
                                                            ExtraColumns<V, kExtra>* x = nullptr) {
  if constexpr (kRows > 1) {
    if (rows < kRows) {
      return multiply_accumulate_part<V, kMr, kNv, kFullN, kRowsOf, kExtra, kRows - 1, kActive>(
          acc, args, rows, active, mask, x);
    }
  }
  if constexpr (kActive > 1 && !kFullN) {
    if (active < kActive) {
      return multiply_accumulate_part<V, kMr, kNv, kFullN, kRowsOf, kExtra, kRows, kActive - 1>(
          acc, args, rows, active, mask, x);
    }
  }
  if constexpr (kRowsOf == BRows::kTaps) {
    multiply_accumulate_taps<V, kMr, kNv, kRows, kActive, kExtra>(acc, args, x);
  } else if constexpr (kRowsOf == BRows::kIndirect) {
    multiply_accumulate<V, kMr, kNv, kRows, kActive, kFullN, true>(acc, args.a, args.b, args.k, 0,
                                                                   mask, args.b_row_offsets);
  } else {
    multiply_accumulate<V, kMr, kNv, kRows, kActive, kFullN, false, kExtra>(
        acc, args.a, args.b, args.k, args.ldb, mask, nullptr, x);
  }
}

// Applies `act` to every accumulator: one switch per tile, not one per vector.
template <typename V, int kMr, int kNv>
inline void activate_tile(Activation act, typename V::Vec (&acc)[kMr][kNv], float clip_min,
                          float clip_max) {
  if (act == Activation::kNone) return;
  const auto lo = V::splat(clip_min), hi = V::splat(clip_max);
#pragma GCC unroll 16
  for (int i = 0; i < kMr; ++i) {
#pragma GCC unroll 8
    for (int v = 0; v < kNv; ++v) acc[i][v] = activate<V>(act, acc[i][v], lo, hi);
  }
}

// The epilogue and the store of a tile, stage by stage over all the accumulators, so that each
// optional part costs one branch per tile instead of one per vector (the earlier per-vector form
// ran ~10 tests and branches per vector: 120 for a 6x16 tile, against the 96 cycles of FMAs of
// a K = 16 tile, MobileNetV2's 16 -> 96 layer). Rows past args.m read row args.m - 1 (valid
// memory, results never stored), so that only the stores need a row test. Together with the
// unrolled k loop and the C prefetch below, against the per-vector form (thread CPU time,
// medians of 5 interleaved rounds on a loaded 2-core Zen 3): conv2d_rows on every dense layer
// of bench/conv_bench.cc 1.06-1.80x (MobileNetV2's K = 64 and K = 16 pointwise layers 1.80x
// and 1.69x, ResNet-50's 3x3 layers 1.06-1.17x); the gemm_bench shapes 0.90-1.41x, median 1.09x.
//
// Always inlined, as are multiply_accumulate, multiply_accumulate_taps and
// multiply_accumulate_part: the accumulators must stay in registers, and GCC stops inlining them
// on its own once several variants of the body call them (the taps, the column tail, the
// indirect B), passing the accumulators by address instead: every FMA of the k loop then went
// through the stack (2x slower; the implicit GEMM on ResNet-50's 3x3 64 @ 56x56 3x slower:
// 2.7 ms against 0.92).
// `column`: the tile column of the accumulators' first lane (the extra columns start at args.n).
template <typename V, int kMr, int kNv, bool kFullN>
[[gnu::always_inline]] inline void finish_tile(typename V::Vec (&acc)[kMr][kNv],
                                               const GemmUkernelArgs& args,
                                               const typename V::Mask (&mask)[kNv],
                                               int64_t column = 0) {
  constexpr int kLanes = V::kLanes;
  auto load_columns = [&](const float* row, int v) {
    if constexpr (kFullN) {
      return V::load(row + kLanes * v);
    } else {
      return V::load_masked(row + kLanes * v, mask[v]);
    }
  };
  int64_t row[kMr];
#pragma GCC unroll 16
  for (int i = 0; i < kMr; ++i) row[i] = i < args.m ? i : args.m - 1;
  if (args.accumulate) {
#pragma GCC unroll 16
    for (int i = 0; i < kMr; ++i) {
#pragma GCC unroll 8
      for (int v = 0; v < kNv; ++v) {
        acc[i][v] = V::add(acc[i][v], load_columns(args.c + row[i] * args.ldc + column, v));
      }
    }
  }
  if (const Epilogue* e = args.epilogue; e != nullptr) {
    if (e->row_bias != nullptr) {
#pragma GCC unroll 16
      for (int i = 0; i < kMr; ++i) {
        const auto bias = V::splat(e->row_bias[row[i]]);
#pragma GCC unroll 8
        for (int v = 0; v < kNv; ++v) acc[i][v] = V::add(acc[i][v], bias);
      }
    }
    if (e->col_bias != nullptr) {
#pragma GCC unroll 8
      for (int v = 0; v < kNv; ++v) {
        const auto bias = load_columns(e->col_bias + column, v);
#pragma GCC unroll 16
        for (int i = 0; i < kMr; ++i) acc[i][v] = V::add(acc[i][v], bias);
      }
    }
    activate_tile<V>(e->pre_residual, acc, e->clip_min, e->clip_max);
    if (e->residual != nullptr) {
#pragma GCC unroll 16
      for (int i = 0; i < kMr; ++i) {
#pragma GCC unroll 8
        for (int v = 0; v < kNv; ++v) {
          acc[i][v] =
              V::add(acc[i][v], load_columns(e->residual + row[i] * e->residual_ld + column, v));
        }
      }
    }
    activate_tile<V>(e->post_residual, acc, e->clip_min, e->clip_max);
  }
#pragma GCC unroll 16
  for (int i = 0; i < kMr; ++i) {
    if (i >= args.m) break;
    float* c = args.c + i * args.ldc + column;
#pragma GCC unroll 8
    for (int v = 0; v < kNv; ++v) {
      if constexpr (kFullN) {
        V::store(c + kLanes * v, acc[i][v]);
      } else if (column > 0 || kLanes * v < args.n) {
        // (a vector of the tile's with no valid column stores nothing)
        V::store_masked(c + kLanes * v, mask[v], acc[i][v]);
      }
    }
  }
}

// The extra columns' sums, transposed from one vector per column (lanes = rows) into one vector
// per row (lanes = columns), through their epilogue and store (finish_tile) at column args.n.
template <typename V, int kMr, int kExtra>
[[gnu::always_inline]] inline void finish_extra_columns(const ExtraColumns<V, kExtra>& x,
                                                        const GemmUkernelArgs& args) {
  float sums[kExtra][V::kLanes];
#pragma GCC unroll 4
  for (int e = 0; e < kExtra; ++e) V::store(sums[e], x.acc[e]);
  typename V::Vec rows[kMr][1];
#pragma GCC unroll 16
  for (int i = 0; i < kMr; ++i) {
    float row[V::kLanes] = {};
#pragma GCC unroll 4
    for (int e = 0; e < kExtra; ++e) row[e] = sums[e][i];
    rows[i][0] = V::load(row);
  }
  const typename V::Mask mask[1] = {V::mask_first(kExtra)};
  finish_tile<V, kMr, 1, false>(rows, args, mask, args.n);
}

template <typename V, int kMr, int kNv, bool kFullN, BRows kRowsOf, int kExtra = 0>
inline void ukernel_body(const GemmUkernelArgs& args) {
  constexpr int kLanes = V::kLanes;
  constexpr int kNr = kLanes * kNv;
  typename V::Mask mask[kNv];
#pragma GCC unroll 8
  for (int v = 0; v < kNv; ++v) {
    const int64_t left = args.n - kLanes * v;
    mask[v] = V::mask_first(static_cast<int>(left < 0 ? 0 : (left > kLanes ? kLanes : left)));
  }
  const int rows = static_cast<int>(args.m < kMr ? args.m : kMr);
  // The C tile is read (accumulate) or written at the end: ask for its lines now, so that their
  // miss overlaps the k loop (C rarely stays in cache between the blocks of K, and a K = 64
  // layer writes 3136-wide rows of C that are nowhere in cache). Measured 1.04-1.30x on most
  // gemm_bench shapes; neutral (within noise) on the K >= 768 BERT and square shapes.
#pragma GCC unroll 16
  for (int i = 0; i < kMr; ++i) {
    const float* c = args.c + (i < rows ? i : rows - 1) * args.ldc;
    __builtin_prefetch(c, 1);
    __builtin_prefetch(c + kNr - 1, 1);
  }
  typename V::Vec acc[kMr][kNv];
#pragma GCC unroll 16
  for (int i = 0; i < kMr; ++i) {
#pragma GCC unroll 8
    for (int v = 0; v < kNv; ++v) acc[i][v] = V::zero();
  }
  const int active = static_cast<int>((args.n + kLanes - 1) / kLanes);
  if constexpr (kExtra > 0) {
    static_assert(kMr <= kLanes, "the extra columns hold a panel's rows in one vector");
    ExtraColumns<V, kExtra> x;
#pragma GCC unroll 4
    for (int e = 0; e < kExtra; ++e) x.acc[e] = V::zero();
    x.b = args.b + args.n;  // the taps path sets its own per tap
    multiply_accumulate_part<V, kMr, kNv, kFullN, kRowsOf, kExtra>(acc, args, rows, active, mask,
                                                                   &x);
    finish_tile<V, kMr, kNv, kFullN>(acc, args, mask);
    finish_extra_columns<V, kMr, kExtra>(x, args);
  } else {
    multiply_accumulate_part<V, kMr, kNv, kFullN, kRowsOf>(acc, args, rows, active, mask);
    finish_tile<V, kMr, kNv, kFullN>(acc, args, mask);
  }
}

template <typename V, int kMr, int kNv, int kExtra>
void ukernel_extra(const GemmUkernelArgs& args) {
  static_assert(kExtra <= kMaxExtraColumns);
  if (args.taps > 0) return ukernel_body<V, kMr, kNv, false, BRows::kTaps, kExtra>(args);
  if (args.n == V::kLanes * kNv) {
    return ukernel_body<V, kMr, kNv, true, BRows::kStrided, kExtra>(args);
  }
  ukernel_body<V, kMr, kNv, false, BRows::kStrided, kExtra>(args);
}

// kExtraColumns: whether this micro-kernel computes extra columns (GemmUkernel::extra_columns).
template <typename V, int kMr, int kNv, bool kExtraColumns = false>
void ukernel(const GemmUkernelArgs& args) {
  constexpr int kNr = V::kLanes * kNv;
  if constexpr (kExtraColumns) {
    switch (args.extra) {
      case 1:
        return ukernel_extra<V, kMr, kNv, 1>(args);
      case 2:
        return ukernel_extra<V, kMr, kNv, 2>(args);
      case 3:
        return ukernel_extra<V, kMr, kNv, 3>(args);
      case 4:
        return ukernel_extra<V, kMr, kNv, 4>(args);
      default:
        break;
    }
  }
  if (args.taps > 0) {
    ukernel_body<V, kMr, kNv, false, BRows::kTaps>(args);
  } else if (args.b_row_offsets != nullptr) {
    if (args.n == kNr) {
      ukernel_body<V, kMr, kNv, true, BRows::kIndirect>(args);
    } else {
      ukernel_body<V, kMr, kNv, false, BRows::kIndirect>(args);
    }
  } else if (args.n == kNr) {
    ukernel_body<V, kMr, kNv, true, BRows::kStrided>(args);
  } else {
    ukernel_body<V, kMr, kNv, false, BRows::kStrided>(args);
  }
}

}  // namespace
}  // namespace sparsecol::kernels
