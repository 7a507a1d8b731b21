// Reference execution of the tensor (data movement and shape) ops.
//
// Each op derives its parameters from the tensors it is actually given, with the same resolvers
// as shape inference (graph/ops_tensor.h), and checks that the output it was handed has the
// shape it computes before a kernel writes a byte: a disagreement is a bug (kInternal), never a
// buffer overrun. Indices that arrive at run time are checked against their axis.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <type_traits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "graph/ops_tensor.h"
#include "reference/resize.h"
#include "reference/tensor.h"
#include "runtime/reference/reference_ops.h"

namespace sparsecol::runtime {

namespace {

namespace kernels = sparsecol::kernels::reference;
using graph::InferContext;

// The graph-side validators fail through an InferContext; this one names the same node.
InferContext site(const RefOpContext& ctx) { return InferContext(ctx.graph, ctx.node); }

std::string dims(const std::vector<int64_t>& values) {
  return fmt::format("[{}]", fmt::join(values, ", "));
}

const Tensor* optional_input(const RefOpContext& ctx, std::size_t i) {
  return i < ctx.inputs.size() ? ctx.inputs[i] : nullptr;
}

const Tensor& input(const RefOpContext& ctx, std::size_t i) {
  const Tensor* t = optional_input(ctx, i);
  if (t == nullptr) ctx.fail(ErrorCode::kInvalidModel, fmt::format("input {} is missing", i));
  return *t;
}

Tensor& output(const RefOpContext& ctx, std::size_t i) {
  if (i >= ctx.outputs.size() || ctx.outputs[i] == nullptr) {
    ctx.fail(ErrorCode::kInternal, fmt::format("output {} was not allocated", i));
  }
  return *ctx.outputs[i];
}

// The output the executor allocated, checked against what this op computes from its inputs.
Tensor& checked_output(const RefOpContext& ctx, std::size_t i, DType dtype,
                       const std::vector<int64_t>& shape) {
  Tensor& out = output(ctx, i);
  if (out.dtype() != dtype || out.shape() != shape) {
    ctx.fail(ErrorCode::kInternal,
             fmt::format("output {} was allocated as {} {}, but the inputs give {} {}", i,
                         to_string(out.dtype()), dims(out.shape()), to_string(dtype), dims(shape)));
  }
  return out;
}

int64_t product(std::vector<int64_t>::const_iterator first,
                std::vector<int64_t>::const_iterator last) {
  return std::accumulate(first, last, int64_t{1}, std::multiplies<>());
}

int64_t axis_attr(const RefOpContext& ctx, int64_t rank, int64_t fallback) {
  if (rank == 0) ctx.fail(ErrorCode::kShapeMismatch, "input must have rank >= 1, got a scalar");
  return graph::normalize_axis(site(ctx), ctx.node.attr_int("axis", fallback), rank);
}

// Reshape, Flatten, Squeeze, Unsqueeze: the bytes are unchanged, only the shape differs.
void run_copy(RefOpContext& ctx) {
  const Tensor& in = input(ctx, 0);
  Tensor& out = output(ctx, 0);
  if (out.dtype() != in.dtype() || out.numel() != in.numel()) {
    ctx.fail(ErrorCode::kInternal,
             fmt::format("output was allocated as {} {}, input is {} {}", to_string(out.dtype()),
                         dims(out.shape()), to_string(in.dtype()), dims(in.shape())));
  }
  // An executor may alias the output to the input (the bytes are the same): nothing to copy.
  if (in.nbytes() > 0 && out.raw_data() != in.raw_data()) {
    std::memcpy(out.raw_data(), in.raw_data(), in.nbytes());
  }
}

void run_transpose(RefOpContext& ctx) {
  const Tensor& in = input(ctx, 0);
  const std::vector<int64_t> perm = graph::resolve_perm(site(ctx), in.rank());
  std::vector<int64_t> shape;
  shape.reserve(perm.size());
  for (int64_t p : perm) shape.push_back(in.dim(static_cast<int>(p)));
  Tensor& out = checked_output(ctx, 0, in.dtype(), shape);
  kernels::transpose(in.raw_data(), in.shape(), perm, out.raw_data(), dtype_size(in.dtype()));
}

void run_concat(RefOpContext& ctx) {
  const Tensor& first = input(ctx, 0);
  const auto axis = static_cast<std::size_t>(axis_attr(ctx, first.rank(), 0));
  std::vector<int64_t> shape = first.shape();
  shape[axis] = 0;
  std::vector<const void*> srcs;
  std::vector<int64_t> axis_dims;
  for (std::size_t i = 0; i < ctx.inputs.size(); ++i) {
    const Tensor& in = input(ctx, i);
    bool compatible = in.dtype() == first.dtype() && in.rank() == first.rank();
    for (std::size_t a = 0; compatible && a < shape.size(); ++a) {
      compatible = a == axis || in.shape()[a] == shape[a];
    }
    if (!compatible) {
      ctx.fail(ErrorCode::kShapeMismatch,
               fmt::format("input {} is {} {}, expected {} {} except along axis {}", i,
                           to_string(in.dtype()), dims(in.shape()), to_string(first.dtype()),
                           dims(first.shape()), axis));
    }
    shape[axis] += in.shape()[axis];
    srcs.push_back(in.raw_data());
    axis_dims.push_back(in.shape()[axis]);
  }
  Tensor& out = checked_output(ctx, 0, first.dtype(), shape);
  kernels::concat(srcs, axis_dims, product(shape.begin(), shape.begin() + axis),
                  product(shape.begin() + axis + 1, shape.end()), out.raw_data(),
                  dtype_size(first.dtype()));
}

void run_split(RefOpContext& ctx) {
  const Tensor& in = input(ctx, 0);
  const auto axis = static_cast<std::size_t>(axis_attr(ctx, in.rank(), 0));
  // The sizes were resolved by inference (attribute, input or equal parts); the outputs carry
  // them, and they must tile the input exactly.
  std::vector<void*> dsts;
  std::vector<int64_t> axis_dims;
  int64_t total = 0;
  for (std::size_t k = 0; k < ctx.outputs.size(); ++k) {
    Tensor& out = output(ctx, k);
    std::vector<int64_t> expected = in.shape();
    expected[axis] = out.rank() == in.rank() ? out.shape()[axis] : 0;
    checked_output(ctx, k, in.dtype(), expected);
    total += expected[axis];
    dsts.push_back(out.raw_data());
    axis_dims.push_back(expected[axis]);
  }
  if (total != in.shape()[axis]) {
    ctx.fail(ErrorCode::kInternal, fmt::format("outputs split {} elements of axis {} of {}", total,
                                               axis, dims(in.shape())));
  }
  const std::vector<int64_t>& shape = in.shape();
  kernels::split(in.raw_data(), product(shape.begin(), shape.begin() + axis), axis_dims,
                 product(shape.begin() + axis + 1, shape.end()), dsts, dtype_size(in.dtype()));
}

void run_gather(RefOpContext& ctx) {
  const Tensor& data = input(ctx, 0);
  const Tensor& indices = input(ctx, 1);
  const auto axis = static_cast<std::size_t>(axis_attr(ctx, data.rank(), 0));
  const std::vector<int64_t>& shape = data.shape();
  const std::vector<int64_t> resolved =
      graph::resolve_indices(site(ctx), indices, shape[axis], ErrorCode::kInvalidArgument);
  std::vector<int64_t> expected(shape.begin(), shape.begin() + axis);
  expected.insert(expected.end(), indices.shape().begin(), indices.shape().end());
  expected.insert(expected.end(), shape.begin() + axis + 1, shape.end());
  Tensor& out = checked_output(ctx, 0, data.dtype(), expected);
  kernels::gather(data.raw_data(), product(shape.begin(), shape.begin() + axis), shape[axis],
                  product(shape.begin() + axis + 1, shape.end()), resolved, out.raw_data(),
                  dtype_size(data.dtype()));
}

void run_gather_elements(RefOpContext& ctx) {
  const Tensor& data = input(ctx, 0);
  const Tensor& indices = input(ctx, 1);
  const auto axis = static_cast<std::size_t>(axis_attr(ctx, data.rank(), 0));
  bool fits = indices.rank() == data.rank();
  for (std::size_t a = 0; fits && a < data.shape().size(); ++a) {
    fits = a == axis || indices.shape()[a] <= data.shape()[a];
  }
  if (!fits) {
    ctx.fail(ErrorCode::kShapeMismatch,
             fmt::format("indices of shape {} must have the rank of data {} and be no larger on "
                         "every axis but {}",
                         dims(indices.shape()), dims(data.shape()), axis));
  }
  const std::vector<int64_t> resolved =
      graph::resolve_indices(site(ctx), indices, data.shape()[axis], ErrorCode::kInvalidArgument);
  Tensor& out = checked_output(ctx, 0, data.dtype(), indices.shape());
  kernels::gather_elements(data.raw_data(), data.shape(), resolved, indices.shape(), axis,
                           out.raw_data(), dtype_size(data.dtype()));
}

void run_slice(RefOpContext& ctx) {
  const Tensor& data = input(ctx, 0);
  const std::vector<graph::SliceAxis> axes =
      graph::resolve_slice(site(ctx), data.shape(), input(ctx, 1), input(ctx, 2),
                           optional_input(ctx, 3), optional_input(ctx, 4));
  std::vector<int64_t> starts, steps, shape;
  for (const graph::SliceAxis& a : axes) {
    starts.push_back(a.start);
    steps.push_back(a.step);
    shape.push_back(a.count);
  }
  Tensor& out = checked_output(ctx, 0, data.dtype(), shape);
  kernels::slice(data.raw_data(), data.shape(), starts, steps, shape, out.raw_data(),
                 dtype_size(data.dtype()));
}

void run_expand(RefOpContext& ctx) {
  const Tensor& in = input(ctx, 0);
  const InferContext where = site(ctx);
  const std::vector<int64_t> shape =
      graph::broadcast_shapes(where, in.shape(), graph::int_values(where, input(ctx, 1), "shape"));
  Tensor& out = checked_output(ctx, 0, in.dtype(), shape);
  kernels::broadcast(in.raw_data(), in.shape(), shape, out.raw_data(), dtype_size(in.dtype()));
}

void run_tile(RefOpContext& ctx) {
  const Tensor& in = input(ctx, 0);
  const std::vector<int64_t> repeats = graph::int_values(site(ctx), input(ctx, 1), "repeats");
  if (repeats.size() != in.shape().size()) {
    ctx.fail(ErrorCode::kShapeMismatch,
             fmt::format("repeats {} must have one value per axis of input {}", dims(repeats),
                         dims(in.shape())));
  }
  std::vector<int64_t> shape(repeats.size());
  for (std::size_t a = 0; a < shape.size(); ++a) {
    if (repeats[a] < 0) {
      ctx.fail(ErrorCode::kInvalidModel,
               fmt::format("repeats {} has a negative value", dims(repeats)));
    }
    shape[a] = checked_mul(ctx.graph, ctx.node, in.shape()[a], repeats[a]);
  }
  Tensor& out = checked_output(ctx, 0, in.dtype(), shape);
  kernels::tile(in.raw_data(), in.shape(), repeats, out.raw_data(), dtype_size(in.dtype()));
}

kernels::PadMode pad_mode(const RefOpContext& ctx) {
  const std::string mode = ctx.node.attr_string("mode", "constant");
  if (mode == "constant") return kernels::PadMode::kConstant;
  if (mode == "reflect") return kernels::PadMode::kReflect;
  if (mode == "edge") return kernels::PadMode::kEdge;
  if (mode == "wrap") return kernels::PadMode::kWrap;
  ctx.fail(ErrorCode::kUnsupported,
           fmt::format("mode '{}' is not supported (constant, reflect, edge, wrap)", mode));
}

void run_pad(RefOpContext& ctx) {
  const Tensor& in = input(ctx, 0);
  const bool inputs = ctx.graph.opset >= 11;
  const std::vector<int64_t> pads =
      graph::resolve_pads(site(ctx), in.rank(), inputs ? &input(ctx, 1) : nullptr,
                          inputs ? optional_input(ctx, 3) : nullptr);
  const kernels::PadMode mode = pad_mode(ctx);
  const std::size_t element_size = dtype_size(in.dtype());
  // The fill value as bytes of the data's dtype: the constant_value input (opset 11+), the
  // `value` attribute converted from float (before), or zero.
  alignas(8) unsigned char value[8] = {};
  if (const Tensor* given = inputs ? optional_input(ctx, 2) : nullptr) {
    if (given->dtype() != in.dtype() || given->numel() != 1) {
      ctx.fail(ErrorCode::kInvalidModel,
               fmt::format("constant_value must be one {} element, got {} of shape {}",
                           to_string(in.dtype()), to_string(given->dtype()), dims(given->shape())));
    }
    std::memcpy(value, given->raw_data(), element_size);
  } else if (!inputs) {
    graph::visit_dtype(in.dtype(), [&](auto zero) {
      const auto v = static_cast<decltype(zero)>(ctx.node.attr_float("value", 0.0f));
      std::memcpy(value, &v, sizeof v);
    });
  }
  const std::size_t rank = in.shape().size();
  std::vector<int64_t> shape(rank);
  std::vector<int64_t> begin(pads.begin(), pads.begin() + static_cast<std::ptrdiff_t>(rank));
  for (std::size_t a = 0; a < rank; ++a) {
    shape[a] = checked_add(ctx.graph, ctx.node, in.shape()[a], pads[a]);
    shape[a] = checked_add(ctx.graph, ctx.node, shape[a], pads[a + rank]);
    if (mode != kernels::PadMode::kConstant && in.shape()[a] == 0 && shape[a] > 0) {
      ctx.fail(ErrorCode::kShapeMismatch, fmt::format("cannot pad the empty axis {} of {} by "
                                                      "repeating its elements",
                                                      a, dims(in.shape())));
    }
  }
  Tensor& out = checked_output(ctx, 0, in.dtype(), shape);
  kernels::pad(in.raw_data(), in.shape(), begin, shape, mode, value, out.raw_data(), element_size);
}

// The input's shape: from the tensor, or, when the constant folder asks before the tensor
// exists, from the graph (Shape and Size only need the shape).
std::vector<int64_t> input_shape(const RefOpContext& ctx) {
  if (const Tensor* in = optional_input(ctx, 0)) return in->shape();
  const int id = ctx.node.input(0);
  const graph::Value* value =
      id >= 0 && id < static_cast<int>(ctx.graph.values.size()) ? &ctx.graph.values[id] : nullptr;
  std::optional<std::vector<int64_t>> shape;
  if (value != nullptr && value->shape) shape = graph::concrete(*value->shape);
  if (!shape) ctx.fail(ErrorCode::kInvalidModel, "the input's shape is not known");
  return *shape;
}

void run_shape(RefOpContext& ctx) {
  const std::vector<int64_t> shape = input_shape(ctx);
  const auto [start, end] =
      graph::resolve_shape_range(site(ctx), static_cast<int64_t>(shape.size()));
  const std::vector<int64_t> dims_read(shape.begin() + start, shape.begin() + std::max(start, end));
  Tensor& out = checked_output(ctx, 0, DType::kInt64, {static_cast<int64_t>(dims_read.size())});
  std::copy(dims_read.begin(), dims_read.end(), out.data<int64_t>());
}

void run_size(RefOpContext& ctx) {
  const std::vector<int64_t> shape = input_shape(ctx);
  *checked_output(ctx, 0, DType::kInt64, {}).data<int64_t>() = product(shape.begin(), shape.end());
}

void run_constant(RefOpContext& ctx) {
  const Tensor value = graph::constant_value(site(ctx));
  Tensor& out = checked_output(ctx, 0, value.dtype(), value.shape());
  if (value.nbytes() > 0) std::memcpy(out.raw_data(), value.raw_data(), value.nbytes());
}

void run_constant_of_shape(RefOpContext& ctx) {
  const std::vector<int64_t> shape = graph::int_values(site(ctx), input(ctx, 0), "shape");
  const Tensor* value = ctx.node.attr_tensor("value");
  if (value != nullptr && value->numel() != 1) {
    ctx.fail(ErrorCode::kInvalidModel, fmt::format("attribute 'value' must hold one element, "
                                                   "got shape {}",
                                                   dims(value->shape())));
  }
  const float zero = 0.0f;
  const DType dtype = value != nullptr ? value->dtype() : DType::kFloat32;
  Tensor& out = checked_output(ctx, 0, dtype, shape);
  kernels::fill(out.raw_data(), out.numel(), value != nullptr ? value->raw_data() : &zero,
                dtype_size(dtype));
}

// Calls run(T{}) for the dtypes the arithmetic kernels are instantiated for.
template <typename Run>
void visit_arithmetic(const RefOpContext& ctx, DType dtype, Run&& run) {
  graph::visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> ||
                  std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>) {
      run(zero);
    } else {
      ctx.fail(ErrorCode::kUnsupported,
               fmt::format("dtype {} is not supported (float32, float64, int32, int64)",
                           to_string(dtype)));
    }
  });
}

void run_range(RefOpContext& ctx) {
  const Tensor& start = input(ctx, 0);
  const Tensor& delta = input(ctx, 2);
  if (start.numel() != 1 || delta.numel() != 1 || start.dtype() != delta.dtype()) {
    ctx.fail(ErrorCode::kInvalidModel, "start and delta must be scalars of the same dtype");
  }
  // The element count was computed by inference from start, limit and delta.
  Tensor& out = output(ctx, 0);
  checked_output(ctx, 0, start.dtype(), {out.numel()});
  visit_arithmetic(ctx, start.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::range<T>(*start.data<T>(), *delta.data<T>(), out.numel(), out.data<T>());
  });
}

// DepthToSpace and SpaceToDepth are one transpose of a 6-D view of the NCHW input.
void run_block_transpose(RefOpContext& ctx, bool to_space) {
  const Tensor& in = input(ctx, 0);
  const int64_t b = ctx.node.attr_int("blocksize", 0);
  const std::vector<int64_t>& s = in.shape();
  const bool valid = s.size() == 4 && b > 0 && b <= (int64_t{1} << 31) &&
                     (to_space ? s[1] % (b * b) == 0 : s[2] % b == 0 && s[3] % b == 0);
  if (!valid) {
    ctx.fail(ErrorCode::kShapeMismatch,
             fmt::format("blocksize {} does not divide input {}", b, dims(s)));
  }
  std::vector<int64_t> view, perm, shape;
  if (!to_space) {
    view = {s[0], s[1], s[2] / b, b, s[3] / b, b};
    perm = {0, 3, 5, 1, 2, 4};
    shape = {s[0], checked_mul(ctx.graph, ctx.node, s[1], b * b), s[2] / b, s[3] / b};
  } else if (ctx.node.attr_string("mode", "DCR") == "CRD") {
    view = {s[0], s[1] / (b * b), b, b, s[2], s[3]};
    perm = {0, 1, 4, 2, 5, 3};
    shape = {s[0], s[1] / (b * b), checked_mul(ctx.graph, ctx.node, s[2], b),
             checked_mul(ctx.graph, ctx.node, s[3], b)};
  } else {
    view = {s[0], b, b, s[1] / (b * b), s[2], s[3]};
    perm = {0, 3, 4, 1, 5, 2};
    shape = {s[0], s[1] / (b * b), checked_mul(ctx.graph, ctx.node, s[2], b),
             checked_mul(ctx.graph, ctx.node, s[3], b)};
  }
  Tensor& out = checked_output(ctx, 0, in.dtype(), shape);
  kernels::transpose(in.raw_data(), view, perm, out.raw_data(), dtype_size(in.dtype()));
}

void run_depth_to_space(RefOpContext& ctx) { run_block_transpose(ctx, true); }
void run_space_to_depth(RefOpContext& ctx) { run_block_transpose(ctx, false); }

// The value of an int32/int64 scalar input.
int64_t int_scalar(const RefOpContext& ctx, const Tensor& tensor, const char* what) {
  const std::vector<int64_t> values = graph::int_values(site(ctx), tensor, what);
  if (values.size() != 1) {
    ctx.fail(ErrorCode::kShapeMismatch,
             fmt::format("{} must hold one value, got shape {}", what, dims(tensor.shape())));
  }
  return values[0];
}

void run_cumsum(RefOpContext& ctx) {
  const Tensor& in = input(ctx, 0);
  if (in.rank() == 0) ctx.fail(ErrorCode::kShapeMismatch, "input must have rank >= 1");
  const auto axis = static_cast<std::size_t>(
      graph::normalize_axis(site(ctx), int_scalar(ctx, input(ctx, 1), "axis"), in.rank()));
  Tensor& out = checked_output(ctx, 0, in.dtype(), in.shape());
  const std::vector<int64_t>& s = in.shape();
  const bool exclusive = ctx.node.attr_int("exclusive", 0) != 0;
  const bool reverse = ctx.node.attr_int("reverse", 0) != 0;
  visit_arithmetic(ctx, in.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::cumsum<T>(in.data<T>(), product(s.begin(), s.begin() + axis), s[axis],
                       product(s.begin() + axis + 1, s.end()), exclusive, reverse, out.data<T>());
  });
}

// An attribute's value among its enumerators (inference refused any other value).
template <typename Enum>
Enum attr_enum(const RefOpContext& ctx, const char* attr, const char* fallback,
               std::initializer_list<std::pair<const char*, Enum>> values) {
  const std::string value = ctx.node.attr_string(attr, fallback);
  for (const auto& [name, e] : values) {
    if (value == name) return e;
  }
  ctx.fail(ErrorCode::kUnsupported, fmt::format("{} '{}' is not supported", attr, value));
}

void run_resize(RefOpContext& ctx) {
  const Tensor& in = input(ctx, 0);
  const graph::ResizeSpec spec =
      graph::resolve_resize(site(ctx), in.shape(), optional_input(ctx, 1), optional_input(ctx, 2),
                            optional_input(ctx, 3));
  Tensor& out = checked_output(ctx, 0, DType::kFloat32, spec.out);
  using kernels::NearestRounding;
  using kernels::ResizeCoordinates;
  using kernels::ResizeMode;
  kernels::ResizeParams params;
  params.mode = attr_enum<ResizeMode>(ctx, "mode", "nearest",
                                      {{"nearest", ResizeMode::kNearest},
                                       {"linear", ResizeMode::kLinear},
                                       {"cubic", ResizeMode::kCubic}});
  params.coordinates =
      attr_enum<ResizeCoordinates>(ctx, "coordinate_transformation_mode", "half_pixel",
                                   {{"half_pixel", ResizeCoordinates::kHalfPixel},
                                    {"pytorch_half_pixel", ResizeCoordinates::kPytorchHalfPixel},
                                    {"align_corners", ResizeCoordinates::kAlignCorners},
                                    {"asymmetric", ResizeCoordinates::kAsymmetric},
                                    {"tf_half_pixel_for_nn", ResizeCoordinates::kTfHalfPixelForNn},
                                    {"tf_crop_and_resize", ResizeCoordinates::kTfCropAndResize}});
  params.nearest =
      attr_enum<NearestRounding>(ctx, "nearest_mode", "round_prefer_floor",
                                 {{"round_prefer_floor", NearestRounding::kRoundPreferFloor},
                                  {"round_prefer_ceil", NearestRounding::kRoundPreferCeil},
                                  {"floor", NearestRounding::kFloor},
                                  {"ceil", NearestRounding::kCeil}});
  params.cubic_coeff_a = ctx.node.attr_float("cubic_coeff_a", -0.75f);
  params.exclude_outside = ctx.node.attr_int("exclude_outside", 0) != 0;
  params.extrapolation_value = ctx.node.attr_float("extrapolation_value", 0.0f);
  params.scales = spec.scales;
  params.roi = spec.roi;
  kernels::resize(in.data<float>(), in.shape(), out.data<float>(), out.shape(), params);
}

// out = data with updates' slices of `slice` elements written (or reduced) at `offsets`.
void scatter_into(RefOpContext& ctx, const Tensor& data, const Tensor& updates,
                  std::span<const int64_t> offsets, int64_t slice) {
  Tensor& out = checked_output(ctx, 0, data.dtype(), data.shape());
  std::memcpy(out.raw_data(), data.raw_data(), data.nbytes());
  using kernels::ScatterReduction;
  const ScatterReduction reduction = attr_enum<ScatterReduction>(ctx, "reduction", "none",
                                                                 {{"none", ScatterReduction::kNone},
                                                                  {"add", ScatterReduction::kAdd},
                                                                  {"mul", ScatterReduction::kMul},
                                                                  {"max", ScatterReduction::kMax},
                                                                  {"min", ScatterReduction::kMin}});
  if (reduction == ScatterReduction::kNone) {  // any dtype: bytes moved as they are
    kernels::scatter_nd(out.raw_data(), offsets, slice, updates.raw_data(),
                        dtype_size(data.dtype()));
    return;
  }
  visit_arithmetic(ctx, data.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::scatter_nd_reduce<T>(out.data<T>(), offsets, slice, updates.data<T>(), reduction);
  });
}

void run_scatter_nd(RefOpContext& ctx) {
  const Tensor& data = input(ctx, 0);
  const Tensor& indices = input(ctx, 1);
  const Tensor& updates = input(ctx, 2);  // of data's dtype (infer_scatter_nd)
  graph::check_nd_updates(site(ctx), data.shape(), indices.shape(), updates.shape());
  const graph::NdSlices slices = graph::resolve_nd_slices(site(ctx), data.shape(), indices.shape(),
                                                          &indices, ErrorCode::kInvalidArgument);
  scatter_into(ctx, data, updates, slices.offsets, slices.slice);
}

void run_scatter_elements(RefOpContext& ctx) {
  const Tensor& data = input(ctx, 0);
  const Tensor& indices = input(ctx, 1);
  const Tensor& updates = input(ctx, 2);  // of data's dtype and indices' shape
  const auto axis = static_cast<std::size_t>(axis_attr(ctx, data.rank(), 0));
  if (updates.shape() != indices.shape()) {
    ctx.fail(ErrorCode::kShapeMismatch, fmt::format("updates have shape {}, indices {}",
                                                    dims(updates.shape()), dims(indices.shape())));
  }
  const std::vector<int64_t> offsets = graph::resolve_element_offsets(
      site(ctx), data.shape(), indices.shape(), &indices, axis, ErrorCode::kInvalidArgument);
  scatter_into(ctx, data, updates, offsets, 1);
}

void run_grid_sample(RefOpContext& ctx) {
  const Tensor& x = input(ctx, 0);
  const Tensor& grid = input(ctx, 1);
  kernels::GridSampleShape shape;
  shape.batch = x.shape()[0];
  shape.channels = x.shape()[1];
  shape.in_h = x.shape()[2];
  shape.in_w = x.shape()[3];
  shape.out_h = grid.shape()[1];
  shape.out_w = grid.shape()[2];
  using kernels::GridPadding;
  using kernels::GridSampleMode;
  shape.mode = attr_enum<GridSampleMode>(ctx, "mode", "bilinear",
                                         {{"bilinear", GridSampleMode::kBilinear},
                                          {"nearest", GridSampleMode::kNearest},
                                          {"bicubic", GridSampleMode::kBicubic}});
  shape.padding = attr_enum<GridPadding>(ctx, "padding_mode", "zeros",
                                         {{"zeros", GridPadding::kZeros},
                                          {"border", GridPadding::kBorder},
                                          {"reflection", GridPadding::kReflection}});
  shape.align_corners = ctx.node.attr_int("align_corners", 0) != 0;
  Tensor& y = checked_output(ctx, 0, DType::kFloat32,
                             {shape.batch, shape.channels, shape.out_h, shape.out_w});
  kernels::grid_sample(x.data<float>(), grid.data<float>(), y.data<float>(), shape);
}

void run_einsum(RefOpContext& ctx) {
  std::vector<std::vector<int64_t>> shapes;
  for (std::size_t i = 0; i < ctx.inputs.size(); ++i) shapes.push_back(input(ctx, i).shape());
  const graph::EinsumSpec spec =
      graph::resolve_einsum(site(ctx), ctx.node.attr_string("equation", ""), shapes);
  const DType dtype = input(ctx, 0).dtype();
  Tensor& out = checked_output(ctx, 0, dtype, spec.output_shape);
  visit_arithmetic(ctx, dtype, [&](auto zero) {
    using T = decltype(zero);
    std::vector<const T*> operands;
    for (std::size_t i = 0; i < ctx.inputs.size(); ++i) operands.push_back(input(ctx, i).data<T>());
    kernels::einsum<T>(spec.sizes, operands, spec.input_strides, spec.output_strides, out.numel(),
                       out.data<T>());
  });
}

void run_top_k(RefOpContext& ctx) {
  const Tensor& x = input(ctx, 0);
  const graph::TopKSpec spec = graph::resolve_top_k(site(ctx), x.shape(), input(ctx, 1));
  std::vector<int64_t> shape = x.shape();
  int64_t outer = 1, inner = 1;
  for (std::size_t a = 0; a < spec.axis; ++a) outer *= shape[a];
  for (std::size_t a = spec.axis + 1; a < shape.size(); ++a) inner *= shape[a];
  const int64_t dim = shape[spec.axis];
  shape[spec.axis] = spec.k;
  Tensor& values = checked_output(ctx, 0, x.dtype(), shape);
  Tensor& indices = checked_output(ctx, 1, DType::kInt64, shape);
  const bool largest = ctx.node.attr_int("largest", 1) != 0;
  visit_arithmetic(ctx, x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::top_k<T>(x.data<T>(), outer, dim, inner, spec.k, largest, values.data<T>(),
                      indices.data<int64_t>());
  });
}

// GatherND: each index tuple's slice of data, one after another.
void run_gather_nd(RefOpContext& ctx) {
  const Tensor& data = input(ctx, 0);
  const Tensor& indices = input(ctx, 1);
  const int64_t batch_dims = ctx.node.attr_int("batch_dims", 0);
  const graph::NdSlices slices = graph::resolve_nd_slices(
      site(ctx), data.shape(), indices.shape(), &indices, ErrorCode::kInvalidArgument, batch_dims);
  Tensor& out =
      checked_output(ctx, 0, data.dtype(),
                     graph::nd_slices_shape(site(ctx), data.shape(), indices.shape(), batch_dims));
  const std::size_t bytes = static_cast<std::size_t>(slices.slice) * dtype_size(data.dtype());
  for (std::size_t t = 0; t < slices.offsets.size(); ++t) {
    std::memcpy(static_cast<char*>(out.raw_data()) + t * bytes,
                static_cast<const char*>(data.raw_data()) +
                    static_cast<std::size_t>(slices.offsets[t]) * dtype_size(data.dtype()),
                bytes);
  }
}

void run_eye_like(RefOpContext& ctx) {
  const Tensor& in = input(ctx, 0);
  Tensor& out = output(ctx, 0);
  checked_output(ctx, 0, out.dtype(), in.shape());
  if (in.rank() != 2) ctx.fail(ErrorCode::kShapeMismatch, "input must have rank 2");
  alignas(8) unsigned char one[8] = {};
  graph::visit_dtype(out.dtype(), [&](auto zero) {
    const auto v = static_cast<decltype(zero)>(1);
    std::memcpy(one, &v, sizeof v);
  });
  kernels::eye(in.dim(0), in.dim(1), ctx.node.attr_int("k", 0), one, out.raw_data(),
               dtype_size(out.dtype()));
}

void run_one_hot(RefOpContext& ctx) {
  const Tensor& indices = input(ctx, 0);
  const Tensor& values = input(ctx, 2);
  Tensor& out = output(ctx, 0);
  const int64_t rank = indices.rank() + 1;
  const int64_t axis = graph::normalize_axis(site(ctx), ctx.node.attr_int("axis", -1), rank);
  // The depth was read by inference (it sets the output's shape).
  const int64_t depth = out.rank() == rank ? out.dim(static_cast<int>(axis)) : 0;
  std::vector<int64_t> shape = indices.shape();
  shape.insert(shape.begin() + axis, depth);
  checked_output(ctx, 0, values.dtype(), shape);
  if (values.numel() != 2) ctx.fail(ErrorCode::kShapeMismatch, "values must be [off, on]");
  // Indices of any numeric dtype; negative ones count from depth; the rest give all `off`.
  std::vector<int64_t> hot(static_cast<std::size_t>(indices.numel()));
  graph::visit_dtype(indices.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* data = static_cast<const T*>(indices.raw_data());
    for (std::size_t i = 0; i < hot.size(); ++i) {
      const double x = std::trunc(static_cast<double>(data[i]));
      const double d = static_cast<double>(depth);
      hot[i] = x >= -d && x < d ? static_cast<int64_t>(x < 0 ? x + d : x) : -1;
    }
  });
  const std::size_t element_size = dtype_size(values.dtype());
  const auto* off = static_cast<const unsigned char*>(values.raw_data());
  const std::vector<int64_t>& s = indices.shape();
  kernels::one_hot(hot, product(s.begin(), s.begin() + axis), depth,
                   product(s.begin() + axis, s.end()), off, off + element_size, out.raw_data(),
                   element_size);
}

// ReverseSequence: per batch entry, its first sequence_lens[b] steps along the time axis in
// reverse order, the rest as they were: two strided copies each (the first with a negative
// time stride).
void run_reverse_sequence(RefOpContext& ctx) {
  const Tensor& in = input(ctx, 0);
  const Tensor& lens = input(ctx, 1);
  Tensor& out = checked_output(ctx, 0, in.dtype(), in.shape());
  const auto batch_axis = static_cast<std::size_t>(ctx.node.attr_int("batch_axis", 1));
  const auto time_axis = static_cast<std::size_t>(ctx.node.attr_int("time_axis", 0));
  const std::vector<int64_t> strides = kernels::contiguous_strides(in.shape());
  const int64_t steps = in.shape()[time_axis];
  const std::size_t element = dtype_size(in.dtype());
  for (int64_t b = 0; b < in.shape()[batch_axis]; ++b) {
    const int64_t length = lens.data<int64_t>()[b];
    if (length < 0 || length > steps) {
      ctx.fail(ErrorCode::kInvalidArgument,
               fmt::format("sequence_lens[{}] = {} is outside [0, {}] (the time axis)", b, length,
                           steps));
    }
    std::vector<int64_t> shape = in.shape();
    shape[batch_axis] = 1;
    const auto* src = static_cast<const unsigned char*>(in.raw_data());
    auto* dst = static_cast<unsigned char*>(out.raw_data());
    const auto at = [&](int64_t t) {
      return static_cast<std::size_t>(b * strides[batch_axis] + t * strides[time_axis]) * element;
    };
    std::vector<int64_t> reversed = strides;
    reversed[time_axis] = -strides[time_axis];
    shape[time_axis] = length;
    if (length > 0) {
      kernels::copy_strided(src + at(length - 1), reversed, dst + at(0), strides, shape, element);
    }
    shape[time_axis] = steps - length;
    if (length < steps) {
      kernels::copy_strided(src + at(length), strides, dst + at(length), strides, shape, element);
    }
  }
}

void run_trilu(RefOpContext& ctx) {
  const Tensor& in = input(ctx, 0);
  if (in.rank() < 2) ctx.fail(ErrorCode::kShapeMismatch, "input must have rank >= 2");
  const Tensor* k = optional_input(ctx, 1);
  Tensor& out = checked_output(ctx, 0, in.dtype(), in.shape());
  const std::vector<int64_t>& s = in.shape();
  kernels::trilu(in.raw_data(), product(s.begin(), s.end() - 2), s[s.size() - 2], s.back(),
                 k != nullptr ? int_scalar(ctx, *k, "k") : 0, ctx.node.attr_int("upper", 1) != 0,
                 out.raw_data(), dtype_size(in.dtype()));
}

constexpr RefOp kTensorReferenceOps[] = {
    {"Concat", run_concat},
    {"Constant", run_constant},
    {"ConstantOfShape", run_constant_of_shape},
    {"CumSum", run_cumsum},
    {"DepthToSpace", run_depth_to_space},
    {"Einsum", run_einsum},
    {"Expand", run_expand},
    {"EyeLike", run_eye_like},
    {"Flatten", run_copy},
    {"Gather", run_gather},
    {"GatherElements", run_gather_elements},
    {"GatherND", run_gather_nd},
    {"GridSample", run_grid_sample},
    {"OneHot", run_one_hot},
    {"Pad", run_pad},
    {"Range", run_range},
    {"Reshape", run_copy},
    {"Resize", run_resize},
    {"ReverseSequence", run_reverse_sequence},
    {"ScatterElements", run_scatter_elements},
    {"ScatterND", run_scatter_nd},
    {"Shape", run_shape},
    {"Size", run_size},
    {"Slice", run_slice},
    {"SpaceToDepth", run_space_to_depth},
    {"Split", run_split},
    {"Squeeze", run_copy},
    {"Tile", run_tile},
    {"Transpose", run_transpose},
    {"TopK", run_top_k},
    {"Trilu", run_trilu},
    {"Unsqueeze", run_copy},
};

}  // namespace

std::span<const RefOp> tensor_reference_ops() { return kTensorReferenceOps; }

}  // namespace sparsecol::runtime
