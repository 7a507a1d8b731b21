// Naive reference convolution: the oracle the fast convolution kernels are tested against.
//
// Layout: src is N x C x [D x] [H x] W, weight is OC x (C / groups) x [KD x] [KH x] KW, dst is
// N x OC x [OD x] [OH x] OW, all dense and C-ordered (ONNX Conv). 1-D, 2-D and 3-D share one
// loop nest.
#pragma once

#include <cstdint>

#include "reference/window.h"

namespace sparsecol::kernels::reference {

struct ConvShape {
  int64_t batch = 1;
  int64_t in_channels = 0;   // all groups together
  int64_t out_channels = 0;  // all groups together
  int64_t groups = 1;        // in_channels and out_channels are multiples of it
  Window window;             // pad_end is implied by out_size and unused here
};

// dst = conv(src, weight) + bias. bias (out_channels values) may be nullptr. Sums are taken in
// double, so the result is the float rounding of a nearly exact sum.
void conv_reference(const float* src, const float* weight, const float* bias, float* dst,
                    const ConvShape& shape);

// dst = conv_transpose(src, weight) + bias (ONNX ConvTranspose): weight is IC x (OC / groups) x
// [KD x] [KH x] KW; the window's in_size is src's and out_size dst's, and input position i adds
// to output position i * stride + k * dilation - pad_begin through tap k. Sums in double, each
// output plane in one fixed order.
void conv_transpose_reference(const float* src, const float* weight, const float* bias, float* dst,
                              const ConvShape& shape);

}  // namespace sparsecol::kernels::reference
