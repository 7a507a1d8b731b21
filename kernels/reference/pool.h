// Naive reference pooling: MaxPool, AveragePool and their global forms (ONNX semantics).
//
// Layout: src is N x C x [D x] [H x] W, dst is N x C x [OD x] [OH x] OW, dense and C-ordered.
// Every (n, c) plane is pooled on its own.
#pragma once

#include <cstdint>

#include "reference/window.h"

namespace sparsecol::kernels::reference {

struct PoolShape {
  int64_t batch = 1;
  int64_t channels = 0;
  Window window;  // out_size already reflects ceil_mode
  // AveragePool: whether padded positions count in the divisor. Positions beyond pad_end
  // (reached only by ceil_mode's extra window) never count.
  bool count_include_pad = false;
};

// Maximum over the window's taps that fall inside the input; padding is never the maximum.
void max_pool_reference(const float* src, float* dst, const PoolShape& shape);
// Mean over the window's taps (see count_include_pad), summed in double.
void average_pool_reference(const float* src, float* dst, const PoolShape& shape);

// One value per plane of `plane_size` elements: its mean (summed in double) or its maximum.
void global_average_pool_reference(const float* src, float* dst, int64_t planes,
                                   int64_t plane_size);
void global_max_pool_reference(const float* src, float* dst, int64_t planes, int64_t plane_size);

}  // namespace sparsecol::kernels::reference
