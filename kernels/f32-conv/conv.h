// f32 2-D convolution on NCHW activations, computing a range of output rows of one image.
//
// Layout: NCHW, because the sparse kernels (and this dense one) broadcast one weight and FMA it
// into 16 consecutive pixels of a channel plane, and because a tile of output rows of an NCHW
// image is a contiguous run of each plane: the depth-wise schedule's tiles need no gather.
// Implementations, chosen at packing time from the geometry and the weight's sparsity:
//  - 1x1, stride 1: a GEMM of weights [OC x IC] by the input planes [IC x H*W]; strided 1x1
//    without padding: the same GEMM over the pixels it reads, gathered ("gemm-1x1-gathered");
//  - depthwise (groups == in_c == out_c): a per-channel direct kernel (always dense: 9 weights
//    per channel leave nothing for a sparse format to skip);
//  - one group, stride 1, rows as wide in as out (ResNet-50's 3x3 layers): an implicit GEMM
//    (gemm_packed_taps) that reads each tap's shifted input rows in place, masking the taps that
//    fall off the image's edges, with no im2col;
//  - otherwise: im2col of the needed input rows into scratch, in the GEMM's packed layout, then
//    GEMM per group.
// A weight whose fraction of exact zeros reaches the sparse threshold runs through the sparse
// kernels (f32-spmm/spmm.h) instead: 1x1 stride 1 straight from the input planes ("spmm-1x1"),
// any other convolution over a zero-padded copy of the input rows split by stride phase
// ("spmm-3x3", "spmm-3x3-strided"; see pack_sparse in conv.cc), which needs no im2col, except
// strided 1x1 convolutions, which gather the pixels they read ("spmm-1x1-gathered"). All
// groups share one sparse matrix: a non-zero's offset names its group's input channel directly.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "epilogue.h"
#include "f32-gemm/gemm.h"

namespace sparsecol::kernels {

struct ConvGeometry {
  int64_t in_c = 0, in_h = 0, in_w = 0;
  int64_t out_c = 0, out_h = 0, out_w = 0;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_left = 0;  // bottom/right padding follows from out_h/out_w
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
};

// im2col works on chunks of output rows whose column matrix (written straight into the GEMM's
// packed strips) stays near this many floats (256 KiB), so that it is still in L2 (1-2 MiB per
// core on current x86 servers) when the GEMM streams it. A chunk is never narrower than 64
// output pixels (conv.cc, kMinChunkPixels), so a very deep layer exceeds it: ResNet-50's
// 4608-deep 7x7 layer takes all 7 rows, 221 Ki floats; see also im2col_chunk_rows.
inline constexpr int64_t kIm2colBudgetFloats = 64 * 1024;

// Output rows per chunk of a convolution that runs through im2col and the GEMM at `isa`: about
// kIm2colBudgetFloats of column matrix, never fewer than 64 output pixels (conv.cc), and where
// it fills the GEMM's column strips better, up to twice that.
int64_t im2col_chunk_rows(const ConvGeometry& g, Isa isa = active_isa());

// Input rows [first, last) that output rows [oh_begin, oh_end) read (clamped to the image):
// the tile algebra of a convolution.
void conv_input_rows(const ConvGeometry& g, int64_t oh_begin, int64_t oh_end, int64_t* first,
                     int64_t* last);

// A 1x1 convolution with stride > 1 whose taps all fall inside the image (ResNet-50's downsample
// layers). It gathers the pixels it reads into dense planes and runs the stride-1 1x1 product
// over them, dense ("gemm-1x1-gathered") or sparse ("spmm-1x1-gathered"). Sparse, that replaced
// the phase lowering, which copies all stride_h x stride_w phase planes of which the taps read
// one, in chunks of a few rows that each stream the weights again: ResNet-50 90% pruned's three
// downsample layers ran 2-3x faster (batch 16, 2 threads, interleaved runs of the same binary
// with and without; 2-core Zen 3). Dense, it replaced the implicit GEMM over the one phase (see
// dense_conv_rows in conv.cc). Scratch: in_c x out_h x out_w floats, of which a call touches its
// own rows.
bool gathers_strided_pointwise(const ConvGeometry& g);

// Whether the sparse phase lowering at `isa` packs shifted where its rows pad to the vector
// (f32-spmm/spmm.h, SparseMatrix), or reads the taps' shifted B rows in unaligned loads. AVX2
// does not: its 16 registers hold a shifted tile of 4 vectors (4 accumulators, the 5 sums of a
// shift group and a broadcast) against 8 unshifted, and a 32-byte load at a 1- or 2-float shift
// straddles two cache lines half as often as a 64-byte one. ResNet-50's 3x3 layers on AVX2
// (Zen 3, bench/spmm_bench.cc, one thread, four alternated rounds, ratios to the dense kernel
// of the same run): the stride-1 ones 1.1-1.4x faster unshifted at 90% and 95%, the stride-2
// ones 1.1-1.4x. The portable path's shifted tiles, of the same 4 vectors, ran its 14x14 and 7x7
// layers 1.5-2x faster than unshifted (its 16-byte loads cost more unaligned): it keeps them.
bool sparse_phases_shifted(Isa isa);

// A dense convolution with too few input channels for the implicit GEMM (fewer than 16: the
// stems of ResNet-50 and MobileNetV2, 3 channels), not depthwise and not a 1x1 layer that reads
// its input in place or gathered. It runs the GEMM over zero-padded planes of a chunk of its
// input rows split by stride phase, each B row (channel, tap) read at its offset there
// ("phase-gemm"), instead of an im2col that copies the input once per tap. Scratch per output
// row: (in_c x stride_h x stride_w + out_c / groups) x phase_w floats, phase_w being out_w plus
// the taps' reach in phase columns.
bool runs_on_phase_planes(const ConvGeometry& g);

// Where a kernel reads or writes one image: `data` points at row `row0` of channel 0; channel c's
// row r is at data + c * plane_stride + (r - row0) * width. A whole tensor has row0 = 0 and
// plane_stride = H * W; a tile buffer holds only some rows.
struct PlaneView {
  float* data = nullptr;
  int64_t row0 = 0;
  int64_t plane_stride = 0;
};

// The view of channels [c, ...) of `v`: the same rows, planes shifted by c.
inline PlaneView from_channel(const PlaneView& v, int64_t c) {
  return {v.data + c * v.plane_stride, v.row0, v.plane_stride};
}

// The largest output plane conv2d_images stacks: 7x7 (49 pixels fill 64 lanes, 23% of them
// wasted). 14x14 planes waste 12.5%, and their layers gained 1.05-1.09x alone but lost more to the
// copies: ResNet-50's 14x14 1x1 layers ran 0.73-0.82x stacked at batch 16 (layer by layer, 2
// threads), its 3x3 ones 1.02-1.08x.
inline constexpr int64_t kStackedPlanePixels = 64;

// Whether conv2d_images stacks the images of a convolution of this geometry, packed dense or
// sparse, rather than running them one by one: 1x1 stride-1 layers, and dense strided 1x1 layers
// and dense layers that run as implicit GEMMs, whose input has exactly stride_h rows per output
// row, on output planes of at most kStackedPlanePixels pixels.
bool stacks_images(const ConvGeometry& g, bool sparse);

// A sparse 1x1 layer with more input than output channels, on planes of more than
// kStackedPlanePixels and at most this many pixels (ResNet-50's 1024 -> 256 layers and
// MobileNetV2's projections at 14x14), sums its input channels in two halves, each packed on its
// own, and adds the two sums: every entry point does (conv2d_region through conv2d_input_half and
// add_input_halves), so the bits do not depend on the schedule or the thread count. Why: at batch
// 1 such a layer runs one row task per image, and two threads split it by output channels; each
// thread then copied the whole input into line-aligned planes, half of it written last by the
// other core (the layer before splits its output channels the same way), and these layers scaled
// 0.96-1.2x from one core to two. By halves each thread sums the half its core wrote, over all
// output channels, and then adds the two sums for half the output channels (the layer-by-layer
// step, at batch 1). Against oneDNN at batch 1 on two threads (Intel Emerald Rapids, alternated
// processes): MobileNetV2 80% 1.13-1.18x -> 1.20-1.26x, ResNet-50 90% 2.21-2.27x -> 2.36-2.50x,
// 95% 3.22-3.26x -> 3.30-3.47x; batch 16 and the depth-wise schedule (whose tiles run the two
// halves one after the other) within noise (docs/BENCHMARKS.md). 7x7 planes stack their images
// at larger batches (kStackedPlanePixels) and are left out.
inline constexpr int64_t kInputHalvesMaxPixels = 200;

// Weights (and bias) packed once at load for the implementation the geometry selects.
class PackedConv {
 public:
  // `sparse_threshold`: the sparsity (fraction of exact zeros) at or above which the sparse
  // kernels are used; negative: kConvSparseThreshold (f32-spmm/spmm.h), kAlwaysDense: never.
  // The sparse kernels and the dense GEMMs run at `isa` (capped at active_isa()): tests pick
  // each path.
  PackedConv(const ConvGeometry& geometry, const float* weight, const float* bias,
             double sparse_threshold = -1.0, Isa isa = active_isa());
  const ConvGeometry& geometry() const { return geometry_; }
  std::string implementation() const;  // e.g. "gemm-1x1/avx512", "spmm-1x1-jit/avx512"
  double weight_sparsity() const;      // fraction of exact zeros of the weight
  const char* weight_format() const;   // "dense" or "sparse-csr"
  int64_t packed_bytes() const;  // bytes of the packed weight and bias, and of its generated code
  // conv2d_region takes output channel ranges that start at a multiple of this and end at one
  // or at out_c: 1 for the sparse implementations, the GEMM's panel height for a dense GEMM of
  // one group, a vector of channels for depthwise convolutions (the channel-lane kernel's
  // group), out_c (all channels only) for other grouped convolutions.
  int64_t channel_granule() const;
  // Whether the output may be written over the residual: handed the residual's own view as
  // dst, every entry point below reads each residual element before it writes that output
  // element and writes each output element once (no partial sums over blocks of input channels
  // stored in dst first). An executor then places the output in the residual's buffer where
  // nothing reads the residual afterwards: the output's stores hit the lines the epilogue has
  // just read, instead of each missing and fetching a line from memory that it then overwrites.
  bool may_overwrite_residual() const;
  // Whether conv2d_images stacks images (kernels::stacks_images).
  bool stacks_images() const;
  // Where the layer sums its input channels in two halves (kInputHalvesMaxPixels): the first
  // input channel of the second half; 0 where it sums them in one piece.
  int64_t input_split() const;

  struct Impl;
  std::shared_ptr<const Impl> impl() const { return impl_; }

 private:
  enum class Halves { kAllowed, kNever };  // kNever: a half itself
  PackedConv(const ConvGeometry& geometry, const float* weight, const float* bias,
             double sparse_threshold, Isa isa, Halves halves);

  ConvGeometry geometry_;
  std::shared_ptr<const Impl> impl_;
};

// Throws Error(kInvalidArgument) naming `caller` and `implementation` unless output channels
// [oc_begin, oc_end) of out_c start at a multiple of `granule` and end at one or at out_c: the
// ranges a packed convolution's channel_granule() allows.
void check_channel_range(const char* caller, int64_t oc_begin, int64_t oc_end, int64_t out_c,
                         int64_t granule, const std::string& implementation);

// Computes output rows [oh_begin, oh_end) of one image. `src` must hold the input rows
// conv_input_rows() names. The epilogue's row_bias is ignored (the packed bias is used); its
// residual, when set, is read through `residual` with the output's layout. Single-threaded;
// `scratch` grows as needed and may be reused across calls.
void conv2d_rows(const PackedConv& conv, const PlaneView& src, const PlaneView& dst,
                 int64_t oh_begin, int64_t oh_end, const Epilogue& epilogue,
                 const PlaneView* residual, std::vector<float>& scratch);

// As conv2d_rows, for output channels [oc_begin, oc_end) only, so that a layer whose image has
// few rows can still be split across threads, each streaming its part of the weights. The range
// follows conv.channel_granule() (Error(kInvalidArgument) otherwise).
void conv2d_region(const PackedConv& conv, const PlaneView& src, const PlaneView& dst,
                   int64_t oh_begin, int64_t oh_end, int64_t oc_begin, int64_t oc_end,
                   const Epilogue& epilogue, const PlaneView* residual,
                   std::vector<float>& scratch);

// A layer with input halves (conv.input_split() > 0) in two steps, for callers that run the
// halves on different threads: conv2d_input_half writes the raw sums of input half `half` (0:
// channels [0, input_split()), 1: the rest; no bias, no epilogue) for output rows [oh_begin,
// oh_end) and channels [oc_begin, oc_end) into `sums`, a view like dst; add_input_halves writes
// post(pre(sums0 + sums1 + bias) + residual) over the same region into dst (which may be the
// residual's own view). conv2d_region on such a layer gives the same bits. Error(kInvalidArgument)
// for a layer without halves.
void conv2d_input_half(const PackedConv& conv, int half, const PlaneView& src,
                       const PlaneView& sums, int64_t oh_begin, int64_t oh_end, int64_t oc_begin,
                       int64_t oc_end, std::vector<float>& scratch);
void add_input_halves(const PackedConv& conv, const PlaneView& sums0, const PlaneView& sums1,
                      const PlaneView& dst, int64_t oh_begin, int64_t oh_end, int64_t oc_begin,
                      int64_t oc_end, const Epilogue& epilogue, const PlaneView* residual);

// Whole images of a batch at once, for small planes: images [0, images) of NCHW tensors (src's
// images in_c * in_h * in_w floats apart, dst's and the residual's out_c * out_h * out_w), output
// channels [oc_begin, oc_end) as conv2d_region takes them. Where conv.stacks_images(), the
// images' planes are copied one after another into scratch, channel by channel, and the
// convolution runs once over that stack as over one tall image (taps never reach into a
// neighbour image), the output copied back with the residual and the activation after it;
// otherwise image by image. Same results as conv2d_region per image, to the bit.
//
// Why: the kernels' vectors run along a plane's pixels, so a plane of 49 pixels (7x7) fills 64
// lanes of the GEMM's 32-pixel strips or the sparse kernel's 16-pixel vectors, and every image
// pays a row's fixed costs again. Standalone (one thread, Zen 5, the product alone), 16 stacked
// 7x7 images ran 1.27-1.35x faster than one call per image dense and 1.13-1.26x for 1x1 layers
// at 90% sparsity. In ResNet-50 at batch 16 (layer by layer, 2 threads, 8 images a stack, the
// copies included) its dense 7x7 layers ran 1.22-1.30x faster, the strided 1x1 one 1.08x.
void conv2d_images(const PackedConv& conv, const float* src, float* dst, int64_t images,
                   int64_t oc_begin, int64_t oc_end, const Epilogue& epilogue,
                   const float* residual, std::vector<float>& scratch);

// conv2d_images in two steps, for callers whose threads share one stack between blocks of output
// channels instead of each building its own (the layer-by-layer step at a batch of 16 7x7 images
// on many threads: ResNet-50 90%'s 2048-channel inputs are 6.4 MB a stack). The stack holds
// channel c of `images` images one after another, channel planes stacked_plane_floats(g, images)
// floats apart from a 64-byte aligned start; stack_channels fills its channels [c_begin, c_end)
// (threads may fill disjoint ranges); conv2d_stacked computes output channels [oc_begin, oc_end)
// from a whole stack, with conv2d_images' results to the bit. Only for conv.stacks_images().
int64_t stacked_plane_floats(const ConvGeometry& g, int64_t images);
void stack_channels(const ConvGeometry& g, const float* src, int64_t images, int64_t c_begin,
                    int64_t c_end, float* stack);
void conv2d_stacked(const PackedConv& conv, const float* stack, float* dst, int64_t images,
                    int64_t oc_begin, int64_t oc_end, const Epilogue& epilogue,
                    const float* residual, std::vector<float>& scratch);

}  // namespace sparsecol::kernels
