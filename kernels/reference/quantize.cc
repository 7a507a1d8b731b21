#include "reference/quantize.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace sparsecol::kernels::reference {

template <typename Q>
void quantize_linear(const float* src, int64_t outer, int64_t channels, int64_t inner,
                     const float* scale, const Q* zero_point, Q* dst) {
  constexpr float kLow = std::numeric_limits<Q>::lowest(), kHigh = std::numeric_limits<Q>::max();
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t c = 0; c < channels; ++c) {
      const float zero = zero_point != nullptr ? static_cast<float>(zero_point[c]) : 0.0f;
      const int64_t first = (o * channels + c) * inner;
      for (int64_t i = first; i < first + inner; ++i) {
        // nearbyint rounds halves to even in the default rounding mode; the sum of two
        // integers below 2^24 in magnitude is exact in float.
        const float q = std::nearbyint(src[i] / scale[c]) + zero;
        dst[i] = std::isnan(q) ? static_cast<Q>(zero) : static_cast<Q>(std::clamp(q, kLow, kHigh));
      }
    }
  }
}

template <typename Q>
void dequantize_linear(const Q* src, int64_t outer, int64_t channels, int64_t inner,
                       const float* scale, const Q* zero_point, float* dst) {
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t c = 0; c < channels; ++c) {
      // In double: an int32 input and zero point can be further apart than float holds exactly.
      const double zero = zero_point != nullptr ? static_cast<double>(zero_point[c]) : 0.0;
      const int64_t first = (o * channels + c) * inner;
      for (int64_t i = first; i < first + inner; ++i) {
        dst[i] = static_cast<float>((static_cast<double>(src[i]) - zero) * scale[c]);
      }
    }
  }
}

template void quantize_linear<uint8_t>(const float*, int64_t, int64_t, int64_t, const float*,
                                       const uint8_t*, uint8_t*);
template void quantize_linear<int8_t>(const float*, int64_t, int64_t, int64_t, const float*,
                                      const int8_t*, int8_t*);
template void dequantize_linear<uint8_t>(const uint8_t*, int64_t, int64_t, int64_t, const float*,
                                         const uint8_t*, float*);
template void dequantize_linear<int8_t>(const int8_t*, int64_t, int64_t, int64_t, const float*,
                                        const int8_t*, float*);
template void dequantize_linear<int32_t>(const int32_t*, int64_t, int64_t, int64_t, const float*,
                                         const int32_t*, float*);

}  // namespace sparsecol::kernels::reference
