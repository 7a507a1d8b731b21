// Naive reference Resize (ONNX opsets 11 to 17): each output element is the tensor product of
// one 1-D interpolation per axis, computed in double, with the taps and weights of ONNX's own
// reference implementation (onnx/backend/test/case/node/resize.py).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace sparsecol::kernels::reference {

enum class ResizeMode { kNearest, kLinear, kCubic };

// How an output coordinate maps to an input one (ONNX's coordinate_transformation_mode).
enum class ResizeCoordinates {
  kHalfPixel,
  kPytorchHalfPixel,
  kAlignCorners,
  kAsymmetric,
  kTfHalfPixelForNn,
  kTfCropAndResize,
};

// Which of the two input elements around a coordinate nearest mode takes (ONNX's nearest_mode).
enum class NearestRounding { kRoundPreferFloor, kRoundPreferCeil, kFloor, kCeil };

struct ResizeParams {
  ResizeMode mode = ResizeMode::kNearest;
  ResizeCoordinates coordinates = ResizeCoordinates::kHalfPixel;
  NearestRounding nearest = NearestRounding::kRoundPreferFloor;
  double cubic_coeff_a = -0.75;
  // Cubic: taps outside the input get weight 0 and the rest are renormalized (else they read the
  // nearest edge element, as every mode does).
  bool exclude_outside = false;
  // tf_crop_and_resize: the value of output elements whose input coordinate is outside the input.
  float extrapolation_value = 0.0f;
  // Per axis, output length / input length as the coordinate mapping uses it: the `scales`
  // input, or the output size over the input size when `sizes` gives the output.
  std::vector<double> scales;
  // tf_crop_and_resize: the region of interest, every axis' start then every axis' end, as
  // fractions of the input length minus one.
  std::vector<double> roi;
};

// src of src_shape resized into dst of dst_shape (same rank, every length > 0 where dst has
// elements).
void resize(const float* src, std::span<const int64_t> src_shape, float* dst,
            std::span<const int64_t> dst_shape, const ResizeParams& params);

// GridSample (opset 16): output pixel (n, c, i, j) samples channel c of image n at the point
// grid[n, i, j] = (x, y), normalized to [-1, 1] across the image (align_corners: the corner
// pixels' centres, else their outer edges). Points and taps off the image read zeros, the
// border pixels (kBorder) or the image reflected at its edges (kReflection). Bicubic uses Keys'
// weights with a = -0.75; nearest rounds halves to even. Computed in double.
enum class GridSampleMode { kBilinear, kNearest, kBicubic };
enum class GridPadding { kZeros, kBorder, kReflection };
struct GridSampleShape {
  int64_t batch = 0, channels = 0, in_h = 0, in_w = 0, out_h = 0, out_w = 0;
  GridSampleMode mode = GridSampleMode::kBilinear;
  GridPadding padding = GridPadding::kZeros;
  bool align_corners = false;
};
// x is [batch, channels, in_h, in_w], grid [batch, out_h, out_w, 2], y [batch, channels, out_h,
// out_w].
void grid_sample(const float* x, const float* grid, float* y, const GridSampleShape& shape);

}  // namespace sparsecol::kernels::reference
