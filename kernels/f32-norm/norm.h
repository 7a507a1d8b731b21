// f32 softmax and layer normalization over the last axis, computing a range of rows (tokens).
//
// Layout: `rows` rows of `n` contiguous values, `src_ld` / `dst_ld` floats apart (dst may equal
// src). A caller computes a region by offsetting the pointers to its first row: layer-by-layer
// hands all rows, a tiled schedule a tile of tokens. Both are numerically stable: softmax
// subtracts the row maximum before exp (a vectorized exp: Cody-Waite range reduction and a
// degree-6 polynomial, ~1 ulp on [-87, 88]); layer norm takes the variance as the mean of
// squared deviations (two passes over a row that is in L1), not E[x^2] - E[x]^2.
#pragma once

#include <cstdint>

#include "isa.h"

namespace sparsecol::kernels {

// dst[r][j] = exp(x[r][j] - max_r) / sum_j exp(x[r][j] - max_r). `isa` is capped at active_isa().
void softmax_rows(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows,
                  int64_t n, Isa isa = active_isa());

// dst[r][j] = (x[r][j] - mean_r) / sqrt(var_r + epsilon) * gamma[j] + beta[j] (beta may be
// nullptr), with the biased variance.
void layer_norm_rows(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, int64_t rows,
                     int64_t n, const float* gamma, const float* beta, float epsilon,
                     Isa isa = active_isa());

}  // namespace sparsecol::kernels
