// The depthwise convolution compiled for AVX2 + FMA (ymm): see dwconv.h.
#include "f32-dwconv/dwconv_impl.h"

namespace sparsecol::kernels::detail {

void dwconv2d_rows_avx2(const ConvGeometry& g, const float* weight, const float* bias,
                        const PlaneView& src, const PlaneView& dst, int64_t oh_begin,
                        int64_t oh_end, const Epilogue& epilogue, const PlaneView* residual,
                        std::vector<float>& scratch, DwconvMethod method) {
  dwconv2d_rows_impl(g, weight, bias, src, dst, oh_begin, oh_end, epilogue, residual, scratch,
                     method);
}

}  // namespace sparsecol::kernels::detail
