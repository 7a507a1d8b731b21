// The element-wise tail fused into a kernel's output, applied while the tile is in registers.
// Mirrors graph::EpilogueOp but in kernel terms (no graph types), resolved to pointers.
#pragma once

#include <cstdint>

namespace sparsecol::kernels {

enum class Activation { kNone, kRelu, kClip, kGelu };

// out[m][n] = post(residual[m][n] + pre(acc[m][n] + row_bias[m] + col_bias[n])), each part
// optional (a null pointer or kNone skips it). Covers the fused patterns the graph passes produce:
// Conv(+bias)(+residual)(+Relu/Clip), MatMul(+bias)(+Gelu)(+residual).
struct Epilogue {
  const float* row_bias = nullptr;  // one value per output row (conv: per output channel)
  const float* col_bias = nullptr;  // one value per output column (linear layer: per feature)
  Activation pre_residual = Activation::kNone;  // applied before the residual is added
  const float* residual = nullptr;  // same layout as the output (its own leading dimension)
  int64_t residual_ld = 0;
  Activation post_residual = Activation::kNone;  // applied after the residual is added
  float clip_min = 0.0f, clip_max = 0.0f;        // bounds of kClip (either position)
};

}  // namespace sparsecol::kernels
