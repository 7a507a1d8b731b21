// Element-wise kernels compiled for the baseline ISA, and the ISA dispatch (the best compiled
// variant no higher than the requested and the active ISA): see eltwise.h.
#include "f32-eltwise/eltwise_impl.h"

namespace sparsecol::kernels {
namespace detail {

void binary_rows_avx2(BinaryKind kind, const RowOperand& a, const RowOperand& b, float* dst,
                      int64_t dst_ld, int64_t rows, int64_t n);
void unary_rows_avx2(UnaryKind kind, const float* src, int64_t src_ld, float* dst, int64_t dst_ld,
                     int64_t rows, int64_t n, float lo, float hi);

void binary_rows_avx512(BinaryKind kind, const RowOperand& a, const RowOperand& b, float* dst,
                        int64_t dst_ld, int64_t rows, int64_t n);
void unary_rows_avx512(UnaryKind kind, const float* src, int64_t src_ld, float* dst, int64_t dst_ld,
                       int64_t rows, int64_t n, float lo, float hi);

void gather_rows_avx2(const float* in, int64_t in_ld, int64_t stride, int64_t rows, int64_t first,
                      int64_t last, int64_t width, float* out, int64_t out_ld);
void gather_rows_avx512(const float* in, int64_t in_ld, int64_t stride, int64_t rows, int64_t first,
                        int64_t last, int64_t width, float* out, int64_t out_ld);

void split_column_phases_avx2(const float* in, int64_t in_ld, int64_t in_w, int64_t shift,
                              int64_t rows, int64_t width, float* even, float* odd, int64_t out_ld);
void split_column_phases_avx512(const float* in, int64_t in_ld, int64_t in_w, int64_t shift,
                                int64_t rows, int64_t width, float* even, float* odd,
                                int64_t out_ld);

}  // namespace detail

void binary_rows(BinaryKind kind, const RowOperand& a, const RowOperand& b, float* dst,
                 int64_t dst_ld, int64_t rows, int64_t n, Isa isa) {
  switch (effective_isa(isa)) {
    case Isa::kAvx512:
      return detail::binary_rows_avx512(kind, a, b, dst, dst_ld, rows, n);
    case Isa::kAvx2:
      return detail::binary_rows_avx2(kind, a, b, dst, dst_ld, rows, n);
    case Isa::kPortable:
      return binary_rows_impl(kind, a, b, dst, dst_ld, rows, n);
  }
}

void unary_rows(UnaryKind kind, const float* src, int64_t src_ld, float* dst, int64_t dst_ld,
                int64_t rows, int64_t n, float lo, float hi, Isa isa) {
  switch (effective_isa(isa)) {
    case Isa::kAvx512:
      return detail::unary_rows_avx512(kind, src, src_ld, dst, dst_ld, rows, n, lo, hi);
    case Isa::kAvx2:
      return detail::unary_rows_avx2(kind, src, src_ld, dst, dst_ld, rows, n, lo, hi);
    case Isa::kPortable:
      return unary_rows_impl(kind, src, src_ld, dst, dst_ld, rows, n, lo, hi);
  }
}

void gather_rows(const float* in, int64_t in_ld, int64_t stride, int64_t rows, int64_t first,
                 int64_t last, int64_t width, float* out, int64_t out_ld, Isa isa) {
  switch (effective_isa(isa)) {
    case Isa::kAvx512:
      return detail::gather_rows_avx512(in, in_ld, stride, rows, first, last, width, out, out_ld);
    case Isa::kAvx2:
      return detail::gather_rows_avx2(in, in_ld, stride, rows, first, last, width, out, out_ld);
    case Isa::kPortable:
      return gather_rows_impl(in, in_ld, stride, rows, first, last, width, out, out_ld);
  }
}

void split_column_phases(const float* in, int64_t in_ld, int64_t in_w, int64_t shift, int64_t rows,
                         int64_t width, float* even, float* odd, int64_t out_ld, Isa isa) {
  switch (effective_isa(isa)) {
    case Isa::kAvx512:
      return detail::split_column_phases_avx512(in, in_ld, in_w, shift, rows, width, even, odd,
                                                out_ld);
    case Isa::kAvx2:
      return detail::split_column_phases_avx2(in, in_ld, in_w, shift, rows, width, even, odd,
                                              out_ld);
    case Isa::kPortable:
      return split_column_phases_impl(in, in_ld, in_w, shift, rows, width, even, odd, out_ld);
  }
}

}  // namespace sparsecol::kernels
