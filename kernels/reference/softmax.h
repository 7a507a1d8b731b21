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

// NegativeLogLikelihoodLoss (and SoftmaxCrossEntropyLoss on log_softmax's output): with the
// input seen as [n, classes, inner] (log-probabilities) and target as [n, inner] class indices,
// element (i, k) loses -input[i, target, k] * weight[target] (weight nullptr: 1), or 0 where
// target is the ignored index. kNone writes the n * inner losses, kSum their sum, kMean their sum
// over the sum of the weights taken (the count of targets not ignored without weights; NaN when
// every one is ignored). Every target must be in [0, classes) or ignored. Sums in double.
enum class LossReduction { kNone, kSum, kMean };
struct NllLossShape {
  int64_t n = 0, classes = 0, inner = 1;
  LossReduction reduction = LossReduction::kMean;
  bool has_ignore_index = false;
  int64_t ignore_index = 0;
};
void nll_loss_reference(const float* input, const int64_t* target, const float* weight, float* loss,
                        const NllLossShape& shape);

}  // namespace sparsecol::kernels::reference
