// Device kernels of the cuda schedules (see cuda_kernels.h for what each computes and why it is
// not a library call). They are memory-bound: each touches every element once (LayerNorm twice,
// from L2), so they are written for coalesced access and a grid that fills the GPU, not for
// arithmetic tricks.
#include <cstdint>

#include "backends/cuda/cuda_kernels.h"

namespace sparsecol::cuda {

namespace {

// 256 threads a block and up to 32 blocks per SM worth of grid (an H100 has 132 SMs): enough
// warps to hide DRAM latency, a grid-stride loop covering any size.
constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 132 * 32;

int blocks_for(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

__device__ float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }

__device__ float apply(ElementOp op, float a, float b, float alpha, float beta) {
  switch (op) {
    case ElementOp::kCopy:
      return a;
    case ElementOp::kAdd:
      return a + b;
    case ElementOp::kSub:
      return a - b;
    case ElementOp::kMul:
      return a * b;
    case ElementOp::kDiv:
      return a / b;
    case ElementOp::kPow:
      return powf(a, b);
    case ElementOp::kMax:
      return fmaxf(a, b);
    case ElementOp::kMin:
      return fminf(a, b);
    case ElementOp::kRelu:
      return a > 0.0f ? a : 0.0f;
    case ElementOp::kLeakyRelu:
      return a >= 0.0f ? a : alpha * a;
    case ElementOp::kSigmoid:
      return 1.0f / (1.0f + expf(-a));
    case ElementOp::kTanh:
      return tanhf(a);
    case ElementOp::kExp:
      return expf(a);
    case ElementOp::kLog:
      return logf(a);
    case ElementOp::kSqrt:
      return sqrtf(a);
    case ElementOp::kNeg:
      return -a;
    case ElementOp::kAbs:
      return fabsf(a);
    case ElementOp::kErf:
      return erff(a);
    case ElementOp::kReciprocal:
      return 1.0f / a;
    case ElementOp::kClip:
      return fminf(fmaxf(a, alpha), beta);
    case ElementOp::kGelu:
      return gelu_erf(a);
  }
  return a;
}

// The element offset of output element `index` in an operand with `strides`.
__device__ int64_t offset_of(const ElementwiseParams& p, int64_t index, const Operand& operand) {
  if (operand.contiguous) return index;
  int64_t offset = 0;
  for (int d = p.rank - 1; d >= 0; --d) {
    const int64_t coordinate = index % p.dims[d];
    index /= p.dims[d];
    offset += coordinate * operand.strides[d];
  }
  return offset;
}

__global__ void elementwise_kernel(const ElementwiseParams p, int64_t count, float* dst) {
  const bool binary = p.op >= ElementOp::kAdd && p.op <= ElementOp::kMin;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float a = p.a.data[offset_of(p, i, p.a)];
    const float b = binary ? p.b.data[offset_of(p, i, p.b)] : 0.0f;
    float v = apply(p.op, a, b, p.alpha, p.beta);
    for (int k = 0; k < p.post_count; ++k) {
      const PostOp& post = p.post[k];
      const float operand =
          post.op == ElementOp::kAdd ? post.operand.data[offset_of(p, i, post.operand)] : 0.0f;
      v = apply(post.op, v, operand, post.alpha, post.beta);
    }
    dst[i] = v;
  }
}

// Sum over a block of kThreads threads; every thread gets the result.
__device__ float block_sum(float value, float* shared) {
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_down_sync(0xffffffffu, value, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < kThreads / 32 ? shared[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) {
      value += __shfl_down_sync(0xffffffffu, value, offset);
    }
    if (lane == 0) shared[0] = value;
  }
  __syncthreads();
  const float total = shared[0];
  __syncthreads();  // shared is reused by the next call
  return total;
}

// One block per row: BERT's rows (768 floats) are three loads per thread, and the second pass
// over the row hits L1/L2.
__global__ void layer_norm_kernel(const float* x, const float* scale, const float* bias, float* y,
                                  int64_t rows, int64_t cols, float epsilon) {
  __shared__ float shared[kThreads / 32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* src = x + row * cols;
    float* dst = y + row * cols;
    float sum = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += src[c];
    const float mean = block_sum(sum, shared) / static_cast<float>(cols);
    float squares = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float d = src[c] - mean;
      squares += d * d;
    }
    const float inv_std = rsqrtf(block_sum(squares, shared) / static_cast<float>(cols) + epsilon);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float v = (src[c] - mean) * inv_std * scale[c];
      dst[c] = bias != nullptr ? v + bias[c] : v;
    }
  }
}

// One thread per element of the [C*KH*KW, N, OH*OW] column matrix: consecutive threads write
// consecutive output pixels (coalesced) and read input pixels `stride` apart.
__global__ void im2col_kernel(const Im2ColParams p, const float* src, float* dst, int64_t count) {
  const int64_t pixels = p.out_h * p.out_w;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t pixel = i % pixels;
    const int64_t n = (i / pixels) % p.batch;
    const int64_t row = i / (pixels * p.batch);  // c * KH * KW + kh * KW + kw
    const int64_t kw = row % p.kernel_w;
    const int64_t kh = (row / p.kernel_w) % p.kernel_h;
    const int64_t c = row / (p.kernel_w * p.kernel_h);
    const int64_t ih = (pixel / p.out_w) * p.stride_h - p.pad_top + kh * p.dilation_h;
    const int64_t iw = (pixel % p.out_w) * p.stride_w - p.pad_left + kw * p.dilation_w;
    const bool inside = ih >= 0 && ih < p.in_h && iw >= 0 && iw < p.in_w;
    dst[i] = inside ? src[((n * p.channels + c) * p.in_h + ih) * p.in_w + iw] : 0.0f;
  }
}

}  // namespace

cudaError_t launch_elementwise(const ElementwiseParams& params, float* dst, cudaStream_t stream) {
  int64_t count = 1;
  for (int d = 0; d < params.rank; ++d) count *= params.dims[d];
  if (count == 0) return cudaSuccess;
  elementwise_kernel<<<blocks_for(count), kThreads, 0, stream>>>(params, count, dst);
  return cudaGetLastError();
}

cudaError_t launch_layer_norm(const float* x, const float* scale, const float* bias, float* y,
                              int64_t rows, int64_t cols, float epsilon, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  const int blocks = static_cast<int>(rows < kMaxBlocks ? rows : kMaxBlocks);
  layer_norm_kernel<<<blocks, kThreads, 0, stream>>>(x, scale, bias, y, rows, cols, epsilon);
  return cudaGetLastError();
}

cudaError_t launch_im2col(const Im2ColParams& params, const float* src, float* dst,
                          cudaStream_t stream) {
  const int64_t count = params.channels * params.kernel_h * params.kernel_w * params.batch *
                        params.out_h * params.out_w;
  if (count == 0) return cudaSuccess;
  im2col_kernel<<<blocks_for(count), kThreads, 0, stream>>>(params, src, dst, count);
  return cudaGetLastError();
}

}  // namespace sparsecol::cuda
