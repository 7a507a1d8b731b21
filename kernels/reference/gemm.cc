#include "reference/gemm.h"

#include <algorithm>
#include <vector>

#include <omp.h>

namespace sparsecol::kernels::reference {

namespace {

// Below this many multiply-adds, waking a thread team costs more than the work saves.
constexpr int64_t kMinParallelWork = 1 << 18;

// Computes each row of a[m x k] * b[k x n] in double and hands it to finish(row, values).
// Rows are independent, so threads share them; each row is summed in the same order
// whatever the thread count.
template <typename Finish>
void product_rows(const float* a, const float* b, int64_t m, int64_t k, int64_t n, Finish finish) {
  // One accumulator row per thread, allocated here: an exception must not leave a parallel
  // region.
  const bool parallel = m * k * n > kMinParallelWork;
  const int64_t threads = parallel ? omp_get_max_threads() : 1;
  std::vector<double> rows(static_cast<std::size_t>(threads * n));
#pragma omp parallel if (parallel)
  {
    double* row = rows.data() + omp_get_thread_num() * n;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < m; ++i) {
      std::fill_n(row, n, 0.0);
      for (int64_t p = 0; p < k; ++p) {
        const double a_ip = a[i * k + p];
        const float* b_row = b + p * n;
        for (int64_t j = 0; j < n; ++j) row[j] += a_ip * b_row[j];
      }
      finish(i, row);
    }
  }
}

// A rows x cols row-major copy of the transpose of src (cols x rows).
std::vector<float> transposed(const float* src, int64_t rows, int64_t cols) {
  std::vector<float> dst(static_cast<std::size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = src[c * rows + r];
  }
  return dst;
}

}  // namespace

void gemm_reference(const float* a, const float* b, const float* c, float* dst,
                    const GemmShape& shape) {
  const int64_t m = shape.m, k = shape.k, n = shape.n;
  // Transposed operands are copied to row-major first: simpler than strided loops and keeps
  // the inner loop contiguous.
  std::vector<float> a_copy, b_copy;
  if (shape.trans_a) a_copy = transposed(a, m, k);
  if (shape.trans_b) b_copy = transposed(b, k, n);
  const double alpha = shape.alpha, beta = shape.beta;
  product_rows(shape.trans_a ? a_copy.data() : a, shape.trans_b ? b_copy.data() : b, m, k, n,
               [&](int64_t i, const double* row) {
                 for (int64_t j = 0; j < n; ++j) {
                   const double bias = c != nullptr ? beta * c[i * n + j] : 0.0;
                   dst[i * n + j] = static_cast<float>(alpha * row[j] + bias);
                 }
               });
}

void matmul_reference(const float* a, const float* b, float* dst, const MatMulShape& shape) {
  const int64_t m = shape.m, k = shape.k, n = shape.n;
  const std::size_t dims = shape.batch.size();
  int64_t batches = 1;
  for (int64_t d : shape.batch) batches *= d;
  std::vector<int64_t> index(dims, 0);  // multi-index of the current batch, odometer-style
  for (int64_t batch = 0; batch < batches; ++batch) {
    int64_t a_offset = 0, b_offset = 0;
    for (std::size_t d = 0; d < dims; ++d) {
      a_offset += index[d] * shape.a_batch_stride[d];
      b_offset += index[d] * shape.b_batch_stride[d];
    }
    float* y = dst + batch * m * n;
    product_rows(a + a_offset, b + b_offset, m, k, n, [&](int64_t i, const double* row) {
      for (int64_t j = 0; j < n; ++j) y[i * n + j] = static_cast<float>(row[j]);
    });
    for (std::size_t d = dims; d-- > 0;) {
      if (++index[d] < shape.batch[d]) break;
      index[d] = 0;
    }
  }
}

}  // namespace sparsecol::kernels::reference
