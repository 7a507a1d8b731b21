#include "reference/softmax.h"

#include <cmath>
#include <limits>

namespace sparsecol::kernels::reference {

namespace {

// Calls finish(x, max, sum of exp(x - max)) per element of each line along the axis and
// stores its result.
template <typename Finish>
void for_each_line(const float* src, float* dst, const SoftmaxShape& shape, Finish finish) {
  const int64_t stride = shape.inner;
  for (int64_t o = 0; o < shape.outer; ++o) {
    for (int64_t i = 0; i < shape.inner; ++i) {
      const float* x = src + o * shape.axis_size * stride + i;
      float* y = dst + o * shape.axis_size * stride + i;
      double max = -std::numeric_limits<double>::infinity();
      for (int64_t a = 0; a < shape.axis_size; ++a) max = std::fmax(max, x[a * stride]);
      double sum = 0.0;
      for (int64_t a = 0; a < shape.axis_size; ++a) sum += std::exp(x[a * stride] - max);
      for (int64_t a = 0; a < shape.axis_size; ++a) {
        y[a * stride] = static_cast<float>(finish(static_cast<double>(x[a * stride]), max, sum));
      }
    }
  }
}

}  // namespace

void softmax_reference(const float* src, float* dst, const SoftmaxShape& shape) {
  for_each_line(src, dst, shape,
                [](double x, double max, double sum) { return std::exp(x - max) / sum; });
}

void log_softmax_reference(const float* src, float* dst, const SoftmaxShape& shape) {
  for_each_line(src, dst, shape,
                [](double x, double max, double sum) { return x - max - std::log(sum); });
}

void hardmax_reference(const float* src, float* dst, const SoftmaxShape& shape) {
  const int64_t stride = shape.inner;
  for (int64_t o = 0; o < shape.outer; ++o) {
    for (int64_t i = 0; i < shape.inner; ++i) {
      const float* x = src + o * shape.axis_size * stride + i;
      float* y = dst + o * shape.axis_size * stride + i;
      int64_t best = 0;
      for (int64_t a = 1; a < shape.axis_size && !std::isnan(x[best * stride]); ++a) {
        if (std::isnan(x[a * stride]) || x[a * stride] > x[best * stride]) best = a;
      }
      for (int64_t a = 0; a < shape.axis_size; ++a) y[a * stride] = a == best ? 1.0f : 0.0f;
    }
  }
}

void nll_loss_reference(const float* input, const int64_t* target, const float* weight, float* loss,
                        const NllLossShape& s) {
  double total = 0.0, weights = 0.0;
  for (int64_t i = 0; i < s.n; ++i) {
    for (int64_t k = 0; k < s.inner; ++k) {
      const int64_t t = target[i * s.inner + k];
      double value = 0.0;
      if (!s.has_ignore_index || t != s.ignore_index) {
        const double w = weight != nullptr ? weight[t] : 1.0;
        value = -static_cast<double>(input[(i * s.classes + t) * s.inner + k]) * w;
        weights += w;
      }
      if (s.reduction == LossReduction::kNone) loss[i * s.inner + k] = static_cast<float>(value);
      total += value;
    }
  }
  if (s.reduction == LossReduction::kSum) loss[0] = static_cast<float>(total);
  if (s.reduction == LossReduction::kMean) loss[0] = static_cast<float>(total / weights);
}

}  // namespace sparsecol::kernels::reference
