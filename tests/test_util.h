// Small helpers shared by the tests: comparing tensors with a tolerance (reporting the max
// absolute and relative error and where the worst element is), seeded random tensors, slicing
// a batch.
//
//   EXPECT_TRUE(sparsecol::test::tensors_near(actual, expected, /*rtol=*/1e-3, /*atol=*/1e-5));
//   sparsecol::Tensor x = sparsecol::test::random_tensor({2, 3, 8, 8}, /*seed=*/42);
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sparsecol/sparsecol.h"

namespace sparsecol::test {

// Whether this is an AddressSanitizer or ThreadSanitizer build: their runtimes keep shadow memory
// and quarantined frees, so tests about the address space or peak memory do not hold there.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

// Runs `fn` and checks that it throws a sparsecol::Error with `code` whose message contains each
// of `parts`. Returns the message (empty when nothing was thrown).
template <typename Fn>
std::string expect_error(Fn&& fn, ErrorCode code, std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_STREQ(to_string(e.code()), to_string(code)) << message;
    for (const std::string& part : parts) {
      EXPECT_NE(message.find(part), std::string::npos)
          << "message does not name '" << part << "': " << message;
    }
    return message;
  }
  ADD_FAILURE() << "no sparsecol::Error thrown";
  return {};
}

// The multi-index of row-major flat index `flat` in `shape`, and back: the tests' own index
// arithmetic, independent of the library's.
inline std::vector<int64_t> unravel(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> index(shape.size());
  for (std::size_t a = shape.size(); a-- > 0;) {
    index[a] = flat % shape[a];
    flat /= shape[a];
  }
  return index;
}

inline int64_t ravel(const std::vector<int64_t>& index, const std::vector<int64_t>& shape) {
  int64_t flat = 0;
  for (std::size_t a = 0; a < shape.size(); ++a) flat = flat * shape[a] + index[a];
  return flat;
}

inline std::string shape_string(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// The multi-index of flat element `index` in a C-ordered tensor of `shape`, as "[i, j, k]".
inline std::string index_string(const std::vector<int64_t>& shape, int64_t index) {
  std::vector<int64_t> idx(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    if (shape[d] > 0) {
      idx[d] = index % shape[d];
      index /= shape[d];
    }
  }
  return shape_string(idx);
}

// Every element of a tensor of any dtype, as doubles (exact for every dtype but int64 beyond
// 2^53, which no test uses).
inline std::vector<double> to_doubles(const Tensor& t) {
  const auto n = static_cast<std::size_t>(t.numel());
  std::vector<double> out(n);
  auto copy = [&](const auto* p) {
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<double>(p[i]);
  };
  switch (t.dtype()) {
    case DType::kFloat32:
      copy(t.data<float>());
      break;
    case DType::kFloat64:
      copy(t.data<double>());
      break;
    case DType::kInt64:
      copy(t.data<int64_t>());
      break;
    case DType::kInt32:
      copy(t.data<int32_t>());
      break;
    case DType::kInt8:
      copy(t.data<int8_t>());
      break;
    case DType::kUInt8:
      copy(t.data<uint8_t>());
      break;
    case DType::kBool:
      copy(t.data<bool>());
      break;
  }
  return out;
}

inline bool is_floating(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64;
}

// How far `actual` is from `expected`, element by element. An element matches when both are
// NaN, when both are equal (infinities included), or when |a - e| <= atol + rtol * |e| (the
// numpy.testing.assert_allclose rule, which ONNX's backend tests use).
struct TensorDiff {
  int64_t count = 0;       // elements compared
  int64_t mismatches = 0;  // elements outside the tolerance
  double max_abs_err = 0;  // over finite pairs
  double max_rel_err = 0;  // |a - e| / |e| over finite pairs with e != 0
  double max_abs_expected = 0;
  int64_t worst_index = -1;  // the element furthest outside its tolerance (-1: none outside)
  double worst_actual = 0;
  double worst_expected = 0;
};

inline TensorDiff diff_tensors(const Tensor& actual, const Tensor& expected, double rtol,
                               double atol) {
  const std::vector<double> a = to_doubles(actual);
  const std::vector<double> e = to_doubles(expected);
  TensorDiff diff;
  diff.count = static_cast<int64_t>(std::min(a.size(), e.size()));
  double worst_excess = 0;
  for (int64_t i = 0; i < diff.count; ++i) {
    const double x = a[static_cast<std::size_t>(i)];
    const double y = e[static_cast<std::size_t>(i)];
    if (std::isfinite(y)) diff.max_abs_expected = std::max(diff.max_abs_expected, std::abs(y));
    if ((std::isnan(x) && std::isnan(y)) || x == y) continue;
    const double err = std::abs(x - y);
    if (std::isfinite(err)) {
      diff.max_abs_err = std::max(diff.max_abs_err, err);
      if (y != 0) diff.max_rel_err = std::max(diff.max_rel_err, err / std::abs(y));
    }
    const double allowed = atol + rtol * std::abs(y);
    if (err <= allowed) continue;  // false for NaN err: NaN vs number is a mismatch
    ++diff.mismatches;
    // NaN or infinite excess counts as the worst.
    const double excess = std::isfinite(err) ? err - allowed : HUGE_VAL;
    if (diff.worst_index < 0 || excess > worst_excess) {
      worst_excess = excess;
      diff.worst_index = i;
      diff.worst_actual = x;
      diff.worst_expected = y;
    }
  }
  return diff;
}

// "max abs err 1.2e-06, max rel err 3.4e-05, max |expected| 2.1" for logs.
inline std::string describe_errors(const TensorDiff& diff) {
  return fmt::format("max abs err {:.3g}, max rel err {:.3g}, max |expected| {:.4g}",
                     diff.max_abs_err, diff.max_rel_err, diff.max_abs_expected);
}

// Checks dtype, shape and values. Floating tensors match within rtol/atol; integer and bool
// tensors must be equal. The failure message says how many elements differ, the max errors,
// and the worst element's index and values.
inline ::testing::AssertionResult tensors_near(const Tensor& actual, const Tensor& expected,
                                               double rtol, double atol) {
  if (actual.dtype() != expected.dtype()) {
    return ::testing::AssertionFailure()
           << "dtype " << to_string(actual.dtype()) << ", expected " << to_string(expected.dtype());
  }
  if (actual.shape() != expected.shape()) {
    return ::testing::AssertionFailure() << "shape " << shape_string(actual.shape())
                                         << ", expected " << shape_string(expected.shape());
  }
  if (!is_floating(expected.dtype())) rtol = atol = 0;
  const TensorDiff diff = diff_tensors(actual, expected, rtol, atol);
  if (diff.mismatches == 0) return ::testing::AssertionSuccess() << describe_errors(diff);
  return ::testing::AssertionFailure()
         << diff.mismatches << " of " << diff.count << " elements differ beyond atol " << atol
         << " + rtol " << rtol << " * |expected|; " << describe_errors(diff) << "; worst at "
         << index_string(expected.shape(), diff.worst_index) << ": actual "
         << fmt::format("{:.9g}", diff.worst_actual) << ", expected "
         << fmt::format("{:.9g}", diff.worst_expected);
}

// A float32 tensor of uniform values in [lo, hi), the same for the same seed.
inline Tensor random_tensor(std::vector<int64_t> shape, uint32_t seed, float lo = -1.0F,
                            float hi = 1.0F) {
  Tensor t = Tensor::zeros(DType::kFloat32, std::move(shape));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

// A float32 tensor of N(mean, stddev) values, the same for the same seed.
inline Tensor random_normal_tensor(std::vector<int64_t> shape, uint32_t seed, float mean = 0.0F,
                                   float stddev = 1.0F) {
  Tensor t = Tensor::zeros(DType::kFloat32, std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(mean, stddev);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

// An owning copy of samples [begin, begin + count) along the first axis.
inline Tensor slice_batch(const Tensor& t, int64_t begin, int64_t count) {
  if (t.rank() == 0 || begin < 0 || count < 0 || begin + count > t.dim(0)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("cannot slice samples [{}, {}) of a tensor of shape {}", begin,
                            begin + count, shape_string(t.shape())));
  }
  std::vector<int64_t> shape = t.shape();
  shape[0] = count;
  Tensor out = Tensor::zeros(t.dtype(), shape);
  const std::size_t sample_bytes =
      t.dim(0) == 0 ? 0 : t.nbytes() / static_cast<std::size_t>(t.dim(0));
  if (out.nbytes() > 0) {
    std::memcpy(
        out.raw_data(),
        static_cast<const char*>(t.raw_data()) + static_cast<std::size_t>(begin) * sample_bytes,
        out.nbytes());
  }
  return out;
}

}  // namespace sparsecol::test
