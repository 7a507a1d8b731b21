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

// Points `tile`'s pointers at the tile at (row, col) of `e`, field by field. Why not a fresh
// copy per tile: the micro-kernel reads the struct right after it is written, and GCC copies it
// with 16-byte moves, one of which reads back what two 8-byte stores just wrote; store-to-load
// forwarding cannot serve that, and every tile stalled. perf on MobileNetV2 at batch 16 (Zen 3,
// cpu-clock) put 65% of the driver's samples on two instructions after those loads, the driver
// at 8.3% of the run (1.25% now); the model ran 1.04x (batch 16) and 1.05x (batch 1) faster.
inline void move_epilogue_to(const Epilogue& e, int64_t row, int64_t col, Epilogue& tile) {
  if (e.row_bias != nullptr) tile.row_bias = e.row_bias + row;
  if (e.col_bias != nullptr) tile.col_bias = e.col_bias + col;
  if (e.residual != nullptr) tile.residual = e.residual + row * e.residual_ld + col;
}

}  // namespace sparsecol::kernels
