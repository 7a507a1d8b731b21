// The depthwise convolution compiled for the baseline ISA, and the ISA dispatch (the best compiled
// variant no higher than the requested and the active ISA): see dwconv.h.
#include "f32-dwconv/dwconv_impl.h"

namespace sparsecol::kernels {
namespace detail {

void dwconv2d_rows_avx2(const ConvGeometry& g, const float* weight, const float* bias,
                        const PlaneView& src, const PlaneView& dst, int64_t oh_begin,
                        int64_t oh_end, const Epilogue& epilogue, const PlaneView* residual,
                        std::vector<float>& scratch, DwconvMethod method);

void dwconv2d_rows_avx512(const ConvGeometry& g, const float* weight, const float* bias,
                          const PlaneView& src, const PlaneView& dst, int64_t oh_begin,
                          int64_t oh_end, const Epilogue& epilogue, const PlaneView* residual,
                          std::vector<float>& scratch, DwconvMethod method);

}  // namespace detail

void dwconv2d_rows(const ConvGeometry& g, const float* weight, const float* bias,
                   const PlaneView& src, const PlaneView& dst, int64_t oh_begin, int64_t oh_end,
                   const Epilogue& epilogue, const PlaneView* residual, std::vector<float>& scratch,
                   Isa isa, DwconvMethod method) {
  switch (effective_isa(isa)) {
    case Isa::kAvx512:
      return detail::dwconv2d_rows_avx512(g, weight, bias, src, dst, oh_begin, oh_end, epilogue,
                                          residual, scratch, method);
    case Isa::kAvx2:
      return detail::dwconv2d_rows_avx2(g, weight, bias, src, dst, oh_begin, oh_end, epilogue,
                                        residual, scratch, method);
    case Isa::kPortable:
      return dwconv2d_rows_impl(g, weight, bias, src, dst, oh_begin, oh_end, epilogue, residual,
                                scratch, method);
  }
}

}  // namespace sparsecol::kernels
