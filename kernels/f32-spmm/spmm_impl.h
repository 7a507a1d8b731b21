// The spmm micro-kernel body, compiled once per ISA by spmm_avx512.cc, spmm_avx2.cc and
// spmm_portable.cc: GCC generic vectors of 16, 8 or 4 floats (zmm, ymm, xmm), so that the
// portable path every machine can test runs the logic the vector paths run. Everything lives in
// an anonymous namespace: each translation unit gets its own copy built with its own flags, so
// the linker can never hand one ISA's caller another ISA's body. Include only from .cc files.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "f32-eltwise/simd.h"
#include "f32-gemm/ukernels.h"  // kErfP, kErfQ, kErfClamp: the GELU the dense kernels use
#include "f32-spmm/spmm.h"

namespace sparsecol::kernels {
namespace {

// Vectors per tile: 8, one accumulator each (see SPARSECOL_F32_SPMM_UKERNELS).
constexpr int kTileVecs = 8;
constexpr int64_t kTile = kTileVecs * kLanes;
// The most vectors a column remainder may add to the last full tile (see spmm_region): 12
// accumulators, a broadcast and a load fit AVX2's 16 registers.
constexpr int kMergeVecs = 4;

// GELU with the dense GEMM's erf approximation (f32-gemm/ukernels.h, |error| <= 4.5e-7), so
// that a layer gives the same GELU whether its weight is packed dense or sparse.
inline Vec vgelu_rational(Vec x) {
  const Vec z = x * 0.70710678118654752f;
  const Vec zc = vmin(vmax(z, splat(-kErfClamp)), splat(kErfClamp));
  const Vec t = zc * zc;
  Vec p = splat(kErfP[5]), q = splat(kErfQ[5]);
  for (int i = 4; i >= 0; --i) {
    p = fmadd(p, t, splat(kErfP[i]));
    q = fmadd(q, t, splat(kErfQ[i]));
  }
  return 0.5f * x * (1.0f + zc * p / q);
}

// `act` on every vector of a tile; the switch is outside the loop so that a row pays one branch
// per activation, not one per vector (a row of a 90%-sparse 64-channel layer has only ~6
// non-zeros: its fixed costs matter).
template <int kVecs>
inline void activate_tile(Activation act, Vec (&x)[kVecs], const Epilogue& e) {
  switch (act) {
    case Activation::kNone:
      return;
    case Activation::kRelu:
#pragma GCC unroll 16
      for (int v = 0; v < kVecs; ++v) x[v] = vmax(x[v], splat(0.0f));
      return;
    case Activation::kClip:
#pragma GCC unroll 16
      for (int v = 0; v < kVecs; ++v) x[v] = vmin(vmax(x[v], splat(e.clip_min)), splat(e.clip_max));
      return;
    case Activation::kGelu:
      for (int v = 0; v < kVecs; ++v) x[v] = vgelu_rational(x[v]);
      return;
  }
}

// Loads vector v of a tile whose last vector holds `tail` valid lanes (0: full).
template <int kVecs>
inline Vec tile_load(const float* p, int v, int64_t tail) {
  return v == kVecs - 1 && tail != 0 ? load_partial(p + v * kLanes, tail) : load(p + v * kLanes);
}

// out = post(residual + pre(acc + row_bias + col_bias)) on one row's tile of accumulators.
template <int kVecs>
inline void apply_epilogue(Vec (&acc)[kVecs], const Epilogue& e, int64_t row, int64_t col,
                           int64_t tail) {
  if (e.row_bias != nullptr) {
    const Vec bias = broadcast(e.row_bias + row);
#pragma GCC unroll 16
    for (int v = 0; v < kVecs; ++v) acc[v] += bias;
  }
  if (e.col_bias != nullptr) {
#pragma GCC unroll 16
    for (int v = 0; v < kVecs; ++v) acc[v] += tile_load<kVecs>(e.col_bias + col, v, tail);
  }
  activate_tile(e.pre_residual, acc, e);
  if (e.residual != nullptr) {
    const float* residual = e.residual + row * e.residual_ld + col;
#pragma GCC unroll 16
    for (int v = 0; v < kVecs; ++v) acc[v] += tile_load<kVecs>(residual, v, tail);
  }
  activate_tile(e.post_residual, acc, e);
}

// The epilogue (when set) and the store of one row's tile; the last vector holds `tail` valid
// lanes (0: full).
template <int kVecs>
[[gnu::always_inline]] inline void store_row_tile(Vec (&acc)[kVecs], const Epilogue* e, int64_t row,
                                                  int64_t col, int64_t tail, float* dst) {
  if (e != nullptr) apply_epilogue<kVecs>(acc, *e, row, col, tail);
#pragma GCC unroll 16
  for (int v = 0; v < kVecs; ++v) {
    if (v == kVecs - 1 && tail != 0) {
      store_partial(dst + v * kLanes, acc[v], tail);
    } else {
      store(dst + v * kLanes, acc[v]);
    }
  }
}

// Columns [col, col + count) of every row, (kVecs - 1) * kLanes < count <= kVecs * kLanes.
// Each output element is one chain of FMAs over its row's non-zeros in order: the same order in
// every tile width, so results do not depend on where a caller splits the columns.
template <int kVecs>
inline void spmm_tile(const SpmmArgs& args, int64_t col, int64_t count) {
  const int64_t tail = count % kLanes;
  const float* src = args.src + col;
  const Epilogue* e = args.epilogue;
  for (int64_t row = 0; row < args.rows; ++row) {
    float* dst = args.dst + row * args.ldd + col;
    Vec acc[kVecs];
    if (args.accumulate) {
#pragma GCC unroll 16
      for (int v = 0; v < kVecs; ++v) acc[v] = tile_load<kVecs>(dst, v, tail);
    } else {
#pragma GCC unroll 16
      for (int v = 0; v < kVecs; ++v) acc[v] = Vec{};
    }
    const int64_t begin = args.row_ptr[row], end = args.row_ptr[row + 1];
    if (tail == 0) {
      for (int64_t j = begin; j < end; ++j) {
        const float* p = src + args.offsets[j];
        const Vec w = broadcast(args.values + j);
#pragma GCC unroll 16
        for (int v = 0; v < kVecs; ++v) acc[v] = fmadd(w, load(p + v * kLanes), acc[v]);
      }
    } else {
      for (int64_t j = begin; j < end; ++j) {
        const float* p = src + args.offsets[j];
        const Vec w = broadcast(args.values + j);
#pragma GCC unroll 16
        for (int v = 0; v < kVecs; ++v) acc[v] = fmadd(w, tile_load<kVecs>(p, v, tail), acc[v]);
      }
    }

    store_row_tile<kVecs>(acc, e, row, col, tail, dst);
  }
}

// One tile of `count` columns, 0 < count <= (kTileVecs + kMergeVecs) * kLanes, through the
// spmm_tile whose vector count (a compile-time constant, so that the accumulators stay in
// registers) covers it: a chain of at most 12 tests per tile, against the tile's rows x non-zeros.
template <int kVecs = 1>
inline void spmm_tile_of(const SpmmArgs& args, int64_t col, int64_t count) {
  if constexpr (kVecs < kTileVecs + kMergeVecs) {
    if (count > kVecs * kLanes) return spmm_tile_of<kVecs + 1>(args, col, count);
  }
  spmm_tile<kVecs>(args, col, count);
}

// ---- Shifted packing (SpmmArgs::shifts > 1) ----

// Vectors per shifted tile: one accumulator each, and one more for the group being summed (its
// sums reach one vector past the tile): 8 + 9 of AVX-512's 32 registers, 4 + 5 of AVX2's and the
// portable path's 16.
constexpr int kShiftTileVecs = kLanes == 16 ? 8 : 4;
// The most vectors a column remainder may add to the last full shifted tile: 12 + 13 of
// AVX-512's registers, 6 + 7 of the others'.
constexpr int kShiftMergeVecs = kLanes == 16 ? 4 : 2;

// Walks one shift group's non-zeros [begin, end) into sum[0, kVecs): aligned whole-vector loads
// only.
template <int kVecs>
[[gnu::always_inline]] inline void sum_group(const SpmmArgs& args, const float* src, int32_t begin,
                                             int32_t end, Vec* sum) {
  for (int32_t j = begin; j < end; ++j) {
    const float* p = src + args.offsets[j];
    const Vec w = broadcast(args.values + j);
#pragma GCC unroll 16
    for (int v = 0; v < kVecs; ++v) sum[v] = fmadd(w, load(p + v * kLanes), sum[v]);
  }
}

// Adds shift group kShift's sums to `acc` with their lanes shifted into place: its sum for B
// column x belongs to output column x - kShift. The tile's last kShift columns take their sums
// from one vector past the tile; a tile whose `count` columns end at least kShift lanes before
// its last vector's end stores no such column, so it sums no such vector (those lanes take
// zeros): one FMA and one load fewer per non-zero. ResNet-50's 3x3 layers end every chunk of
// rows so (its last row's last 8, 4, 2 or 1 of 64, 32, 16 or 8 floats are padding): layer4's
// 3x3 512 on 7x7 (one tile of 55 columns) sums 4 vectors instead of 5, 1.1-1.15x faster at 90%
// and 95% (bench/spmm_bench.cc, one thread, Zen 4, three alternated rounds).
template <int kVecs, int kShift>
[[gnu::always_inline]] inline void add_shifted_group(const SpmmArgs& args, const float* src,
                                                     int32_t begin, int32_t end, int64_t count,
                                                     Vec (&acc)[kVecs]) {
  Vec sum[kVecs + 1];
#pragma GCC unroll 16
  for (int v = 0; v <= kVecs; ++v) sum[v] = Vec{};
  if (count + kShift <= kVecs * kLanes) {
    sum_group<kVecs>(args, src, begin, end, sum);
  } else {
    sum_group<kVecs + 1>(args, src, begin, end, sum);
  }
#pragma GCC unroll 16
  for (int v = 0; v < kVecs; ++v) acc[v] += shift_lanes<kShift>(sum[v], sum[v + 1]);
}

// Columns [col, col + count) of every row, (kVecs - 1) * kLanes < count <= kVecs * kLanes: group
// s sums its non-zeros over B from their aligned bases, and the groups are added in order, each
// after the last (so only one group's sums need registers beside the tile's). Every B load is
// whole (SpmmArgs::shifts: the lanes past `count` only feed columns that are not stored).
template <int kVecs, int kShifts>
inline void spmm_shifted_tile(const SpmmArgs& args, int64_t col, int64_t count) {
  const int64_t tail = count % kLanes;
  const float* src = args.src + col;
  const Epilogue* e = args.epilogue;
  for (int64_t row = 0; row < args.rows; ++row) {
    const int32_t* group = args.row_ptr + row * kShifts;
    Vec acc[kVecs];
#pragma GCC unroll 16
    for (int v = 0; v < kVecs; ++v) acc[v] = Vec{};
    sum_group<kVecs>(args, src, group[0], group[1], acc);
    add_shifted_group<kVecs, 1>(args, src, group[1], group[2], count, acc);
    if constexpr (kShifts > 2) {
      add_shifted_group<kVecs, 2>(args, src, group[2], group[3], count, acc);
    }
    float* dst = args.dst + row * args.ldd + col;
    if (args.accumulate) {
#pragma GCC unroll 16
      for (int v = 0; v < kVecs; ++v) acc[v] = tile_load<kVecs>(dst, v, tail) + acc[v];
    }
    store_row_tile<kVecs>(acc, e, row, col, tail, dst);
  }
}

// A region's tiles: full tiles of kFullVecs vectors, then the column remainder, alone or, when it
// is at most kMergeMaxVecs vectors, with the last full tile: one wider tile pays a row's fixed
// costs (its loop, the weight stream) once where a full tile and a narrow one pay them twice, and
// a narrow tile's few accumulators wait on the FMA latency. Measured on ResNet-50's 14x14 layers
// at 90% (196 pixels: 3 tiles + 4 pixels before, 2 tiles + one of 68 now; one thread, AVX2, Zen
// 3, 61 interleaved pairs, same binary): 1x1 1024->256 1.075x, 256->1024 1.03x, 3x3 256 1.09x
// faster; shapes without such a remainder within +-1%. `tile(col, count)` runs one tile.
template <int kFullVecs, int kMergeMaxVecs, typename Tile>
inline void for_each_tile(int64_t n, Tile&& tile) {
  constexpr int64_t kWidth = kFullVecs * kLanes;
  const int64_t full_tiles = n / kWidth;
  const int64_t left = n - full_tiles * kWidth;
  const bool merge_tail = full_tiles > 0 && left > 0 && left <= kMergeMaxVecs * kLanes;
  const int64_t plain_tiles = merge_tail ? full_tiles - 1 : full_tiles;
  int64_t col = 0;
  for (int64_t t = 0; t < plain_tiles; ++t, col += kWidth) tile(col, kWidth);
  if (col < n) tile(col, n - col);
}

template <int kShifts, int kVecs = 1>
inline void spmm_shifted_tile_of(const SpmmArgs& args, int64_t col, int64_t count) {
  if constexpr (kVecs < kShiftTileVecs + kShiftMergeVecs) {
    if (count > kVecs * kLanes) return spmm_shifted_tile_of<kShifts, kVecs + 1>(args, col, count);
  }
  spmm_shifted_tile<kVecs, kShifts>(args, col, count);
}

template <int kShifts>
inline void spmm_shifted_region(const SpmmArgs& args) {
  for_each_tile<kShiftTileVecs, kShiftMergeVecs>(
      args.n, [&](int64_t col, int64_t count) { spmm_shifted_tile_of<kShifts>(args, col, count); });
}

// One column with SpmmArgs::reassociate: a vector with one useful lane would hold the row's sum
// in one chain of FMAs, each waiting on the last; here a row's non-zeros go kLanes at a time,
// their inputs (at offsets[j] >> offset_shift) gathered into a vector, into kLanes partial sums
// added at the row's end (reduce_add). Against four scalar partial sums (one FMA and three loads
// per non-zero), CNN classifiers at batch 1 ran 1.5-2.4x faster (MobileNetV2's 1280 -> 1000 at
// 80-95% 1.5-1.7x, ResNet-50's 2048 -> 1000 1.7-2.4x; bench/spmm_bench.cc, one thread, three
// alternated runs, Intel Emerald Rapids), where at 80% the scalar sums had run 0.65x of the dense
// GEMV. On Zen 4 an earlier gathering version had run 1.2x slower than eight scalar sums (not
// measured there since).
inline void spmv_region(const SpmmArgs& args) {
  for (int64_t row = 0; row < args.rows; ++row) {
    Vec part = {};
    const int32_t end = args.row_ptr[row + 1];
    int32_t j = args.row_ptr[row];
    for (; j + kLanes <= end; j += kLanes) {
      part = fmadd(load(args.values + j),
                   gather_partial(args.src, args.offsets + j, args.offset_shift, kLanes), part);
    }
    if (j < end) {
      part = fmadd(load_partial(args.values + j, end - j),
                   gather_partial(args.src, args.offsets + j, args.offset_shift, end - j), part);
    }
    float sum = reduce_add(part);
    if (args.accumulate) sum += args.dst[row * args.ldd];
    Vec acc[1] = {splat(sum)};
    store_row_tile<1>(acc, args.epilogue, row, 0, 1, args.dst + row * args.ldd);
  }
}

// The whole region: full tiles, then the column tail, alone or with the last full tile (see
// for_each_tile). The loop over columns is outside the loop over rows, so the B columns of a tile
// stay in cache while every row's non-zeros stream past them.
inline void spmm_region(const SpmmArgs& args) {
  if (args.reassociate && args.n == 1 && args.shifts == 1) return spmv_region(args);
  if (args.shifts > 1) {
    return args.shifts == 2 ? spmm_shifted_region<2>(args) : spmm_shifted_region<3>(args);
  }
  for_each_tile<kTileVecs, kMergeVecs>(
      args.n, [&](int64_t col, int64_t count) { spmm_tile_of(args, col, count); });
}

}  // namespace
}  // namespace sparsecol::kernels
