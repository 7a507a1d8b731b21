// Naive element-wise kernels (ONNX semantics) and the one broadcast iterator they all share.
//
// Layout: dense C-ordered arrays given as a pointer plus a shape. Binary, variadic and
// three-way ops broadcast numpy-style: shapes are right-aligned and a dimension of 1 (or a
// missing leading one) is repeated. These kernels are the oracle the fast paths are tested
// against, so they favour obvious correctness over speed; the only concession is that the
// broadcast iterator costs O(1) per element (an odometer, no divisions).
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "sparsecol/sparsecol.h"

namespace sparsecol::kernels::reference {

template <typename T>
constexpr bool kIsFloat = std::is_floating_point_v<T>;

// NaN test that compiles for integer element types too (always false there).
template <typename T>
bool is_nan_value(T x) {
  if constexpr (kIsFloat<T>) {
    return std::isnan(x);
  } else {
    return false;
  }
}

using Dims = std::span<const int64_t>;

// Element strides of an operand of shape `shape` read broadcast over `out_shape`: one entry per
// output dimension, 0 where the operand is repeated. Throws Error(kShapeMismatch) if `shape`
// does not broadcast to `out_shape`.
std::vector<int64_t> broadcast_strides(Dims shape, Dims out_shape);

// Visits every element of `out_shape` in C order and calls fn(out_index, offsets), where
// offsets[k] is the element offset in operand k (of shape shapes[k]) that numpy broadcasting
// pairs with that output element. Throws Error(kShapeMismatch) if an operand does not broadcast.
//
// This one iterator serves every broadcasting op and also the reductions: reducing a tensor is
// visiting its elements with the kept-dims output shape as the broadcast operand.
template <std::size_t N, typename Fn>
void for_each_broadcast(Dims out_shape, const std::array<Dims, N>& shapes, Fn&& fn) {
  const std::size_t rank = out_shape.size();
  std::array<std::vector<int64_t>, N> strides;
  for (std::size_t k = 0; k < N; ++k) strides[k] = broadcast_strides(shapes[k], out_shape);
  int64_t total = 1;
  for (int64_t d : out_shape) total *= d;
  if (total == 0) return;

  // The innermost dimension runs as a plain loop; the outer ones advance like an odometer.
  const int64_t inner = rank == 0 ? 1 : out_shape[rank - 1];
  std::array<int64_t, N> inner_stride{};
  for (std::size_t k = 0; k < N; ++k) inner_stride[k] = rank == 0 ? 0 : strides[k][rank - 1];
  std::vector<int64_t> index(rank, 0);
  std::array<int64_t, N> base{};
  for (int64_t out = 0; out < total; out += inner) {
    std::array<int64_t, N> offsets = base;
    for (int64_t i = 0; i < inner; ++i) {
      fn(out + i, offsets);
      for (std::size_t k = 0; k < N; ++k) offsets[k] += inner_stride[k];
    }
    for (int d = static_cast<int>(rank) - 2; d >= 0; --d) {
      for (std::size_t k = 0; k < N; ++k) base[k] += strides[k][d];
      if (++index[d] < out_shape[d]) break;
      for (std::size_t k = 0; k < N; ++k) base[k] -= strides[k][d] * out_shape[d];
      index[d] = 0;
    }
  }
}

// ---- unary: dst[i] = f(src[i]) ----

enum class UnaryOp {
  // Defined for every numeric type.
  kAbs,
  kNeg,
  kSign,
  kRelu,
  // Floating point only.
  kSqrt,
  kExp,
  kLog,
  kErf,
  kReciprocal,
  kFloor,
  kCeil,
  kRound,
  kSin,
  kCos,
  kTan,
  kAsin,
  kAcos,
  kAtan,
  kSinh,
  kCosh,
  kAsinh,
  kAcosh,
  kAtanh,
  kTanh,
  kSigmoid,
  kLeakyRelu,
  kElu,
  kSelu,
  kCelu,
  kHardSigmoid,
  kHardSwish,
  kSoftplus,
  kSoftsign,
  kThresholdedRelu,
  kShrink,
};

// True for the ops above that are defined on integer types too.
constexpr bool is_integer_unary(UnaryOp op) { return op <= UnaryOp::kRelu; }

// The attributes of the parameterized activations, with ONNX's names and defaults in the op
// bindings: LeakyRelu/Elu/Celu/ThresholdedRelu use alpha; Selu alpha and gamma; HardSigmoid
// alpha and beta; Shrink lambd as alpha and bias as beta.
struct UnaryParams {
  float alpha = 0.0f;
  float beta = 0.0f;
  float gamma = 0.0f;
};

// T: float, double, int64_t, int32_t, int8_t, uint8_t. For integer T only is_integer_unary ops
// are defined (others throw Error(kInternal): the op bindings check dtypes first). Integer
// overflow (Neg or Abs of the most negative value) wraps.
template <typename T>
void unary(UnaryOp op, const UnaryParams& params, const T* src, T* dst, int64_t count);

// dst = min(max(src, lo), hi), so lo > hi yields hi everywhere (as numpy.clip); NaN stays NaN.
template <typename T>
void clip(const T* src, T* dst, int64_t count, T lo, T hi);

// T: float, double.
template <typename T>
void is_nan(const T* src, bool* dst, int64_t count);
template <typename T>
void is_inf(const T* src, bool* dst, int64_t count, bool detect_negative, bool detect_positive);

void logical_not(const bool* src, bool* dst, int64_t count);

// Converts between any two of the element types. Float to integer truncates toward zero and
// saturates at the target's range, NaN becomes 0 (C++ leaves those undefined; ONNX leaves them
// unspecified). Anything non-zero becomes true.
void cast(DType src_type, const void* src, DType dst_type, void* dst, int64_t count);

// ---- binary with broadcasting: dst = a op b ----

enum class BinaryOp {
  // Numeric types.
  kAdd,
  kSub,
  kMul,
  kDiv,
  kMax,
  kMin,
  kMod,    // sign of the divisor (Python's %, numpy.mod)
  kFmod,   // sign of the dividend (C's fmod)
  kPRelu,  // a < 0 ? a * b : a
  // bool only.
  kAnd,
  kOr,
  kXor,
  // uint8_t only.
  kBitShiftLeft,
  kBitShiftRight,
};

// T: float, double, int64_t, int32_t, int8_t, uint8_t, and bool for kAnd/kOr/kXor. Integer
// arithmetic wraps; integer Div truncates toward zero; integer Div and Mod by zero yield 0
// rather than trapping. Max and Min propagate NaN. dst may alias an operand whose shape is
// dst_shape (the variadic ops accumulate in place).
template <typename T>
void binary(BinaryOp op, const T* a, Dims a_shape, const T* b, Dims b_shape, T* dst,
            Dims dst_shape);

enum class CompareOp { kEqual, kLess, kGreater, kLessOrEqual, kGreaterOrEqual };

// T: every element type.
template <typename T>
void compare(CompareOp op, const T* a, Dims a_shape, const T* b, Dims b_shape, bool* dst,
             Dims dst_shape);

// dst = base ^ exponent, computed in double and converted to T (so int32 ^ float works as
// ONNX's Pow allows). Base T: float, double, int64_t, int32_t; exponent E: any numeric type.
template <typename T, typename E>
void pow(const T* base, Dims base_shape, const E* exponent, Dims exponent_shape, T* dst,
         Dims dst_shape);

// dst = cond ? x : y, three-way broadcast. T: every element type.
template <typename T>
void where(const bool* cond, Dims cond_shape, const T* x, Dims x_shape, const T* y, Dims y_shape,
           T* dst, Dims dst_shape);

// Writes `src` broadcast to `dst_shape` into dst (numpy.broadcast_to, materialized).
// T: every element type.
template <typename T>
void broadcast_to(const T* src, Dims src_shape, T* dst, Dims dst_shape);

}  // namespace sparsecol::kernels::reference
