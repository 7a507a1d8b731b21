// The oracle of the convolution kernel tests (dense and sparse): the naive reference convolution
// of one image followed by the kernel epilogue, element by element.
#pragma once

#include <cstddef>
#include <vector>

#include "epilogue.h"
#include "f32-conv/conv.h"
#include "f32-gemm/gemm.h"
#include "reference/conv.h"
#include "reference/window.h"

namespace sparsecol::testing {

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
