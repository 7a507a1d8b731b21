// f32 2-D convolution on NCHW activations, computing a range of output rows of one image.
//
// Layout: NCHW, because the sparse kernels (and this dense one) broadcast one weight and FMA it
// into 16 consecutive pixels of a channel plane, and because a tile of output rows of an NCHW
// image is a contiguous run of each plane: the depth-wise schedule's tiles need no gather.
// Implementations, chosen at packing time from the geometry:
//  - 1x1, stride 1: a GEMM of weights [OC x IC] by the input planes [IC x H*W];
//  - depthwise (groups == in_c == out_c): a per-channel direct kernel;
//  - otherwise: im2col of the needed input rows into scratch, then GEMM per group.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "epilogue.h"
#include "f32-gemm/gemm.h"

namespace sparsecol::kernels {

struct ConvGeometry {
  int64_t in_c = 0, in_h = 0, in_w = 0;
  int64_t out_c = 0, out_h = 0, out_w = 0;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_left = 0;  // bottom/right padding follows from out_h/out_w
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
};

// Input rows [first, last) that output rows [oh_begin, oh_end) read (clamped to the image):
// the tile algebra of a convolution.
void conv_input_rows(const ConvGeometry& g, int64_t oh_begin, int64_t oh_end, int64_t* first,
                     int64_t* last);

// Where a kernel reads or writes one image: `data` points at row `row0` of channel 0; channel c's
// row r is at data + c * plane_stride + (r - row0) * width. A whole tensor has row0 = 0 and
// plane_stride = H * W; a tile buffer holds only some rows.
struct PlaneView {
  float* data = nullptr;
  int64_t row0 = 0;
  int64_t plane_stride = 0;
};

// Weights (and bias) packed once at load for the implementation the geometry selects.
class PackedConv {
 public:
  PackedConv(const ConvGeometry& geometry, const float* weight, const float* bias);
  const ConvGeometry& geometry() const { return geometry_; }
  std::string implementation() const;  // e.g. "gemm-1x1/avx512", "depthwise-3x3/portable"

  struct Impl;
  std::shared_ptr<const Impl> impl() const { return impl_; }

 private:
  ConvGeometry geometry_;
  std::shared_ptr<const Impl> impl_;
};

// Computes output rows [oh_begin, oh_end) of one image. `src` must hold the input rows
// conv_input_rows() names. The epilogue's row_bias is ignored (the packed bias is used); its
// residual, when set, is read through `residual` with the output's layout. Single-threaded;
// `scratch` grows as needed and may be reused across calls.
void conv2d_rows(const PackedConv& conv, const PlaneView& src, const PlaneView& dst,
                 int64_t oh_begin, int64_t oh_end, const Epilogue& epilogue,
                 const PlaneView* residual, std::vector<float>& scratch);

}  // namespace sparsecol::kernels
