#include "reference/elementwise.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace sparsecol::kernels::reference {

std::vector<int64_t> broadcast_strides(Dims shape, Dims out_shape) {
  const std::size_t rank = out_shape.size();
  std::vector<int64_t> strides(rank, 0);
  if (shape.size() > rank) {
    throw Error(ErrorCode::kShapeMismatch,
                fmt::format("shape [{}] has higher rank than the broadcast result [{}]",
                            fmt::join(shape, ", "), fmt::join(out_shape, ", ")));
  }
  const std::size_t lead = rank - shape.size();  // missing leading dimensions repeat
  int64_t stride = 1;
  for (std::size_t d = shape.size(); d-- > 0;) {
    if (shape[d] == out_shape[lead + d]) {
      strides[lead + d] = shape[d] == 1 ? 0 : stride;
    } else if (shape[d] != 1) {
      throw Error(ErrorCode::kShapeMismatch,
                  fmt::format("shape [{}] does not broadcast to [{}]", fmt::join(shape, ", "),
                              fmt::join(out_shape, ", ")));
    }
    stride *= shape[d];
  }
  return strides;
}

namespace {

[[noreturn]] void undefined_for(const char* what, int op, DType dtype) {
  throw Error(ErrorCode::kInternal,
              fmt::format("{} op #{} is not defined for {}", what, op, to_string(dtype)));
}

// Integer arithmetic done in the unsigned type, which wraps where the signed one would be
// undefined on overflow (int64 shape arithmetic must never trap).
template <typename T, typename Op>
T wrapping(T a, T b, Op op) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(op(static_cast<U>(a), static_cast<U>(b)));
}

template <typename T>
T add(T a, T b) {
  if constexpr (kIsFloat<T>)
    return a + b;
  else
    return wrapping(a, b, std::plus<>());
}
template <typename T>
T sub(T a, T b) {
  if constexpr (kIsFloat<T>)
    return a - b;
  else
    return wrapping(a, b, std::minus<>());
}
template <typename T>
T mul(T a, T b) {
  if constexpr (kIsFloat<T>)
    return a * b;
  else
    return wrapping(a, b, std::multiplies<>());
}

template <typename T>
T div(T a, T b) {
  if constexpr (kIsFloat<T>) {
    return a / b;
  } else {
    if (b == 0) return 0;
    // min / -1 overflows and traps on x86; as a wrapping negation it is min again.
    if constexpr (std::is_signed_v<T>) {
      if (b == -1) return sub<T>(0, a);
    }
    return static_cast<T>(a / b);
  }
}

// The remainder with the dividend's sign (C's %, fmod).
template <typename T>
T fmod(T a, T b) {
  if constexpr (kIsFloat<T>) {
    return std::fmod(a, b);
  } else {
    if (b == 0) return 0;
    if constexpr (std::is_signed_v<T>) {
      if (b == -1) return 0;
    }
    return static_cast<T>(a % b);
  }
}

// The remainder with the divisor's sign (Python's %, numpy.mod).
template <typename T>
T mod(T a, T b) {
  T r = fmod(a, b);
  if constexpr (std::is_signed_v<T>) {
    if (r != 0 && ((r < 0) != (b < 0))) r = add(r, b);
  }
  return r;
}

template <typename T>
T max(T a, T b) {
  if (is_nan_value(a) || is_nan_value(b)) return std::numeric_limits<T>::quiet_NaN();
  return std::max(a, b);
}
template <typename T>
T min(T a, T b) {
  if (is_nan_value(a) || is_nan_value(b)) return std::numeric_limits<T>::quiet_NaN();
  return std::min(a, b);
}

template <typename T>
T shift(T a, T b, bool left) {
  // Shifting by the type's width or more is undefined in C++; all bits are gone by then.
  if (b >= std::numeric_limits<T>::digits) return 0;
  return static_cast<T>(left ? a << b : a >> b);
}

// Converts with the semantics documented at cast(): truncation, saturation, NaN to 0.
template <typename D, typename S>
D convert(S value) {
  if constexpr (std::is_same_v<D, bool>) {
    return value != 0;
  } else if constexpr (kIsFloat<D> || !kIsFloat<S>) {
    return static_cast<D>(value);
  } else {
    const double x = static_cast<double>(value);
    if (std::isnan(x)) return 0;
    // The limits as doubles are exact powers of two (or within 1 of them), so comparing
    // against them decides representability after truncation.
    if (x <= static_cast<double>(std::numeric_limits<D>::lowest())) {
      return std::numeric_limits<D>::lowest();
    }
    if (x >= static_cast<double>(std::numeric_limits<D>::max())) {
      return std::numeric_limits<D>::max();
    }
    return static_cast<D>(x);
  }
}

template <typename T, typename F>
void map(const T* src, T* dst, int64_t count, F f) {
  for (int64_t i = 0; i < count; ++i) dst[i] = f(src[i]);
}

template <typename T>
void float_unary(UnaryOp op, const UnaryParams& params, const T* src, T* dst, int64_t count) {
  const T alpha = static_cast<T>(params.alpha);
  const T beta = static_cast<T>(params.beta);
  const T gamma = static_cast<T>(params.gamma);
  const auto run = [&](auto f) { map(src, dst, count, f); };
  switch (op) {
    case UnaryOp::kSqrt:
      return run([](T x) { return std::sqrt(x); });
    case UnaryOp::kExp:
      return run([](T x) { return std::exp(x); });
    case UnaryOp::kLog:
      return run([](T x) { return std::log(x); });
    case UnaryOp::kErf:
      return run([](T x) { return std::erf(x); });
    case UnaryOp::kReciprocal:
      return run([](T x) { return T(1) / x; });
    case UnaryOp::kFloor:
      return run([](T x) { return std::floor(x); });
    case UnaryOp::kCeil:
      return run([](T x) { return std::ceil(x); });
    // Halves go to the even neighbour: nearbyint under the default rounding mode.
    case UnaryOp::kRound:
      return run([](T x) { return std::nearbyint(x); });
    case UnaryOp::kSin:
      return run([](T x) { return std::sin(x); });
    case UnaryOp::kCos:
      return run([](T x) { return std::cos(x); });
    case UnaryOp::kTan:
      return run([](T x) { return std::tan(x); });
    case UnaryOp::kAsin:
      return run([](T x) { return std::asin(x); });
    case UnaryOp::kAcos:
      return run([](T x) { return std::acos(x); });
    case UnaryOp::kAtan:
      return run([](T x) { return std::atan(x); });
    case UnaryOp::kSinh:
      return run([](T x) { return std::sinh(x); });
    case UnaryOp::kCosh:
      return run([](T x) { return std::cosh(x); });
    case UnaryOp::kAsinh:
      return run([](T x) { return std::asinh(x); });
    case UnaryOp::kAcosh:
      return run([](T x) { return std::acosh(x); });
    case UnaryOp::kAtanh:
      return run([](T x) { return std::atanh(x); });
    case UnaryOp::kTanh:
      return run([](T x) { return std::tanh(x); });
    // Both branches only ever exponentiate a non-positive number, so neither overflows.
    case UnaryOp::kSigmoid:
      return run([](T x) {
        if (x >= 0) return T(1) / (T(1) + std::exp(-x));
        const T e = std::exp(x);
        return e / (T(1) + e);
      });
    case UnaryOp::kLeakyRelu:
      return run([=](T x) { return x < 0 ? alpha * x : x; });
    case UnaryOp::kElu:
      return run([=](T x) { return x < 0 ? alpha * std::expm1(x) : x; });
    case UnaryOp::kSelu:
      return run([=](T x) { return gamma * (x <= 0 ? alpha * std::expm1(x) : x); });
    case UnaryOp::kCelu:
      return run([=](T x) { return x < 0 ? alpha * std::expm1(x / alpha) : x; });
    case UnaryOp::kHardSigmoid:
      return run([=](T x) { return std::clamp(alpha * x + beta, T(0), T(1)); });
    case UnaryOp::kHardSwish:
      return run([](T x) { return x * std::clamp(x / T(6) + T(0.5), T(0), T(1)); });
    // log(1 + e^x) without overflowing e^x for large x.
    case UnaryOp::kSoftplus:
      return run(
          [](T x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); });
    case UnaryOp::kSoftsign:
      return run([](T x) { return x / (T(1) + std::abs(x)); });
    case UnaryOp::kThresholdedRelu:
      return run([=](T x) { return x > alpha ? x : T(0); });
    case UnaryOp::kShrink:
      return run([=](T x) { return x < -alpha ? x + beta : x > alpha ? x - beta : T(0); });
    default:
      undefined_for("unary", static_cast<int>(op), DTypeOf<T>::kValue);
  }
}

template <typename T, typename F>
void apply_binary(const T* a, Dims a_shape, const T* b, Dims b_shape, T* dst, Dims dst_shape, F f) {
  for_each_broadcast<2>(
      dst_shape, {a_shape, b_shape},
      [&](int64_t i, const std::array<int64_t, 2>& at) { dst[i] = f(a[at[0]], b[at[1]]); });
}

}  // namespace

template <typename T>
void unary(UnaryOp op, const UnaryParams& params, const T* src, T* dst, int64_t count) {
  const auto run = [&](auto f) { map(src, dst, count, f); };
  switch (op) {
    case UnaryOp::kAbs:
      if constexpr (kIsFloat<T>)
        return run([](T x) { return std::abs(x); });
      else
        return run([](T x) { return x < 0 ? sub<T>(0, x) : x; });
    case UnaryOp::kNeg:
      if constexpr (kIsFloat<T>)
        return run([](T x) { return -x; });
      else
        return run([](T x) { return sub<T>(0, x); });
    // Keeps zero (and NaN) as they are.
    case UnaryOp::kSign:
      return run([](T x) { return x > 0 ? T(1) : x < 0 ? T(-1) : x; });
    // NaN propagates, as in numpy.maximum(x, 0).
    case UnaryOp::kRelu:
      return run([](T x) { return x < 0 ? T(0) : x; });
    default:
      if constexpr (kIsFloat<T>)
        return float_unary(op, params, src, dst, count);
      else
        undefined_for("unary", static_cast<int>(op), DTypeOf<T>::kValue);
  }
}

template <typename T>
void clip(const T* src, T* dst, int64_t count, T lo, T hi) {
  map(src, dst, count, [=](T x) { return std::min(std::max(x, lo), hi); });
}

template <typename T>
void is_nan(const T* src, bool* dst, int64_t count) {
  for (int64_t i = 0; i < count; ++i) dst[i] = std::isnan(src[i]);
}

template <typename T>
void is_inf(const T* src, bool* dst, int64_t count, bool detect_negative, bool detect_positive) {
  for (int64_t i = 0; i < count; ++i) {
    const T x = src[i];
    dst[i] = std::isinf(x) && (x < 0 ? detect_negative : detect_positive);
  }
}

void logical_not(const bool* src, bool* dst, int64_t count) {
  for (int64_t i = 0; i < count; ++i) dst[i] = !src[i];
}

namespace {

// Calls fn(T{}) with T the C++ type of `dtype`.
template <typename Fn>
void visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      return fn(float{});
    case DType::kFloat64:
      return fn(double{});
    case DType::kInt64:
      return fn(int64_t{});
    case DType::kInt32:
      return fn(int32_t{});
    case DType::kInt8:
      return fn(int8_t{});
    case DType::kUInt8:
      return fn(uint8_t{});
    case DType::kBool:
      return fn(bool{});
  }
  throw Error(ErrorCode::kInternal, "cast: unknown dtype");
}

}  // namespace

void cast(DType src_type, const void* src, DType dst_type, void* dst, int64_t count) {
  visit_dtype(src_type, [&](auto s) {
    visit_dtype(dst_type, [&](auto d) {
      using S = decltype(s);
      using D = decltype(d);
      const S* in = static_cast<const S*>(src);
      D* out = static_cast<D*>(dst);
      for (int64_t i = 0; i < count; ++i) out[i] = convert<D>(in[i]);
    });
  });
}

template <typename T>
void binary(BinaryOp op, const T* a, Dims a_shape, const T* b, Dims b_shape, T* dst,
            Dims dst_shape) {
  const auto run = [&](auto f) { apply_binary(a, a_shape, b, b_shape, dst, dst_shape, f); };
  if constexpr (std::is_same_v<T, bool>) {
    switch (op) {
      case BinaryOp::kAnd:
        return run([](bool x, bool y) { return x && y; });
      case BinaryOp::kOr:
        return run([](bool x, bool y) { return x || y; });
      case BinaryOp::kXor:
        return run([](bool x, bool y) { return x != y; });
      default:
        break;
    }
  } else {
    switch (op) {
      case BinaryOp::kAdd:
        return run(add<T>);
      case BinaryOp::kSub:
        return run(sub<T>);
      case BinaryOp::kMul:
        return run(mul<T>);
      case BinaryOp::kDiv:
        return run(div<T>);
      case BinaryOp::kMax:
        return run(max<T>);
      case BinaryOp::kMin:
        return run(min<T>);
      case BinaryOp::kMod:
        return run(mod<T>);
      case BinaryOp::kFmod:
        return run(fmod<T>);
      case BinaryOp::kPRelu:
        return run([](T x, T slope) { return x < 0 ? mul(x, slope) : x; });
      case BinaryOp::kBitShiftLeft:
      case BinaryOp::kBitShiftRight:
        if constexpr (std::is_unsigned_v<T>) {
          const bool left = op == BinaryOp::kBitShiftLeft;
          return run([left](T x, T bits) { return shift(x, bits, left); });
        }
        break;
      default:
        break;
    }
  }
  undefined_for("binary", static_cast<int>(op), DTypeOf<T>::kValue);
}

template <typename T>
void compare(CompareOp op, const T* a, Dims a_shape, const T* b, Dims b_shape, bool* dst,
             Dims dst_shape) {
  const auto run = [&](auto f) {
    for_each_broadcast<2>(
        dst_shape, {a_shape, b_shape},
        [&](int64_t i, const std::array<int64_t, 2>& at) { dst[i] = f(a[at[0]], b[at[1]]); });
  };
  switch (op) {
    case CompareOp::kEqual:
      return run(std::equal_to<T>());
    case CompareOp::kLess:
      return run(std::less<T>());
    case CompareOp::kGreater:
      return run(std::greater<T>());
    case CompareOp::kLessOrEqual:
      return run(std::less_equal<T>());
    case CompareOp::kGreaterOrEqual:
      return run(std::greater_equal<T>());
  }
  undefined_for("compare", static_cast<int>(op), DTypeOf<T>::kValue);
}

template <typename T, typename E>
void pow(const T* base, Dims base_shape, const E* exponent, Dims exponent_shape, T* dst,
         Dims dst_shape) {
  for_each_broadcast<2>(
      dst_shape, {base_shape, exponent_shape}, [&](int64_t i, const std::array<int64_t, 2>& at) {
        dst[i] = convert<T>(
            std::pow(static_cast<double>(base[at[0]]), static_cast<double>(exponent[at[1]])));
      });
}

template <typename T>
void where(const bool* cond, Dims cond_shape, const T* x, Dims x_shape, const T* y, Dims y_shape,
           T* dst, Dims dst_shape) {
  for_each_broadcast<3>(dst_shape, {cond_shape, x_shape, y_shape},
                        [&](int64_t i, const std::array<int64_t, 3>& at) {
                          dst[i] = cond[at[0]] ? x[at[1]] : y[at[2]];
                        });
}

template <typename T>
void broadcast_to(const T* src, Dims src_shape, T* dst, Dims dst_shape) {
  for_each_broadcast<1>(dst_shape, {src_shape},
                        [&](int64_t i, const std::array<int64_t, 1>& at) { dst[i] = src[at[0]]; });
}

// ---- explicit instantiations ----

#define SPARSECOL_NUMERIC_TYPES(X) X(float) X(double) X(int64_t) X(int32_t) X(int8_t) X(uint8_t)
#define SPARSECOL_ALL_TYPES(X) SPARSECOL_NUMERIC_TYPES(X) X(bool)

#define SPARSECOL_NUMERIC(T)                                                  \
  template void unary<T>(UnaryOp, const UnaryParams&, const T*, T*, int64_t); \
  template void clip<T>(const T*, T*, int64_t, T, T);
SPARSECOL_NUMERIC_TYPES(SPARSECOL_NUMERIC)
#undef SPARSECOL_NUMERIC

#define SPARSECOL_ANY(T)                                                               \
  template void binary<T>(BinaryOp, const T*, Dims, const T*, Dims, T*, Dims);         \
  template void compare<T>(CompareOp, const T*, Dims, const T*, Dims, bool*, Dims);    \
  template void where<T>(const bool*, Dims, const T*, Dims, const T*, Dims, T*, Dims); \
  template void broadcast_to<T>(const T*, Dims, T*, Dims);
SPARSECOL_ALL_TYPES(SPARSECOL_ANY)
#undef SPARSECOL_ANY

#define SPARSECOL_FLOAT(T)                           \
  template void is_nan<T>(const T*, bool*, int64_t); \
  template void is_inf<T>(const T*, bool*, int64_t, bool, bool);
SPARSECOL_FLOAT(float)
SPARSECOL_FLOAT(double)
#undef SPARSECOL_FLOAT

#define SPARSECOL_POW(T, E) template void pow<T, E>(const T*, Dims, const E*, Dims, T*, Dims);
#define SPARSECOL_POW_BASE(T) \
  SPARSECOL_POW(T, float)     \
  SPARSECOL_POW(T, double)    \
  SPARSECOL_POW(T, int64_t)   \
  SPARSECOL_POW(T, int32_t) SPARSECOL_POW(T, int8_t) SPARSECOL_POW(T, uint8_t)
SPARSECOL_POW_BASE(float)
SPARSECOL_POW_BASE(double)
SPARSECOL_POW_BASE(int64_t)
SPARSECOL_POW_BASE(int32_t)
#undef SPARSECOL_POW_BASE
#undef SPARSECOL_POW

}  // namespace sparsecol::kernels::reference
