// Naive reference normalizations (ONNX BatchNormalization in inference form,
// InstanceNormalization, LayerNormalization, LRN).
//
// Layout: dense, C-ordered. Channel-wise ops see src as batch x channels x inner, where inner
// is the product of the spatial dimensions. Statistics are computed in double, two-pass
// (mean first, then the mean of squared deviations), so they do not suffer cancellation.
#pragma once

#include <cstdint>

namespace sparsecol::kernels::reference {

// dst = scale * (src - mean) / sqrt(var + epsilon) + bias, per channel; all four parameter
// arrays hold `channels` values.
void batch_norm_inference_reference(const float* src, const float* scale, const float* bias,
                                    const float* mean, const float* var, float* dst, int64_t batch,
                                    int64_t channels, int64_t inner, float epsilon);

// Normalizes each (n, c) plane of `inner` values by its own mean and biased variance, then
// applies scale[c] and bias[c].
void instance_norm_reference(const float* src, const float* scale, const float* bias, float* dst,
                             int64_t batch, int64_t channels, int64_t inner, float epsilon);

// Normalizes each of `outer` rows of `inner` values by its own mean and biased variance, then
// applies scale[j] and bias[j] (j < inner; bias may be nullptr). mean and inv_std_dev, when not
// nullptr, receive the row statistics (`outer` values each).
void layer_norm_reference(const float* src, const float* scale, const float* bias, float* dst,
                          float* mean, float* inv_std_dev, int64_t outer, int64_t inner,
                          float epsilon);

// Local response normalization across channels (ONNX LRN):
// dst = src / (bias + alpha / size * sum of squares over channels
//              [c - floor((size - 1) / 2), c + ceil((size - 1) / 2)]) ^ beta.
void lrn_reference(const float* src, float* dst, int64_t batch, int64_t channels, int64_t inner,
                   int64_t size, float alpha, float beta, float bias);

}  // namespace sparsecol::kernels::reference
