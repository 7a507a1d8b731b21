// The few device kernels of the cuda schedules that no NVIDIA library covers
// (cuda_kernels.cu): one strided, broadcasting element-wise kernel that also serves as bias /
// residual add, activation epilogue and transpose, the LayerNorm of a row, and im2col for the
// sparse (cuSPARSE) convolution. Convolution, pooling and softmax are cuDNN's; GEMM cuBLASLt's;
// SpMM cuSPARSE's.
//
// Plain types only (no graph, no CUDA headers beyond the runtime API's stream), so that the
// host executor and nvcc share this header.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace sparsecol::cuda {

// Broadcast shapes are right-aligned to at most this many dimensions (ONNX models in practice
// stay at 4 or 5; attention reshapes reach 4).
constexpr int kMaxRank = 6;
// Epilogue operations fused behind one element-wise pass (graph::EpilogueOp lists rarely pass 2).
constexpr int kMaxPostOps = 4;

// An input of an element-wise launch: its data and its element strides over the output's
// dimensions (0 where it broadcasts, permuted strides for a transpose). `contiguous` says the
// strides are the output's own row-major ones, so the kernel reads it at the output index.
struct Operand {
  const float* data = nullptr;
  int64_t strides[kMaxRank] = {};
  bool contiguous = false;
};

// What one output element is made of: first `op` of the operands, then each post-op in order.
enum class ElementOp : int {
  kCopy,  // a
  // binary, a op b
  kAdd,
  kSub,
  kMul,
  kDiv,
  kPow,
  kMax,
  kMin,
  // unary, op(a)
  kRelu,
  kLeakyRelu,  // alpha: slope
  kSigmoid,
  kTanh,
  kExp,
  kLog,
  kSqrt,
  kNeg,
  kAbs,
  kErf,
  kReciprocal,
  kClip,  // alpha: min, beta: max
  kGelu,  // erf form, as PyTorch's nn.GELU() and graph::EpilogueOp::kGelu
};

struct PostOp {
  ElementOp op = ElementOp::kCopy;  // kRelu, kClip, kGelu or kAdd (with operand)
  float alpha = 0.0f, beta = 0.0f;
  Operand operand;  // kAdd only
};

struct ElementwiseParams {
  int rank = 0;  // of the output, 0 for a scalar
  int64_t dims[kMaxRank] = {};
  ElementOp op = ElementOp::kCopy;
  float alpha = 0.0f, beta = 0.0f;
  Operand a, b;
  int post_count = 0;
  PostOp post[kMaxPostOps];
};

// dst[i] = post(op(a[i], b[i])) over every output element. dst may be a's data when a is
// contiguous (an in-place epilogue): each element is read before it is written, by one thread.
cudaError_t launch_elementwise(const ElementwiseParams& params, float* dst, cudaStream_t stream);

// y = (x - mean) / sqrt(var + epsilon) * scale + bias over each of `rows` rows of `cols`
// contiguous elements; scale and bias have `cols` elements (bias may be null). Mean and
// variance are accumulated in fp32 over the row in two passes (no E[x^2] - E[x]^2
// cancellation).
cudaError_t launch_layer_norm(const float* x, const float* scale, const float* bias, float* y,
                              int64_t rows, int64_t cols, float epsilon, cudaStream_t stream);

// The columns of a 2-D convolution as a [C * KH * KW, N, OH * OW] row-major matrix (the batch
// folded into the columns, so one SpMM serves the whole batch); zeros where the window reads
// padding.
struct Im2ColParams {
  int64_t batch = 0, channels = 0, in_h = 0, in_w = 0, out_h = 0, out_w = 0;
  int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_left = 0, dilation_h = 1, dilation_w = 1;
};
cudaError_t launch_im2col(const Im2ColParams& params, const float* src, float* dst,
                          cudaStream_t stream);

}  // namespace sparsecol::cuda
