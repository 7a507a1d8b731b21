#include "graph/op_params.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace sparsecol::graph {

namespace {

// Largest kernel size, stride, dilation or pad accepted: far beyond any real model, and small
// enough that products of two of them cannot overflow int64_t.
constexpr int64_t kMaxWindowAttr = std::numeric_limits<int32_t>::max();
// Conv and pooling accept 1 to 3 spatial dimensions (what the kernels implement).
constexpr std::size_t kMaxSpatialRank = 3;

std::string dims(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// A per-spatial-dimension attribute: `count` values, each in [lo, kMaxWindowAttr].
std::vector<int64_t> window_attr(const Graph& graph, const Node& node, const char* name,
                                 std::size_t count, int64_t fallback, int64_t lo) {
  std::vector<int64_t> values = node.attr_ints(name, std::vector<int64_t>(count, fallback));
  if (values.size() != count) {
    fail(graph, node, ErrorCode::kInvalidModel,
         fmt::format("attribute '{}' must have {} values ({}), got {}", name, count,
                     std::string(name) == "pads" ? "all begins, then all ends"
                                                 : "one per spatial dimension",
                     dims(values)));
  }
  for (int64_t v : values) {
    if (v < lo || v > kMaxWindowAttr) {
      fail(graph, node, ErrorCode::kInvalidModel,
           fmt::format("attribute '{}' = {}: every value must be in [{}, {}]", name, dims(values),
                       lo, kMaxWindowAttr));
    }
  }
  return values;
}

// The spatial dimensions of X = [N, C, spatial...], checking the rank.
std::vector<int64_t> spatial_dims(const Graph& graph, const Node& node,
                                  const std::vector<int64_t>& x_shape) {
  if (x_shape.size() < 3) {
    fail(graph, node, ErrorCode::kShapeMismatch,
         fmt::format("input X must be [N, C, spatial...] with at least one spatial dimension, "
                     "got {}",
                     dims(x_shape)));
  }
  if (x_shape.size() > 2 + kMaxSpatialRank) {
    fail(graph, node, ErrorCode::kUnsupported,
         fmt::format("at most {} spatial dimensions are supported, input X is {}", kMaxSpatialRank,
                     dims(x_shape)));
  }
  std::vector<int64_t> spatial(x_shape.begin() + 2, x_shape.end());
  for (int64_t d : spatial) {
    if (d > kMaxWindowAttr) {
      fail(graph, node, ErrorCode::kUnsupported,
           fmt::format("spatial dimensions above {} are not supported, input X is {}",
                       kMaxWindowAttr, dims(x_shape)));
    }
  }
  return spatial;
}

// Reads strides, dilations, pads and auto_pad (ONNX Conv / pooling) around a given kernel and
// computes the output size. SAME_UPPER / SAME_LOWER pad so that out = ceil(in / stride), the
// odd pad going to the end / the beginning. ceil_mode (pooling) rounds the window count up,
// then drops a last window that would start in the end padding (it would see padding only),
// as PyTorch does and as the ONNX pooling spec has stated since it clarified ceil_mode.
WindowParams parse_window(const Graph& graph, const Node& node, std::vector<int64_t> in_size,
                          std::vector<int64_t> kernel, bool ceil_mode) {
  const std::size_t rank = in_size.size();
  WindowParams w;
  w.strides = window_attr(graph, node, "strides", rank, 1, 1);
  w.dilations = window_attr(graph, node, "dilations", rank, 1, 1);
  const std::string auto_pad = node.attr_string("auto_pad", "NOTSET");
  const bool same = auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
  if (!same && auto_pad != "NOTSET" && auto_pad != "VALID") {
    fail(graph, node, ErrorCode::kInvalidModel,
         fmt::format("attribute auto_pad = '{}': expected NOTSET, SAME_UPPER, SAME_LOWER or VALID",
                     auto_pad));
  }
  std::vector<int64_t> pads(2 * rank, 0);
  if (auto_pad == "NOTSET") pads = window_attr(graph, node, "pads", 2 * rank, 0, 0);
  w.pads_begin.assign(pads.begin(), pads.begin() + static_cast<std::ptrdiff_t>(rank));
  w.pads_end.assign(pads.begin() + static_cast<std::ptrdiff_t>(rank), pads.end());
  w.out_size.resize(rank);

  for (std::size_t i = 0; i < rank; ++i) {
    const int64_t in = in_size[i], stride = w.strides[i];
    const int64_t extent = (kernel[i] - 1) * w.dilations[i] + 1;  // the dilated kernel
    if (same) {
      const int64_t out = (in + stride - 1) / stride;
      const int64_t total = std::max<int64_t>(0, (out - 1) * stride + extent - in);
      const int64_t small = total / 2;
      w.pads_begin[i] = auto_pad == "SAME_UPPER" ? small : total - small;
      w.pads_end[i] = total - w.pads_begin[i];
      w.out_size[i] = out;
      continue;
    }
    const int64_t span = in + w.pads_begin[i] + w.pads_end[i] - extent;
    if (span < 0) {
      fail(graph, node, ErrorCode::kShapeMismatch,
           fmt::format("spatial dimension {}: input size {} plus pads {} + {} is smaller than "
                       "the dilated kernel ({})",
                       i, in, w.pads_begin[i], w.pads_end[i], extent));
    }
    int64_t out = (ceil_mode ? (span + stride - 1) / stride : span / stride) + 1;
    if (ceil_mode && (out - 1) * stride >= in + w.pads_begin[i]) --out;
    w.out_size[i] = out;
  }
  w.in_size = std::move(in_size);
  w.kernel = std::move(kernel);
  return w;
}

int64_t normalized_axis(const Graph& graph, const Node& node, int64_t axis, std::size_t rank) {
  const auto r = static_cast<int64_t>(rank);
  if (axis < -r || axis >= r) {
    fail(graph, node, ErrorCode::kInvalidModel,
         fmt::format("attribute axis = {} is out of range for an input of rank {}", axis, r));
  }
  return axis < 0 ? axis + r : axis;
}

// The product of shape[begin:end]. Checked: with a 0 elsewhere in the shape the tensor is
// empty, yet a part of its shape can still overflow.
int64_t product(const Graph& graph, const Node& node, const std::vector<int64_t>& shape,
                std::size_t begin, std::size_t end) {
  int64_t p = 1;
  for (std::size_t i = begin; i < end; ++i) {
    if (shape[i] < 0 || __builtin_mul_overflow(p, shape[i], &p)) {
      fail(
          graph, node, ErrorCode::kShapeMismatch,
          fmt::format("input shape {} has a negative dimension or too many elements", dims(shape)));
    }
  }
  return p;
}

}  // namespace

bool broadcasts_to(const std::vector<int64_t>& from, const std::vector<int64_t>& to) {
  if (from.size() > to.size()) return false;
  const std::size_t shift = to.size() - from.size();
  for (std::size_t i = 0; i < from.size(); ++i) {
    if (from[i] != 1 && from[i] != to[shift + i]) return false;
  }
  return true;
}

std::vector<int64_t> ConvParams::output_shape() const {
  std::vector<int64_t> shape = {batch, out_channels};
  shape.insert(shape.end(), window.out_size.begin(), window.out_size.end());
  return shape;
}

std::vector<int64_t> PoolParams::output_shape() const {
  std::vector<int64_t> shape = {batch, channels};
  shape.insert(shape.end(), window.out_size.begin(), window.out_size.end());
  return shape;
}

namespace {

// What Conv and ConvTranspose share: X [N, C, spatial...]; W of X's rank, [M, C / group,
// kernel...] for Conv and [C, M / group, kernel...] for ConvTranspose (kernel_shape, when given,
// equal to its kernel); the group dividing C and M; B, when given, [M]. The window is left to the
// caller; `kernel` receives the kernel.
ConvParams parse_conv_weight(const Graph& graph, const Node& node,
                             const std::vector<int64_t>& x_shape,
                             const std::vector<int64_t>& w_shape,
                             const std::optional<std::vector<int64_t>>& bias_shape, bool transposed,
                             std::vector<int64_t>& kernel) {
  const char* layout = transposed ? "[C, M / group, kernel...]" : "[M, C / group, kernel...]";
  if (w_shape.size() != x_shape.size()) {
    fail(graph, node, ErrorCode::kShapeMismatch,
         fmt::format("weight W must be {} of rank {} like X {}, got {}", layout, x_shape.size(),
                     dims(x_shape), dims(w_shape)));
  }
  ConvParams p;
  p.batch = x_shape[0];
  p.in_channels = x_shape[1];
  p.group = node.attr_int("group", 1);
  if (p.group < 1 || p.group > kMaxWindowAttr) {
    fail(graph, node, ErrorCode::kInvalidModel,
         fmt::format("attribute group = {} must be at least 1", p.group));
  }
  // Compared by division: W.shape[1] * group could overflow.
  const bool channels_fit =
      transposed ? w_shape[0] == p.in_channels && p.in_channels % p.group == 0
                 : p.in_channels % p.group == 0 && p.in_channels / p.group == w_shape[1];
  if (!channels_fit) {
    fail(graph, node, ErrorCode::kShapeMismatch,
         fmt::format("X {} has {} channels, but W {} with group {} needs C == {}", dims(x_shape),
                     p.in_channels, dims(w_shape), p.group,
                     transposed ? "W.shape[0], a multiple of group" : "W.shape[1] * group"));
  }
  p.out_channels = transposed ? checked_mul(graph, node, w_shape[1], p.group) : w_shape[0];
  if (p.out_channels % p.group != 0) {
    fail(graph, node, ErrorCode::kShapeMismatch,
         fmt::format("W {} has {} output channels, not a multiple of group {}", dims(w_shape),
                     p.out_channels, p.group));
  }
  kernel.assign(w_shape.begin() + 2, w_shape.end());
  for (int64_t k : kernel) {
    if (k < 1 || k > kMaxWindowAttr) {
      fail(graph, node, ErrorCode::kShapeMismatch,
           fmt::format("weight W {} has an empty or oversized kernel", dims(w_shape)));
    }
  }
  if (node.has_attr("kernel_shape") && node.attr_ints("kernel_shape") != kernel) {
    fail(graph, node, ErrorCode::kShapeMismatch,
         fmt::format("attribute kernel_shape = {} differs from the kernel of W {}",
                     dims(node.attr_ints("kernel_shape")), dims(w_shape)));
  }
  if (bias_shape && *bias_shape != std::vector<int64_t>{p.out_channels}) {
    fail(graph, node, ErrorCode::kShapeMismatch,
         fmt::format("bias B must be [{}] (one value per output channel), got {}", p.out_channels,
                     dims(*bias_shape)));
  }
  return p;
}

}  // namespace

ConvParams parse_conv(const Graph& graph, const Node& node, const std::vector<int64_t>& x_shape,
                      const std::vector<int64_t>& w_shape,
                      const std::optional<std::vector<int64_t>>& bias_shape) {
  std::vector<int64_t> in_size = spatial_dims(graph, node, x_shape);
  std::vector<int64_t> kernel;
  ConvParams p = parse_conv_weight(graph, node, x_shape, w_shape, bias_shape, false, kernel);
  p.window = parse_window(graph, node, std::move(in_size), std::move(kernel), false);
  return p;
}

ConvParams parse_conv_transpose(const Graph& graph, const Node& node,
                                const std::vector<int64_t>& x_shape,
                                const std::vector<int64_t>& w_shape,
                                const std::optional<std::vector<int64_t>>& bias_shape) {
  std::vector<int64_t> in_size = spatial_dims(graph, node, x_shape);
  const std::size_t rank = in_size.size();
  std::vector<int64_t> kernel;
  ConvParams p = parse_conv_weight(graph, node, x_shape, w_shape, bias_shape, true, kernel);
  WindowParams& w = p.window;
  w.strides = window_attr(graph, node, "strides", rank, 1, 1);
  w.dilations = window_attr(graph, node, "dilations", rank, 1, 1);
  const std::vector<int64_t> output_padding =
      window_attr(graph, node, "output_padding", rank, 0, 0);
  const std::string auto_pad = node.attr_string("auto_pad", "NOTSET");
  if (auto_pad != "NOTSET" && auto_pad != "VALID" && auto_pad != "SAME_UPPER" &&
      auto_pad != "SAME_LOWER") {
    fail(graph, node, ErrorCode::kInvalidModel,
         fmt::format("attribute auto_pad = '{}': expected NOTSET, SAME_UPPER, SAME_LOWER or VALID",
                     auto_pad));
  }
  // output_shape: the spatial sizes, or (as some exporters write it) N, M and then those.
  std::vector<int64_t> wanted = node.attr_ints("output_shape", {});
  if (wanted.size() == rank + 2) wanted.erase(wanted.begin(), wanted.begin() + 2);
  if (!wanted.empty() && wanted.size() != rank) {
    fail(graph, node, ErrorCode::kInvalidModel,
         fmt::format("attribute output_shape = {} must have one value per spatial dimension ({})",
                     dims(node.attr_ints("output_shape", {})), rank));
  }
  const bool same = auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
  std::vector<int64_t> pads(2 * rank, 0);
  if (auto_pad == "NOTSET" && wanted.empty())
    pads = window_attr(graph, node, "pads", 2 * rank, 0, 0);
  w.pads_begin.assign(pads.begin(), pads.begin() + static_cast<std::ptrdiff_t>(rank));
  w.pads_end.assign(pads.begin() + static_cast<std::ptrdiff_t>(rank), pads.end());
  w.out_size.resize(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    if (output_padding[i] >= std::max(w.strides[i], w.dilations[i])) {
      fail(graph, node, ErrorCode::kInvalidModel,
           fmt::format("attribute output_padding = {} must be less than the stride or the dilation "
                       "of its dimension",
                       dims(output_padding)));
    }
    const int64_t extent = (kernel[i] - 1) * w.dilations[i] + 1;  // the dilated kernel
    // The length the input spreads over before any padding is taken off.
    const int64_t full =
        checked_add(graph, node,
                    checked_add(graph, node, checked_mul(graph, node, w.strides[i], in_size[i] - 1),
                                output_padding[i]),
                    extent);
    if (!wanted.empty() || same) {
      // ONNX's formulas: the output length asked for (output_shape, or input x stride for
      // SAME_*), the padding the difference, its odd unit at the end for SAME_UPPER and at the
      // beginning otherwise. An output longer than the input gives pads the difference below
      // zero: halved rounding down (as ONNX's reference, in Python), so NOTSET extends the end
      // with zeros (plus the bias).
      const int64_t out = !wanted.empty() ? wanted[i] : in_size[i] * w.strides[i];
      if (out < 0) {
        fail(graph, node, ErrorCode::kInvalidModel,
             fmt::format("attribute output_shape = {} has a negative length", dims(wanted)));
      }
      const int64_t total = full - out;
      const int64_t half = total >= 0 ? total / 2 : -((1 - total) / 2);  // floor(total / 2)
      w.pads_begin[i] = auto_pad == "SAME_UPPER" ? half : total - half;
      w.pads_end[i] = total - w.pads_begin[i];
      w.out_size[i] = out;
      continue;
    }
    w.out_size[i] = full - w.pads_begin[i] - w.pads_end[i];
    if (w.out_size[i] < 0) {
      fail(graph, node, ErrorCode::kShapeMismatch,
           fmt::format("spatial dimension {}: pads {} + {} exceed the {} elements input {} gives",
                       i, w.pads_begin[i], w.pads_end[i], full, dims(x_shape)));
    }
  }
  w.in_size = std::move(in_size);
  w.kernel = std::move(kernel);
  return p;
}

PoolParams parse_pool(const Graph& graph, const Node& node, const std::vector<int64_t>& x_shape) {
  if (node.op_type == "MaxPool" && node.outputs.size() > 1) {
    fail(graph, node, ErrorCode::kUnsupported, "the optional output Indices is not supported");
  }
  std::vector<int64_t> in_size = spatial_dims(graph, node, x_shape);
  if (!node.has_attr("kernel_shape")) {
    fail(graph, node, ErrorCode::kInvalidModel, "attribute kernel_shape is required");
  }
  std::vector<int64_t> kernel = window_attr(graph, node, "kernel_shape", in_size.size(), 1, 1);
  PoolParams p;
  p.batch = x_shape[0];
  p.channels = x_shape[1];
  p.ceil_mode = node.attr_int("ceil_mode", 0) != 0;
  p.count_include_pad = node.attr_int("count_include_pad", 0) != 0;
  p.window = parse_window(graph, node, std::move(in_size), std::move(kernel), p.ceil_mode);
  return p;
}

GemmParams parse_gemm(const Graph& graph, const Node& node, const std::vector<int64_t>& a_shape,
                      const std::vector<int64_t>& b_shape,
                      const std::optional<std::vector<int64_t>>& c_shape) {
  if (a_shape.size() != 2 || b_shape.size() != 2) {
    fail(graph, node, ErrorCode::kShapeMismatch,
         fmt::format("A and B must be matrices (rank 2), got A {} and B {}", dims(a_shape),
                     dims(b_shape)));
  }
  GemmParams p;
  p.trans_a = node.attr_int("transA", 0) != 0;
  p.trans_b = node.attr_int("transB", 0) != 0;
  p.alpha = node.attr_float("alpha", 1.0f);
  p.beta = node.attr_float("beta", 1.0f);
  p.m = p.trans_a ? a_shape[1] : a_shape[0];
  p.k = p.trans_a ? a_shape[0] : a_shape[1];
  const int64_t b_k = p.trans_b ? b_shape[1] : b_shape[0];
  p.n = p.trans_b ? b_shape[0] : b_shape[1];
  if (b_k != p.k) {
    fail(graph, node, ErrorCode::kShapeMismatch,
         fmt::format("inner dimensions differ: A {} (transA={}) has K = {}, B {} (transB={}) "
                     "has K = {}",
                     dims(a_shape), int{p.trans_a}, p.k, dims(b_shape), int{p.trans_b}, b_k));
  }
  if (c_shape && !broadcasts_to(*c_shape, {p.m, p.n})) {
    fail(graph, node, ErrorCode::kShapeMismatch,
         fmt::format("C {} does not broadcast to the output [{}, {}]", dims(*c_shape), p.m, p.n));
  }
  return p;
}

MatMulParams parse_matmul(const Graph& graph, const Node& node, const std::vector<int64_t>& a_shape,
                          const std::vector<int64_t>& b_shape) {
  if (a_shape.empty() || b_shape.empty()) {
    fail(graph, node, ErrorCode::kShapeMismatch,
         fmt::format("MatMul operands must have rank 1 or more, got A {} and B {}", dims(a_shape),
                     dims(b_shape)));
  }
  const std::size_t a_rank = a_shape.size(), b_rank = b_shape.size();
  MatMulParams p;
  p.m = a_rank == 1 ? 1 : a_shape[a_rank - 2];
  p.k = a_shape[a_rank - 1];
  const int64_t b_k = b_rank == 1 ? b_shape[0] : b_shape[b_rank - 2];
  p.n = b_rank == 1 ? 1 : b_shape[b_rank - 1];
  if (b_k != p.k) {
    fail(graph, node, ErrorCode::kShapeMismatch,
         fmt::format("inner dimensions differ: A {} has K = {}, B {} has K = {}", dims(a_shape),
                     p.k, dims(b_shape), b_k));
  }
  const std::vector<int64_t> a_batch(a_shape.begin(),
                                     a_shape.end() - std::min<std::size_t>(a_rank, 2));
  const std::vector<int64_t> b_batch(b_shape.begin(),
                                     b_shape.end() - std::min<std::size_t>(b_rank, 2));
  const std::size_t batch_rank = std::max(a_batch.size(), b_batch.size());
  // Right-align both operands' batch dimensions, padding with 1s.
  p.a_batch.assign(batch_rank - a_batch.size(), 1);
  p.a_batch.insert(p.a_batch.end(), a_batch.begin(), a_batch.end());
  p.b_batch.assign(batch_rank - b_batch.size(), 1);
  p.b_batch.insert(p.b_batch.end(), b_batch.begin(), b_batch.end());
  for (std::size_t i = 0; i < batch_rank; ++i) {
    const int64_t da = p.a_batch[i], db = p.b_batch[i];
    if (da != db && da != 1 && db != 1) {
      fail(graph, node, ErrorCode::kShapeMismatch,
           fmt::format("batch dimensions of A {} and B {} do not broadcast", dims(a_shape),
                       dims(b_shape)));
    }
    p.batch.push_back(da == 1 ? db : da);
  }
  p.output_shape = p.batch;
  if (a_rank > 1) p.output_shape.push_back(p.m);
  if (b_rank > 1) p.output_shape.push_back(p.n);
  return p;
}

SoftmaxParams parse_softmax(const Graph& graph, const Node& node,
                            const std::vector<int64_t>& x_shape) {
  if (x_shape.empty()) {
    fail(graph, node, ErrorCode::kShapeMismatch, "input must have rank 1 or more, got a scalar");
  }
  // A graph of unknown opset (0, built in memory) gets the current semantics.
  const bool flatten = graph.opset > 0 && graph.opset < 13;
  const int64_t axis =
      normalized_axis(graph, node, node.attr_int("axis", flatten ? 1 : -1), x_shape.size());
  const auto a = static_cast<std::size_t>(axis);
  SoftmaxParams p;
  p.outer = product(graph, node, x_shape, 0, a);
  p.axis_size = flatten ? product(graph, node, x_shape, a, x_shape.size()) : x_shape[a];
  p.inner = flatten ? 1 : product(graph, node, x_shape, a + 1, x_shape.size());
  return p;
}

LayerNormParams parse_layer_norm(const Graph& graph, const Node& node,
                                 const std::vector<int64_t>& x_shape,
                                 const std::vector<int64_t>& scale_shape,
                                 const std::optional<std::vector<int64_t>>& bias_shape) {
  if (x_shape.empty()) {
    fail(graph, node, ErrorCode::kShapeMismatch, "input X must have rank 1 or more, got a scalar");
  }
  const int64_t stash_type = node.attr_int("stash_type", 1);
  if (stash_type != 1) {
    fail(graph, node, ErrorCode::kUnsupported,
         fmt::format("attribute stash_type = {}: only 1 (float32 statistics) is supported",
                     stash_type));
  }
  LayerNormParams p;
  p.axis = normalized_axis(graph, node, node.attr_int("axis", -1), x_shape.size());
  p.epsilon = node.attr_float("epsilon", 1e-5f);
  const auto a = static_cast<std::size_t>(p.axis);
  p.outer = product(graph, node, x_shape, 0, a);
  p.inner = product(graph, node, x_shape, a, x_shape.size());
  p.normalized_shape.assign(x_shape.begin() + p.axis, x_shape.end());
  p.stats_shape.assign(x_shape.begin(), x_shape.begin() + p.axis);
  p.stats_shape.resize(x_shape.size(), 1);
  const auto check = [&](const std::vector<int64_t>& shape, const char* what) {
    if (!broadcasts_to(shape, p.normalized_shape)) {
      fail(graph, node, ErrorCode::kShapeMismatch,
           fmt::format("{} {} does not broadcast to the normalized shape {} (X {}, axis {})", what,
                       dims(shape), dims(p.normalized_shape), dims(x_shape), p.axis));
    }
  };
  check(scale_shape, "Scale");
  if (bias_shape) check(*bias_shape, "B");
  return p;
}

NllLossParams parse_nll_loss(const Graph& graph, const Node& node,
                             const std::vector<int64_t>& input_shape,
                             const std::vector<int64_t>& target_shape,
                             const std::optional<std::vector<int64_t>>& weight_shape) {
  NllLossParams p;
  p.reduction = node.attr_string("reduction", "mean");
  if (p.reduction != "none" && p.reduction != "sum" && p.reduction != "mean") {
    fail(graph, node, ErrorCode::kInvalidModel,
         fmt::format("attribute reduction = '{}': expected none, sum or mean", p.reduction));
  }
  if (node.has_attr("ignore_index")) p.ignore_index = node.attr_int("ignore_index", 0);
  std::vector<int64_t> expected_target = input_shape;
  if (input_shape.size() >= 2) expected_target.erase(expected_target.begin() + 1);
  if (input_shape.size() < 2 || target_shape != expected_target) {
    fail(graph, node, ErrorCode::kShapeMismatch,
         fmt::format("input {} and target {}: expected input [N, C, d1, ...] and target [N, d1, "
                     "...]",
                     dims(input_shape), dims(target_shape)));
  }
  p.n = input_shape[0];
  p.classes = input_shape[1];
  p.inner = product(graph, node, input_shape, 2, input_shape.size());
  if (weight_shape && *weight_shape != std::vector<int64_t>{p.classes}) {
    fail(graph, node, ErrorCode::kShapeMismatch,
         fmt::format("weight has shape {}, expected [{}] (one per class)", dims(*weight_shape),
                     p.classes));
  }
  if (p.reduction == "none") p.output_shape = target_shape;
  return p;
}

RecurrentParams parse_recurrent(const Graph& graph, const Node& node,
                                const std::vector<std::optional<std::vector<int64_t>>>& shapes) {
  RecurrentParams p;
  const bool lstm = node.op_type == "LSTM";
  p.gates = lstm ? 4 : node.op_type == "GRU" ? 3 : 1;
  const std::string direction = node.attr_string("direction", "forward");
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional") {
    fail(graph, node, ErrorCode::kInvalidModel,
         fmt::format("attribute direction = '{}': expected forward, reverse or bidirectional",
                     direction));
  }
  p.reverse = direction == "reverse";
  p.directions = direction == "bidirectional" ? 2 : 1;
  const int64_t layout = node.attr_int("layout", 0);
  if (layout != 0 && layout != 1) {
    fail(graph, node, ErrorCode::kInvalidModel,
         fmt::format("attribute layout = {}: expected 0 or 1", layout));
  }
  p.batch_major = layout == 1;
  if (node.attr_float("clip", 1.0f) <= 0.0f) {
    fail(graph, node, ErrorCode::kInvalidModel, "attribute clip must be positive");
  }
  auto shape = [&](std::size_t i) -> const std::vector<int64_t>* {  // nullptr: omitted
    return i < shapes.size() && shapes[i] ? &*shapes[i] : nullptr;
  };
  constexpr const char* kNames[] = {"X",         "W",         "R", "B", "sequence_lens",
                                    "initial_h", "initial_c", "P"};
  auto expect = [&](std::size_t i, const std::vector<int64_t>& expected) {
    if (shape(i) && *shape(i) != expected) {
      fail(graph, node, ErrorCode::kShapeMismatch,
           fmt::format("input {} has shape {}, expected {}", kNames[i], dims(*shape(i)),
                       dims(expected)));
    }
  };
  for (std::size_t i = 0; i < 3; ++i) {
    if (!shape(i) || shape(i)->size() != 3) {
      fail(graph, node, ErrorCode::kShapeMismatch,
           fmt::format("input {} must have rank 3, got {}", kNames[i],
                       shape(i) ? dims(*shape(i)) : std::string("none")));
    }
  }
  const std::vector<int64_t>& x = *shape(0);
  p.seq_length = x[p.batch_major ? 1 : 0];
  p.batch = x[p.batch_major ? 0 : 1];
  p.input_size = x[2];
  p.hidden_size = node.attr_int("hidden_size", (*shape(2))[2]);
  if (p.hidden_size <= 0) {
    fail(graph, node, ErrorCode::kInvalidModel,
         fmt::format("attribute hidden_size = {} must be positive", p.hidden_size));
  }
  const int64_t d = p.directions, h = p.hidden_size, gh = p.gates * h;
  expect(1, {d, gh, p.input_size});
  expect(2, {d, gh, h});
  expect(3, {d, 2 * gh});
  expect(4, {p.batch});
  p.state_shape =
      p.batch_major ? std::vector<int64_t>{p.batch, d, h} : std::vector<int64_t>{d, p.batch, h};
  expect(5, p.state_shape);
  if (!lstm && shapes.size() > 6) {
    fail(graph, node, ErrorCode::kInvalidModel,
         fmt::format("{} has at most 6 inputs, got {}", node.op_type, shapes.size()));
  }
  expect(6, p.state_shape);
  expect(7, {d, 3 * h});
  p.y_shape = p.batch_major ? std::vector<int64_t>{p.batch, p.seq_length, d, h}
                            : std::vector<int64_t>{p.seq_length, d, p.batch, h};
  return p;
}

ChannelLayout parse_channel_layout(const Graph& graph, const Node& node,
                                   const std::vector<int64_t>& x_shape, std::size_t min_rank) {
  if (x_shape.size() < min_rank) {
    fail(graph, node, ErrorCode::kShapeMismatch,
         fmt::format("input X must be [N, C, ...] of rank {} or more, got {}", min_rank,
                     dims(x_shape)));
  }
  return {x_shape[0], x_shape[1], product(graph, node, x_shape, 2, x_shape.size())};
}

namespace {

constexpr const char* kBatchNormParams[] = {"scale", "B", "input_mean", "input_var"};

void check_per_channel(const Graph& graph, const Node& node, const char* name,
                       const std::vector<int64_t>& shape, int64_t channels) {
  if (shape != std::vector<int64_t>{channels}) {
    fail(graph, node, ErrorCode::kShapeMismatch,
         fmt::format("{} must be [{}] (one value per channel of X), got {}", name, channels,
                     dims(shape)));
  }
}

}  // namespace

ChannelNormParams parse_batch_norm(const Graph& graph, const Node& node,
                                   const std::vector<int64_t>& x_shape,
                                   const std::vector<std::vector<int64_t>>& param_shapes) {
  if (node.attr_int("training_mode", 0) != 0) {
    fail(graph, node, ErrorCode::kUnsupported,
         "training_mode = 1 is not supported (inference only)");
  }
  if (node.outputs.size() > 1) {
    fail(graph, node, ErrorCode::kUnsupported,
         fmt::format("only the output Y is supported (inference only), the node has {} outputs",
                     node.outputs.size()));
  }
  ChannelNormParams p{parse_channel_layout(graph, node, x_shape),
                      node.attr_float("epsilon", 1e-5f)};
  if (param_shapes.size() != std::size(kBatchNormParams)) {
    fail(graph, node, ErrorCode::kInvalidModel,
         fmt::format("expected 5 inputs (X, scale, B, input_mean, input_var), got {}",
                     param_shapes.size() + 1));
  }
  for (std::size_t i = 0; i < param_shapes.size(); ++i) {
    check_per_channel(graph, node, kBatchNormParams[i], param_shapes[i], p.layout.channels);
  }
  return p;
}

ChannelNormParams parse_instance_norm(const Graph& graph, const Node& node,
                                      const std::vector<int64_t>& x_shape,
                                      const std::vector<int64_t>& scale_shape,
                                      const std::vector<int64_t>& bias_shape) {
  ChannelNormParams p{parse_channel_layout(graph, node, x_shape, 3),
                      node.attr_float("epsilon", 1e-5f)};
  check_per_channel(graph, node, "scale", scale_shape, p.layout.channels);
  check_per_channel(graph, node, "B", bias_shape, p.layout.channels);
  return p;
}

LrnParams parse_lrn(const Graph& graph, const Node& node, const std::vector<int64_t>& x_shape) {
  LrnParams p;
  p.layout = parse_channel_layout(graph, node, x_shape, 3);
  if (!node.has_attr("size")) {
    fail(graph, node, ErrorCode::kInvalidModel, "attribute size is required");
  }
  p.size = node.attr_int("size", 1);
  if (p.size < 1) {
    fail(graph, node, ErrorCode::kInvalidModel,
         fmt::format("attribute size = {} must be at least 1", p.size));
  }
  p.alpha = node.attr_float("alpha", 1e-4f);
  p.beta = node.attr_float("beta", 0.75f);
  p.bias = node.attr_float("bias", 1.0f);
  return p;
}

}  // namespace sparsecol::graph
