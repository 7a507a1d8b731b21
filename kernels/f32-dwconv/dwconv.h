// f32 depthwise 2-D convolution (groups == in_c == out_c) on NCHW activations, computing a range
// of output rows of one image.
//
// Layout: weight is [C x KH*KW] (ONNX's [C, 1, KH, KW]); src/dst/residual are PlaneViews (see
// f32-conv/conv.h), so a tile buffer that holds only some rows works. A depthwise layer does 9
// multiply-adds per output pixel, so it is bound by memory and by data movement, not by FMAs:
// per channel, the needed input rows are copied once into a zero-padded scratch block, after
// which every tap is one contiguous, unaligned vector load and one FMA per vector of outputs (16
// on AVX-512, 8 on AVX2, 4 on the portable path); no bounds test is left in the inner loop. Any
// kernel size, stride, dilation and padding is served. Stride 1 lays the rows out flat, so the
// whole row range is one run of vectors (dwconv_impl.h, dwconv2d_flat: 7- and 14-wide planes
// waste no vectors per row); other strides split each row into `stride` phases (even/odd
// columns for stride 2) and run row by row. On AVX2 and AVX-512, 3x3 stride 1 and 2
// (MobileNetV2) take the channel-lane kernel instead (lanes_impl.h): a vector holds one pixel of
// kLanes channels, so small planes waste no lanes and pay no per-plane-row cost. Against the flat
// stride-1 kernel on MobileNetV2's shapes (bench/dwconv_bench.cc, one thread): Zen 3 AVX2 about
// as fast on 7x7 and 14x14 planes (0.97-1.24x) and 1.4-1.6x faster on the larger ones; Zen 5
// AVX-512 1.2-1.3x at stride 1 (1.9x on 7x7 planes) and 2.7-6.3x at stride 2 (docs/BENCHMARKS.md).
// Its two 16x16 transposes per vector of outputs were over half its time on Zen 5, so on AVX-512
// 3x3 stride-1 layers with rows at least a vector wide (MobileNetV2's 28- to 112-wide ones) take
// the flat per-plane kernel instead (dwconv_impl.h, dwconv3x3_flat: no transposes, aligned loads,
// lane shifts for the side taps): 1.06-1.18x the channel lanes there (one thread, Zen 5). So do
// the stride-2 ones, their input rows split into even and odd columns first (1.12x on the
// 112x112 layer, about even on the 56x56 one). On AVX2 only stride-1 rows of one to two vectors
// (MobileNetV2's 14x14 layers) do, where the lanes lost reading from L3 (dwconv_impl.h).
#pragma once

#include <cstdint>
#include <vector>

#include "epilogue.h"
#include "f32-conv/conv.h"
#include "isa.h"

namespace sparsecol::kernels {

// Which kernel serves a call: kAuto picks (channel lanes where they apply on AVX2, planes
// otherwise); the others force one (tests and benchmarks compare them). kChannelLanes falls back to
// kPlanes where it does not apply (any geometry but 3x3 stride 1 or 2 undilated, fewer than kLanes
// channels) and for the last in_c % kLanes channels.
enum class DwconvMethod { kAuto, kPlanes, kChannelLanes };

// Output rows [oh_begin, oh_end) of every channel. `weight` is [C x KH*KW], `bias` has C values
// (may be nullptr). The epilogue's row_bias and residual pointer are ignored: bias comes from
// `bias`, the residual (when `residual` is not nullptr) through its PlaneView. `isa` is capped at
// active_isa(). Single-threaded; `scratch` grows as needed.
void dwconv2d_rows(const ConvGeometry& g, const float* weight, const float* bias,
                   const PlaneView& src, const PlaneView& dst, int64_t oh_begin, int64_t oh_end,
                   const Epilogue& epilogue, const PlaneView* residual, std::vector<float>& scratch,
                   Isa isa = active_isa(), DwconvMethod method = DwconvMethod::kAuto);

}  // namespace sparsecol::kernels
