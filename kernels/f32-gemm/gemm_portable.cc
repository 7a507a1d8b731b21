// The portable micro-kernel: plain C++ that GCC vectorizes for the x86-64-v2 baseline (SSE4.2,
// 16 xmm registers, no FMA). A 4 x 8 tile keeps 8 xmm accumulators, 2 B vectors and a broadcast
// in registers; the accumulator array is fully unrolled so it never touches memory.
#include <cstdint>

#include "f32-gemm/ukernels.h"

namespace sparsecol::kernels {
namespace {

inline float activate(Activation act, float x, float clip_min, float clip_max) {
  switch (act) {
    case Activation::kNone:
      return x;
    case Activation::kRelu:
      return x > 0.0f ? x : 0.0f;
    case Activation::kClip:
      return x < clip_min ? clip_min : (x > clip_max ? clip_max : x);
    case Activation::kGelu:
      return 0.5f * x * (1.0f + erf_rational(x * 0.70710678118654752f));
  }
  return x;
}

template <int kMr, int kNr>
void ukernel_portable(const GemmUkernelArgs& args) {
  float acc[kMr][kNr] = {};
  const float* a = args.a;
  const float* b = args.b;
  if (args.taps > 0) {  // a convolution's taps: read only the columns each tap's mask names
    const int64_t depth = args.k / args.taps;
    for (int64_t t = 0; t < args.taps; ++t) {
      const uint64_t bits = args.tap_masks[t];
      const float* row = b + args.tap_offset[t];
      for (int64_t p = 0; p < depth; ++p, a += kMr, row += args.ldb) {
        for (int j = 0; j < args.n; ++j) {
          if ((bits >> j & 1) == 0) continue;
          for (int i = 0; i < kMr; ++i) acc[i][j] += a[i] * row[j];
        }
      }
    }
  } else if (args.b_row_offsets != nullptr) {  // an indirect B: row p at b + b_row_offsets[p]
    for (int64_t p = 0; p < args.k; ++p, a += kMr) {
      const float* row = b + args.b_row_offsets[p];
      for (int i = 0; i < kMr; ++i) {
        for (int j = 0; j < args.n; ++j) acc[i][j] += a[i] * row[j];
      }
    }
  } else if (args.n == kNr) {
    for (int64_t p = 0; p < args.k; ++p, a += kMr, b += args.ldb) {
#pragma GCC unroll 16
      for (int i = 0; i < kMr; ++i) {
#pragma GCC unroll 16
        for (int j = 0; j < kNr; ++j) acc[i][j] += a[i] * b[j];
      }
    }
  } else {  // a column tail: never read B past n
    for (int64_t p = 0; p < args.k; ++p, a += kMr, b += args.ldb) {
      for (int i = 0; i < kMr; ++i) {
        for (int j = 0; j < args.n; ++j) acc[i][j] += a[i] * b[j];
      }
    }
  }
  const Epilogue* e = args.epilogue;
  for (int i = 0; i < args.m; ++i) {
    float* c = args.c + i * args.ldc;
    for (int j = 0; j < args.n; ++j) {
      float x = acc[i][j];
      if (args.accumulate) x += c[j];
      if (e != nullptr) {
        if (e->row_bias != nullptr) x += e->row_bias[i];
        if (e->col_bias != nullptr) x += e->col_bias[j];
        x = activate(e->pre_residual, x, e->clip_min, e->clip_max);
        if (e->residual != nullptr) x += e->residual[i * e->residual_ld + j];
        x = activate(e->post_residual, x, e->clip_min, e->clip_max);
      }
      c[j] = x;
    }
  }
}

}  // namespace

void f32_gemm_4x8__portable(const GemmUkernelArgs& args) { ukernel_portable<4, 8>(args); }

}  // namespace sparsecol::kernels
