// The channel-lane 3x3 window kernel: the depthwise convolution's DwconvMethod::kChannelLanes
// (see dwconv.h) and the 3x3 max pooling (f32-pool/pool_impl.h). kLanes channels per vector
// instead of kLanes pixels of one plane. Include only from .cc files (see f32-eltwise/simd.h).
//
// Why: on NCHW planes a vector holds pixels of one channel, so a 7x7 or 14x14 plane wastes lanes
// (7 of 8, 14 of 16) and pays a fixed cost per channel and row (a padded copy of every input row,
// an accumulator round trip, an epilogue pass) that its few pixels cannot amortize: the
// per-plane kernel ran MobileNetV2's 960x7x7 layer at ~4 ns per output on Zen 3, its 112x112
// stride-2 layer at ~3.4 ns. With channels in the lanes every tap is one full vector at any
// width, stride 2 is just an address step, the 9 weights and the bias stay in registers for a
// whole block of channels, and the epilogue runs on registers. The price is a transpose of each
// input row on the way in and of each output row on the way out (kLanes x kLanes register
// blocks). Against the per-plane kernel on all ten depthwise shapes of MobileNetV2
// (bench/dwconv_bench.cc, Zen 3, one thread, thread CPU time, medians of 5 in one run on a loaded
// machine): 2.4x (32x112x112), 2.6x (144x56x56 stride 2), 3.0-3.1x (96x112x112 stride 2,
// 144x56x56, 192x28x28), 3.7-4.5x (192x28x28 stride 2 and every 14x14 and 7x7 layer).
//
// Per block of kLanes channels, output row by output row: the 3 input rows an output row reads
// live transposed ([column][lane], padded columns and rows) in a ring of 3 rows, so each
// input row is transposed once (stride 1: one new row per output row, stride 2: two); an output
// row is computed into a [column][lane] buffer, then transposed back into the kLanes planes.
// Accumulation order per output (bias, then taps ky-major, x * w + acc) is the per-plane
// kernel's, so both give bit-identical results.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "f32-conv/conv.h"
#include "f32-dwconv/window_impl.h"
#include "f32-eltwise/simd.h"
#include "scratch.h"

namespace sparsecol::kernels {
namespace {

// Whether transpose() below is a shuffle network (AVX2, AVX-512) rather than element moves:
// DwconvMethod::kAuto takes the channel-lane kernel only then.
#if defined(__AVX2__)
constexpr bool kTransposeTuned = true;
#else
constexpr bool kTransposeTuned = false;
#endif

// r[i][j] <-> r[j][i] for a kLanes x kLanes block.
#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__)
// GCC 12 warns that the AVX-512 shuffles' undefined pass-through operand "may be used
// uninitialized" (its intrinsics initialise it from itself), or at -O1 (the sanitizer builds)
// that it "is used uninitialized"; every lane is written.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
inline void transpose(Vec* r) {
#if defined(__AVX2__) && !defined(__AVX512F__)
  // The 24-shuffle 8x8 transpose: 32-bit interleave, 64-bit interleave, 128-bit halves.
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
#elif defined(__AVX512F__)
  // The 64-shuffle 16x16 transpose. After the 32- and 64-bit interleaves within 128-bit lanes,
  // u[4g + j] holds, in its 128-bit lane L, column 4L + j of rows 4g..4g+3; two rounds of 128-bit
  // lane shuffles then gather column x's four lanes (one per group of rows) into r[x].
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int j = 0; j < 4; ++j) {
    // 0x88 takes 128-bit lanes 0 and 2 of each operand, 0xDD lanes 1 and 3.
    const __m512 v0 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x88);  // cols j, 8+j of groups 0, 1
    const __m512 v1 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xDD);  // cols 4+j, 12+j
    const __m512 v2 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x88);  // groups 2, 3
    const __m512 v3 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xDD);
    r[j] = _mm512_shuffle_f32x4(v0, v2, 0x88);
    r[8 + j] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
    r[4 + j] = _mm512_shuffle_f32x4(v1, v3, 0x88);
    r[12 + j] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
  }
#else
  // Element moves: correct at any lane count, for the tests of the portable path.
  float t[kLanes * kLanes];
  for (int i = 0; i < kLanes; ++i) {
    for (int j = 0; j < kLanes; ++j) t[j * kLanes + i] = r[i][j];
  }
  for (int i = 0; i < kLanes; ++i) r[i] = load(t + i * kLanes);
#endif
}
#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// Whether the channel-lane kernel serves a window of geometry g over `channels` channels
// (MobileNetV2's depthwise layers, ResNet-50's max pooling).
inline bool lanes_supported(const WindowGeometry& g, int64_t channels) {
  return g.kernel_h == 3 && g.kernel_w == 3 && g.dilation_h == 1 && g.dilation_w == 1 &&
         g.stride_h == g.stride_w && (g.stride_w == 1 || g.stride_w == 2) && g.pad_left <= 2 &&
         channels >= kLanes;
}

// What a window computes over its taps, one channel block at a time (the per-plane engine's Op,
// window_impl.h): the depthwise convolution, bias + sum of x * w over the taps, with the block's
// 9 weights and bias held in registers...
struct LaneTaps {
  Vec w[9], bias;
  Vec init() const { return bias; }
  Vec step(Vec a, Vec x, int64_t t) const { return fmadd(x, w[t], a); }
};
// ... and max pooling.
struct LaneMax {
  Vec init() const { return splat(-std::numeric_limits<float>::infinity()); }
  Vec step(Vec a, Vec x, int64_t) const { return vmax(a, x); }
};

// One output row of one channel block: out[ox] = the fold of op over the taps, taps ky-major,
// for ox < out_w, `rows` the 3 transposed input rows it reads. Four outputs at a time: four
// independent chains hide the FMA latency while the op's constants stay in registers (the
// epilogue runs after the transpose back, which keeps its constants out of this loop's
// registers).
template <int64_t S, typename Op>
inline void lanes_row(const float* const* rows, const Op& op, int64_t out_w, float* out) {
  int64_t ox = 0;
  for (; ox + 4 <= out_w; ox += 4) {
    Vec a0 = op.init(), a1 = a0, a2 = a0, a3 = a0;
    for (int ky = 0; ky < 3; ++ky) {
      for (int kx = 0; kx < 3; ++kx) {
        const float* p = rows[ky] + (ox * S + kx) * kLanes;
        const int64_t t = ky * 3 + kx;
        a0 = op.step(a0, load(p), t);
        a1 = op.step(a1, load(p + S * kLanes), t);
        a2 = op.step(a2, load(p + 2 * S * kLanes), t);
        a3 = op.step(a3, load(p + 3 * S * kLanes), t);
      }
    }
    store(out + ox * kLanes, a0);
    store(out + (ox + 1) * kLanes, a1);
    store(out + (ox + 2) * kLanes, a2);
    store(out + (ox + 3) * kLanes, a3);
  }
  for (; ox < out_w; ++ox) {
    Vec a = op.init();
    for (int ky = 0; ky < 3; ++ky) {
      for (int kx = 0; kx < 3; ++kx)
        a = op.step(a, load(rows[ky] + (ox * S + kx) * kLanes), ky * 3 + kx);
    }
    store(out + ox * kLanes, a);
  }
}

// How store_back applies the epilogue: not at all, as one clamp (Relu, Clip: MobileNetV2's
// Relu6), or through the generic activation switch (a residual, two activations, Gelu).
enum class StoreMode { kPlain, kClamp, kGeneric };

// Without a residual the two activations run one after the other, so where only one is set it is
// the whole epilogue, in either slot. The executors fuse a Conv's Relu or Clip into the first
// (pre_residual) when no Add comes before it, so that is where MobileNetV2's depthwise layers
// carry their Relu6: through the generic switch they ran 1.2-1.4x slower than as one clamp
// (bench/dwconv_bench.cc's shapes, one thread, Intel Emerald Rapids; docs/BENCHMARKS.md, the
// forty-ninth session).
inline Activation sole_activation(const Epilogue& e) {
  return e.pre_residual != Activation::kNone ? e.pre_residual : e.post_residual;
}

inline StoreMode store_mode(const Epilogue& e, const PlaneView* residual) {
  if (residual != nullptr ||
      (e.pre_residual != Activation::kNone && e.post_residual != Activation::kNone)) {
    return StoreMode::kGeneric;
  }
  switch (sole_activation(e)) {
    case Activation::kNone:
      return StoreMode::kPlain;
    case Activation::kRelu:
    case Activation::kClip:
      return StoreMode::kClamp;
    default:
      return StoreMode::kGeneric;
  }
}

// Calls store(std::integral_constant<StoreMode, mode>{}), so that one switch turns the mode into
// the template argument of a storer.
template <typename Store>
inline void with_store_mode(StoreMode mode, const Store& store) {
  switch (mode) {
    case StoreMode::kPlain:
      return store(std::integral_constant<StoreMode, StoreMode::kPlain>{});
    case StoreMode::kClamp:
      return store(std::integral_constant<StoreMode, StoreMode::kClamp>{});
    case StoreMode::kGeneric:
      return store(std::integral_constant<StoreMode, StoreMode::kGeneric>{});
  }
}

// Stores one vector of `count` outputs (whole vectors as one store, others as store_partial)
// through the epilogue in mode kMode: the per-vector half of both depthwise storers (store_back
// below, store_rows in dwconv_impl.h). `res` points at the vector's residual values (nullptr:
// none).
template <StoreMode kMode>
struct EpilogueStore {
  const Epilogue& e;
  Vec lo, hi;  // kClamp's bounds: Relu as [0, +inf), Clip as [clip_min, clip_max]

  explicit EpilogueStore(const Epilogue& epilogue)
      : e(epilogue),
        lo(splat(sole_activation(e) == Activation::kRelu ? 0.0f : e.clip_min)),
        hi(splat(sole_activation(e) == Activation::kRelu ? std::numeric_limits<float>::infinity()
                                                         : e.clip_max)) {}

  void operator()(Vec v, const float* res, int64_t count, float* dst) const {
    if constexpr (kMode == StoreMode::kClamp) {
      v = vmin(vmax(v, lo), hi);
    } else if constexpr (kMode == StoreMode::kGeneric) {
      v = vactivation(e.pre_residual, v, e.clip_min, e.clip_max);
      if (res != nullptr) v += count == kLanes ? load(res) : load_partial(res, count);
      v = vactivation(e.post_residual, v, e.clip_min, e.clip_max);
    }
    if (count == kLanes) {
      store(dst, v);
    } else {
      store_partial(dst, v, count);
    }
  }
};

// Transposes one output row of a channel block ([column][lane], out_w columns) back into the
// kLanes planes at d (d_stride apart), applying post(residual + pre(acc)) on the way; `res`
// (res_stride apart) is nullptr without a residual. The store is the kernel's costliest stage
// (with the generic activation switch per vector, leaving it out made the 144x56x56 layer ~3x
// faster), so the common epilogues skip that switch: kClamp is vmax then vmin, the very
// operations vactivation runs for Relu (max with 0, min with +inf changes nothing) and Clip.
// Measured 1.1-1.8x on the whole kernel over the switch per vector (two runs, not interleaved).
template <StoreMode kMode>
inline void store_back(const float* out, int64_t out_w, const Epilogue& e, const float* res,
                       int64_t res_stride, float* d, int64_t d_stride) {
  const EpilogueStore<kMode> store_vector(e);
  for (int64_t x0 = 0; x0 < out_w; x0 += kLanes) {
    const int64_t count = std::min(kLanes, out_w - x0);
    Vec r[kLanes];
    for (int k = 0; k < kLanes; ++k) r[k] = load(out + (x0 + k) * kLanes);
    transpose(r);
    for (int i = 0; i < kLanes; ++i) {
      store_vector(r[i], res == nullptr ? nullptr : res + i * res_stride + x0, count,
                   d + i * d_stride + x0);
    }
  }
}

// Channels [0, c_end) (a multiple of kLanes) of output rows [oh_begin, oh_end) of a 3x3 window
// (lanes_supported); see the top of this file. make_op(c0) gives the Op of the block from channel
// c0 (LaneTaps, LaneMax); positions in the padding read `pad`; the store applies the epilogue
// and `residual` (nullptr: none) as dwconv2d_rows does.
template <typename MakeOp>
inline void window3x3_lanes(const WindowGeometry& g, int64_t c_end, float pad,
                            const MakeOp& make_op, const PlaneView& src, const PlaneView& dst,
                            int64_t oh_begin, int64_t oh_end, const Epilogue& e,
                            const PlaneView* residual, std::vector<float>& scratch) {
  const int64_t s = g.stride_w;
  const int64_t padded_w = (g.out_w - 1) * s + 3;  // padded columns the outputs read
  const int64_t cols = std::clamp(padded_w - g.pad_left, int64_t{0}, g.in_w);  // input columns read
  const int64_t row_floats = padded_w * kLanes;
  const int64_t out_blocks = (g.out_w + kLanes - 1) / kLanes;
  // The padding columns keep `pad` for the whole call. Line-aligned: every tap and every
  // transposed row is a whole-line vector access (the kernel is bound by those loads).
  const int64_t scratch_floats = 3 * row_floats + out_blocks * kLanes * kLanes;
  float* ring = aligned_scratch(scratch, scratch_floats);
  std::fill_n(ring, scratch_floats, pad);
  float* out = ring + 3 * row_floats;
  const StoreMode mode = store_mode(e, residual);
  auto slot = [&](int64_t v) { return ring + (v % 3 + 3) % 3 * row_floats; };

  for (int64_t c0 = 0; c0 < c_end; c0 += kLanes) {
    const auto op = make_op(c0);
    // Transposes input row v of the block into its ring slot (`pad` outside the image).
    auto fill = [&](int64_t v) {
      float* row = slot(v) + g.pad_left * kLanes;
      if (v < 0 || v >= g.in_h) {
        std::fill_n(row, cols * kLanes, pad);
        return;
      }
      const float* plane = src.data + c0 * src.plane_stride + (v - src.row0) * g.in_w;
      for (int64_t x0 = 0; x0 < cols; x0 += kLanes) {
        const int64_t count = std::min(kLanes, cols - x0);
        Vec r[kLanes];
        for (int i = 0; i < kLanes; ++i) {
          const float* p = plane + i * src.plane_stride + x0;
          r[i] = count == kLanes ? load(p) : load_partial(p, count);
        }
        transpose(r);
        for (int64_t k = 0; k < count; ++k) store(row + (x0 + k) * kLanes, r[k]);
      }
    };

    int64_t next = oh_begin * s - g.pad_top;  // input rows below `next` are in the ring
    for (int64_t oh = oh_begin; oh < oh_end; ++oh) {
      const int64_t v0 = oh * s - g.pad_top;
      for (; next < v0 + 3; ++next) fill(next);
      const float* rows[3] = {slot(v0), slot(v0 + 1), slot(v0 + 2)};
      if (s == 1) {
        lanes_row<1>(rows, op, g.out_w, out);
      } else {
        lanes_row<2>(rows, op, g.out_w, out);
      }
      const float* res = residual == nullptr ? nullptr
                                             : residual->data + c0 * residual->plane_stride +
                                                   (oh - residual->row0) * g.out_w;
      float* d = dst.data + c0 * dst.plane_stride + (oh - dst.row0) * g.out_w;
      const int64_t res_stride = residual == nullptr ? 0 : residual->plane_stride;
      with_store_mode(mode, [&](auto m) {
        store_back<decltype(m)::value>(out, g.out_w, e, res, res_stride, d, dst.plane_stride);
      });
    }
  }
}

// The depthwise convolution's block op: channels [c0, c0 + kLanes) of the [C x 9] weights and
// the bias (nullptr: zero), as vectors (built through memory: element inserts into generic
// vectors draw GCC 12's spurious maybe-uninitialized warnings).
inline LaneTaps lane_taps(const float* weight, const float* bias, int64_t c0) {
  LaneTaps op;
  float lane[kLanes];
  for (int t = 0; t < 9; ++t) {
    for (int i = 0; i < kLanes; ++i) lane[i] = weight[(c0 + i) * 9 + t];
    op.w[t] = load(lane);
  }
  for (int i = 0; i < kLanes; ++i) lane[i] = bias != nullptr ? bias[c0 + i] : 0.0f;
  op.bias = load(lane);
  return op;
}

}  // namespace
}  // namespace sparsecol::kernels
