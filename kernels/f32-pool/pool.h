// f32 2-D max / average pooling on NCHW activations, computing a range of output rows of one
// image, and global average pooling.
//
// Layout: src/dst are PlaneViews (see f32-conv/conv.h): a tile buffer holding only some rows
// works. Same scheme as the depthwise convolution (f32-dwconv/dwconv.h): per channel the needed
// input rows are copied once into a padded, phase-split scratch block (padding is -inf for max,
// 0 for average), then each tap is a contiguous vector load and a max or an add. The average's
// divisor is separable (rows in window x columns in window), so it is one multiply per output.
#pragma once

#include <cstdint>
#include <vector>

#include "f32-conv/conv.h"
#include "isa.h"

namespace sparsecol::kernels {

enum class PoolKind { kMax, kAverage };

struct PoolGeometry {
  int64_t channels = 0, in_h = 0, in_w = 0, out_h = 0, out_w = 0;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_left = 0;
  int64_t pad_bottom = 0, pad_right = 0;  // the average's divisor needs them (count_include_pad)
  int64_t dilation_h = 1, dilation_w = 1;
  // Average only: padded positions count in the divisor; positions beyond pad_bottom/right
  // (ceil_mode's extra window) never do, as in ONNX.
  bool count_include_pad = false;
};

// Input rows [first, last) that output rows [oh_begin, oh_end) read, clamped to the image.
void pool_input_rows(const PoolGeometry& g, int64_t oh_begin, int64_t oh_end, int64_t* first,
                     int64_t* last);

// Output rows [oh_begin, oh_end) of every channel. `src` must hold pool_input_rows(). A max
// window that lies wholly in padding yields -inf. `isa` is capped at active_isa().
void pool2d_rows(PoolKind kind, const PoolGeometry& g, const PlaneView& src, const PlaneView& dst,
                 int64_t oh_begin, int64_t oh_end, std::vector<float>& scratch,
                 Isa isa = active_isa());

// dst[c] = mean of channel c's plane, for channels [0, channels) (src planes `plane_stride`
// apart, each `plane_size` values). Needs the whole plane: it ends a tensor column.
void global_average_pool(const float* src, int64_t plane_stride, int64_t plane_size,
                         int64_t channels, float* dst, Isa isa = active_isa());

}  // namespace sparsecol::kernels
