// Naive reference Softmax, LogSoftmax and Hardmax along one axis (ONNX semantics).
//
// Layout: src is seen as outer x axis_size x inner (dense, C-ordered); each of the
// outer * inner lines along the middle axis is normalized on its own. The line's maximum is
// subtracted before exponentiating, so large inputs do not overflow, and sums are in double.
#pragma once

#include <cstdint>

namespace sparsecol::kernels::reference {

struct SoftmaxShape {
  int64_t outer = 1;
  int64_t axis_size = 1;
  int64_t inner = 1;
};

// dst = exp(x - max) / sum(exp(x - max)) along the axis.
void softmax_reference(const float* src, float* dst, const SoftmaxShape& shape);
// dst = x - max - log(sum(exp(x - max))) along the axis.
void log_softmax_reference(const float* src, float* dst, const SoftmaxShape& shape);
// dst = 1 at the first largest element of each line along the axis, 0 elsewhere (a NaN counts
// as the largest, as in numpy's argmax).
void hardmax_reference(const float* src, float* dst, const SoftmaxShape& shape);

}  // namespace sparsecol::kernels::reference
