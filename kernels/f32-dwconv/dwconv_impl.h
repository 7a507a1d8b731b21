// The depthwise convolution body, compiled once per ISA by dwconv_portable.cc, dwconv_avx2.cc
// and dwconv_avx512.cc (see f32-eltwise/simd.h for why one body serves all three).
#pragma once

#include "f32-dwconv/dwconv.h"
#include "f32-dwconv/lanes_impl.h"
#include "f32-dwconv/window_impl.h"
#include "scratch.h"

namespace sparsecol::kernels {
namespace {

// window_row's operation for one channel: bias plus the sum of tap value x tap weight.
struct MultiplyAdd {
  const float* w;  // the channel's weights, one per tap
  Vec bias;
  Vec init() const { return bias; }
  Vec step(Vec a, Vec x, int64_t t) const { return fmadd(x, broadcast(w + t), a); }
};

// Output rows `pitch` apart in acc to `rows` contiguous rows of out_w at dst, through the
// epilogue (see store_mode), as whole vectors wherever they stay inside the rows: a vector that
// runs past its row writes throw-away values over the start of the next row, which that row's
// own stores then overwrite; only the region's last vector is stored in part.
template <StoreMode kMode>
inline void store_rows(const float* acc, int64_t pitch, int64_t rows, int64_t out_w,
                       const Epilogue& e, const float* res, float* dst) {
  const EpilogueStore<kMode> store_vector(e);
  const int64_t n = rows * out_w;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t x = 0; x < out_w; x += kLanes) {
      const int64_t i = r * out_w + x;  // position in the region
      store_vector(load(acc + r * pitch + x), res == nullptr ? nullptr : res + i,
                   std::min(kLanes, n - i), dst + i);
    }
  }
}

// n floats from `from` to `to` as whole vector stores, the last one zero-filled past the row: the
// flat blocks' row copy, whose rows are at least a vector of zeros apart or copied in order (what
// a store writes past the row is padding or the next row's data, copied after it).
inline void copy_row_in_vectors(const float* from, int64_t n, float* to) {
  int64_t x = 0;
  for (; x + kLanes <= n; x += kLanes) store(to + x, load(from + x));
  if (x < n) store(to + x, load_partial(from + x, n - x));
}

// Stride 1 on planes: the region's input rows of a channel lie in one flat block whose rows are
// `pitch` = in_w + max(pad_left, pad_right) floats apart, the zeros after one row's data serving
// as the right padding of that row and the left padding of the next. Output (oh, x) then sits at
// flat position q = (oh - oh_begin) * pitch + x and tap (ky, kx) reads block[q + ky * dilation_h
// * pitch + kx * dilation_w] for every output of the region alike, so the whole region is one
// long run of vectors (four accumulator chains, no per-row cost) at the price of computing
// pitch - out_w throw-away outputs per row; these are dropped when the rows are packed for the
// epilogue. (Pads wider than the kernel's reach make pitch < out_w: the end of one row and the
// start of the next then share positions, which is right because both read the same zeros.) Why not
// per row: a 14- or 7-wide row is one or two vectors, a single dependent FMA chain per vector whose
// latency the row cannot hide. Against the per-row layout it replaced, on MobileNetV2's stride-1
// shapes (bench/dwconv_bench.cc "planes", AVX2, one thread, medians of 3, two runs): 3.7x
// (960x7x7), 4.2-5.2x (14x14), 1.8x (28x28 to 112x112).
inline void dwconv2d_flat(const ConvGeometry& g, const float* weight, const float* bias,
                          const PlaneView& src, const PlaneView& dst, int64_t oh_begin,
                          int64_t oh_end, const Epilogue& epilogue, const PlaneView* residual,
                          std::vector<float>& scratch) {
  const int64_t reach_w = (g.kernel_w - 1) * g.dilation_w,
                reach_h = (g.kernel_h - 1) * g.dilation_h;
  const int64_t pad_right = std::max<int64_t>(0, g.out_w + reach_w - g.in_w - g.pad_left);
  const int64_t pitch = g.in_w + std::max(g.pad_left, pad_right);
  const int64_t out_rows = oh_end - oh_begin;
  const int64_t v0 = oh_begin - g.pad_top;  // input row of block row 0
  const int64_t block_rows = out_rows + reach_h;
  PaddedBlock b;
  // Whole groups of window_row's four vectors: its one-vector tail is a single FMA chain.
  b.out_w_padded = round_up((out_rows - 1) * pitch + g.out_w, 4 * kLanes);
  for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
    for (int64_t kx = 0; kx < g.kernel_w; ++kx)
      b.taps.push_back(ky * g.dilation_h * pitch + kx * g.dilation_w);
  }
  // Past the last row: the reads of the last vector of outputs, and a vector of slack for the
  // whole-vector stores that copy a row in.
  const int64_t block_len =
      std::max(block_rows * pitch, b.out_w_padded + reach_h * pitch + reach_w) + kLanes;
  // acc: a vector of slack too, for store_rows' whole-vector reads of the last row.
  scratch.assign(static_cast<std::size_t>(block_len + b.out_w_padded + kLanes), 0.0f);
  float* block = scratch.data();  // zeroed once: only the rows' data positions change
  float* acc = block + block_len;
  const StoreMode mode = store_mode(epilogue, residual);
  const int64_t row_first = std::max<int64_t>(v0, 0), row_last = std::min(v0 + block_rows, g.in_h);
  const int64_t taps = g.kernel_h * g.kernel_w;

  for (int64_t c = 0; c < g.in_c; ++c) {
    const float* plane = src.data + c * src.plane_stride;
    for (int64_t v = row_first; v < row_last; ++v) {
      const float* from = plane + (v - src.row0) * g.in_w;
      float* to = block + (v - v0) * pitch + g.pad_left;
      copy_row_in_vectors(from, g.in_w, to);
    }
    const MultiplyAdd op{weight + c * taps, splat(bias != nullptr ? bias[c] : 0.0f)};
    window_row(b, block, acc, op);
    const float* res = residual == nullptr ? nullptr
                                           : residual->data + c * residual->plane_stride +
                                                 (oh_begin - residual->row0) * g.out_w;
    float* out = dst.data + c * dst.plane_stride + (oh_begin - dst.row0) * g.out_w;
    with_store_mode(mode, [&](auto m) {
      store_rows<decltype(m)::value>(acc, pitch, out_rows, g.out_w, epilogue, res, out);
    });
  }
}

// Whether dwconv3x3_flat serves geometry g: 3x3, undilated, one row and one column of padding
// before the image, rows at least half a vector wide (narrower planes would waste most of every
// vector on the padding). Stride 1 needs a column of padding after each row too (out_w == in_w);
// stride 2 as many outputs as even columns ((in_w + 1) / 2: MobileNetV2's downsampling layers).
inline bool flat3x3_supported(const ConvGeometry& g) {
  const bool s1 = g.stride_h == 1 && g.stride_w == 1 && g.out_w == g.in_w;
  const bool s2 = g.stride_h == 2 && g.stride_w == 2 && g.out_w == (g.in_w + 1) / 2;
  return g.kernel_h == 3 && g.kernel_w == 3 && (s1 || s2) && g.dilation_h == 1 &&
         g.dilation_w == 1 && g.pad_top == 1 && g.pad_left == 1 && 2 * g.out_w >= kLanes;
}

// Output vectors per step of the flat 3x3 kernels: four FMA chains hide the latency.
constexpr int64_t kFlatGroup = 4;
// A chunk's copied input rows stay in L1: chunks of output rows whose copies take at most this.
constexpr int64_t kFlatBlockBytes = 16 * 1024;

// Stride 1 (dwconv3x3_flat): a chunk's input rows are copied into a zeroed block, `pitch` =
// in_w + 1 rounded up to whole vectors apart, every row starting on a cache line (the zeros after
// a row's data are its right padding and the next row's left padding). Output (oh, x) sits at
// flat position q = (oh - r0) * pitch + x and reads, per tap row ky, the three vectors at
// q + ky * pitch - kLanes, q + ky * pitch, q + ky * pitch + kLanes: the middle one is tap kx = 1
// as loaded, taps 0 and 2 are it shifted by one lane from its neighbours (one valignd each).
// Consecutive output vectors share those loads, so a vector of outputs costs 9 FMAs, 6 lane
// shifts and 3 aligned loads.
struct FlatStride1 {
  int64_t pitch, chunk, lead = kLanes, block_floats;

  FlatStride1(const ConvGeometry& g, int64_t out_rows) : pitch(round_up(g.in_w + 1, kLanes)) {
    chunk = std::clamp<int64_t>(kFlatBlockBytes / static_cast<int64_t>(sizeof(float)) / pitch - 2,
                                1, out_rows);
    // A vector of zeros before block row 0 (its left padding); after the rows, what the last
    // group's reads reach: two tap rows and a vector past it.
    const int64_t outputs = round_up(chunk * pitch, kFlatGroup * kLanes);
    block_floats = lead + std::max((chunk + 2) * pitch, outputs + 2 * pitch + kLanes);
  }

  // Input rows r0 - 1 .. r0 + rows of one channel's plane into the block.
  void fill(const ConvGeometry& g, const PlaneView& src, const float* plane, int64_t r0,
            int64_t rows, float* block) const {
    for (int64_t r = 0; r < rows + 2; ++r) {
      float* to = block + lead + r * pitch;
      const int64_t v = r0 - 1 + r;
      if (v < 0 || v >= g.in_h) {
        std::fill_n(to, g.in_w, 0.0f);
        continue;
      }
      copy_row_in_vectors(plane + (v - src.row0) * g.in_w, g.in_w, to);
    }
  }

  void add_taps(const float* block, int64_t q, const Vec (&w)[9], Vec (&a)[kFlatGroup]) const {
    for (int ky = 0; ky < 3; ++ky) {
      const float* p = block + lead + ky * pitch + q;
      Vec prev = load(p - kLanes), cur = load(p);
      for (int i = 0; i < kFlatGroup; ++i) {
        const Vec next = load(p + (i + 1) * kLanes);
        a[i] = fmadd(shift_lanes<kLanes - 1>(prev, cur), w[3 * ky], a[i]);
        a[i] = fmadd(cur, w[3 * ky + 1], a[i]);
        a[i] = fmadd(shift_lanes<1>(cur, next), w[3 * ky + 2], a[i]);
        prev = cur;
        cur = next;
      }
    }
  }
};

// The even and odd columns of a row of n floats into even[0, ...) and odd[0, ...), whole vectors
// with zeros past the row's data: two loads (the last ones masked) and two vpermt2ps per 2 *
// kLanes columns. The sparse convolutions' split_column_phases (f32-eltwise) does the same with a
// column shift and a window test per vector; called here a row at a time, with a fast path for
// vectors inside the row, it ran MobileNetV2's stride-2 layers 1.04-1.18x slower (Zen 4, one
// thread, three alternated rounds).
inline void split_row_phases(const float* in, int64_t n, float* even, float* odd) {
  int64_t x = 0;
  for (; 2 * x + 2 * kLanes <= n; x += kLanes) {
    const Vec a = load(in + 2 * x), b = load(in + 2 * x + kLanes);
    store(even + x, even_lanes(a, b));
    store(odd + x, odd_lanes(a, b));
  }
  const int64_t left = n - 2 * x;
  if (left > 0) {
    const Vec a = left >= kLanes ? load(in + 2 * x) : load_partial(in + 2 * x, left);
    const Vec b = left > kLanes ? load_partial(in + 2 * x + kLanes, left - kLanes) : splat(0.0f);
    store(even + x, even_lanes(a, b));
    store(odd + x, odd_lanes(a, b));
  }
}

// Stride 2 (dwconv3x3_flat): a chunk's input rows are split by row and column phase into four
// planes of `pitch` = out_w + 1 rounded up to whole vectors a row (split_row_phases). Output row
// r0 + i reads input rows 2 (r0 + i) - 1, 2 (r0 + i) and 2 (r0 + i) + 1: rows i and i + 1 of the
// odd-row planes and row i of the even-row ones, so output (oh, x) sits at flat position
// q = (oh - r0) * pitch + x in all of them, as at stride 1. Of a row's two column phases, the
// even one holds columns 2x (tap kx = 1) and the odd one columns 2x + 1 (tap 2); tap 0, column
// 2x - 1, is the odd one shifted by one lane from its previous vector (the zeros before a plane
// and past every row's data are the left padding). A vector of outputs costs 9 FMAs, 3 lane
// shifts and 6 aligned loads, plus its share of the split: two vpermt2ps per input row vector.
struct FlatStride2 {
  int64_t pitch, chunk, lead = kLanes, plane_floats, block_floats;

  FlatStride2(const ConvGeometry& g, int64_t out_rows) : pitch(round_up(g.out_w + 1, kLanes)) {
    chunk = std::clamp<int64_t>(
        kFlatBlockBytes / static_cast<int64_t>(sizeof(float)) / (4 * pitch) - 1, 1, out_rows);
    // A vector of zeros, then the odd-row planes' rows 0 .. chunk, and what the last group's
    // reads of row i + 1 reach.
    const int64_t outputs = round_up(chunk * pitch, kFlatGroup * kLanes);
    plane_floats = round_up_to_line(lead + std::max((chunk + 1) * pitch, outputs + pitch));
    block_floats = 4 * plane_floats;
  }

  // Where row 0 of plane (row phase, column phase) starts in the block: row phase 0 holds the
  // odd input rows (2 r0 - 1, 2 r0 + 1, ...), row phase 1 the even ones (2 r0, ...).
  int64_t plane(int row_phase, int column_phase) const {
    return (2 * row_phase + column_phase) * plane_floats + lead;
  }

  // Input rows 2 r0 - 1 .. 2 (r0 + rows) - 1 in order (one stream for the prefetchers).
  void fill(const ConvGeometry& g, const PlaneView& src, const float* plane_data, int64_t r0,
            int64_t rows, float* block) const {
    for (int64_t j = 0; j <= 2 * rows; ++j) {
      const int64_t v = 2 * r0 - 1 + j;
      const int row_phase = static_cast<int>(j % 2);
      float* even = block + plane(row_phase, 0) + j / 2 * pitch;
      float* odd = block + plane(row_phase, 1) + j / 2 * pitch;
      if (v < 0 || v >= g.in_h) {
        std::fill_n(even, pitch, 0.0f);
        std::fill_n(odd, pitch, 0.0f);
        continue;
      }
      split_row_phases(plane_data + (v - src.row0) * g.in_w, g.in_w, even, odd);
    }
  }

  void add_taps(const float* block, int64_t q, const Vec (&w)[9], Vec (&a)[kFlatGroup]) const {
    for (int ky = 0; ky < 3; ++ky) {
      const int row_phase = ky == 1 ? 1 : 0;
      const int64_t row = ky == 2 ? pitch : 0;
      const float* even = block + plane(row_phase, 0) + row + q;
      const float* odd = block + plane(row_phase, 1) + row + q;
      Vec prev = load(odd - kLanes);
      for (int i = 0; i < kFlatGroup; ++i) {
        const Vec cur = load(odd + i * kLanes);
        a[i] = fmadd(shift_lanes<kLanes - 1>(prev, cur), w[3 * ky], a[i]);
        a[i] = fmadd(load(even + i * kLanes), w[3 * ky + 1], a[i]);
        a[i] = fmadd(cur, w[3 * ky + 2], a[i]);
        prev = cur;
      }
    }
  }
};

// 3x3 stride 1 or 2 on planes with no transposes and no unaligned taps (MobileNetV2's layers
// whose rows are at least half a vector wide): per channel, chunks of output rows whose input
// rows `Layout` (FlatStride1, FlatStride2) copies into an L1 block where every tap of output
// (oh, x) lies at the same flat position q = (oh - r0) * pitch + x of its plane and tap row; the
// positions run in groups of kFlatGroup vectors, each from the bias through the taps in order
// (as the channel-lane kernel sums them: both give the same bits), and its vectors inside the
// output rows go through the epilogue on the register (no accumulator buffer). Against the
// channel-lane kernel, whose two 16x16 transposes per vector were over half its time
// (bench/dwconv_bench.cc, Zen 5, one thread): see dwconv.h.
template <typename Layout>
inline void dwconv3x3_flat(const ConvGeometry& g, const float* weight, const float* bias,
                           const PlaneView& src, const PlaneView& dst, int64_t oh_begin,
                           int64_t oh_end, const Epilogue& epilogue, const PlaneView* residual,
                           std::vector<float>& scratch) {
  const Layout layout(g, oh_end - oh_begin);
  float* block = aligned_scratch(scratch, layout.block_floats);
  // Zeroed once: the copies rewrite only the rows' data positions (whole vectors, zeros past
  // the row), which keeps every padding column zero.
  std::fill_n(block, layout.block_floats, 0.0f);
  const StoreMode mode = store_mode(epilogue, residual);
  const int64_t pitch = layout.pitch;

  for (int64_t c = 0; c < g.in_c; ++c) {
    const float* plane = src.data + c * src.plane_stride;
    Vec w[9];
    for (int t = 0; t < 9; ++t) w[t] = broadcast(weight + c * 9 + t);
    const Vec b = splat(bias != nullptr ? bias[c] : 0.0f);
    for (int64_t r0 = oh_begin; r0 < oh_end; r0 += layout.chunk) {
      const int64_t rows = std::min(layout.chunk, oh_end - r0);
      layout.fill(g, src, plane, r0, rows, block);
      const float* res = residual == nullptr ? nullptr
                                             : residual->data + c * residual->plane_stride +
                                                   (r0 - residual->row0) * g.out_w;
      float* out = dst.data + c * dst.plane_stride + (r0 - dst.row0) * g.out_w;
      const int64_t positions = rows * pitch;
      with_store_mode(mode, [&](auto m) {
        const EpilogueStore<decltype(m)::value> store_vector(epilogue);
        int64_t row = 0, x = 0;  // of flat position q (pitch is a whole number of vectors)
        for (int64_t q = 0; q < positions; q += kFlatGroup * kLanes) {
          Vec a[kFlatGroup];
          for (int i = 0; i < kFlatGroup; ++i) a[i] = b;
          layout.add_taps(block, q, w, a);
          for (int i = 0; i < kFlatGroup; ++i, x += kLanes) {
            if (x == pitch) x = 0, ++row;
            if (row >= rows || x >= g.out_w) continue;  // padding columns, rows past the chunk
            const int64_t o = row * g.out_w + x;
            store_vector(a[i], res == nullptr ? nullptr : res + o, std::min(kLanes, g.out_w - x),
                         out + o);
          }
        }
      });
    }
  }
}

// The per-plane kernel (DwconvMethod::kPlanes): see dwconv.h.
inline void dwconv2d_planes(const ConvGeometry& g, const float* weight, const float* bias,
                            const PlaneView& src, const PlaneView& dst, int64_t oh_begin,
                            int64_t oh_end, const Epilogue& epilogue, const PlaneView* residual,
                            std::vector<float>& scratch) {
  if (flat3x3_supported(g)) {
    if (g.stride_w == 1) {
      dwconv3x3_flat<FlatStride1>(g, weight, bias, src, dst, oh_begin, oh_end, epilogue, residual,
                                  scratch);
    } else {
      dwconv3x3_flat<FlatStride2>(g, weight, bias, src, dst, oh_begin, oh_end, epilogue, residual,
                                  scratch);
    }
    return;
  }
  if (g.stride_h == 1 && g.stride_w == 1) {
    dwconv2d_flat(g, weight, bias, src, dst, oh_begin, oh_end, epilogue, residual, scratch);
    return;
  }
  const WindowGeometry wg{g.in_h,     g.in_w,    g.out_w,    g.kernel_h,   g.kernel_w,  g.stride_h,
                          g.stride_w, g.pad_top, g.pad_left, g.dilation_h, g.dilation_w};
  const PaddedBlock b = plan_block(wg, oh_begin, oh_end);
  scratch.resize(
      static_cast<std::size_t>(b.rows * b.row_len + b.out_w_padded + fill_scratch_size(b)));
  float* block = scratch.data();
  float* acc = block + b.rows * b.row_len;
  float* padded = acc + b.out_w_padded;
  const int64_t taps = g.kernel_h * g.kernel_w;

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
  // kAuto: the channel-lane kernel wherever it applies and its transposes are tuned (AVX2,
  // AVX-512): 2.4-4.5x the per-plane kernel on MobileNetV2's layers on Zen 3, 1.2-6.3x on Zen 5
  // (bench/dwconv_bench.cc, dwconv.h).
  // Output rows at least a vector wide go to the flat kernel instead, where it applies and pays:
  // no transposes. On AVX-512, stride 1: 1.06-1.18x the channel lanes on MobileNetV2's 28- to
  // 112-wide layers (Zen 5); stride 2: 1.12x on its 56-wide output, about even on its 28-wide
  // one (Zen 4, one thread, medians of six alternated rounds: 164 against 184 us, 68.5 against
  // 69.9 us). On AVX2 only stride-1 rows under two vectors wide (MobileNetV2's 14x14 layers):
  // the lanes ran its 28- to 112-wide stride-1 layers 1.2-1.8x faster than flat (Zen 3, one
  // thread, one image; 1.1-1.3x per layer in the model at batch 16), but its 14-wide ones
  // 1.2-1.9x slower from L3 (16 images in turn, and layer by layer in the model at batch 16);
  // AVX2's even/odd split crosses the 128-bit halves, and its stride-2 flat kernel ran 1.3-1.4x
  // slower than the lanes.
  const bool flat = flat3x3_supported(g) && g.out_w >= kLanes &&
                    (kLanes == 16 || (g.stride_w == 1 && g.out_w < 2 * kLanes));
  const bool lanes = method == DwconvMethod::kChannelLanes ||
                     (method == DwconvMethod::kAuto && kTransposeTuned && !flat);
  const WindowGeometry wg{g.in_h,     g.in_w,    g.out_w,    g.kernel_h,   g.kernel_w,  g.stride_h,
                          g.stride_w, g.pad_top, g.pad_left, g.dilation_h, g.dilation_w};
  const int64_t lanes_c = lanes && lanes_supported(wg, g.in_c) ? g.in_c / kLanes * kLanes : 0;
  if (lanes_c > 0) {
    window3x3_lanes(
        wg, lanes_c, 0.0f, [&](int64_t c0) { return lane_taps(weight, bias, c0); }, src, dst,
        oh_begin, oh_end, epilogue, residual, scratch);
  }
  if (lanes_c == g.in_c) return;
  // The remaining channels, through the per-plane kernel on views shifted by lanes_c channels.
  ConvGeometry rest = g;
  rest.in_c = rest.out_c = rest.groups = g.in_c - lanes_c;
  const PlaneView res_rest = residual != nullptr ? from_channel(*residual, lanes_c) : PlaneView{};
  dwconv2d_planes(rest, weight + lanes_c * g.kernel_h * g.kernel_w,
                  bias == nullptr ? nullptr : bias + lanes_c, from_channel(src, lanes_c),
                  from_channel(dst, lanes_c), oh_begin, oh_end, epilogue,
                  residual == nullptr ? nullptr : &res_rest, scratch);
}

}  // namespace
}  // namespace sparsecol::kernels
