// The pooling bodies, compiled once per ISA by pool_portable.cc, pool_avx2.cc and pool_avx512.cc
// (see f32-eltwise/simd.h for why one body serves all three).
#pragma once

#include <limits>

#include "f32-dwconv/lanes_impl.h"
#include "f32-dwconv/window_impl.h"
#include "f32-pool/pool.h"

namespace sparsecol::kernels {
namespace {

// How many of a window's taps, starting at `first`, fall in [lo, hi): the average's divisor
// along one axis.
inline int64_t taps_in(int64_t first, int64_t kernel, int64_t dilation, int64_t lo, int64_t hi) {
  int64_t count = 0;
  for (int64_t k = 0; k < kernel; ++k) {
    const int64_t p = first + k * dilation;
    count += p >= lo && p < hi ? 1 : 0;
  }
  return count;
}

// Channels [0, g.channels) by plane (see pool.h).
inline void pool2d_planes(PoolKind kind, const PoolGeometry& g, const WindowGeometry& wg,
                          const PlaneView& src, const PlaneView& dst, int64_t oh_begin,
                          int64_t oh_end, std::vector<float>& scratch) {
  const PaddedBlock b = plan_block(wg, oh_begin, oh_end);
  const int64_t block_size = b.rows * b.row_len;
  scratch.resize(static_cast<std::size_t>(block_size + 2 * b.out_w_padded + fill_scratch_size(b)));
  float* block = scratch.data();
  float* acc = block + block_size;
  float* inv_count_w = acc + b.out_w_padded;  // average: 1 / (taps counted along the row)
  float* padded = inv_count_w + b.out_w_padded;

  const bool average = kind == PoolKind::kAverage;
  const int64_t lo_h = g.count_include_pad ? -g.pad_top : 0;
  const int64_t hi_h = g.count_include_pad ? g.in_h + g.pad_bottom : g.in_h;
  const int64_t lo_w = g.count_include_pad ? -g.pad_left : 0;
  const int64_t hi_w = g.count_include_pad ? g.in_w + g.pad_right : g.in_w;
  for (int64_t x = 0; x < b.out_w_padded; ++x) {
    const int64_t n =
        x < g.out_w ? taps_in(x * g.stride_w - g.pad_left, g.kernel_w, g.dilation_w, lo_w, hi_w)
                    : 0;
    inv_count_w[x] = n > 0 ? 1.0f / static_cast<float>(n) : 0.0f;
  }

  struct Max {
    Vec init() const { return splat(-std::numeric_limits<float>::infinity()); }
    Vec step(Vec a, Vec x, int64_t) const { return vmax(a, x); }
  };
  struct Sum {
    Vec init() const { return splat(0.0f); }
    Vec step(Vec a, Vec x, int64_t) const { return a + x; }
  };
  const float pad = average ? 0.0f : -std::numeric_limits<float>::infinity();
  for (int64_t c = 0; c < g.channels; ++c) {
    fill_block(wg, b, src.data + c * src.plane_stride, src.row0, pad, block, padded);
    for (int64_t oh = oh_begin; oh < oh_end; ++oh) {
      const float* base = block + (oh - oh_begin) * g.stride_h * b.row_len;
      float* out = dst.data + c * dst.plane_stride + (oh - dst.row0) * g.out_w;
      if (!average) {
        window_row(b, base, acc, Max{});
        std::copy(acc, acc + g.out_w, out);
        continue;
      }
      window_row(b, base, acc, Sum{});
      const int64_t n_h =
          taps_in(oh * g.stride_h - g.pad_top, g.kernel_h, g.dilation_h, lo_h, hi_h);
      const float inv_h = n_h > 0 ? 1.0f / static_cast<float>(n_h) : 0.0f;
      for (int64_t x = 0; x < b.out_w_padded; x += kLanes) {
        store(acc + x, load(acc + x) * load(inv_count_w + x) * inv_h);
      }
      std::copy(acc, acc + g.out_w, out);
    }
  }
}

inline void pool2d_rows_impl(PoolKind kind, const PoolGeometry& g, const PlaneView& src,
                             const PlaneView& dst, int64_t oh_begin, int64_t oh_end,
                             std::vector<float>& scratch) {
  if (oh_begin >= oh_end) return;
  const WindowGeometry wg{g.in_h,     g.in_w,    g.out_w,    g.kernel_h,   g.kernel_w,  g.stride_h,
                          g.stride_w, g.pad_top, g.pad_left, g.dilation_h, g.dilation_w};
  // A 3x3 max (ResNet-50's stem pooling) takes the depthwise convolution's channel-lane kernel
  // where its transposes are tuned, as the depthwise layers do (f32-dwconv/lanes_impl.h). On
  // ResNet-50's 64x112x112 stride-2 pooling, one thread, Zen 5: per plane 252 us in the model
  // against oneDNN's 65 (ONEDNN_VERBOSE), by channel lanes 75 us (66-69 us alone,
  // bench/dwconv_bench.cc pool/).
  const int64_t lanes_c =
      kind == PoolKind::kMax && kTransposeTuned && lanes_supported(wg, g.channels)
          ? g.channels / kLanes * kLanes
          : 0;
  if (lanes_c > 0) {
    window3x3_lanes(
        wg, lanes_c, -std::numeric_limits<float>::infinity(), [](int64_t) { return LaneMax{}; },
        src, dst, oh_begin, oh_end, Epilogue{}, nullptr, scratch);
  }
  if (lanes_c == g.channels) return;
  PoolGeometry rest = g;
  rest.channels = g.channels - lanes_c;
  pool2d_planes(kind, rest, wg, from_channel(src, lanes_c), from_channel(dst, lanes_c), oh_begin,
                oh_end, scratch);
}

inline void global_average_pool_impl(const float* src, int64_t plane_stride, int64_t plane_size,
                                     int64_t channels, float* dst) {
  const float inv = plane_size > 0 ? 1.0f / static_cast<float>(plane_size) : 0.0f;
  for (int64_t c = 0; c < channels; ++c) {
    const float* p = src + c * plane_stride;
    Vec s0 = splat(0.0f), s1 = s0;
    int64_t i = 0;
    for (; i + 2 * kLanes <= plane_size; i += 2 * kLanes) {
      s0 += load(p + i);
      s1 += load(p + i + kLanes);
    }
    for (; i < plane_size; i += kLanes) {
      s0 += plane_size - i >= kLanes ? load(p + i) : load_partial(p + i, plane_size - i);
    }
    dst[c] = reduce_add(s0 + s1) * inv;
  }
}

}  // namespace
}  // namespace sparsecol::kernels
