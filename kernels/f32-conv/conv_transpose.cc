#include "f32-conv/conv_transpose.h"

#include <algorithm>
#include <numeric>
#include <optional>

#include <fmt/format.h>

#include "f32-gemm/gemm.h"
#include "f32-gemm/ukernels.h"
#include "f32-spmm/spmm.h"
#include "scratch.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol::kernels {

struct PackedConvTranspose::Impl {
  // W^T per group: rows (output channel of the group, tap), columns the group's input channels.
  std::vector<PackedA> dense;
  std::optional<SparseMatrix> sparse;  // one group only: the same rows, B rows the input planes
  Isa isa = Isa::kPortable;
  std::vector<float> bias;  // out_c values, zeros when the layer has none
  double sparsity = 0.0;
};

namespace {

// cols floats per chunk of input rows (256 KiB), so that the product's output is still in L2
// when col2im reads it.
constexpr int64_t kColsBudgetFloats = int64_t{64} * 1024;

void check_geometry(const ConvGeometry& g) {
  const bool positive = g.in_c > 0 && g.in_h > 0 && g.in_w > 0 && g.out_c > 0 && g.out_h > 0 &&
                        g.out_w > 0 && g.kernel_h > 0 && g.kernel_w > 0 && g.stride_h > 0 &&
                        g.stride_w > 0 && g.dilation_h > 0 && g.dilation_w > 0 && g.groups > 0;
  if (!positive || g.in_c % g.groups != 0 || g.out_c % g.groups != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("PackedConvTranspose: channels {} -> {} in {} groups, input {}x{}, "
                            "output {}x{}, kernel {}x{}, strides {}x{}, dilations {}x{}, pads "
                            "top {} left {}",
                            g.in_c, g.out_c, g.groups, g.in_h, g.in_w, g.out_h, g.out_w, g.kernel_h,
                            g.kernel_w, g.stride_h, g.stride_w, g.dilation_h, g.dilation_w,
                            g.pad_top, g.pad_left));
  }
}

// The input columns [*first, *last) whose tap at `offset` (kx * dilation - pad) lands inside an
// output row of `out` pixels: 0 <= x * stride + offset < out.
void landing_columns(int64_t in, int64_t stride, int64_t offset, int64_t out, int64_t* first,
                     int64_t* last) {
  *first = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  *last = out - offset <= 0 ? 0 : std::min(in, (out - offset - 1) / stride + 1);
  *last = std::max(*first, *last);
}

// Adds the rows of cols (output channels [c0, c1) of the range, each kernel_h x kernel_w taps,
// `n` = rows x in_w columns from input row r0) into their output planes.
void col2im(const ConvGeometry& g, const float* cols, int64_t n, int64_t c0, int64_t c1, int64_t r0,
            int64_t rows, float* dst) {
  const int64_t taps = g.kernel_h * g.kernel_w, out_plane = g.out_h * g.out_w;
  for (int64_t c = c0; c < c1; ++c) {
    float* plane = dst + c * out_plane;
    for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
      for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
        const float* row = cols + ((c - c0) * taps + ky * g.kernel_w + kx) * n;
        const int64_t dx = kx * g.dilation_w - g.pad_left;
        int64_t x0 = 0, x1 = 0;
        landing_columns(g.in_w, g.stride_w, dx, g.out_w, &x0, &x1);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t oy = (r0 + r) * g.stride_h + ky * g.dilation_h - g.pad_top;
          if (oy < 0 || oy >= g.out_h) continue;
          float* out = plane + oy * g.out_w;
          const float* in = row + r * g.in_w;
          for (int64_t x = x0; x < x1; ++x) out[x * g.stride_w + dx] += in[x];
        }
      }
    }
  }
}

}  // namespace

PackedConvTranspose::PackedConvTranspose(const ConvGeometry& geometry, const float* weight,
                                         const float* bias, double sparse_threshold, Isa isa)
    : geometry_(geometry) {
  check_geometry(geometry);
  const ConvGeometry& g = geometry_;
  auto impl = std::make_shared<Impl>();
  impl->isa = std::min(isa, active_isa());
  impl->bias.assign(static_cast<std::size_t>(g.out_c), 0.0f);
  if (bias != nullptr) std::copy(bias, bias + g.out_c, impl->bias.begin());
  const int64_t ic = g.in_c / g.groups, oc = g.out_c / g.groups;
  const int64_t rows = oc * g.kernel_h * g.kernel_w;  // of W^T per group
  impl->sparsity = zero_fraction(weight, g.in_c * rows);
  // Element (r, k) of group 0's W^T is weight[k * rows + r]: ONNX's [in_c][out_c / groups][taps]
  // read column-wise.
  if (g.groups == 1 &&
      impl->sparsity >= resolve_sparse_threshold(sparse_threshold, SparseLayerKind::kConv)) {
    std::vector<int64_t> planes(static_cast<std::size_t>(ic));
    for (int64_t c = 0; c < ic; ++c) planes[static_cast<std::size_t>(c)] = c * g.in_h * g.in_w;
    impl->sparse.emplace(weight, rows, ic, 1, rows, 1, planes);
  } else {
    std::vector<float> transposed(static_cast<std::size_t>(rows * ic));
    for (int64_t group = 0; group < g.groups; ++group) {
      const float* w = weight + group * ic * rows;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t k = 0; k < ic; ++k) {
          transposed[static_cast<std::size_t>(r * ic + k)] = w[k * rows + r];
        }
      }
      impl->dense.emplace_back(transposed.data(), rows, ic, ic, impl->isa);
    }
  }
  impl_ = std::move(impl);
}

std::string PackedConvTranspose::implementation() const {
  return fmt::format("{}-col2im/{}", impl_->sparse ? "spmm" : "gemm", to_string(impl_->isa));
}

double PackedConvTranspose::weight_sparsity() const { return impl_->sparsity; }

const char* PackedConvTranspose::weight_format() const {
  return impl_->sparse ? "sparse-csr" : "dense";
}

int64_t PackedConvTranspose::packed_bytes() const {
  const ConvGeometry& g = geometry_;
  int64_t bytes = g.out_c * static_cast<int64_t>(sizeof(float));
  if (impl_->sparse) return bytes + impl_->sparse->packed_bytes();
  for (const PackedA& a : impl_->dense) {
    bytes += packed_a_size(a.rows(), a.depth(), default_gemm_ukernel(a.isa()).mr) *
             static_cast<int64_t>(sizeof(float));
  }
  return bytes;
}

int64_t PackedConvTranspose::channel_granule() const {
  if (geometry_.groups > 1) return geometry_.out_c;
  if (impl_->sparse) return 1;
  // The fewest channels whose taps fill whole panels.
  const int64_t taps = geometry_.kernel_h * geometry_.kernel_w;
  const int64_t panel = impl_->dense.front().panel_rows();
  return panel / std::gcd(panel, taps);
}

void conv_transpose2d_image(const PackedConvTranspose& conv, const float* src, float* dst,
                            int64_t oc_begin, int64_t oc_end, std::vector<float>& scratch) {
  const ConvGeometry& g = conv.geometry();
  const PackedConvTranspose::Impl& impl = *conv.impl();
  check_channel_range("conv_transpose2d_image", oc_begin, oc_end, g.out_c, conv.channel_granule(),
                      conv.implementation());
  if (oc_begin >= oc_end) return;
  const int64_t in_plane = g.in_h * g.in_w, out_plane = g.out_h * g.out_w;
  for (int64_t c = oc_begin; c < oc_end; ++c) {
    std::fill_n(dst + c * out_plane, out_plane, impl.bias[static_cast<std::size_t>(c)]);
  }
  const int64_t taps = g.kernel_h * g.kernel_w;
  const int64_t ic = g.in_c / g.groups, oc = g.out_c / g.groups;
  // Per group, the range's channels of that group (all of them with several groups).
  const int64_t channels = g.groups == 1 ? oc_end - oc_begin : oc;
  const int64_t chunk =
      std::clamp<int64_t>(kColsBudgetFloats / (channels * taps * g.in_w), 1, g.in_h);
  float* cols = aligned_scratch(scratch, channels * taps * chunk * g.in_w);
  for (int64_t group = 0; group < g.groups; ++group) {
    const int64_t c0 = g.groups == 1 ? oc_begin : group * oc;
    const float* x = src + group * ic * in_plane;
    for (int64_t r0 = 0; r0 < g.in_h; r0 += chunk) {
      const int64_t rows = std::min(chunk, g.in_h - r0), n = rows * g.in_w;
      const float* b = x + r0 * g.in_w;
      const int64_t row_begin = (c0 - group * oc) * taps, row_end = row_begin + channels * taps;
      if (impl.sparse) {
        spmm(*impl.sparse, impl.sparse->offsets(), row_begin, row_end, b, n, cols, n, Epilogue{},
             impl.isa);
      } else {
        gemm_packed(impl.dense[static_cast<std::size_t>(group)].row_range(row_begin, row_end), b,
                    in_plane, cols, n, n, Epilogue{});
      }
      col2im(g, cols, n, c0, c0 + channels, r0, rows, dst);
    }
  }
}

}  // namespace sparsecol::kernels
