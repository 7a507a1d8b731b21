// Naive reference matrix products: ONNX Gemm and batched MatMul with broadcast batch dims.
//
// Layout: dense, C-ordered, row-major matrices. Products are summed in double (i-k-j order,
// so the inner loop streams a row of B), then rounded once to float.
#pragma once

#include <cstdint>
#include <vector>

namespace sparsecol::kernels::reference {

struct GemmShape {
  int64_t m = 0, k = 0, n = 0;
  bool trans_a = false;  // a is stored k x m instead of m x k
  bool trans_b = false;  // b is stored n x k instead of k x n
  float alpha = 1.0f;
  float beta = 1.0f;
};

// dst[m x n] = alpha * op(a) * op(b) + beta * c, where c is a full m x n matrix (the caller
// broadcasts ONNX's C) or nullptr for none.
void gemm_reference(const float* a, const float* b, const float* c, float* dst,
                    const GemmShape& shape);

struct MatMulShape {
  int64_t m = 0, k = 0, n = 0;
  // Batch dimensions of dst, outermost first, and for each the distance in elements between
  // consecutive matrices of a and of b: 0 where that operand broadcasts along the dimension.
  std::vector<int64_t> batch;
  std::vector<int64_t> a_batch_stride;
  std::vector<int64_t> b_batch_stride;
};

// dst[batch..., m, n] = a[..., m, k] * b[..., k, n], one product per batch index.
void matmul_reference(const float* a, const float* b, float* dst, const MatMulShape& shape);

}  // namespace sparsecol::kernels::reference
