// How far one tensor is from another: what `bench` reports as agreement between paths and
// `check` as error against ONNX test data. One implementation, so that the two never disagree
// about NaN, infinities or integer outputs.
#pragma once

#include <cstdint>
#include <vector>

#include "sparsecol/sparsecol.h"

namespace sparsecol::cli {

struct Difference {
  double max_abs = 0;  // max |actual - expected|
  double max_rel = 0;  // max |actual - expected| / |expected| (infinite where expected is 0)
  // max_abs / max |expected| over the finite expected values: a scale-free single number for a
  // whole tensor, robust to outputs near zero (what `bench` compares paths with).
  double max_abs_over_max = 0;
  // Elements outside |actual - expected| <= atol + rtol * |expected| (numpy.isclose's rule, as
  // ONNX's backend test runner applies it); integer and bool tensors must be equal.
  int64_t outside = 0;
};

// `actual` and `expected` must have the same dtype and shape (the caller reports otherwise).
// NaN matches NaN, an infinity the same infinity; NaN against a number is infinitely far.
Difference compare(const Tensor& actual, const Tensor& expected, double atol, double rtol);

// Every element as a double (int64 beyond 2^53 loses precision; fine for differences).
std::vector<double> as_doubles(const Tensor& tensor);

}  // namespace sparsecol::cli
