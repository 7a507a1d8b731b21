#include "reference/normalization.h"

#include <algorithm>
#include <cmath>

namespace sparsecol::kernels::reference {

namespace {

struct Moments {
  double mean = 0.0;
  double inv_std_dev = 0.0;  // 1 / sqrt(biased variance + epsilon)
};

Moments moments(const float* x, int64_t count, float epsilon) {
  double sum = 0.0;
  for (int64_t i = 0; i < count; ++i) sum += x[i];
  const double mean = count > 0 ? sum / static_cast<double>(count) : 0.0;
  double squares = 0.0;
  for (int64_t i = 0; i < count; ++i) squares += (x[i] - mean) * (x[i] - mean);
  const double var = count > 0 ? squares / static_cast<double>(count) : 0.0;
  return {mean, 1.0 / std::sqrt(var + static_cast<double>(epsilon))};
}

}  // namespace

void batch_norm_inference_reference(const float* src, const float* scale, const float* bias,
                                    const float* mean, const float* var, float* dst, int64_t batch,
                                    int64_t channels, int64_t inner, float epsilon) {
  for (int64_t n = 0; n < batch; ++n) {
    for (int64_t c = 0; c < channels; ++c) {
      const double gain = scale[c] / std::sqrt(static_cast<double>(var[c]) + epsilon);
      const float* x = src + (n * channels + c) * inner;
      float* y = dst + (n * channels + c) * inner;
      for (int64_t i = 0; i < inner; ++i) {
        y[i] = static_cast<float>((x[i] - static_cast<double>(mean[c])) * gain + bias[c]);
      }
    }
  }
}

void instance_norm_reference(const float* src, const float* scale, const float* bias, float* dst,
                             int64_t batch, int64_t channels, int64_t inner, float epsilon) {
  for (int64_t plane = 0; plane < batch * channels; ++plane) {
    const int64_t c = plane % channels;
    const float* x = src + plane * inner;
    float* y = dst + plane * inner;
    const Moments m = moments(x, inner, epsilon);
    for (int64_t i = 0; i < inner; ++i) {
      y[i] = static_cast<float>((x[i] - m.mean) * m.inv_std_dev * scale[c] + bias[c]);
    }
  }
}

void layer_norm_reference(const float* src, const float* scale, const float* bias, float* dst,
                          float* mean, float* inv_std_dev, int64_t outer, int64_t inner,
                          float epsilon) {
  for (int64_t row = 0; row < outer; ++row) {
    const float* x = src + row * inner;
    float* y = dst + row * inner;
    const Moments m = moments(x, inner, epsilon);
    for (int64_t j = 0; j < inner; ++j) {
      const double shift = bias != nullptr ? bias[j] : 0.0;
      y[j] = static_cast<float>((x[j] - m.mean) * m.inv_std_dev * scale[j] + shift);
    }
    if (mean != nullptr) mean[row] = static_cast<float>(m.mean);
    if (inv_std_dev != nullptr) inv_std_dev[row] = static_cast<float>(m.inv_std_dev);
  }
}

void lrn_reference(const float* src, float* dst, int64_t batch, int64_t channels, int64_t inner,
                   int64_t size, float alpha, float beta, float bias) {
  const int64_t before = (size - 1) / 2;
  const int64_t after = size - 1 - before;  // ceil((size - 1) / 2)
  for (int64_t n = 0; n < batch; ++n) {
    const float* x = src + n * channels * inner;
    float* y = dst + n * channels * inner;
    for (int64_t c = 0; c < channels; ++c) {
      const int64_t lo = std::max<int64_t>(0, c - before);
      const int64_t hi = std::min(channels - 1, c + after);
      for (int64_t i = 0; i < inner; ++i) {
        double squares = 0.0;
        for (int64_t j = lo; j <= hi; ++j) {
          const double v = x[j * inner + i];
          squares += v * v;
        }
        const double denom =
            std::pow(bias + static_cast<double>(alpha) / static_cast<double>(size) * squares,
                     static_cast<double>(beta));
        y[c * inner + i] = static_cast<float>(x[c * inner + i] / denom);
      }
    }
  }
}

}  // namespace sparsecol::kernels::reference
