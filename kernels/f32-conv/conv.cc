// The convolution front end: picks an implementation per geometry at packing time and lowers a
// range of output rows onto the GEMM (f32-gemm/gemm.h) or the depthwise kernel
// (f32-dwconv/dwconv.h). See conv.h.
#include "f32-conv/conv.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "f32-dwconv/dwconv.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol::kernels {

struct PackedConv::Impl {
  enum class Kind { kGemm1x1, kIm2colGemm, kDepthwise };
  Kind kind = Kind::kIm2colGemm;
  std::vector<PackedA> groups;  // GEMM kinds: group g's weights [OC/g x IC/g*KH*KW]
  std::vector<float> weight;    // depthwise: [C x KH*KW]
  std::vector<float> bias;      // out_c values, zeros when the layer has none
};

namespace {

// im2col works on chunks of output rows whose column matrix stays below this many floats
// (256 KiB), so that it is still in L2 (1-2 MiB per core on current x86 servers) when the GEMM
// streams it; but never on fewer than kMinChunkPixels output pixels, because a GEMM this narrow
// spends its time on edges (ResNet-50's last 3x3 layer, 4608 deep and 7 wide, ran 3x slower in
// chunks of 2 rows than in one chunk of all 7).
constexpr int64_t kIm2colBudget = 64 * 1024;
constexpr int64_t kMinChunkPixels = 64;

void check_geometry(const ConvGeometry& g) {
  const bool positive = g.in_c > 0 && g.in_h > 0 && g.in_w > 0 && g.out_c > 0 && g.out_h > 0 &&
                        g.out_w > 0 && g.kernel_h > 0 && g.kernel_w > 0 && g.stride_h > 0 &&
                        g.stride_w > 0 && g.dilation_h > 0 && g.dilation_w > 0 && g.groups > 0 &&
                        g.pad_top >= 0 && g.pad_left >= 0;
  if (!positive || g.in_c % g.groups != 0 || g.out_c % g.groups != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("PackedConv: invalid geometry in {}x{}x{} -> out {}x{}x{}, kernel "
                            "{}x{}, stride {}x{}, dilation {}x{}, pad {},{}, groups {}",
                            g.in_c, g.in_h, g.in_w, g.out_c, g.out_h, g.out_w, g.kernel_h,
                            g.kernel_w, g.stride_h, g.stride_w, g.dilation_h, g.dilation_w,
                            g.pad_top, g.pad_left, g.groups));
  }
}

// Columns [first, last) of output positions x whose input column x * stride + offset lies in
// [0, size).
void valid_range(int64_t out_size, int64_t stride, int64_t offset, int64_t size, int64_t* first,
                 int64_t* last) {
  const int64_t begin = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  const int64_t last_in = size - 1 - offset;
  const int64_t end = last_in < 0 ? 0 : std::min(out_size, last_in / stride + 1);
  *first = std::min(begin, end);
  *last = end;
}

// The column matrix of input channels [c0, c0 + channels) for output rows [oh_begin, oh_end):
// row (c, ky, kx), column (oh - oh_begin) * out_w + ox, zeros where the tap is in padding.
void im2col(const ConvGeometry& g, const PlaneView& src, int64_t c0, int64_t channels,
            int64_t oh_begin, int64_t oh_end, float* cols) {
  const int64_t n = (oh_end - oh_begin) * g.out_w;
  for (int64_t c = 0; c < channels; ++c) {
    const float* plane = src.data + (c0 + c) * src.plane_stride;
    for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
      for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
        float* row = cols + ((c * g.kernel_h + ky) * g.kernel_w + kx) * n;
        const int64_t off_w = kx * g.dilation_w - g.pad_left;
        int64_t x0 = 0, x1 = 0;
        valid_range(g.out_w, g.stride_w, off_w, g.in_w, &x0, &x1);
        for (int64_t oh = oh_begin; oh < oh_end; ++oh) {
          float* out = row + (oh - oh_begin) * g.out_w;
          const int64_t ih = oh * g.stride_h - g.pad_top + ky * g.dilation_h;
          if (ih < 0 || ih >= g.in_h) {
            std::fill_n(out, g.out_w, 0.0f);
            continue;
          }
          const float* in = plane + (ih - src.row0) * g.in_w + off_w;
          std::fill(out, out + x0, 0.0f);
          if (g.stride_w == 1) {
            std::memcpy(out + x0, in + x0, static_cast<std::size_t>(x1 - x0) * sizeof(float));
          } else {
            for (int64_t x = x0; x < x1; ++x) out[x] = in[x * g.stride_w];
          }
          std::fill(out + x1, out + g.out_w, 0.0f);
        }
      }
    }
  }
}

}  // namespace

void conv_input_rows(const ConvGeometry& g, int64_t oh_begin, int64_t oh_end, int64_t* first,
                     int64_t* last) {
  if (oh_begin >= oh_end) {
    *first = *last = 0;
    return;
  }
  const int64_t lo = oh_begin * g.stride_h - g.pad_top;
  const int64_t hi = (oh_end - 1) * g.stride_h - g.pad_top + (g.kernel_h - 1) * g.dilation_h + 1;
  *first = std::clamp(lo, int64_t{0}, g.in_h);
  *last = std::clamp(hi, *first, g.in_h);
}

PackedConv::PackedConv(const ConvGeometry& geometry, const float* weight, const float* bias)
    : geometry_(geometry) {
  check_geometry(geometry);
  const ConvGeometry& g = geometry_;
  auto impl = std::make_shared<Impl>();
  impl->bias.assign(static_cast<std::size_t>(g.out_c), 0.0f);
  if (bias != nullptr) std::copy(bias, bias + g.out_c, impl->bias.begin());

  const int64_t taps = g.kernel_h * g.kernel_w;
  if (g.groups == g.in_c && g.groups == g.out_c) {
    impl->kind = Impl::Kind::kDepthwise;
    impl->weight.assign(weight, weight + g.out_c * taps);
  } else {
    const bool pointwise = g.kernel_h == 1 && g.kernel_w == 1 && g.stride_h == 1 &&
                           g.stride_w == 1 && g.pad_top == 0 && g.pad_left == 0 &&
                           g.in_h == g.out_h && g.in_w == g.out_w;
    impl->kind = pointwise ? Impl::Kind::kGemm1x1 : Impl::Kind::kIm2colGemm;
    const int64_t oc_per_group = g.out_c / g.groups;
    const int64_t depth =
        g.in_c / g.groups * taps;  // ONNX weight rows are already [oc][ic][ky][kx]
    for (int64_t group = 0; group < g.groups; ++group) {
      impl->groups.emplace_back(weight + group * oc_per_group * depth, oc_per_group, depth, depth);
    }
  }
  impl_ = std::move(impl);
}

std::string PackedConv::implementation() const {
  switch (impl_->kind) {
    case Impl::Kind::kGemm1x1:
      return fmt::format("gemm-1x1/{}", to_string(impl_->groups.front().isa()));
    case Impl::Kind::kIm2colGemm:
      return fmt::format("im2col-gemm-{}x{}/{}", geometry_.kernel_h, geometry_.kernel_w,
                         to_string(impl_->groups.front().isa()));
    case Impl::Kind::kDepthwise:
      return fmt::format("depthwise-{}x{}/{}", geometry_.kernel_h, geometry_.kernel_w,
                         to_string(active_isa()));
  }
  return "unknown";
}

void conv2d_rows(const PackedConv& conv, const PlaneView& src, const PlaneView& dst,
                 int64_t oh_begin, int64_t oh_end, const Epilogue& epilogue,
                 const PlaneView* residual, std::vector<float>& scratch) {
  const ConvGeometry& g = conv.geometry();
  const PackedConv::Impl& impl = *conv.impl();
  if (oh_begin >= oh_end) return;
  if (impl.kind == PackedConv::Impl::Kind::kDepthwise) {
    dwconv2d_rows(g, impl.weight.data(), impl.bias.data(), src, dst, oh_begin, oh_end, epilogue,
                  residual, scratch);
    return;
  }

  const int64_t ic_per_group = g.in_c / g.groups;
  const int64_t oc_per_group = g.out_c / g.groups;
  // Output rows [r0, r1) of group `group`, from B (the group's input columns, ldb apart).
  auto gemm_rows = [&](int64_t group, int64_t r0, int64_t r1, const float* b, int64_t ldb) {
    Epilogue e = epilogue;
    e.row_bias = impl.bias.data() + group * oc_per_group;
    e.col_bias = nullptr;
    e.residual = nullptr;
    if (residual != nullptr) {
      e.residual = residual->data + group * oc_per_group * residual->plane_stride +
                   (r0 - residual->row0) * g.out_w;
      e.residual_ld = residual->plane_stride;
    }
    float* c = dst.data + group * oc_per_group * dst.plane_stride + (r0 - dst.row0) * g.out_w;
    gemm_packed(impl.groups[group], b, ldb, c, dst.plane_stride, (r1 - r0) * g.out_w, e);
  };

  if (impl.kind == PackedConv::Impl::Kind::kGemm1x1) {
    for (int64_t group = 0; group < g.groups; ++group) {
      const float* b =
          src.data + group * ic_per_group * src.plane_stride + (oh_begin - src.row0) * g.in_w;
      gemm_rows(group, oh_begin, oh_end, b, src.plane_stride);
    }
    return;
  }

  const int64_t depth = ic_per_group * g.kernel_h * g.kernel_w;
  const int64_t chunk =
      std::max(kIm2colBudget / (depth * g.out_w), (kMinChunkPixels + g.out_w - 1) / g.out_w);
  scratch.resize(static_cast<std::size_t>(depth * std::min(chunk, oh_end - oh_begin) * g.out_w));
  for (int64_t r0 = oh_begin; r0 < oh_end; r0 += chunk) {
    const int64_t r1 = std::min(oh_end, r0 + chunk);
    for (int64_t group = 0; group < g.groups; ++group) {
      im2col(g, src, group * ic_per_group, ic_per_group, r0, r1, scratch.data());
      gemm_rows(group, r0, r1, scratch.data(), (r1 - r0) * g.out_w);
    }
  }
}

}  // namespace sparsecol::kernels
