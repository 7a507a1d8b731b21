// The depthwise convolution body, compiled once per ISA by dwconv_portable.cc, dwconv_avx2.cc
// and dwconv_avx512.cc (see f32-eltwise/simd.h for why one body serves all three).
#pragma once

#include "f32-dwconv/dwconv.h"
#include "f32-dwconv/lanes_impl.h"
#include "f32-dwconv/window_impl.h"

namespace sparsecol::kernels {
namespace {

// The per-plane kernel (DwconvMethod::kPlanes): see dwconv.h.
inline void dwconv2d_planes(const ConvGeometry& g, const float* weight, const float* bias,
                            const PlaneView& src, const PlaneView& dst, int64_t oh_begin,
                            int64_t oh_end, const Epilogue& epilogue, const PlaneView* residual,
                            std::vector<float>& scratch) {
  const WindowGeometry wg{g.in_h,     g.in_w,    g.out_w,    g.kernel_h,   g.kernel_w,  g.stride_h,
                          g.stride_w, g.pad_top, g.pad_left, g.dilation_h, g.dilation_w};
  const PaddedBlock b = plan_block(wg, oh_begin, oh_end);
  scratch.resize(
      static_cast<std::size_t>(b.rows * b.row_len + b.out_w_padded + fill_scratch_size(b)));
  float* block = scratch.data();
  float* acc = block + b.rows * b.row_len;
  float* padded = acc + b.out_w_padded;
  const int64_t taps = g.kernel_h * g.kernel_w;

  struct MultiplyAdd {
    const float* w;
    Vec bias;
    Vec init() const { return bias; }
    Vec step(Vec a, Vec x, int64_t t) const { return fmadd(x, splat(w[t]), a); }
  };
  for (int64_t c = 0; c < g.in_c; ++c) {
    fill_block(wg, b, src.data + c * src.plane_stride, src.row0, 0.0f, block, padded);
    const MultiplyAdd op{weight + c * taps, splat(bias != nullptr ? bias[c] : 0.0f)};
    for (int64_t oh = oh_begin; oh < oh_end; ++oh) {
      window_row(b, block + (oh - oh_begin) * g.stride_h * b.row_len, acc, op);
      const float* res = residual == nullptr ? nullptr
                                             : residual->data + c * residual->plane_stride +
                                                   (oh - residual->row0) * g.out_w;
      epilogue_row(acc, g.out_w, epilogue, res,
                   dst.data + c * dst.plane_stride + (oh - dst.row0) * g.out_w);
    }
  }
}

inline void dwconv2d_rows_impl(const ConvGeometry& g, const float* weight, const float* bias,
                               const PlaneView& src, const PlaneView& dst, int64_t oh_begin,
                               int64_t oh_end, const Epilogue& epilogue, const PlaneView* residual,
                               std::vector<float>& scratch, DwconvMethod method) {
  if (oh_begin >= oh_end) return;
  // kAuto: the channel-lane kernel wherever it applies and its transposes are tuned (AVX2):
  // 2.4-4.5x the per-plane kernel on MobileNetV2's layers (bench/dwconv_bench.cc).
  const bool lanes =
      method == DwconvMethod::kChannelLanes || (method == DwconvMethod::kAuto && kTransposeTuned);
  const int64_t lanes_c = lanes && lanes_supported(g) ? g.in_c / kLanes * kLanes : 0;
  if (lanes_c > 0) {
    dwconv3x3_lanes(g, weight, bias, src, dst, oh_begin, oh_end, epilogue, residual, lanes_c,
                    scratch);
  }
  if (lanes_c == g.in_c) return;
  // The remaining channels, through the per-plane kernel on views shifted by lanes_c channels.
  ConvGeometry rest = g;
  rest.in_c = rest.out_c = rest.groups = g.in_c - lanes_c;
  const PlaneView src_rest{src.data + lanes_c * src.plane_stride, src.row0, src.plane_stride};
  const PlaneView dst_rest{dst.data + lanes_c * dst.plane_stride, dst.row0, dst.plane_stride};
  PlaneView res_rest;
  if (residual != nullptr) {
    res_rest = {residual->data + lanes_c * residual->plane_stride, residual->row0,
                residual->plane_stride};
  }
  dwconv2d_planes(rest, weight + lanes_c * g.kernel_h * g.kernel_w,
                  bias == nullptr ? nullptr : bias + lanes_c, src_rest, dst_rest, oh_begin, oh_end,
                  epilogue, residual == nullptr ? nullptr : &res_rest, scratch);
}

}  // namespace
}  // namespace sparsecol::kernels
