#include "reference/reduce.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace sparsecol::kernels::reference {

namespace {

int64_t product(Dims dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

// The one reduce loop: folds map(x, slot) into the accumulator of each element's output slot.
// The broadcast iterator walks `src` in order with the kept-dims shape as its operand, so the
// operand offset it reports is exactly the output slot.
template <typename T, typename Acc, typename Map, typename Combine>
std::vector<Acc> accumulate(const T* src, Dims shape, Dims kept, Acc init, Map map,
                            Combine combine) {
  std::vector<Acc> acc(static_cast<std::size_t>(product(kept)), init);
  for_each_broadcast<1>(shape, {kept}, [&](int64_t i, const std::array<int64_t, 1>& slot) {
    Acc& a = acc[static_cast<std::size_t>(slot[0])];
    a = combine(a, map(src[i], slot[0]));
  });
  return acc;
}

template <typename T>
T nan_max(T a, T b) {
  return is_nan_value(a) || b < a ? a : b;
}
template <typename T>
T nan_min(T a, T b) {
  return is_nan_value(a) || a < b ? a : b;
}

}  // namespace

template <typename T>
void reduce(ReduceOp op, const T* src, Dims shape, std::span<const int64_t> axes, T* dst) {
  // Sums and products of integers run in uint64_t, whose overflow wraps (signed overflow would
  // be undefined); converting back to T keeps the low bits, as wrapping T arithmetic would.
  using Wide = std::conditional_t<kIsFloat<T>, double, uint64_t>;
  std::vector<int64_t> kept(shape.begin(), shape.end());
  int64_t group = 1;  // elements per output slot
  int64_t previous = -1;
  for (int64_t axis : axes) {
    if (axis <= previous || axis >= static_cast<int64_t>(shape.size())) {
      throw Error(ErrorCode::kInternal,
                  fmt::format("reduce: axes [{}] are not ascending axes of a rank-{} tensor",
                              fmt::join(axes, ", "), shape.size()));
    }
    previous = axis;
    group *= shape[axis];
    kept[axis] = 1;
  }
  const auto out_count = static_cast<std::size_t>(product(kept));
  const auto wide = [](T x, int64_t) { return static_cast<Wide>(x); };
  const auto plus = [](Wide a, Wide b) { return a + b; };
  const auto store = [&](const auto& acc) {
    for (std::size_t o = 0; o < out_count; ++o) dst[o] = static_cast<T>(acc[o]);
  };
  // For the reductions whose result is irrational: finish in double, then convert to T
  // through the cast kernel (which saturates rather than overflowing for integer T).
  const auto store_double = [&](const std::vector<double>& acc, auto finish) {
    std::vector<double> result(out_count);
    for (std::size_t o = 0; o < out_count; ++o) result[o] = finish(acc[o], o);
    cast(DType::kFloat64, result.data(), DTypeOf<T>::kValue, dst, static_cast<int64_t>(out_count));
  };
  const auto as_double = [](T x, int64_t) { return static_cast<double>(x); };
  const auto square = [](double a, double x) { return a + x * x; };

  switch (op) {
    case ReduceOp::kSum:
      return store(accumulate(src, shape, kept, Wide(0), wide, plus));
    case ReduceOp::kSumSquare:
      return store(
          accumulate(src, shape, kept, Wide(0), wide, [](Wide a, Wide x) { return a + x * x; }));
    case ReduceOp::kL1:
      return store(accumulate(src, shape, kept, Wide(0), wide, [](Wide a, Wide x) {
        if constexpr (kIsFloat<T>)
          return a + std::abs(x);
        else
          return a + (static_cast<T>(x) < 0 ? Wide(0) - x : x);
      }));
    case ReduceOp::kProd:
      return store(
          accumulate(src, shape, kept, Wide(1), wide, [](Wide a, Wide x) { return a * x; }));
    case ReduceOp::kMean: {
      const std::vector<Wide> sum = accumulate(src, shape, kept, Wide(0), wide, plus);
      for (std::size_t o = 0; o < out_count; ++o) {
        if constexpr (kIsFloat<T>) {
          dst[o] = static_cast<T>(sum[o] / static_cast<double>(group));
        } else {
          dst[o] = group == 0 ? T(0) : static_cast<T>(static_cast<int64_t>(sum[o]) / group);
        }
      }
      return;
    }
    case ReduceOp::kMax: {
      const T lowest =
          kIsFloat<T> ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::lowest();
      const auto same = [](T x, int64_t) { return x; };
      return store(accumulate(src, shape, kept, lowest, same, nan_max<T>));
    }
    case ReduceOp::kMin: {
      const T highest =
          kIsFloat<T> ? std::numeric_limits<T>::infinity() : std::numeric_limits<T>::max();
      const auto same = [](T x, int64_t) { return x; };
      return store(accumulate(src, shape, kept, highest, same, nan_min<T>));
    }
    case ReduceOp::kL2:
      return store_double(accumulate(src, shape, kept, 0.0, as_double, square),
                          [](double a, std::size_t) { return std::sqrt(a); });
    case ReduceOp::kLogSum:
      return store_double(
          accumulate(src, shape, kept, 0.0, as_double, [](double a, double x) { return a + x; }),
          [](double a, std::size_t) { return std::log(a); });
    case ReduceOp::kLogSumExp: {
      // Shift by the group's maximum so that no exponential overflows; an infinite maximum
      // (or an empty group) is left unshifted, where exp already gives the exact answer.
      std::vector<double> shift =
          accumulate(src, shape, kept, -std::numeric_limits<double>::infinity(), as_double,
                     [](double a, double x) { return std::isnan(x) || x > a ? x : a; });
      for (double& s : shift) s = std::isfinite(s) ? s : 0.0;
      const auto shifted_exp = [&](T x, int64_t slot) {
        return std::exp(static_cast<double>(x) - shift[static_cast<std::size_t>(slot)]);
      };
      return store_double(
          accumulate(src, shape, kept, 0.0, shifted_exp, [](double a, double e) { return a + e; }),
          [&](double a, std::size_t o) { return std::log(a) + shift[o]; });
    }
  }
  throw Error(ErrorCode::kInternal, fmt::format("reduce: unknown op #{}", static_cast<int>(op)));
}

template <typename T>
void arg_reduce(bool is_max, bool select_last_index, const T* src, Dims shape, int64_t axis,
                int64_t* dst) {
  if (axis < 0 || axis >= static_cast<int64_t>(shape.size()) || shape[axis] == 0) {
    throw Error(ErrorCode::kInternal, fmt::format("arg_reduce: bad axis {}", axis));
  }
  std::vector<int64_t> kept(shape.begin(), shape.end());
  kept[axis] = 1;
  // A second broadcast operand of shape [n, 1, ..., 1] (the reduced axis, then the trailing
  // dims as 1) has, as its offset, each element's position along the axis.
  std::vector<int64_t> position(shape.begin() + axis, shape.end());
  std::fill(position.begin() + 1, position.end(), 1);

  struct Best {
    T value{};
    int64_t index = -1;
  };
  std::vector<Best> best(static_cast<std::size_t>(product(kept)));
  for_each_broadcast<2>(shape, {Dims(kept), Dims(position)},
                        [&](int64_t i, const std::array<int64_t, 2>& at) {
                          Best& b = best[static_cast<std::size_t>(at[0])];
                          const T x = src[i];
                          bool take = b.index < 0;
                          if (!take && !is_nan_value(b.value)) {
                            take = is_nan_value(x) || (is_max ? x > b.value : x < b.value) ||
                                   (select_last_index && x == b.value);
                          }
                          if (take) b = Best{x, at[1]};
                        });
  for (std::size_t o = 0; o < best.size(); ++o) dst[o] = best[o].index;
}

#define SPARSECOL_REDUCE(T)                                                        \
  template void reduce<T>(ReduceOp, const T*, Dims, std::span<const int64_t>, T*); \
  template void arg_reduce<T>(bool, bool, const T*, Dims, int64_t, int64_t*);
SPARSECOL_REDUCE(float)
SPARSECOL_REDUCE(double)
SPARSECOL_REDUCE(int64_t)
SPARSECOL_REDUCE(int32_t)
SPARSECOL_REDUCE(int8_t)
SPARSECOL_REDUCE(uint8_t)
#undef SPARSECOL_REDUCE

}  // namespace sparsecol::kernels::reference
