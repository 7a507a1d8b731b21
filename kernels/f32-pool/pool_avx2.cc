// Pooling compiled for AVX2 + FMA (ymm): see pool.h.
#include "f32-pool/pool_impl.h"

namespace sparsecol::kernels::detail {

void pool2d_rows_avx2(PoolKind kind, const PoolGeometry& g, const PlaneView& src,
                      const PlaneView& dst, int64_t oh_begin, int64_t oh_end,
                      std::vector<float>& scratch) {
  pool2d_rows_impl(kind, g, src, dst, oh_begin, oh_end, scratch);
}

void global_average_pool_avx2(const float* src, int64_t plane_stride, int64_t plane_size,
                              int64_t channels, float* dst) {
  global_average_pool_impl(src, plane_stride, plane_size, channels, dst);
}

}  // namespace sparsecol::kernels::detail
