// The depthwise convolution compiled for the baseline ISA, and the ISA dispatch: see dwconv.h.
#include "f32-dwconv/dwconv_impl.h"

namespace sparsecol::kernels {
namespace detail {

void dwconv2d_rows_avx512(const ConvGeometry& g, const float* weight, const float* bias,
                          const PlaneView& src, const PlaneView& dst, int64_t oh_begin,
                          int64_t oh_end, const Epilogue& epilogue, const PlaneView* residual,
                          std::vector<float>& scratch);

}  // namespace detail

void dwconv2d_rows(const ConvGeometry& g, const float* weight, const float* bias,
                   const PlaneView& src, const PlaneView& dst, int64_t oh_begin, int64_t oh_end,
                   const Epilogue& epilogue, const PlaneView* residual, std::vector<float>& scratch,
                   Isa isa) {
  if (isa == Isa::kAvx512 && active_isa() == Isa::kAvx512) {
    detail::dwconv2d_rows_avx512(g, weight, bias, src, dst, oh_begin, oh_end, epilogue, residual,
                                 scratch);
  } else {
    dwconv2d_rows_impl(g, weight, bias, src, dst, oh_begin, oh_end, epilogue, residual, scratch);
  }
}

}  // namespace sparsecol::kernels
