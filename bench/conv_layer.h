// The convolution layers the kernel benchmarks time: square images, a square kernel, padding that
// keeps the size at stride 1 (every layer of ResNet-50 and MobileNetV2 is such a layer).
#pragma once

#include <cstdint>

#include "f32-conv/conv.h"

namespace sparsecol::bench {

struct ConvLayer {
  const char* name;
  int64_t in_c, out_c, in_hw, kernel, stride, groups = 1;
};

inline kernels::ConvGeometry geometry_of(const ConvLayer& layer) {
  kernels::ConvGeometry g;
  g.in_c = layer.in_c;
  g.out_c = layer.out_c;
  g.in_h = g.in_w = layer.in_hw;
  g.kernel_h = g.kernel_w = layer.kernel;
  g.stride_h = g.stride_w = layer.stride;
  g.pad_top = g.pad_left = (layer.kernel - 1) / 2;
  g.groups = layer.groups;
  g.out_h = g.out_w = (layer.in_hw + 2 * g.pad_top - layer.kernel) / layer.stride + 1;
  return g;
}

}  // namespace sparsecol::bench
