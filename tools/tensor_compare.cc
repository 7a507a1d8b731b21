#include "tensor_compare.h"

#include <algorithm>
#include <cmath>

namespace sparsecol::cli {

std::vector<double> as_doubles(const Tensor& tensor) {
  std::vector<double> values(static_cast<std::size_t>(tensor.numel()));
  const auto copy = [&](const auto* src) { std::copy(src, src + values.size(), values.begin()); };
  switch (tensor.dtype()) {
    case DType::kFloat32:
      copy(tensor.data<float>());
      break;
    case DType::kFloat64:
      copy(tensor.data<double>());
      break;
    case DType::kInt64:
      copy(tensor.data<int64_t>());
      break;
    case DType::kInt32:
      copy(tensor.data<int32_t>());
      break;
    case DType::kInt8:
      copy(tensor.data<int8_t>());
      break;
    case DType::kUInt8:
      copy(tensor.data<uint8_t>());
      break;
    case DType::kBool:
      copy(tensor.data<bool>());
      break;
  }
  return values;
}

Difference compare(const Tensor& actual, const Tensor& expected, double atol, double rtol) {
  const std::vector<double> a = as_doubles(actual), e = as_doubles(expected);
  const bool exact = expected.dtype() != DType::kFloat32 && expected.dtype() != DType::kFloat64;
  Difference diff;
  double max_ref = 0;
  for (std::size_t i = 0; i < a.size() && i < e.size(); ++i) {
    if (std::isfinite(e[i])) max_ref = std::max(max_ref, std::abs(e[i]));
    if (a[i] == e[i] || (std::isnan(a[i]) && std::isnan(e[i]))) continue;  // equal infinities too
    const double err = std::abs(a[i] - e[i]);  // NaN or infinite for NaN/infinity vs a number
    const double abs_err = std::isnan(err) ? HUGE_VAL : err;
    diff.max_abs = std::max(diff.max_abs, abs_err);
    diff.max_rel = std::max(diff.max_rel, e[i] == 0 ? HUGE_VAL : abs_err / std::abs(e[i]));
    if (exact || !(abs_err <= atol + rtol * std::abs(e[i]))) ++diff.outside;
  }
  if (a.size() != e.size()) diff.outside += 1;
  diff.max_abs_over_max = max_ref > 0 ? diff.max_abs / max_ref : diff.max_abs;
  return diff;
}

}  // namespace sparsecol::cli
