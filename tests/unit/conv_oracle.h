// The oracle of the convolution kernel tests (dense and sparse): the naive reference convolution
// of one image followed by the kernel epilogue, element by element; and the square-kernel cases
// both tests draw their layer shapes from.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "epilogue.h"
#include "f32-conv/conv.h"
#include "f32-gemm/gemm.h"
#include "reference/conv.h"
#include "reference/window.h"

namespace sparsecol::testing {

// A convolution with a square kernel, the same stride, padding and dilation along both axes.
struct ConvCase {
  std::string name;
  int64_t in_c, out_c, in_h, in_w, kernel, stride, pad, dilation, groups;
};

inline void PrintTo(const ConvCase& c, std::ostream* os) { *os << c.name; }

// The case's geometry, its output size computed as ONNX does.
inline kernels::ConvGeometry make_geometry(const ConvCase& c) {
  kernels::ConvGeometry g;
  g.in_c = c.in_c;
  g.out_c = c.out_c;
  g.in_h = c.in_h;
  g.in_w = c.in_w;
  g.kernel_h = g.kernel_w = c.kernel;
  g.stride_h = g.stride_w = c.stride;
  g.pad_top = g.pad_left = c.pad;
  g.dilation_h = g.dilation_w = c.dilation;
  g.groups = c.groups;
  const int64_t span = c.dilation * (c.kernel - 1) + 1;
  g.out_h = (c.in_h + 2 * c.pad - span) / c.stride + 1;
  g.out_w = (c.in_w + 2 * c.pad - span) / c.stride + 1;
  return g;
}

// The 2-D window of a kernel geometry (ConvGeometry, PoolGeometry) as the reference kernels take
// it; pad_end is left to the caller (a convolution's follows from its output size).
template <typename Geometry>
kernels::reference::Window reference_window(const Geometry& g) {
  kernels::reference::Window w;
  w.rank = 2;
  w.in_size = {g.in_h, g.in_w, 0};
  w.out_size = {g.out_h, g.out_w, 0};
  w.kernel = {g.kernel_h, g.kernel_w, 0};
  w.stride = {g.stride_h, g.stride_w, 0};
  w.dilation = {g.dilation_h, g.dilation_w, 0};
  w.pad_begin = {g.pad_top, g.pad_left, 0};
  return w;
}

// post(residual + pre(conv(src, weight) + bias)), residual added when `residual` is non-null.
inline std::vector<float> expected_conv(const kernels::ConvGeometry& g, const float* src,
                                        const float* weight, const float* bias,
                                        const float* residual, const kernels::Epilogue& e) {
  kernels::reference::ConvShape shape;
  shape.in_channels = g.in_c;
  shape.out_channels = g.out_c;
  shape.groups = g.groups;
  shape.window = reference_window(g);
  std::vector<float> out(static_cast<std::size_t>(g.out_c * g.out_h * g.out_w));
  kernels::reference::conv_reference(src, weight, bias, out.data(), shape);
  for (std::size_t i = 0; i < out.size(); ++i) {
    float v = kernels::apply_activation(e.pre_residual, out[i], e.clip_min, e.clip_max);
    if (residual != nullptr) v += residual[i];
    out[i] = kernels::apply_activation(e.post_residual, v, e.clip_min, e.clip_max);
  }
  return out;
}

}  // namespace sparsecol::testing
