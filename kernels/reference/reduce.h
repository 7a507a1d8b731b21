// Naive reductions over any set of axes (ONNX Reduce* and ArgMax/ArgMin semantics).
//
// Layout: `src` is a dense C-ordered array of `shape`; `dst` holds the kept dimensions in
// order (keepdims only changes the shape the caller reports, never the layout). Every
// reduction runs through one loop: the broadcast iterator of elementwise.h visiting `src`
// with the kept-dims shape as operand, which yields each element's output slot.
#pragma once

#include <cstdint>
#include <span>

#include "reference/elementwise.h"

namespace sparsecol::kernels::reference {

enum class ReduceOp {
  kSum,
  kMean,
  kMax,
  kMin,
  kProd,
  kL1,         // sum |x|
  kL2,         // sqrt(sum x^2)
  kLogSum,     // log(sum x)
  kLogSumExp,  // log(sum e^x), computed as max + log(sum e^(x - max)) so it does not overflow
  kSumSquare,  // sum x^2
};

// Reduces `src` over `axes` (normalized to [0, rank), ascending, no duplicates; empty reduces
// nothing, so every element is its own group) into dst. Floating-point sums accumulate in
// double; integer ones in T and wrap. An empty group yields the identity: 0 for sums, 1 for
// Prod, the lowest value for Max (-inf for floats), the highest for Min, NaN for Mean.
// T: float, double, int64_t, int32_t, int8_t, uint8_t.
template <typename T>
void reduce(ReduceOp op, const T* src, Dims shape, std::span<const int64_t> axes, T* dst);

// Index along `axis` of the largest (is_max) or smallest element of each group; the first
// occurrence among equal ones, or the last with select_last_index. A NaN counts as the extreme,
// as in numpy. The axis must have a non-zero size (an empty group has no index: kInternal).
// T: float, double, int64_t, int32_t, int8_t, uint8_t.
template <typename T>
void arg_reduce(bool is_max, bool select_last_index, const T* src, Dims shape, int64_t axis,
                int64_t* dst);

}  // namespace sparsecol::kernels::reference
