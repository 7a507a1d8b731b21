// Pooling compiled for the baseline ISA, the ISA dispatch and the tile algebra: see pool.h.
#include <algorithm>

#include "f32-pool/pool_impl.h"

namespace sparsecol::kernels {
namespace detail {

void pool2d_rows_avx2(PoolKind kind, const PoolGeometry& g, const PlaneView& src,
                      const PlaneView& dst, int64_t oh_begin, int64_t oh_end,
                      std::vector<float>& scratch);
void global_average_pool_avx2(const float* src, int64_t plane_stride, int64_t plane_size,
                              int64_t channels, float* dst);

void pool2d_rows_avx512(PoolKind kind, const PoolGeometry& g, const PlaneView& src,
                        const PlaneView& dst, int64_t oh_begin, int64_t oh_end,
                        std::vector<float>& scratch);
void global_average_pool_avx512(const float* src, int64_t plane_stride, int64_t plane_size,
                                int64_t channels, float* dst);

}  // namespace detail

void pool_input_rows(const PoolGeometry& g, int64_t oh_begin, int64_t oh_end, int64_t* first,
                     int64_t* last) {
  if (oh_begin >= oh_end) {
    *first = *last = 0;
    return;
  }
  const int64_t lo = oh_begin * g.stride_h - g.pad_top;
  const int64_t hi = (oh_end - 1) * g.stride_h - g.pad_top + (g.kernel_h - 1) * g.dilation_h + 1;
  *first = std::clamp(lo, int64_t{0}, g.in_h);
  *last = std::clamp(hi, *first, g.in_h);
}

void pool2d_rows(PoolKind kind, const PoolGeometry& g, const PlaneView& src, const PlaneView& dst,
                 int64_t oh_begin, int64_t oh_end, std::vector<float>& scratch, Isa isa) {
  switch (effective_isa(isa)) {
    case Isa::kAvx512:
      return detail::pool2d_rows_avx512(kind, g, src, dst, oh_begin, oh_end, scratch);
    case Isa::kAvx2:
      return detail::pool2d_rows_avx2(kind, g, src, dst, oh_begin, oh_end, scratch);
    case Isa::kPortable:
      return pool2d_rows_impl(kind, g, src, dst, oh_begin, oh_end, scratch);
  }
}

void global_average_pool(const float* src, int64_t plane_stride, int64_t plane_size,
                         int64_t channels, float* dst, Isa isa) {
  switch (effective_isa(isa)) {
    case Isa::kAvx512:
      return detail::global_average_pool_avx512(src, plane_stride, plane_size, channels, dst);
    case Isa::kAvx2:
      return detail::global_average_pool_avx2(src, plane_stride, plane_size, channels, dst);
    case Isa::kPortable:
      return global_average_pool_impl(src, plane_stride, plane_size, channels, dst);
  }
}

}  // namespace sparsecol::kernels
