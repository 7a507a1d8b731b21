// f32 2-D transposed convolution (ONNX ConvTranspose) on NCHW activations: a product and a
// col2im. Each input pixel scatters W[c] (out_c / groups x KH x KW) into the output, so
// cols = W^T X, with W^T's rows (output channel, tap) and its columns the input channels, holds
// every input pixel's contribution to every tap, and col2im adds each row into its output plane
// at the tap's offset, input pixel (y, x) landing on output (y * stride_h - pad_top + ky *
// dilation_h, x * stride_w - pad_left + kx * dilation_w). The product is the GEMM on dense
// weights and the sparse kernel (f32-spmm) on pruned ones, as for Conv; a chunk of input rows at
// a time, so that cols stays in L2.
//
// The geometry is a ConvGeometry read the transposed way: in_* are the op's input X, out_* its
// output, pad_top/pad_left the output's begin pads (bottom/right padding and output_padding are
// already in out_h/out_w), weight [in_c x out_c / groups x KH x KW] as ONNX stores it. A begin pad
// may be negative (an output_shape larger than the taps reach, its total padding halved rounding
// down): the output then starts before the first input's taps.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "f32-conv/conv.h"

namespace sparsecol::kernels {

class PackedConvTranspose {
 public:
  // Throws Error(kInvalidArgument) on a geometry whose sizes do not fit together. A weight whose
  // fraction of exact zeros reaches `sparse_threshold` (negative: the default for convolutions;
  // kAlwaysDense: never) and that has one group runs through the sparse kernel.
  PackedConvTranspose(const ConvGeometry& geometry, const float* weight, const float* bias,
                      double sparse_threshold = -1.0, Isa isa = active_isa());
  const ConvGeometry& geometry() const { return geometry_; }
  std::string implementation() const;  // e.g. "gemm-col2im/avx2", "spmm-col2im/avx2"
  double weight_sparsity() const;
  const char* weight_format() const;  // "dense" or "sparse-csr"
  int64_t packed_bytes() const;
  // conv_transpose2d_image takes output channel ranges that start at a multiple of this and end
  // at one or at out_c: a range's rows of W^T (channels x taps) start on a GEMM panel; out_c
  // (all channels only) with several groups.
  int64_t channel_granule() const;

  struct Impl;
  std::shared_ptr<const Impl> impl() const { return impl_; }

 private:
  ConvGeometry geometry_;
  std::shared_ptr<const Impl> impl_;
};

// Output channels [oc_begin, oc_end) of one image: src is its in_c x in_h x in_w floats, dst its
// out_c x out_h x out_w (only those channels' planes are written: bias, then every tap's sum).
// The range follows conv.channel_granule() (Error(kInvalidArgument) otherwise).
// Single-threaded; `scratch` grows as needed.
void conv_transpose2d_image(const PackedConvTranspose& conv, const float* src, float* dst,
                            int64_t oc_begin, int64_t oc_end, std::vector<float>& scratch);

}  // namespace sparsecol::kernels
