// The sliding-window engine shared by the depthwise convolution and pooling (see dwconv.h and
// f32-pool/pool.h): a channel's needed input rows copied once into a padded, phase-split block,
// then one contiguous vector load per tap and output vector. Include only from .cc files (its
// contents are per translation unit, see f32-eltwise/simd.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "f32-eltwise/simd.h"

namespace sparsecol::kernels {
namespace {

struct WindowGeometry {
  int64_t in_h = 0, in_w = 0, out_w = 0;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_left = 0;
  int64_t dilation_h = 1, dilation_w = 1;
};

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Block row r holds input row v0 + r (padding outside the image); each row is stride_w phases
// of phase_len values, phase q holding padded columns q, q + stride_w, ... so that output x of
// tap kx reads phase (kx * dilation_w) % stride_w at x + (kx * dilation_w) / stride_w.
struct PaddedBlock {
  int64_t v0 = 0, rows = 0, phase_len = 0, row_len = 0;
  int64_t out_w_padded = 0;   // out_w rounded up to whole vectors
  std::vector<int64_t> taps;  // offset of each tap (ky, kx) from an output's block position
};

inline PaddedBlock plan_block(const WindowGeometry& g, int64_t oh_begin, int64_t oh_end) {
  PaddedBlock b;
  b.v0 = oh_begin * g.stride_h - g.pad_top;
  b.rows = (oh_end - oh_begin - 1) * g.stride_h + (g.kernel_h - 1) * g.dilation_h + 1;
  b.out_w_padded = round_up(g.out_w, kLanes);
  b.phase_len = b.out_w_padded + (g.kernel_w - 1) * g.dilation_w / g.stride_w;
  b.row_len = b.phase_len * g.stride_w;
  for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
    for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
      const int64_t col = kx * g.dilation_w;
      b.taps.push_back(ky * g.dilation_h * b.row_len + col % g.stride_w * b.phase_len +
                       col / g.stride_w);
    }
  }
  return b;
}

// Floats of scratch that fill_block needs besides the block: one padded row.
inline int64_t fill_scratch_size(const PaddedBlock& b) { return b.row_len + 2 * kLanes; }

// Copies one channel into the block. `plane` points at input row `plane_row0` of the channel;
// `padded` is fill_scratch_size() floats of scratch.
inline void fill_block(const WindowGeometry& g, const PaddedBlock& b, const float* plane,
                       int64_t plane_row0, float pad, float* block, float* padded) {
  // Padded column j is input column j - pad_left.
  const int64_t first = std::min(g.pad_left, b.row_len);
  const int64_t last = std::clamp(g.in_w + g.pad_left, first, b.row_len);
  for (int64_t r = 0; r < b.rows; ++r) {
    const int64_t v = b.v0 + r;
    float* row = block + r * b.row_len;
    if (v < 0 || v >= g.in_h) {
      std::fill_n(row, b.row_len, pad);
      continue;
    }
    const float* src = plane + (v - plane_row0) * g.in_w - g.pad_left;
    // Stride 1 has a single phase: the padded row is the block row itself.
    float* p = g.stride_w == 1 ? row : padded;
    std::fill(p, p + first, pad);
    std::copy(src + first, src + last, p + first);
    std::fill(p + last, p + b.row_len, pad);
    if (g.stride_w == 1) continue;
    int64_t x = 0;
    if (g.stride_w == 2) {  // MobileNetV2's downsampling layers: split with vector shuffles
      for (; x + kLanes <= b.phase_len; x += kLanes) {
        const Vec lo = load(padded + 2 * x), hi = load(padded + 2 * x + kLanes);
        store(row + x, even_lanes(lo, hi));
        store(row + b.phase_len + x, odd_lanes(lo, hi));
      }
    }
    for (int64_t q = 0; q < g.stride_w; ++q) {
      for (int64_t i = x; i < b.phase_len; ++i)
        row[q * b.phase_len + i] = padded[i * g.stride_w + q];
    }
  }
}

// One output row: out[x] = op.finish(fold over taps of op.step(acc, tap value, tap)) for x in
// [0, out_w_padded), `base` being the block position of the row's output 0. Four vectors at a
// time so that four independent accumulation chains hide the FMA / max latency.
template <typename Op>
inline void window_row(const PaddedBlock& b, const float* base, float* out, const Op& op) {
  const int64_t taps = static_cast<int64_t>(b.taps.size());
  const int64_t* tap = b.taps.data();
  int64_t x = 0;
  for (; x + 4 * kLanes <= b.out_w_padded; x += 4 * kLanes) {
    Vec a0 = op.init(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t t = 0; t < taps; ++t) {
      const float* p = base + tap[t] + x;
      a0 = op.step(a0, load(p), t);
      a1 = op.step(a1, load(p + kLanes), t);
      a2 = op.step(a2, load(p + 2 * kLanes), t);
      a3 = op.step(a3, load(p + 3 * kLanes), t);
    }
    store(out + x, a0);
    store(out + x + kLanes, a1);
    store(out + x + 2 * kLanes, a2);
    store(out + x + 3 * kLanes, a3);
  }
  for (; x < b.out_w_padded; x += kLanes) {
    Vec a = op.init();
    for (int64_t t = 0; t < taps; ++t) a = op.step(a, load(base + tap[t] + x), t);
    store(out + x, a);
  }
}

}  // namespace
}  // namespace sparsecol::kernels
