// Naive reference QuantizeLinear and DequantizeLinear (ONNX, opsets 10 to 17).
//
// Layout: src and dst are dense arrays of the same shape, seen as [outer, channels, inner]; scale
// and zero_point hold one value per channel (channels 1: per tensor). zero_point may be nullptr
// (zero).
#pragma once

#include <cstdint>

namespace sparsecol::kernels::reference {

// dst = saturate(round(src / scale) + zero_point), rounding halves to even, saturating to Q's
// range (a NaN gives the zero point, as a float-to-integer conversion of NaN has no value).
// Q: uint8_t, int8_t.
template <typename Q>
void quantize_linear(const float* src, int64_t outer, int64_t channels, int64_t inner,
                     const float* scale, const Q* zero_point, Q* dst);

// dst = (src - zero_point) * scale. Q: uint8_t, int8_t, int32_t.
template <typename Q>
void dequantize_linear(const Q* src, int64_t outer, int64_t channels, int64_t inner,
                       const float* scale, const Q* zero_point, float* dst);

}  // namespace sparsecol::kernels::reference
