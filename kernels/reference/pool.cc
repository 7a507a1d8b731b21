#include "reference/pool.h"

#include <algorithm>
#include <limits>

namespace sparsecol::kernels::reference {

namespace {

// How many taps of a window starting at `first` land in [lo, hi).
int64_t taps_between(int64_t first, int64_t kernel, int64_t dilation, int64_t lo, int64_t hi) {
  int64_t count = 0;
  for (int64_t k = 0; k < kernel; ++k) {
    const int64_t p = first + k * dilation;
    count += p >= lo && p < hi ? 1 : 0;
  }
  return count;
}

// Visits every output position of every plane and hands `reduce` the input plane, the
// window's first input position per dimension (possibly negative, in padding) and the
// expanded window; `reduce` returns the output value.
template <typename Reduce>
void pool_planes(const float* src, float* dst, const PoolShape& shape, Reduce reduce) {
  const Window w = shape.window.expanded();
  const int64_t in_plane = w.in_size[0] * w.in_size[1] * w.in_size[2];
  const int64_t out_plane = w.out_size[0] * w.out_size[1] * w.out_size[2];
  const int64_t planes = shape.batch * shape.channels;
  const int64_t taps = w.kernel[0] * w.kernel[1] * w.kernel[2];
  // Below this many taps, waking a thread team costs more than the work saves.
  constexpr int64_t kMinParallelWork = 1 << 18;
#pragma omp parallel for schedule(static) if (planes * out_plane * taps > kMinParallelWork)
  for (int64_t plane = 0; plane < planes; ++plane) {
    const float* x = src + plane * in_plane;
    float* y = dst + plane * out_plane;
    for (int64_t od = 0; od < w.out_size[0]; ++od) {
      for (int64_t oh = 0; oh < w.out_size[1]; ++oh) {
        for (int64_t ow = 0; ow < w.out_size[2]; ++ow) {
          const int64_t first[3] = {od * w.stride[0] - w.pad_begin[0],
                                    oh * w.stride[1] - w.pad_begin[1],
                                    ow * w.stride[2] - w.pad_begin[2]};
          y[(od * w.out_size[1] + oh) * w.out_size[2] + ow] = reduce(x, first, w);
        }
      }
    }
  }
}

// Calls visit(value) for every tap of the window that lies inside the input.
template <typename Visit>
void for_each_tap(const float* x, const int64_t first[3], const Window& w, Visit visit) {
  for (int64_t kd = 0; kd < w.kernel[0]; ++kd) {
    const int64_t id = first[0] + kd * w.dilation[0];
    if (id < 0 || id >= w.in_size[0]) continue;
    for (int64_t kh = 0; kh < w.kernel[1]; ++kh) {
      const int64_t ih = first[1] + kh * w.dilation[1];
      if (ih < 0 || ih >= w.in_size[1]) continue;
      for (int64_t kw = 0; kw < w.kernel[2]; ++kw) {
        const int64_t iw = first[2] + kw * w.dilation[2];
        if (iw < 0 || iw >= w.in_size[2]) continue;
        visit(x[(id * w.in_size[1] + ih) * w.in_size[2] + iw]);
      }
    }
  }
}

}  // namespace

void max_pool_reference(const float* src, float* dst, const PoolShape& shape) {
  pool_planes(src, dst, shape, [](const float* x, const int64_t first[3], const Window& w) {
    float best = -std::numeric_limits<float>::infinity();
    // std::max would drop a NaN depending on argument order; ONNX propagates it.
    for_each_tap(x, first, w, [&](float v) { best = (v > best || v != v) ? v : best; });
    return best;
  });
}

void average_pool_reference(const float* src, float* dst, const PoolShape& shape) {
  const bool include_pad = shape.count_include_pad;
  pool_planes(src, dst, shape, [&](const float* x, const int64_t first[3], const Window& w) {
    double sum = 0.0;
    for_each_tap(x, first, w, [&](float v) { sum += v; });
    int64_t count = 1;
    for (int d = 0; d < kMaxSpatialRank; ++d) {
      const int64_t lo = include_pad ? -w.pad_begin[d] : 0;
      const int64_t hi = include_pad ? w.in_size[d] + w.pad_end[d] : w.in_size[d];
      count *= taps_between(first[d], w.kernel[d], w.dilation[d], lo, hi);
    }
    // A window wholly in padding has no taps; 0 rather than 0/0.
    return count > 0 ? static_cast<float>(sum / static_cast<double>(count)) : 0.0f;
  });
}

void global_average_pool_reference(const float* src, float* dst, int64_t planes,
                                   int64_t plane_size) {
  for (int64_t p = 0; p < planes; ++p) {
    double sum = 0.0;
    for (int64_t i = 0; i < plane_size; ++i) sum += src[p * plane_size + i];
    dst[p] = plane_size > 0 ? static_cast<float>(sum / static_cast<double>(plane_size)) : 0.0f;
  }
}

void global_max_pool_reference(const float* src, float* dst, int64_t planes, int64_t plane_size) {
  for (int64_t p = 0; p < planes; ++p) {
    float best = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < plane_size; ++i) {
      const float v = src[p * plane_size + i];
      best = (v > best || v != v) ? v : best;
    }
    dst[p] = best;
  }
}

}  // namespace sparsecol::kernels::reference
