#include "reference/conv.h"

#include <algorithm>
#include <vector>

#include <omp.h>

namespace sparsecol::kernels::reference {

namespace {

// Below this many multiply-adds, waking a thread team costs more than the work saves.
constexpr int64_t kMinParallelWork = 1 << 18;

// One loop nest for both: per output plane (n, oc), per input channel of its group and per tap,
// a walk over the positions the tap connects. A convolution walks output positions o and reads
// input o * stride + offset; a transposed one walks input positions i and adds to output
// i * stride + offset. Loop order n, oc, ic, kd, kh, kw, then the walked positions: the innermost
// loop is one row of the walked plane (contiguous in one operand, strided in the other), so a
// whole ResNet-50 runs in seconds rather than minutes. Output planes are independent, so they are
// shared among threads; each plane is summed in one fixed order, so the result does not depend
// on the thread count.
template <bool kTransposed>
void convolve(const float* src, const float* weight, const float* bias, float* dst,
              const ConvShape& shape) {
  const Window w = shape.window.expanded();
  // Plain names, not structured bindings: OpenMP regions cannot capture those in clang.
  const int64_t in_d = w.in_size[0], in_h = w.in_size[1], in_w = w.in_size[2];
  const int64_t out_d = w.out_size[0], out_h = w.out_size[1], out_w = w.out_size[2];
  const int64_t k_d = w.kernel[0], k_h = w.kernel[1], k_w = w.kernel[2];
  const int64_t in_plane = in_d * in_h * in_w;
  const int64_t out_plane = out_d * out_h * out_w;
  const int64_t taps = k_d * k_h * k_w;
  const int64_t ic_per_group = shape.in_channels / shape.groups;
  const int64_t oc_per_group = shape.out_channels / shape.groups;
  const int64_t planes = shape.batch * shape.out_channels;
  const int64_t macs = planes * (kTransposed ? in_plane : out_plane) * ic_per_group * taps;
  // The walked positions on each axis: those whose partner position * stride + offset lies in
  // the other plane.
  const auto walk = [&](int axis, int64_t offset) {
    return kTransposed ? valid_outputs(w.in_size[axis], w.stride[axis], offset, w.out_size[axis])
                       : valid_outputs(w.out_size[axis], w.stride[axis], offset, w.in_size[axis]);
  };

  // One accumulator plane per thread, allocated here: an exception must not leave a parallel
  // region.
  const bool parallel = macs > kMinParallelWork;
  const int64_t threads = parallel ? omp_get_max_threads() : 1;
  std::vector<double> acc_planes(static_cast<std::size_t>(threads * out_plane));

#pragma omp parallel if (parallel)
  {
    double* acc = acc_planes.data() + omp_get_thread_num() * out_plane;
#pragma omp for schedule(static)
    for (int64_t plane = 0; plane < planes; ++plane) {
      const int64_t n = plane / shape.out_channels;
      const int64_t oc = plane % shape.out_channels;
      const int64_t group = oc / oc_per_group;
      std::fill_n(acc, out_plane, bias != nullptr ? static_cast<double>(bias[oc]) : 0.0);
      for (int64_t ic = 0; ic < ic_per_group; ++ic) {
        const int64_t channel = group * ic_per_group + ic;
        const float* x = src + (n * shape.in_channels + channel) * in_plane;
        // Conv's weight is [OC, IC / groups, taps], ConvTranspose's [IC, OC / groups, taps].
        const float* f = weight + (kTransposed ? channel * oc_per_group + oc % oc_per_group
                                               : oc * ic_per_group + ic) *
                                      taps;
        for (int64_t kd = 0; kd < k_d; ++kd) {
          const int64_t off_d = kd * w.dilation[0] - w.pad_begin[0];
          const IndexRange walk_d = walk(0, off_d);
          for (int64_t kh = 0; kh < k_h; ++kh) {
            const int64_t off_h = kh * w.dilation[1] - w.pad_begin[1];
            const IndexRange walk_h = walk(1, off_h);
            for (int64_t kw = 0; kw < k_w; ++kw) {
              const int64_t off_w = kw * w.dilation[2] - w.pad_begin[2];
              const IndexRange walk_w = walk(2, off_w);
              const double tap = f[(kd * k_h + kh) * k_w + kw];
              for (int64_t a = walk_d.begin; a < walk_d.end; ++a) {
                const int64_t b = a * w.stride[0] + off_d;
                const int64_t od = kTransposed ? b : a, id = kTransposed ? a : b;
                for (int64_t ah = walk_h.begin; ah < walk_h.end; ++ah) {
                  const int64_t bh = ah * w.stride[1] + off_h;
                  const int64_t oh = kTransposed ? bh : ah, ih = kTransposed ? ah : bh;
                  const float* x_row = x + (id * in_h + ih) * in_w;
                  double* acc_row = acc + (od * out_h + oh) * out_w;
                  for (int64_t aw = walk_w.begin; aw < walk_w.end; ++aw) {
                    const int64_t bw = aw * w.stride[2] + off_w;
                    acc_row[kTransposed ? bw : aw] += tap * x_row[kTransposed ? aw : bw];
                  }
                }
              }
            }
          }
        }
      }
      float* y = dst + plane * out_plane;
      for (int64_t i = 0; i < out_plane; ++i) y[i] = static_cast<float>(acc[i]);
    }
  }
}

}  // namespace

void conv_reference(const float* src, const float* weight, const float* bias, float* dst,
                    const ConvShape& shape) {
  convolve<false>(src, weight, bias, dst, shape);
}

void conv_transpose_reference(const float* src, const float* weight, const float* bias, float* dst,
                              const ConvShape& shape) {
  convolve<true>(src, weight, bias, dst, shape);
}

}  // namespace sparsecol::kernels::reference
