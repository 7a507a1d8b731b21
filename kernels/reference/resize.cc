#include "reference/resize.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <type_traits>

#include <omp.h>

namespace sparsecol::kernels::reference {

namespace {

// Below this many taps summed in a pass, waking a thread team costs more than the work saves.
constexpr int64_t kMinParallelWork = 1 << 16;

struct Tap {
  int64_t index;  // clamped into the input
  double weight;
};

// One axis' interpolation: the taps of every output coordinate.
struct AxisTaps {
  std::vector<std::size_t> first;  // output coordinate o reads taps [first[o], first[o + 1])
  std::vector<Tap> taps;
  std::vector<bool> outside;  // tf_crop_and_resize: o maps outside the input
};

// The input coordinate of output coordinate `o` of `out` (ONNX's coordinate_transformation_mode,
// as its spec writes the formulas). Where they divide by the output length less one, that is the
// output's length itself, as in PyTorch's align_corners: ONNX 1.12's reference implementation
// (and so the expected outputs of its align_corners tests with fractional scales) uses scale x
// input length there instead, which PyTorch's exports of interpolate(scale_factor=2.5,
// align_corners=True) would not match.
double source_coordinate(int64_t o, int64_t in, int64_t out, double scale, double roi_start,
                         double roi_end, ResizeCoordinates mode) {
  const double x = static_cast<double>(o);
  const double last_in = static_cast<double>(in - 1);
  const double last_out = static_cast<double>(out - 1);
  switch (mode) {
    case ResizeCoordinates::kHalfPixel:
      return (x + 0.5) / scale - 0.5;
    case ResizeCoordinates::kPytorchHalfPixel:
      return out > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
    case ResizeCoordinates::kAlignCorners:
      return out == 1 ? 0.0 : x * last_in / last_out;
    case ResizeCoordinates::kAsymmetric:
      return x / scale;
    case ResizeCoordinates::kTfHalfPixelForNn:
      return (x + 0.5) / scale;
    case ResizeCoordinates::kTfCropAndResize:
      return roi_start * last_in + (out == 1 ? (roi_end - roi_start) * last_in / 2.0
                                             : x * (roi_end - roi_start) * last_in / last_out);
  }
  return 0.0;
}

// Keys' cubic convolution weights of the four taps at offsets -1, 0, 1, 2 from floor(x), for
// x - floor(x) = ratio.
void cubic_weights(double ratio, double a, double (&w)[4]) {
  const auto far = [a](double d) { return ((a * d - 5.0 * a) * d + 8.0 * a) * d - 4.0 * a; };
  const auto near = [a](double d) { return ((a + 2.0) * d - (a + 3.0)) * d * d + 1.0; };
  w[0] = far(ratio + 1.0);
  w[1] = near(ratio);
  w[2] = near(1.0 - ratio);
  w[3] = far(2.0 - ratio);
}

AxisTaps axis_taps(int64_t in, int64_t out, double scale, double roi_start, double roi_end,
                   const ResizeParams& p) {
  AxisTaps axis;
  axis.first.push_back(0);
  axis.outside.assign(static_cast<std::size_t>(out), false);
  for (int64_t o = 0; o < out; ++o) {
    const double x = source_coordinate(o, in, out, scale, roi_start, roi_end, p.coordinates);
    if (p.coordinates == ResizeCoordinates::kTfCropAndResize &&
        (x < 0.0 || x > static_cast<double>(in - 1))) {
      axis.outside[static_cast<std::size_t>(o)] = true;
    }
    // x lies in (base, base + 1]: an integer x is the right end of its interval, as in ONNX's
    // reference, so a tap exactly on an input element gets the whole weight.
    auto base = static_cast<int64_t>(std::floor(x));
    double ratio = x - static_cast<double>(base);
    if (ratio == 0.0) {
      base -= 1;
      ratio = 1.0;
    }
    std::vector<Tap> taps;
    switch (p.mode) {
      case ResizeMode::kNearest: {
        bool right = true;
        if (ratio != 1.0) {
          switch (p.nearest) {
            case NearestRounding::kRoundPreferFloor:
              right = ratio > 0.5;
              break;
            case NearestRounding::kRoundPreferCeil:
              right = ratio >= 0.5;
              break;
            case NearestRounding::kFloor:
              right = false;
              break;
            case NearestRounding::kCeil:
              right = true;
              break;
          }
        }
        taps.push_back({right ? base + 1 : base, 1.0});
        break;
      }
      case ResizeMode::kLinear:
        if (ratio != 1.0) taps.push_back({base, 1.0 - ratio});
        taps.push_back({base + 1, ratio});
        break;
      case ResizeMode::kCubic: {
        double w[4];
        cubic_weights(ratio, p.cubic_coeff_a, w);
        for (int k = 0; k < 4; ++k) taps.push_back({base - 1 + k, w[k]});
        break;
      }
    }
    if (p.exclude_outside && p.mode != ResizeMode::kNearest) {
      double sum = 0.0;
      for (Tap& t : taps) {
        if (t.index < 0 || t.index >= in) t.weight = 0.0;
        sum += t.weight;
      }
      for (Tap& t : taps) t.weight /= sum;
    }
    for (Tap& t : taps) {
      t.index = t.index < 0 ? 0 : t.index >= in ? in - 1 : t.index;  // the edge element
      axis.taps.push_back(t);
    }
    axis.first.push_back(axis.taps.size());
  }
  return axis;
}

bool is_identity(const AxisTaps& axis) {
  for (std::size_t o = 0; o + 1 < axis.first.size(); ++o) {
    const Tap& t = axis.taps[axis.first[o]];
    if (axis.first[o + 1] - axis.first[o] != 1 || t.index != static_cast<int64_t>(o) ||
        t.weight != 1.0 || axis.outside[o]) {
      return false;
    }
  }
  return true;
}

// The pass over one axis: [outer, in, inner] `from` into [outer, out, inner] `to`, each output
// element the sum in double of its taps' elements, in tap order. Output rows are independent and
// each is summed in one order, so threads share them and the result does not depend on their
// number. A row longer than one element is summed tap by tap over the whole row (vectors of
// doubles), into doubles of the thread's own where `to` holds floats; a single element, in a
// register (its sum is one short chain of adds).
template <typename From, typename To>
void resize_pass(const From* from, To* to, int64_t outer, int64_t in, int64_t out, int64_t inner,
                 const AxisTaps& axis) {
  const Tap* taps = axis.taps.data();
  const std::size_t* first = axis.first.data();
  const bool parallel = outer * static_cast<int64_t>(axis.taps.size()) * inner > kMinParallelWork;
  constexpr bool kToDouble = std::is_same_v<To, double>;
  // Allocated here: an exception must not leave a parallel region.
  std::vector<double> sums(
      kToDouble || inner == 1 ? 0 : static_cast<std::size_t>(omp_get_max_threads() * inner));
#pragma omp parallel if (parallel)
  {
    double* sum = sums.empty() ? nullptr : sums.data() + omp_get_thread_num() * inner;
#pragma omp for collapse(2) schedule(static)
    for (int64_t i = 0; i < outer; ++i) {
      for (int64_t o = 0; o < out; ++o) {
        const From* rows = from + i * in * inner;
        To* d = to + (i * out + o) * inner;
        const std::size_t t0 = first[o], t1 = first[o + 1];
        if (inner == 1) {
          double one = 0.0;
          for (std::size_t t = t0; t < t1; ++t) {
            one += taps[t].weight * static_cast<double>(rows[taps[t].index]);
          }
          *d = static_cast<To>(one);
          continue;
        }
        double* acc = nullptr;
        if constexpr (kToDouble) {
          acc = d;
        } else {
          acc = sum;
        }
        std::fill_n(acc, inner, 0.0);
        for (std::size_t t = t0; t < t1; ++t) {
          const double w = taps[t].weight;
          const From* s = rows + taps[t].index * inner;
          for (int64_t k = 0; k < inner; ++k) acc[k] += w * static_cast<double>(s[k]);
        }
        if constexpr (!kToDouble) {
          for (int64_t k = 0; k < inner; ++k) d[k] = static_cast<float>(acc[k]);
        }
      }
    }
  }
}

}  // namespace

// One pass per resized axis, the last axis first: the pass over axis a sums, for each output
// coordinate, its taps' rows of the [outer, length, inner] view. Nesting the sums so (the last
// axis' inside) is the order of ONNX's reference, which recurses from the first axis, and one
// contiguous row per tap makes each pass a few instructions per element where a recursion per
// element took ~30 ns (LRASPP's upsampling of 21 x 28 x 28 to 224 x 224). The first pass reads
// the input and the last one writes the output, so only the passes between hold doubles, in
// buffers the thread keeps. Against a double copy of the input, a buffer per pass and a copy
// back, single-threaded (2 threads, Zen 3, layer by layer, alternated runs): LRASPP's final
// upsampling 3.9-5.2 -> 1.4-1.8 ms at batch 1 and 37-47 -> 5.1-5.5 ms at batch 4,
// small_segmenter's 170-250 -> 80-110 us at batch 1.
void resize(const float* src, std::span<const int64_t> src_shape, float* dst,
            std::span<const int64_t> dst_shape, const ResizeParams& params) {
  const std::size_t rank = src_shape.size();
  std::vector<AxisTaps> axes;
  int64_t count = 1;
  for (std::size_t a = 0; a < rank; ++a) {
    const double start = params.roi.empty() ? 0.0 : params.roi[a];
    const double end = params.roi.empty() ? 1.0 : params.roi[rank + a];
    axes.push_back(axis_taps(src_shape[a], dst_shape[a], params.scales[a], start, end, params));
    count *= dst_shape[a];
  }
  if (count == 0) return;

  std::vector<std::size_t> resized;  // the axes that change, last first
  for (std::size_t a = rank; a-- > 0;) {
    if (src_shape[a] != dst_shape[a] || !is_identity(axes[a])) resized.push_back(a);
  }
  if (resized.empty()) std::copy(src, src + count, dst);
  std::vector<int64_t> shape(src_shape.begin(), src_shape.end());
  // The passes' results between the first and the last, kept by the calling thread from call to
  // call: with a new buffer per call, written by both threads, small_segmenter's upsampling at
  // batch 8 ran 1.4x slower on two threads than the single-threaded code (each call faulted its
  // pages in again, and freeing them flushes the other core's TLB).
  thread_local std::vector<double> between[2];
  const double* from = nullptr;  // the previous pass's result; the input before the first
  for (std::size_t p = 0; p < resized.size(); ++p) {
    const std::size_t a = resized[p];
    int64_t outer = 1, inner = 1;
    for (std::size_t b = 0; b < a; ++b) outer *= shape[b];
    for (std::size_t b = a + 1; b < rank; ++b) inner *= shape[b];
    const int64_t in = shape[a], out = dst_shape[a];
    shape[a] = out;
    auto pass = [&](auto* to) {
      if (p == 0) {
        resize_pass(src, to, outer, in, out, inner, axes[a]);
      } else {
        resize_pass(from, to, outer, in, out, inner, axes[a]);
      }
    };
    if (p + 1 == resized.size()) {
      pass(dst);
      break;
    }
    std::vector<double>& to = between[p % 2];
    to.resize(static_cast<std::size_t>(outer * out * inner));
    pass(to.data());
    from = to.data();
  }

  // tf_crop_and_resize: an element whose coordinate on any axis falls outside the input.
  if (params.coordinates != ResizeCoordinates::kTfCropAndResize) return;
  std::vector<int64_t> at(rank, 0);
  for (int64_t i = 0; i < count; ++i) {
    bool outside = false;
    for (std::size_t a = 0; a < rank; ++a) {
      outside = outside || axes[a].outside[static_cast<std::size_t>(at[a])];
    }
    if (outside) dst[i] = params.extrapolation_value;
    for (std::size_t a = rank; a-- > 0;) {  // the next output index, last axis fastest
      if (++at[a] < dst_shape[a]) break;
      at[a] = 0;
    }
  }
}

namespace {

// x reflected into [lo, hi] as often as it takes (a mirror at each end).
double reflect(double x, double lo, double hi) {
  const double range = hi - lo;
  if (range <= 0.0) return lo;
  if (x >= lo && x <= hi) return x;
  const double d = x < lo ? lo - x : x - hi;
  const double flips = std::floor(d / range), rest = d - flips * range;
  const bool back = static_cast<int64_t>(flips) % 2 == 0;  // an even number of mirrors crossed
  return x < lo ? (back ? lo + rest : hi - rest) : (back ? hi - rest : lo + rest);
}

}  // namespace

void grid_sample(const float* x, const float* grid, float* y, const GridSampleShape& s) {
  const double lo_x = s.align_corners ? 0.0 : -0.5,
               hi_x = s.align_corners ? s.in_w - 1 : s.in_w - 0.5;
  const double lo_y = s.align_corners ? 0.0 : -0.5,
               hi_y = s.align_corners ? s.in_h - 1 : s.in_h - 0.5;
  // Normalized [-1, 1] to pixel coordinates.
  auto pixel = [&](double v, int64_t size) {
    return s.align_corners ? (v + 1.0) / 2.0 * static_cast<double>(size - 1)
                           : ((v + 1.0) * static_cast<double>(size) - 1.0) / 2.0;
  };
  for (int64_t n = 0; n < s.batch; ++n) {
    for (int64_t c = 0; c < s.channels; ++c) {
      const float* image = x + (n * s.channels + c) * s.in_h * s.in_w;
      // The image's value at integer (r, col), by the padding mode off the image.
      auto at = [&](int64_t r, int64_t col) -> double {
        switch (s.padding) {
          case GridPadding::kZeros:
            if (r < 0 || r >= s.in_h || col < 0 || col >= s.in_w) return 0.0;
            break;
          case GridPadding::kBorder:
            r = std::clamp<int64_t>(r, 0, s.in_h - 1);
            col = std::clamp<int64_t>(col, 0, s.in_w - 1);
            break;
          case GridPadding::kReflection:
            r = static_cast<int64_t>(reflect(static_cast<double>(r), lo_y, hi_y));
            col = static_cast<int64_t>(reflect(static_cast<double>(col), lo_x, hi_x));
            r = std::clamp<int64_t>(r, 0, s.in_h - 1);
            col = std::clamp<int64_t>(col, 0, s.in_w - 1);
            break;
        }
        return image[r * s.in_w + col];
      };
      for (int64_t i = 0; i < s.out_h; ++i) {
        for (int64_t j = 0; j < s.out_w; ++j) {
          const float* point = grid + ((n * s.out_h + i) * s.out_w + j) * 2;
          double px = pixel(point[0], s.in_w), py = pixel(point[1], s.in_h);
          if (s.mode == GridSampleMode::kNearest) {
            px = std::nearbyint(px);  // the default rounding mode: halves to even
            py = std::nearbyint(py);
          }
          // A point off the image moves onto it first, except with zeros.
          if (s.padding == GridPadding::kBorder) {
            px = std::clamp(px, 0.0, static_cast<double>(s.in_w - 1));
            py = std::clamp(py, 0.0, static_cast<double>(s.in_h - 1));
          } else if (s.padding == GridPadding::kReflection) {
            px = reflect(px, lo_x, hi_x);
            py = reflect(py, lo_y, hi_y);
          }
          double v = 0.0;
          const auto x0 = static_cast<int64_t>(std::floor(px)),
                     y0 = static_cast<int64_t>(std::floor(py));
          const double fx = px - static_cast<double>(x0), fy = py - static_cast<double>(y0);
          switch (s.mode) {
            case GridSampleMode::kNearest:
              v = at(static_cast<int64_t>(py), static_cast<int64_t>(px));
              break;
            case GridSampleMode::kBilinear:
              v = (1.0 - fy) * ((1.0 - fx) * at(y0, x0) + fx * at(y0, x0 + 1)) +
                  fy * ((1.0 - fx) * at(y0 + 1, x0) + fx * at(y0 + 1, x0 + 1));
              break;
            case GridSampleMode::kBicubic: {
              double wx[4], wy[4];
              cubic_weights(fx, -0.75, wx);
              cubic_weights(fy, -0.75, wy);
              for (int64_t a = 0; a < 4; ++a) {
                double row = 0.0;
                for (int64_t b = 0; b < 4; ++b) row += wx[b] * at(y0 - 1 + a, x0 - 1 + b);
                v += wy[a] * row;
              }
              break;
            }
          }
          y[((n * s.channels + c) * s.out_h + i) * s.out_w + j] = static_cast<float>(v);
        }
      }
    }
  }
}

}  // namespace sparsecol::kernels::reference
