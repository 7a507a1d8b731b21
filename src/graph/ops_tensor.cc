// Shape and dtype inference of the tensor (data movement and shape) ops, ONNX opsets 11-17.
//
// These ops move bytes, so they accept every dtype. Whatever the model file says (perms,
// axes, indices, target shapes, pads) is checked here before anything is allocated, and every
// output's element count is checked to fit 64 bits.
#include "graph/ops_tensor.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iterator>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <type_traits>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace sparsecol::graph {

namespace {

std::string dims(const std::vector<int64_t>& values) {
  return fmt::format("[{}]", fmt::join(values, ", "));
}

// Sets an output only once its element count is known to fit 64 bits, so that no later
// allocation multiplies out a wrapped size.
void set_sized_output(InferContext& ctx, std::size_t i, DType dtype, std::vector<int64_t> shape) {
  try {
    checked_numel(shape);
  } catch (const Error& e) {
    ctx.fail(e.code(), fmt::format("output {}: {}", i, e.what()));
  }
  ctx.set_output(i, dtype, std::move(shape));
}

// Axes normalized against `rank`, each in [-rank, rank) and none repeated.
std::vector<int64_t> unique_axes(const InferContext& ctx, const std::vector<int64_t>& axes,
                                 int64_t rank, const char* what) {
  std::vector<bool> seen(static_cast<std::size_t>(rank), false);
  std::vector<int64_t> normalized;
  for (int64_t axis : axes) {
    if (axis < -rank || axis >= rank) {
      ctx.fail(ErrorCode::kInvalidModel,
               fmt::format("{} {} has axis {}, out of range [{}, {}] for rank {}", what, dims(axes),
                           axis, -rank, rank - 1, rank));
    }
    const int64_t a = axis < 0 ? axis + rank : axis;
    if (seen[static_cast<std::size_t>(a)]) {
      ctx.fail(ErrorCode::kInvalidModel,
               fmt::format("{} {} names axis {} more than once", what, dims(axes), a));
    }
    seen[static_cast<std::size_t>(a)] = true;
    normalized.push_back(a);
  }
  return normalized;
}

// Every element of an int32 or int64 tensor of any rank, as int64.
std::vector<int64_t> all_ints(const InferContext& ctx, const Tensor& tensor, const char* what) {
  if (tensor.dtype() != DType::kInt64 && tensor.dtype() != DType::kInt32) {
    ctx.fail(ErrorCode::kDtypeMismatch,
             fmt::format("{} must be int32 or int64, got {}", what, to_string(tensor.dtype())));
  }
  return visit_dtype(tensor.dtype(), [&](auto zero) {
    using T = decltype(zero);
    std::vector<int64_t> values;
    if constexpr (std::is_integral_v<T>) {
      const T* data = static_cast<const T*>(tensor.raw_data());
      values.assign(data, data + tensor.numel());
    }
    return values;
  });
}

std::vector<int64_t> constant_ints(const InferContext& ctx, std::size_t input, const char* what) {
  return int_values(ctx, ctx.required_constant(input, what), what);
}

// Squeeze/Unsqueeze axes: an attribute up to opset 12, an input from opset 13.
std::optional<std::vector<int64_t>> axes_operand(const InferContext& ctx) {
  if (ctx.graph().opset >= 13) {
    if (!ctx.has_input(1)) return std::nullopt;
    return constant_ints(ctx, 1, "axes");
  }
  if (!ctx.node().has_attr("axes")) return std::nullopt;
  return ctx.node().attr_ints("axes");
}

std::size_t axes_input_limit(const InferContext& ctx) { return ctx.graph().opset >= 13 ? 2 : 1; }

// The value of a one-element constant of any numeric dtype.
double scalar_value(const InferContext& ctx, std::size_t input, const char* what) {
  const Tensor& t = ctx.required_constant(input, what);
  if (t.numel() != 1) {
    ctx.fail(ErrorCode::kShapeMismatch,
             fmt::format("{} must hold exactly one element, got shape {}", what, dims(t.shape())));
  }
  return visit_dtype(t.dtype(), [&](auto zero) {
    return static_cast<double>(*static_cast<const decltype(zero)*>(t.raw_data()));
  });
}

// ---- ops ----

void infer_reshape(InferContext& ctx) {
  ctx.expect_inputs(2, 2);
  const std::vector<int64_t> in = ctx.shape(0);
  const std::vector<int64_t> target = constant_ints(ctx, 1, "target shape");
  const bool allow_zero = ctx.node().attr_int("allowzero", 0) != 0;
  std::vector<int64_t> out = target;
  std::optional<std::size_t> inferred;
  int64_t known = 1;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      if (inferred) {
        ctx.fail(ErrorCode::kInvalidModel,
                 fmt::format("target shape {} has more than one -1", dims(target)));
      }
      inferred = i;
      continue;
    }
    if (out[i] < -1) {
      ctx.fail(ErrorCode::kInvalidModel,
               fmt::format("target shape {} has negative dimension {}", dims(target), out[i]));
    }
    if (out[i] == 0 && !allow_zero) {
      // 0 copies the input's dimension at the same index.
      if (i >= in.size()) {
        ctx.fail(
            ErrorCode::kShapeMismatch,
            fmt::format("target shape {} copies dimension {} (0), but the input {} has rank {}",
                        dims(target), i, dims(in), in.size()));
      }
      out[i] = in[i];
    }
    known = checked_mul(ctx.graph(), ctx.node(), known, out[i]);
  }
  const int64_t count = checked_numel(in);
  if (inferred) {
    if (known == 0 || count % known != 0) {
      ctx.fail(ErrorCode::kShapeMismatch,
               fmt::format("cannot infer the -1 of target shape {} from input {} ({} elements)",
                           dims(target), dims(in), count));
    }
    out[*inferred] = count / known;
    known = count;
  }
  if (known != count) {
    ctx.fail(ErrorCode::kShapeMismatch,
             fmt::format("cannot reshape input {} ({} elements) to target shape {} ({} elements)",
                         dims(in), count, dims(out), known));
  }
  ctx.set_output(0, ctx.dtype(0), std::move(out));
}

void infer_flatten(InferContext& ctx) {
  ctx.expect_inputs(1, 1);
  const std::vector<int64_t> in = ctx.shape(0);
  const auto rank = static_cast<int64_t>(in.size());
  int64_t axis = ctx.node().attr_int("axis", 1);
  if (axis < -rank || axis > rank) {  // unlike most ops, axis == rank is allowed
    ctx.fail(ErrorCode::kInvalidModel,
             fmt::format("axis {} is out of range [{}, {}] for rank {}", axis, -rank, rank, rank));
  }
  if (axis < 0) axis += rank;
  const auto mid = in.begin() + axis;
  const int64_t outer = std::accumulate(in.begin(), mid, int64_t{1}, std::multiplies<>());
  const int64_t inner = std::accumulate(mid, in.end(), int64_t{1}, std::multiplies<>());
  ctx.set_output(0, ctx.dtype(0), {outer, inner});
}

void infer_transpose(InferContext& ctx) {
  ctx.expect_inputs(1, 1);
  const std::vector<int64_t> in = ctx.shape(0);
  std::vector<int64_t> out;
  for (int64_t p : resolve_perm(ctx, static_cast<int64_t>(in.size()))) {
    out.push_back(in[static_cast<std::size_t>(p)]);
  }
  ctx.set_output(0, ctx.dtype(0), std::move(out));
}

void infer_squeeze(InferContext& ctx) {
  ctx.expect_inputs(1, axes_input_limit(ctx));
  const std::vector<int64_t> in = ctx.shape(0);
  const auto rank = static_cast<int64_t>(in.size());
  const std::optional<std::vector<int64_t>> given = axes_operand(ctx);
  std::vector<bool> drop(in.size(), false);
  if (!given || given->empty()) {
    for (std::size_t i = 0; i < in.size(); ++i) drop[i] = in[i] == 1;
  } else {
    for (int64_t a : unique_axes(ctx, *given, rank, "axes")) {
      if (in[static_cast<std::size_t>(a)] != 1) {
        ctx.fail(ErrorCode::kShapeMismatch,
                 fmt::format("cannot squeeze axis {} of input {}: its size is {}, expected 1", a,
                             dims(in), in[static_cast<std::size_t>(a)]));
      }
      drop[static_cast<std::size_t>(a)] = true;
    }
  }
  std::vector<int64_t> out;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (!drop[i]) out.push_back(in[i]);
  }
  ctx.set_output(0, ctx.dtype(0), std::move(out));
}

void infer_unsqueeze(InferContext& ctx) {
  ctx.expect_inputs(ctx.graph().opset >= 13 ? 2 : 1, axes_input_limit(ctx));
  const std::vector<int64_t> in = ctx.shape(0);
  const std::optional<std::vector<int64_t>> given = axes_operand(ctx);
  if (!given) ctx.fail(ErrorCode::kInvalidModel, "axes are missing");
  // Axes count in the output's rank.
  const auto rank = static_cast<int64_t>(in.size() + given->size());
  std::vector<bool> inserted(static_cast<std::size_t>(rank), false);
  for (int64_t a : unique_axes(ctx, *given, rank, "axes"))
    inserted[static_cast<std::size_t>(a)] = true;
  std::vector<int64_t> out;
  out.reserve(inserted.size());
  auto next = in.begin();
  for (bool one : inserted) out.push_back(one ? 1 : *next++);
  ctx.set_output(0, ctx.dtype(0), std::move(out));
}

void infer_concat(InferContext& ctx) {
  ctx.expect_inputs(1, std::numeric_limits<std::size_t>::max());
  if (!ctx.node().has_attr("axis"))
    ctx.fail(ErrorCode::kInvalidModel, "attribute 'axis' is missing");
  std::vector<int64_t> out = ctx.shape(0);
  const auto rank = static_cast<int64_t>(out.size());
  if (rank == 0) ctx.fail(ErrorCode::kShapeMismatch, "cannot concatenate scalars");
  const auto axis =
      static_cast<std::size_t>(normalize_axis(ctx, ctx.node().attr_int("axis", 0), rank));
  out[axis] = 0;
  for (std::size_t i = 0; i < ctx.input_count(); ++i) {
    const std::vector<int64_t> in = ctx.shape(i);
    if (ctx.dtype(i) != ctx.dtype(0)) {
      ctx.fail(ErrorCode::kDtypeMismatch,
               fmt::format("input {} has dtype {}, expected {} like input 0", i,
                           to_string(ctx.dtype(i)), to_string(ctx.dtype(0))));
    }
    bool compatible = in.size() == out.size();
    for (std::size_t a = 0; compatible && a < in.size(); ++a) {
      compatible = a == axis || in[a] == out[a];
    }
    if (!compatible) {
      ctx.fail(ErrorCode::kShapeMismatch,
               fmt::format("input {} has shape {}, expected {} except along axis {}", i, dims(in),
                           dims(ctx.shape(0)), axis));
    }
    out[axis] = checked_add(ctx.graph(), ctx.node(), out[axis], in[axis]);
  }
  set_sized_output(ctx, 0, ctx.dtype(0), std::move(out));
}

void infer_split(InferContext& ctx) {
  const int64_t opset = ctx.graph().opset;
  ctx.expect_inputs(1, opset >= 13 ? 2 : 1);
  const std::vector<int64_t> in = ctx.shape(0);
  const auto rank = static_cast<int64_t>(in.size());
  if (rank == 0) ctx.fail(ErrorCode::kShapeMismatch, "cannot split a scalar");
  const auto axis =
      static_cast<std::size_t>(normalize_axis(ctx, ctx.node().attr_int("axis", 0), rank));
  const int64_t dim = in[axis];
  const auto parts = static_cast<int64_t>(ctx.node().outputs.size());
  if (parts == 0) ctx.fail(ErrorCode::kInvalidModel, "Split has no outputs");
  std::vector<int64_t> sizes;
  if (opset >= 13 && ctx.has_input(1)) {
    sizes = constant_ints(ctx, 1, "split");
  } else if (opset < 13 && ctx.node().has_attr("split")) {
    sizes = ctx.node().attr_ints("split");
  } else if (opset >= 18 && ctx.node().has_attr("num_outputs")) {
    // Opset 18: chunks of ceil(dim / n), the last one smaller.
    const int64_t chunk = (dim + parts - 1) / parts;
    for (int64_t k = 0; k < parts; ++k)
      sizes.push_back(std::clamp(dim - k * chunk, int64_t{0}, chunk));
  } else {
    if (dim % parts != 0) {
      ctx.fail(ErrorCode::kShapeMismatch,
               fmt::format("axis {} of input {} (size {}) does not split into {} equal parts", axis,
                           dims(in), dim, parts));
    }
    sizes.assign(static_cast<std::size_t>(parts), dim / parts);
  }
  if (static_cast<int64_t>(sizes.size()) != parts) {
    ctx.fail(ErrorCode::kInvalidModel,
             fmt::format("split {} has {} sizes for {} outputs", dims(sizes), sizes.size(), parts));
  }
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0)
      ctx.fail(ErrorCode::kInvalidModel, fmt::format("split {} has a negative size", dims(sizes)));
    total = checked_add(ctx.graph(), ctx.node(), total, s);
  }
  if (total != dim) {
    ctx.fail(ErrorCode::kShapeMismatch,
             fmt::format("split {} sums to {}, but axis {} of input {} has size {}", dims(sizes),
                         total, axis, dims(in), dim));
  }
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    std::vector<int64_t> out = in;
    out[axis] = sizes[k];
    ctx.set_output(k, ctx.dtype(0), std::move(out));
  }
}

// What Gather and GatherElements both check first: two inputs, integer indices, data not a
// scalar, and the axis attribute within data's rank (normalized).
struct GatherInputs {
  std::vector<int64_t> data, indices;
  std::size_t axis;
};
GatherInputs gather_inputs(InferContext& ctx) {
  ctx.expect_inputs(2, 2);
  ctx.expect_dtype(1, {DType::kInt32, DType::kInt64});
  GatherInputs in{ctx.shape(0), ctx.shape(1), 0};
  const auto rank = static_cast<int64_t>(in.data.size());
  if (rank == 0) ctx.fail(ErrorCode::kShapeMismatch, "cannot gather from a scalar");
  in.axis = static_cast<std::size_t>(normalize_axis(ctx, ctx.node().attr_int("axis", 0), rank));
  return in;
}

void infer_gather(InferContext& ctx) {
  const auto [data, indices, axis] = gather_inputs(ctx);
  if (const Tensor* constant = ctx.constant(1)) {
    resolve_indices(ctx, *constant, data[axis], ErrorCode::kInvalidModel);
  }
  std::vector<int64_t> out(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(axis));
  out.insert(out.end(), indices.begin(), indices.end());
  out.insert(out.end(), data.begin() + static_cast<std::ptrdiff_t>(axis) + 1, data.end());
  set_sized_output(ctx, 0, ctx.dtype(0), std::move(out));
}

void infer_gather_elements(InferContext& ctx) {
  const auto [data, indices, axis] = gather_inputs(ctx);
  bool fits = indices.size() == data.size();
  for (std::size_t a = 0; fits && a < data.size(); ++a) fits = a == axis || indices[a] <= data[a];
  if (!fits) {
    ctx.fail(ErrorCode::kShapeMismatch,
             fmt::format("indices of shape {} must have the rank of data {} and be no larger "
                         "on every axis but {}",
                         dims(indices), dims(data), axis));
  }
  if (const Tensor* constant = ctx.constant(1)) {
    resolve_indices(ctx, *constant, data[axis], ErrorCode::kInvalidModel);
  }
  ctx.set_output(0, ctx.dtype(0), indices);
}

void infer_resize(InferContext& ctx) {
  ctx.expect_inputs(1, 4);
  ctx.expect_dtype(0, {DType::kFloat32});
  const auto optional_constant = [&](std::size_t i, const char* what) -> const Tensor* {
    return ctx.has_input(i) ? &ctx.required_constant(i, what) : nullptr;
  };
  const ResizeSpec spec =
      resolve_resize(ctx, ctx.shape(0), optional_constant(1, "roi"), optional_constant(2, "scales"),
                     optional_constant(3, "sizes"));
  set_sized_output(ctx, 0, ctx.dtype(0), spec.out);
}

// What ScatterND and ScatterElements check first: three inputs, integer indices, updates of
// data's dtype, a known reduction.
void expect_scatter_inputs(InferContext& ctx, std::initializer_list<DType> index_types) {
  ctx.expect_inputs(3, 3);
  ctx.expect_dtype(1, index_types);
  if (ctx.dtype(2) != ctx.dtype(0)) {
    ctx.fail(ErrorCode::kDtypeMismatch,
             fmt::format("updates are {} but data is {}", to_string(ctx.dtype(2)),
                         to_string(ctx.dtype(0))));
  }
  const std::string reduction = ctx.node().attr_string("reduction", "none");
  if (reduction != "none" && reduction != "add" && reduction != "mul" && reduction != "max" &&
      reduction != "min") {
    ctx.fail(ErrorCode::kInvalidModel,
             fmt::format("reduction '{}' is not one of none, add, mul, max, min", reduction));
  }
}

void infer_scatter_nd(InferContext& ctx) {
  expect_scatter_inputs(ctx, {DType::kInt64});
  const std::vector<int64_t> data = ctx.shape(0);
  check_nd_updates(ctx, data, ctx.shape(1), ctx.shape(2));
  resolve_nd_slices(ctx, data, ctx.shape(1), ctx.constant(1), ErrorCode::kInvalidModel);
  ctx.set_output(0, ctx.dtype(0), data);
}

void infer_scatter_elements(InferContext& ctx) {
  expect_scatter_inputs(ctx, {DType::kInt32, DType::kInt64});
  const std::vector<int64_t> data = ctx.shape(0), indices = ctx.shape(1);
  if (ctx.shape(2) != indices) {
    ctx.fail(ErrorCode::kShapeMismatch,
             fmt::format("updates have shape {}, indices {}", dims(ctx.shape(2)), dims(indices)));
  }
  if (data.empty()) ctx.fail(ErrorCode::kShapeMismatch, "cannot scatter into a scalar");
  const auto rank = static_cast<int64_t>(data.size());
  const auto axis =
      static_cast<std::size_t>(normalize_axis(ctx, ctx.node().attr_int("axis", 0), rank));
  resolve_element_offsets(ctx, data, indices, ctx.constant(1), axis, ErrorCode::kInvalidModel);
  ctx.set_output(0, ctx.dtype(0), data);
}

void infer_grid_sample(InferContext& ctx) {
  ctx.expect_inputs(2, 2);
  ctx.expect_dtype(0, {DType::kFloat32});
  ctx.expect_dtype(1, {DType::kFloat32});
  const std::vector<int64_t> x = ctx.shape(0), grid = ctx.shape(1);
  if (x.size() != 4 || grid.size() != 4 || grid[0] != x[0] || grid[3] != 2) {
    ctx.fail(ErrorCode::kShapeMismatch,
             fmt::format("X {} and grid {}: expected X [N, C, H, W] and grid [N, H_out, W_out, 2]",
                         dims(x), dims(grid)));
  }
  set_sized_output(ctx, 0, DType::kFloat32, {x[0], x[1], grid[1], grid[2]});
}

void infer_einsum(InferContext& ctx) {
  ctx.expect_inputs(1, std::numeric_limits<std::size_t>::max());
  std::vector<std::vector<int64_t>> shapes;
  for (std::size_t i = 0; i < ctx.input_count(); ++i) {
    ctx.expect_dtype(i, {ctx.dtype(0)});
    shapes.push_back(ctx.shape(i));
  }
  ctx.expect_dtype(0, {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64});
  set_sized_output(
      ctx, 0, ctx.dtype(0),
      resolve_einsum(ctx, ctx.node().attr_string("equation", ""), shapes).output_shape);
}

void infer_top_k(InferContext& ctx) {
  ctx.expect_inputs(2, 2);
  ctx.expect_dtype(1, {DType::kInt64});
  std::vector<int64_t> shape = ctx.shape(0);
  const TopKSpec spec = resolve_top_k(ctx, shape, ctx.required_constant(1, "K"));
  shape[spec.axis] = spec.k;
  set_sized_output(ctx, 0, ctx.dtype(0), shape);
  set_sized_output(ctx, 1, DType::kInt64, shape);
}

void infer_gather_nd(InferContext& ctx) {
  ctx.expect_inputs(2, 2);
  ctx.expect_dtype(1, {DType::kInt64});
  const int64_t batch_dims = ctx.node().attr_int("batch_dims", 0);
  resolve_nd_slices(ctx, ctx.shape(0), ctx.shape(1), ctx.constant(1), ErrorCode::kInvalidModel,
                    batch_dims);
  set_sized_output(ctx, 0, ctx.dtype(0),
                   nd_slices_shape(ctx, ctx.shape(0), ctx.shape(1), batch_dims));
}

void infer_slice(InferContext& ctx) {
  ctx.expect_inputs(3, 5);
  const std::vector<int64_t> in = ctx.shape(0);
  const auto optional_constant = [&](std::size_t i, const char* what) -> const Tensor* {
    return ctx.has_input(i) ? &ctx.required_constant(i, what) : nullptr;
  };
  const std::vector<SliceAxis> axes =
      resolve_slice(ctx, in, ctx.required_constant(1, "starts"), ctx.required_constant(2, "ends"),
                    optional_constant(3, "axes"), optional_constant(4, "steps"));
  std::vector<int64_t> out;
  out.reserve(axes.size());
  for (const SliceAxis& a : axes) out.push_back(a.count);
  ctx.set_output(0, ctx.dtype(0), std::move(out));
}

void infer_expand(InferContext& ctx) {
  ctx.expect_inputs(2, 2);
  const std::vector<int64_t> shape = constant_ints(ctx, 1, "shape");
  for (int64_t d : shape) {
    if (d < 0)
      ctx.fail(ErrorCode::kInvalidModel,
               fmt::format("shape {} has a negative dimension", dims(shape)));
  }
  set_sized_output(ctx, 0, ctx.dtype(0), broadcast_shapes(ctx, ctx.shape(0), shape));
}

void infer_tile(InferContext& ctx) {
  ctx.expect_inputs(2, 2);
  const std::vector<int64_t> in = ctx.shape(0);
  const std::vector<int64_t> repeats = constant_ints(ctx, 1, "repeats");
  if (repeats.size() != in.size()) {
    ctx.fail(ErrorCode::kShapeMismatch,
             fmt::format("repeats {} must have one value per axis of input {}", dims(repeats),
                         dims(in)));
  }
  std::vector<int64_t> out(in.size());
  for (std::size_t a = 0; a < in.size(); ++a) {
    if (repeats[a] < 0)
      ctx.fail(ErrorCode::kInvalidModel,
               fmt::format("repeats {} has a negative value", dims(repeats)));
    out[a] = checked_mul(ctx.graph(), ctx.node(), in[a], repeats[a]);
  }
  set_sized_output(ctx, 0, ctx.dtype(0), std::move(out));
}

void infer_pad(InferContext& ctx) {
  const bool inputs = ctx.graph().opset >= 11;
  ctx.expect_inputs(inputs ? 2 : 1, inputs ? 4 : 1);
  const std::vector<int64_t> in = ctx.shape(0);
  const auto rank = static_cast<int64_t>(in.size());
  const std::string mode = ctx.node().attr_string("mode", "constant");
  if (mode != "constant" && mode != "reflect" && mode != "edge" && mode != "wrap") {
    ctx.fail(ErrorCode::kUnsupported,
             fmt::format("mode '{}' is not supported (constant, reflect, edge, wrap)", mode));
  }
  const std::vector<int64_t> pads =
      resolve_pads(ctx, rank, inputs ? &ctx.required_constant(1, "pads") : nullptr,
                   ctx.has_input(3) ? &ctx.required_constant(3, "axes") : nullptr);
  if (ctx.has_input(2)) {
    std::vector<int64_t> value_shape = ctx.shape(2);
    if (ctx.dtype(2) != ctx.dtype(0) || checked_numel(value_shape) != 1) {
      ctx.fail(ErrorCode::kInvalidModel,
               fmt::format("constant_value must be one {} element, got {} of shape {}",
                           to_string(ctx.dtype(0)), to_string(ctx.dtype(2)), dims(value_shape)));
    }
  }
  std::vector<int64_t> out(in.size());
  for (std::size_t a = 0; a < in.size(); ++a) {
    out[a] = checked_add(ctx.graph(), ctx.node(),
                         checked_add(ctx.graph(), ctx.node(), in[a], pads[a]), pads[a + in.size()]);
    if (out[a] < 0) {
      ctx.fail(ErrorCode::kShapeMismatch,
               fmt::format("pads {} crop axis {} of input {} below zero", dims(pads), a, dims(in)));
    }
    if (mode != "constant" && in[a] == 0 && out[a] > 0) {
      ctx.fail(
          ErrorCode::kShapeMismatch,
          fmt::format("mode '{}' cannot pad the empty axis {} of input {}", mode, a, dims(in)));
    }
  }
  set_sized_output(ctx, 0, ctx.dtype(0), std::move(out));
}

void infer_shape(InferContext& ctx) {
  ctx.expect_inputs(1, 1);
  const auto [start, end] = resolve_shape_range(ctx, static_cast<int64_t>(ctx.shape(0).size()));
  ctx.set_output(0, DType::kInt64, {std::max<int64_t>(end - start, 0)});
}

void infer_size(InferContext& ctx) {
  ctx.expect_inputs(1, 1);
  ctx.shape(0);  // must be known
  ctx.set_output(0, DType::kInt64, {});
}

void infer_constant(InferContext& ctx) {
  ctx.expect_inputs(0, 0);
  const Tensor value = constant_value(ctx);
  ctx.set_output(0, value.dtype(), value.shape());
}

void infer_constant_of_shape(InferContext& ctx) {
  ctx.expect_inputs(1, 1);
  const std::vector<int64_t> shape = constant_ints(ctx, 0, "shape");
  DType dtype = DType::kFloat32;
  if (const Tensor* value = ctx.node().attr_tensor("value")) {
    if (value->numel() != 1) {
      ctx.fail(ErrorCode::kInvalidModel,
               fmt::format("attribute 'value' must hold one element, got shape {}",
                           dims(value->shape())));
    }
    dtype = value->dtype();
  }
  set_sized_output(ctx, 0, dtype, shape);
}

void infer_range(InferContext& ctx) {
  ctx.expect_inputs(3, 3);
  const DType dtype = ctx.dtype(0);
  ctx.expect_dtype(0, {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64});
  for (std::size_t i = 1; i < 3; ++i) {
    if (ctx.dtype(i) != dtype) {
      ctx.fail(ErrorCode::kDtypeMismatch,
               fmt::format("input {} has dtype {}, expected {} like start", i,
                           to_string(ctx.dtype(i)), to_string(dtype)));
    }
  }
  const Tensor* operands[3];
  const char* names[3] = {"start", "limit", "delta"};
  for (std::size_t i = 0; i < 3; ++i) {
    operands[i] = &ctx.required_constant(i, names[i]);
    if (operands[i]->numel() != 1) {
      ctx.fail(ErrorCode::kShapeMismatch, fmt::format("{} must be a scalar, got shape {}", names[i],
                                                      dims(operands[i]->shape())));
    }
  }
  const int64_t count = visit_dtype(dtype, [&](auto zero) -> int64_t {
    using T = decltype(zero);
    const auto scalar = [&](int i) { return *static_cast<const T*>(operands[i]->raw_data()); };
    const T start = scalar(0), limit = scalar(1), delta = scalar(2);
    if (delta == T(0)) ctx.fail(ErrorCode::kInvalidModel, "delta must not be zero");
    if constexpr (std::is_integral_v<T>) {
      // ceil((limit - start) / delta) without overflow: the signs are known, so magnitudes fit
      // in uint64.
      if ((delta > 0) ? limit <= start : limit >= start) return 0;
      const auto magnitude = [](T a, T b) {  // |a - b| for a > b
        return static_cast<uint64_t>(a) - static_cast<uint64_t>(b);
      };
      const uint64_t span = delta > 0 ? magnitude(limit, start) : magnitude(start, limit);
      const uint64_t step = delta > 0
                                ? static_cast<uint64_t>(delta)
                                : uint64_t{0} - static_cast<uint64_t>(static_cast<int64_t>(delta));
      const uint64_t n = span / step + (span % step != 0 ? 1 : 0);
      if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        ctx.fail(ErrorCode::kShapeMismatch,
                 fmt::format("range({}, {}, {}) has too many elements", start, limit, delta));
      }
      return static_cast<int64_t>(n);
    } else {
      const double n = std::ceil((static_cast<double>(limit) - static_cast<double>(start)) /
                                 static_cast<double>(delta));
      if (!(n < 9.0e18)) {  // NaN, infinity, or beyond int64
        ctx.fail(ErrorCode::kShapeMismatch,
                 fmt::format("range({}, {}, {}) has too many elements", start, limit, delta));
      }
      return n > 0 ? static_cast<int64_t>(n) : 0;
    }
  });
  set_sized_output(ctx, 0, dtype, {count});
}

// DepthToSpace and SpaceToDepth: rank-4 NCHW, blocksize > 0.
int64_t block_size(const InferContext& ctx, const std::vector<int64_t>& in) {
  if (in.size() != 4)
    ctx.fail(ErrorCode::kShapeMismatch, fmt::format("input must be NCHW, got shape {}", dims(in)));
  const int64_t b = ctx.node().attr_int("blocksize", 0);
  if (b <= 0 || b > (int64_t{1} << 31)) {
    ctx.fail(ErrorCode::kInvalidModel, fmt::format("blocksize must be positive, got {}", b));
  }
  return b;
}

void infer_depth_to_space(InferContext& ctx) {
  ctx.expect_inputs(1, 1);
  const std::vector<int64_t> in = ctx.shape(0);
  const int64_t b = block_size(ctx, in);
  const std::string mode = ctx.node().attr_string("mode", "DCR");
  if (mode != "DCR" && mode != "CRD") {
    ctx.fail(ErrorCode::kInvalidModel, fmt::format("mode '{}' must be DCR or CRD", mode));
  }
  if (in[1] % (b * b) != 0) {
    ctx.fail(ErrorCode::kShapeMismatch, fmt::format("channels of input {} are not a multiple of "
                                                    "blocksize^2 = {}",
                                                    dims(in), b * b));
  }
  set_sized_output(ctx, 0, ctx.dtype(0),
                   {in[0], in[1] / (b * b), checked_mul(ctx.graph(), ctx.node(), in[2], b),
                    checked_mul(ctx.graph(), ctx.node(), in[3], b)});
}

void infer_space_to_depth(InferContext& ctx) {
  ctx.expect_inputs(1, 1);
  const std::vector<int64_t> in = ctx.shape(0);
  const int64_t b = block_size(ctx, in);
  if (in[2] % b != 0 || in[3] % b != 0) {
    ctx.fail(
        ErrorCode::kShapeMismatch,
        fmt::format("height and width of input {} are not multiples of blocksize {}", dims(in), b));
  }
  set_sized_output(
      ctx, 0, ctx.dtype(0),
      {in[0], checked_mul(ctx.graph(), ctx.node(), in[1], b * b), in[2] / b, in[3] / b});
}

void infer_cumsum(InferContext& ctx) {
  ctx.expect_inputs(2, 2);
  ctx.expect_dtype(0, {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64});
  ctx.expect_dtype(1, {DType::kInt32, DType::kInt64});
  const std::vector<int64_t> in = ctx.shape(0);
  if (const Tensor* axis = ctx.constant(1)) {
    const std::vector<int64_t> value = int_values(ctx, *axis, "axis");
    if (value.size() != 1) ctx.fail(ErrorCode::kShapeMismatch, "axis must hold one value");
    unique_axes(ctx, value, static_cast<int64_t>(in.size()), "axis");
  }
  ctx.set_output(0, ctx.dtype(0), in);
}

void infer_eye_like(InferContext& ctx) {
  ctx.expect_inputs(1, 1);
  ctx.expect_rank(0, 2);
  const DType dtype = ctx.node().has_attr("dtype")
                          ? dtype_from_onnx_code(ctx, ctx.node().attr_int("dtype", 1))
                          : ctx.dtype(0);
  ctx.set_output(0, dtype, ctx.shape(0));
}

void infer_one_hot(InferContext& ctx) {
  ctx.expect_inputs(3, 3);
  const std::vector<int64_t> indices = ctx.shape(0);
  const std::vector<int64_t> values = ctx.shape(2);
  if (values.size() != 1 || values[0] != 2) {
    ctx.fail(ErrorCode::kShapeMismatch,
             fmt::format("values must be [off, on] of shape [2], got shape {}", dims(values)));
  }
  const double depth = scalar_value(ctx, 1, "depth");
  if (!(depth >= 0 && depth < 9.0e18)) {
    ctx.fail(ErrorCode::kInvalidModel,
             fmt::format("depth must be a non-negative count, got {}", depth));
  }
  const auto rank = static_cast<int64_t>(indices.size()) + 1;
  int64_t axis = ctx.node().attr_int("axis", -1);
  if (axis < -rank || axis >= rank) {
    ctx.fail(ErrorCode::kInvalidModel,
             fmt::format("axis {} is out of range [{}, {}] for output rank {}", axis, -rank,
                         rank - 1, rank));
  }
  if (axis < 0) axis += rank;
  std::vector<int64_t> out = indices;
  out.insert(out.begin() + axis, static_cast<int64_t>(depth));
  set_sized_output(ctx, 0, ctx.dtype(2), std::move(out));
}

void infer_reverse_sequence(InferContext& ctx) {
  ctx.expect_inputs(2, 2);
  ctx.expect_dtype(1, {DType::kInt64});
  const std::vector<int64_t> in = ctx.shape(0);
  const int64_t batch_axis = ctx.node().attr_int("batch_axis", 1);
  const int64_t time_axis = ctx.node().attr_int("time_axis", 0);
  if (in.size() < 2 || batch_axis == time_axis || (batch_axis != 0 && batch_axis != 1) ||
      (time_axis != 0 && time_axis != 1)) {
    ctx.fail(ErrorCode::kInvalidModel,
             fmt::format("input {} with batch_axis {} and time_axis {}: expected rank 2 or more "
                         "and the two axes 0 and 1 in either order",
                         dims(in), batch_axis, time_axis));
  }
  if (ctx.shape(1) != std::vector<int64_t>{in[static_cast<std::size_t>(batch_axis)]}) {
    ctx.fail(ErrorCode::kShapeMismatch,
             fmt::format("sequence_lens has shape {}, expected [{}] (the batch)",
                         dims(ctx.shape(1)), in[static_cast<std::size_t>(batch_axis)]));
  }
  ctx.set_output(0, ctx.dtype(0), in);
}

void infer_trilu(InferContext& ctx) {
  ctx.expect_inputs(1, 2);
  const std::vector<int64_t> in = ctx.shape(0);
  if (in.size() < 2) {
    ctx.fail(ErrorCode::kShapeMismatch,
             fmt::format("input must have rank >= 2, got shape {}", dims(in)));
  }
  if (ctx.has_input(1)) {
    ctx.expect_dtype(1, {DType::kInt64});
    if (const Tensor* k = ctx.constant(1); k != nullptr && k->numel() != 1) {
      ctx.fail(ErrorCode::kShapeMismatch,
               fmt::format("k must be a scalar, got shape {}", dims(k->shape())));
    }
  }
  ctx.set_output(0, ctx.dtype(0), in);
}

constexpr OpDef kTensorOps[] = {
    {"Concat", infer_concat},
    {"Constant", infer_constant},
    {"ConstantOfShape", infer_constant_of_shape},
    {"CumSum", infer_cumsum},
    {"DepthToSpace", infer_depth_to_space},
    {"Einsum", infer_einsum},
    {"Expand", infer_expand},
    {"EyeLike", infer_eye_like},
    {"Flatten", infer_flatten},
    {"Gather", infer_gather},
    {"GatherElements", infer_gather_elements},
    {"GatherND", infer_gather_nd},
    {"GridSample", infer_grid_sample},
    {"OneHot", infer_one_hot},
    {"Pad", infer_pad},
    {"Range", infer_range},
    {"Reshape", infer_reshape},
    {"Resize", infer_resize},
    {"ReverseSequence", infer_reverse_sequence},
    {"ScatterElements", infer_scatter_elements},
    {"ScatterND", infer_scatter_nd},
    {"Shape", infer_shape},
    {"Size", infer_size},
    {"Slice", infer_slice},
    {"SpaceToDepth", infer_space_to_depth},
    {"Split", infer_split},
    {"Squeeze", infer_squeeze},
    {"Tile", infer_tile},
    {"Transpose", infer_transpose},
    {"TopK", infer_top_k},
    {"Trilu", infer_trilu},
    {"Unsqueeze", infer_unsqueeze},
};

}  // namespace

std::span<const OpDef> tensor_op_defs() { return kTensorOps; }

// ---- parameters shared with the reference ops (ops_tensor.h) ----

std::vector<int64_t> int_values(const InferContext& ctx, const Tensor& tensor, const char* what) {
  if (tensor.rank() > 1) {
    ctx.fail(ErrorCode::kShapeMismatch,
             fmt::format("{} must be a 1-D tensor, got shape {}", what, dims(tensor.shape())));
  }
  return all_ints(ctx, tensor, what);
}

std::vector<int64_t> resolve_perm(const InferContext& ctx, int64_t rank) {
  std::vector<int64_t> reversed(static_cast<std::size_t>(rank));
  std::iota(reversed.rbegin(), reversed.rend(), int64_t{0});
  std::vector<int64_t> perm = ctx.node().attr_ints("perm", reversed);
  std::vector<int64_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> identity(static_cast<std::size_t>(rank));
  std::iota(identity.begin(), identity.end(), int64_t{0});
  if (sorted != identity) {
    ctx.fail(ErrorCode::kInvalidModel,
             fmt::format("perm {} is not a permutation of 0..{} for an input of rank {}",
                         dims(perm), rank - 1, rank));
  }
  return perm;
}

std::vector<int64_t> resolve_indices(const InferContext& ctx, const Tensor& indices, int64_t dim,
                                     ErrorCode code) {
  std::vector<int64_t> values = all_ints(ctx, indices, "indices");
  for (std::size_t k = 0; k < values.size(); ++k) {
    int64_t& index = values[k];
    if (index < -dim || index >= dim) {
      ctx.fail(code, fmt::format("index {} (element {} of indices) is out of range [{}, {}] for an "
                                 "axis of size {}",
                                 index, k, -dim, dim - 1, dim));
    }
    if (index < 0) index += dim;
  }
  return values;
}

ResizeSpec resolve_resize(const InferContext& ctx, const std::vector<int64_t>& in,
                          const Tensor* roi, const Tensor* scales, const Tensor* sizes) {
  const Node& node = ctx.node();
  const auto one_of = [&](const char* attr, const char* fallback,
                          std::initializer_list<const char*> allowed) {
    std::string value = node.attr_string(attr, fallback);
    for (const char* a : allowed) {
      if (value == a) return value;
    }
    ctx.fail(ErrorCode::kUnsupported,
             fmt::format("{} '{}' is not supported ({})", attr, value, fmt::join(allowed, ", ")));
  };
  one_of("mode", "nearest", {"nearest", "linear", "cubic"});
  one_of("nearest_mode", "round_prefer_floor",
         {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"});
  const std::string coordinates =
      one_of("coordinate_transformation_mode", "half_pixel",
             {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
              "tf_half_pixel_for_nn", "tf_crop_and_resize"});
  const auto rank = in.size();
  if (rank == 0) ctx.fail(ErrorCode::kShapeMismatch, "cannot resize a scalar");
  const auto given = [](const Tensor* t) { return t != nullptr && t->numel() > 0; };
  if (given(scales) == given(sizes)) {
    ctx.fail(ErrorCode::kInvalidModel,
             "exactly one of scales (input 2) and sizes (input 3) must be given");
  }
  ResizeSpec spec;
  spec.out.resize(rank);
  spec.scales.resize(rank);
  if (given(scales)) {
    if (scales->dtype() != DType::kFloat32 || scales->numel() != static_cast<int64_t>(rank)) {
      ctx.fail(ErrorCode::kInvalidModel,
               fmt::format("scales must be {} float32 values (one per axis of input {}), got {} {}",
                           rank, dims(in), scales->numel(), to_string(scales->dtype())));
    }
    for (std::size_t a = 0; a < rank; ++a) {
      const double scale = scales->data<float>()[a];
      const double length = std::floor(static_cast<double>(in[a]) * scale);
      if (!(scale > 0.0) || !(length < 0x1p62)) {
        ctx.fail(ErrorCode::kInvalidModel,
                 fmt::format("scale {} of axis {} (input {}) must be positive and finite", scale, a,
                             dims(in)));
      }
      spec.scales[a] = scale;
      spec.out[a] = static_cast<int64_t>(length);
    }
  } else {
    const std::vector<int64_t> lengths = int_values(ctx, *sizes, "sizes");
    if (sizes->dtype() != DType::kInt64 || lengths.size() != rank) {
      ctx.fail(ErrorCode::kInvalidModel,
               fmt::format("sizes must be {} int64 values (one per axis of input {}), got {}", rank,
                           dims(in), dims(lengths)));
    }
    for (std::size_t a = 0; a < rank; ++a) {
      if (lengths[a] < 0 || (in[a] == 0 && lengths[a] > 0)) {
        ctx.fail(
            ErrorCode::kShapeMismatch,
            fmt::format("sizes {} cannot come from input {}: axis {}", dims(lengths), dims(in), a));
      }
      spec.out[a] = lengths[a];
      spec.scales[a] =
          in[a] == 0 ? 1.0 : static_cast<double>(lengths[a]) / static_cast<double>(in[a]);
    }
  }
  if (coordinates == "tf_crop_and_resize") {
    if (!given(roi) || roi->numel() != static_cast<int64_t>(2 * rank) ||
        (roi->dtype() != DType::kFloat32 && roi->dtype() != DType::kFloat64)) {
      ctx.fail(ErrorCode::kInvalidModel,
               fmt::format("tf_crop_and_resize needs roi (input 1): {} float values for input {}",
                           2 * rank, dims(in)));
    }
    for (int64_t i = 0; i < roi->numel(); ++i) {
      spec.roi.push_back(roi->dtype() == DType::kFloat32 ? roi->data<float>()[i]
                                                         : roi->data<double>()[i]);
    }
  }
  return spec;
}

std::vector<int64_t> nd_slices_shape(const InferContext& ctx, const std::vector<int64_t>& data,
                                     const std::vector<int64_t>& indices, int64_t batch_dims) {
  const auto b = static_cast<std::size_t>(batch_dims);
  if (batch_dims < 0 || indices.size() <= b || data.size() <= b ||
      indices.back() > static_cast<int64_t>(data.size() - b) ||
      !std::equal(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(b), indices.begin())) {
    ctx.fail(
        ErrorCode::kShapeMismatch,
        fmt::format("indices {} must have rank > {} and a last axis no longer than the rank "
                    "of data {} less {}, and share data's first {} axes (batch_dims {})",
                    dims(indices), batch_dims, dims(data), batch_dims, batch_dims, batch_dims));
  }
  std::vector<int64_t> shape(indices.begin(), indices.end() - 1);
  shape.insert(shape.end(), data.begin() + static_cast<std::ptrdiff_t>(b) + indices.back(),
               data.end());
  return shape;
}

EinsumSpec resolve_einsum(const InferContext& ctx, const std::string& equation,
                          const std::vector<std::vector<int64_t>>& shapes) {
  std::string eq;
  std::copy_if(equation.begin(), equation.end(), std::back_inserter(eq),
               [](char c) { return c != ' '; });
  const std::size_t arrow = eq.find("->");
  const bool explicit_output = arrow != std::string::npos;
  // Terms as labels: a letter, or kEllipsis for "...".
  constexpr int kEllipsis = -1;
  auto parse_term = [&](const std::string& term) {
    std::vector<int> labels;
    for (std::size_t i = 0; i < term.size(); ++i) {
      if (term.compare(i, 3, "...") == 0 &&
          std::find(labels.begin(), labels.end(), kEllipsis) == labels.end()) {
        labels.push_back(kEllipsis);
        i += 2;
      } else if (std::isalpha(static_cast<unsigned char>(term[i]))) {
        labels.push_back(term[i]);
      } else {
        ctx.fail(ErrorCode::kInvalidModel,
                 fmt::format("equation '{}': term '{}' holds '{}' (terms are letters and at most "
                             "one '...')",
                             equation, term, term[i]));
      }
    }
    return labels;
  };
  std::vector<std::vector<int>> terms;
  const std::string lhs = eq.substr(0, arrow);
  for (std::size_t start = 0;;) {
    const std::size_t comma = lhs.find(',', start);
    terms.push_back(parse_term(lhs.substr(start, comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (terms.size() != shapes.size()) {
    ctx.fail(ErrorCode::kInvalidModel, fmt::format("equation '{}' has {} input terms for {} inputs",
                                                   equation, terms.size(), shapes.size()));
  }
  // The ellipsis' rank: the most dimensions any input gives it.
  int64_t ellipsis_rank = 0;
  for (std::size_t i = 0; i < terms.size(); ++i) {
    const auto letters = static_cast<int64_t>(
        std::count_if(terms[i].begin(), terms[i].end(), [](int l) { return l != kEllipsis; }));
    const bool has_ellipsis = letters != static_cast<int64_t>(terms[i].size());
    const auto rank = static_cast<int64_t>(shapes[i].size());
    if (rank < letters || (!has_ellipsis && rank != letters)) {
      ctx.fail(ErrorCode::kShapeMismatch,
               fmt::format("equation '{}': input {} has rank {}, its term names {} dimensions{}",
                           equation, i, rank, letters, has_ellipsis ? " and '...'" : ""));
    }
    if (has_ellipsis) ellipsis_rank = std::max(ellipsis_rank, rank - letters);
  }
  // Label ids: the ellipsis' dimensions first, then the letters in order of appearance.
  EinsumSpec spec;
  spec.sizes.assign(static_cast<std::size_t>(ellipsis_rank), 1);
  std::map<int, std::size_t> letter_id;
  std::map<int, int> uses;
  auto id_of = [&](int letter) {
    auto [it, added] = letter_id.emplace(letter, spec.sizes.size());
    if (added) spec.sizes.push_back(-1);  // size not seen yet
    return it->second;
  };
  std::vector<std::vector<std::size_t>> axis_labels(terms.size());  // label id of each axis
  for (std::size_t i = 0; i < terms.size(); ++i) {
    const auto rank = static_cast<int64_t>(shapes[i].size());
    const int64_t given = rank - static_cast<int64_t>(terms[i].size()) + 1;  // "..." dims here
    for (int l : terms[i]) {
      if (l == kEllipsis) {
        for (int64_t e = ellipsis_rank - given; e < ellipsis_rank; ++e)
          axis_labels[i].push_back(static_cast<std::size_t>(e));
      } else {
        axis_labels[i].push_back(id_of(l));
        ++uses[l];
      }
    }
    for (std::size_t a = 0; a < axis_labels[i].size(); ++a) {
      int64_t& size = spec.sizes[axis_labels[i][a]];
      const int64_t dim = shapes[i][a];
      const bool ellipsis = axis_labels[i][a] < static_cast<std::size_t>(ellipsis_rank);
      if (size == -1 || (ellipsis && size == 1)) {
        size = dim;
      } else if (dim != size && !(ellipsis && dim == 1)) {
        ctx.fail(ErrorCode::kShapeMismatch,
                 fmt::format("equation '{}': input {} axis {} has size {} where its label has "
                             "size {}",
                             equation, i, a, dim, size));
      }
    }
  }
  std::vector<std::size_t> out_labels;
  if (explicit_output) {
    for (int l : parse_term(eq.substr(arrow + 2))) {
      if (l == kEllipsis) {
        for (int64_t e = 0; e < ellipsis_rank; ++e)
          out_labels.push_back(static_cast<std::size_t>(e));
      } else if (!letter_id.contains(l)) {
        ctx.fail(ErrorCode::kInvalidModel,
                 fmt::format("equation '{}': output label '{}' is in no input term", equation,
                             static_cast<char>(l)));
      } else if (std::find(out_labels.begin(), out_labels.end(), letter_id[l]) !=
                 out_labels.end()) {
        ctx.fail(ErrorCode::kInvalidModel,
                 fmt::format("equation '{}': output label '{}' appears twice", equation,
                             static_cast<char>(l)));
      } else {
        out_labels.push_back(letter_id[l]);
      }
    }
  } else {
    for (int64_t e = 0; e < ellipsis_rank; ++e) out_labels.push_back(static_cast<std::size_t>(e));
    for (const auto& [letter, count] : uses) {  // std::map: alphabetical (ASCII) order
      if (count == 1) out_labels.push_back(letter_id[letter]);
    }
  }
  spec.output_strides.assign(spec.sizes.size(), 0);
  int64_t stride = 1;
  for (std::size_t k = out_labels.size(); k-- > 0;) {
    spec.output_strides[out_labels[k]] = stride;
    stride *= spec.sizes[out_labels[k]];
  }
  for (std::size_t l : out_labels) spec.output_shape.push_back(spec.sizes[l]);
  // The reference op loops over every combination of label values: past 2^32 of them (seconds
  // to minutes) refuse rather than appear to hang.
  constexpr int64_t kMaxCombinations = int64_t{1} << 32;
  int64_t combinations = 1;
  for (int64_t size : spec.sizes) {
    if (size != 0 && combinations > kMaxCombinations / size) {
      ctx.fail(ErrorCode::kUnsupported,
               fmt::format("equation '{}' over shapes {} spans more than 2^32 combinations of "
                           "its labels' values, too many for the reference Einsum (one loop per "
                           "label)",
                           equation, fmt::join(shapes, " ")));
    }
    combinations *= size;
  }
  for (std::size_t i = 0; i < terms.size(); ++i) {
    std::vector<int64_t> strides(spec.sizes.size(), 0);
    int64_t axis_stride = 1;
    for (std::size_t a = axis_labels[i].size(); a-- > 0;) {
      if (shapes[i][a] != 1 || spec.sizes[axis_labels[i][a]] == 1)
        strides[axis_labels[i][a]] += axis_stride;  // a size-1 axis under a larger label: 0
      axis_stride *= shapes[i][a];
    }
    spec.input_strides.push_back(std::move(strides));
  }
  return spec;
}

TopKSpec resolve_top_k(const InferContext& ctx, const std::vector<int64_t>& x, const Tensor& k) {
  if (x.empty()) ctx.fail(ErrorCode::kShapeMismatch, "cannot take the top K of a scalar");
  TopKSpec spec;
  spec.axis = static_cast<std::size_t>(
      normalize_axis(ctx, ctx.node().attr_int("axis", -1), static_cast<int64_t>(x.size())));
  const std::vector<int64_t> values = int_values(ctx, k, "K");
  if (values.size() != 1 || values[0] < 0 || values[0] > x[spec.axis]) {
    ctx.fail(ErrorCode::kInvalidModel,
             fmt::format("K must be one value in [0, {}] (axis {} of {}), got {}", x[spec.axis],
                         spec.axis, dims(x), dims(values)));
  }
  spec.k = values[0];
  return spec;
}

std::vector<int64_t> resolve_element_offsets(const InferContext& ctx,
                                             const std::vector<int64_t>& data,
                                             const std::vector<int64_t>& indices,
                                             const Tensor* index_values, std::size_t axis,
                                             ErrorCode code) {
  bool fits = indices.size() == data.size() && axis < data.size();
  for (std::size_t a = 0; fits && a < data.size(); ++a) fits = a == axis || indices[a] <= data[a];
  if (!fits) {
    ctx.fail(ErrorCode::kShapeMismatch,
             fmt::format("indices of shape {} must have the rank of data {} and be no larger on "
                         "every axis but {}",
                         dims(indices), dims(data), axis));
  }
  if (index_values == nullptr) return {};
  const std::vector<int64_t> values = resolve_indices(ctx, *index_values, data[axis], code);
  std::vector<int64_t> offsets(values.size()), at(indices.size(), 0);
  for (std::size_t i = 0; i < values.size(); ++i) {
    int64_t offset = 0;
    for (std::size_t a = 0; a < data.size(); ++a) {
      offset = offset * data[a] + (a == axis ? values[i] : at[a]);
    }
    offsets[i] = offset;
    for (std::size_t a = indices.size(); a-- > 0;) {  // the next position, last axis fastest
      if (++at[a] < indices[a]) break;
      at[a] = 0;
    }
  }
  return offsets;
}

void check_nd_updates(const InferContext& ctx, const std::vector<int64_t>& data,
                      const std::vector<int64_t>& indices, const std::vector<int64_t>& updates) {
  const std::vector<int64_t> expected = nd_slices_shape(ctx, data, indices);
  if (updates != expected) {
    ctx.fail(ErrorCode::kShapeMismatch,
             fmt::format("updates have shape {}, expected {} (indices {}, data {})", dims(updates),
                         dims(expected), dims(indices), dims(data)));
  }
}

NdSlices resolve_nd_slices(const InferContext& ctx, const std::vector<int64_t>& data,
                           const std::vector<int64_t>& indices, const Tensor* index_values,
                           ErrorCode code, int64_t batch_dims) {
  nd_slices_shape(ctx, data, indices, batch_dims);
  const auto b = static_cast<std::size_t>(batch_dims);
  const auto k = static_cast<std::size_t>(indices.back());
  NdSlices out;
  out.slice = 1;
  for (std::size_t a = b + k; a < data.size(); ++a) out.slice *= data[a];
  if (index_values == nullptr) return out;
  int64_t tuples = 1, batch_tuples = 1, batch_stride = out.slice;
  for (std::size_t a = 0; a + 1 < indices.size(); ++a) tuples *= indices[a];
  for (std::size_t a = b; a + 1 < indices.size(); ++a) batch_tuples *= indices[a];
  for (std::size_t a = b; a < b + k; ++a) batch_stride *= data[a];
  const std::vector<int64_t> values = all_ints(ctx, *index_values, "indices");
  for (int64_t t = 0; t < tuples; ++t) {
    int64_t offset = 0;
    for (std::size_t a = 0; a < k; ++a) {
      int64_t index = values[static_cast<std::size_t>(t) * k + a];
      const int64_t dim = data[b + a];
      if (index < -dim || index >= dim) {
        ctx.fail(code, fmt::format("index {} (tuple {}, component {} of indices) is out of range "
                                   "[{}, {}] for axis {} of data {}",
                                   index, t, a, -dim, dim - 1, b + a, dims(data)));
      }
      offset = offset * dim + (index < 0 ? index + dim : index);
    }
    out.offsets.push_back(t / batch_tuples * batch_stride + offset * out.slice);
  }
  return out;
}

std::vector<SliceAxis> resolve_slice(const InferContext& ctx,
                                     const std::vector<int64_t>& data_shape, const Tensor& starts,
                                     const Tensor& ends, const Tensor* axes, const Tensor* steps) {
  const std::vector<int64_t> first = int_values(ctx, starts, "starts");
  const std::vector<int64_t> last = int_values(ctx, ends, "ends");
  const std::size_t n = first.size();
  std::vector<int64_t> axis_list(n);
  std::iota(axis_list.begin(), axis_list.end(), int64_t{0});
  if (axes != nullptr) axis_list = int_values(ctx, *axes, "axes");
  const std::vector<int64_t> step_list =
      steps != nullptr ? int_values(ctx, *steps, "steps") : std::vector<int64_t>(n, 1);
  if (last.size() != n || axis_list.size() != n || step_list.size() != n) {
    ctx.fail(
        ErrorCode::kInvalidModel,
        fmt::format("starts, ends, axes and steps must have the same length, got {}, {}, {}, {}", n,
                    last.size(), axis_list.size(), step_list.size()));
  }
  const auto rank = static_cast<int64_t>(data_shape.size());
  axis_list = unique_axes(ctx, axis_list, rank, "axes");
  std::vector<SliceAxis> result;
  result.reserve(data_shape.size());
  for (int64_t dim : data_shape) result.push_back(SliceAxis{0, 1, dim});
  for (std::size_t k = 0; k < n; ++k) {
    const int64_t dim = data_shape[static_cast<std::size_t>(axis_list[k])];
    const int64_t step = step_list[k];
    if (step == 0)
      ctx.fail(ErrorCode::kInvalidModel, fmt::format("steps {} contain a zero", dims(step_list)));
    // Negative positions count from the end (no overflow: the value is negative, dim >= 0).
    int64_t start = first[k] < 0 ? first[k] + dim : first[k];
    int64_t end = last[k] < 0 ? last[k] + dim : last[k];
    int64_t count = 0;
    if (dim == 0) {
      start = 0;
    } else if (step > 0) {
      start = std::clamp<int64_t>(start, 0, dim);
      end = std::clamp<int64_t>(end, 0, dim);
      count = end > start ? 1 + (end - start - 1) / step : 0;
    } else {
      start = std::clamp<int64_t>(start, 0, dim - 1);
      end = std::clamp<int64_t>(end, -1, dim - 1);
      const int64_t magnitude =
          step == std::numeric_limits<int64_t>::min() ? std::numeric_limits<int64_t>::max() : -step;
      count = start > end ? 1 + (start - end - 1) / magnitude : 0;
    }
    result[static_cast<std::size_t>(axis_list[k])] =
        SliceAxis{count > 0 ? start : 0, count > 1 ? step : 1, count};
  }
  return result;
}

std::vector<int64_t> resolve_pads(const InferContext& ctx, int64_t rank, const Tensor* pads,
                                  const Tensor* axes) {
  std::vector<int64_t> given;
  if (ctx.graph().opset < 11) {
    if (!ctx.node().has_attr("pads"))
      ctx.fail(ErrorCode::kInvalidModel, "attribute 'pads' is missing");
    given = ctx.node().attr_ints("pads");
  } else {
    if (pads == nullptr) ctx.fail(ErrorCode::kInvalidModel, "input 'pads' is missing");
    given = int_values(ctx, *pads, "pads");
  }
  std::vector<int64_t> axis_list(static_cast<std::size_t>(rank));
  std::iota(axis_list.begin(), axis_list.end(), int64_t{0});
  if (axes != nullptr) axis_list = unique_axes(ctx, int_values(ctx, *axes, "axes"), rank, "axes");
  const std::size_t n = axis_list.size();
  if (given.size() != 2 * n) {
    ctx.fail(ErrorCode::kInvalidModel,
             fmt::format("pads {} has {} values, expected 2 per padded axis = {}", dims(given),
                         given.size(), 2 * n));
  }
  std::vector<int64_t> result(2 * static_cast<std::size_t>(rank), 0);
  for (std::size_t k = 0; k < n; ++k) {
    const auto axis = static_cast<std::size_t>(axis_list[k]);
    result[axis] = given[k];
    result[axis + static_cast<std::size_t>(rank)] = given[n + k];
  }
  return result;
}

std::pair<int64_t, int64_t> resolve_shape_range(const InferContext& ctx, int64_t rank) {
  const auto clamp_position = [rank](int64_t p) {
    return std::clamp<int64_t>(p < 0 ? p + rank : p, 0, rank);
  };
  return {clamp_position(ctx.node().attr_int("start", 0)),
          clamp_position(ctx.node().attr_int("end", rank))};
}

Tensor constant_value(const InferContext& ctx) {
  const Node& node = ctx.node();
  if (node.has_attr("sparse_value")) {
    ctx.fail(ErrorCode::kUnsupported, "sparse_value constants are not supported");
  }
  if (node.has_attr("value_string") || node.has_attr("value_strings")) {
    ctx.fail(ErrorCode::kUnsupported, "string constants are not supported");
  }
  const char* const kKinds[] = {"value", "value_float", "value_floats", "value_int", "value_ints"};
  const auto given = std::count_if(std::begin(kKinds), std::end(kKinds),
                                   [&](const char* k) { return node.has_attr(k); });
  if (given != 1) {
    ctx.fail(ErrorCode::kInvalidModel,
             fmt::format("expected exactly one of the attributes {}, got {}",
                         fmt::join(kKinds, ", "), given));
  }
  if (const Tensor* value = node.attr_tensor("value")) return *value;
  const auto make = [](const auto& values, const std::vector<int64_t>& shape) {
    using T = typename std::decay_t<decltype(values)>::value_type;
    Tensor t = Tensor::zeros(DTypeOf<T>::kValue, shape);
    std::copy(values.begin(), values.end(), t.data<T>());
    return t;
  };
  if (node.has_attr("value_float"))
    return make(std::vector<float>{node.attr_float("value_float", 0)}, {});
  if (node.has_attr("value_int"))
    return make(std::vector<int64_t>{node.attr_int("value_int", 0)}, {});
  if (node.has_attr("value_floats")) {
    const std::vector<float> v = node.attr_floats("value_floats");
    return make(v, {static_cast<int64_t>(v.size())});
  }
  const std::vector<int64_t> v = node.attr_ints("value_ints");
  return make(v, {static_cast<int64_t>(v.size())});
}

EinsumProduct einsum_product(const EinsumSpec& spec) {
  enum Role { kBatch, kM, kN, kK };
  const bool two = spec.input_strides.size() == 2;
  std::vector<std::pair<Role, std::size_t>> labels;  // in spec order, grouped by role below
  for (std::size_t l = 0; l < spec.sizes.size(); ++l) {
    const int64_t a = spec.input_strides[0][l], b = two ? spec.input_strides[1][l] : 0;
    const Role role = spec.output_strides[l] == 0 && spec.sizes[l] != 1 ? kK
                      : a != 0 && b != 0                                ? kBatch
                      : b != 0                                          ? kN
                                                                        : kM;
    labels.emplace_back(role, l);
  }
  EinsumProduct p;
  auto add = [&](Role role, std::vector<int64_t>& shape, std::vector<int64_t>& strides,
                 const std::vector<int64_t>* from) {
    for (const auto& [r, l] : labels) {
      if (r != role) continue;
      shape.push_back(spec.sizes[l]);
      strides.push_back(from != nullptr ? (*from)[l] : 0);
    }
  };
  const std::vector<int64_t>* a = &spec.input_strides[0];
  const std::vector<int64_t>* b = two ? &spec.input_strides[1] : nullptr;
  for (Role role : {kBatch, kM, kK}) add(role, p.a_shape, p.a_strides, a);
  for (Role role : {kBatch, kK, kN}) add(role, p.b_shape, p.b_strides, b);
  for (Role role : {kBatch, kM, kN}) add(role, p.c_shape, p.c_strides, &spec.output_strides);
  for (const auto& [r, l] : labels) {
    int64_t& size = r == kBatch ? p.batch : r == kM ? p.m : r == kN ? p.n : p.k;
    size *= spec.sizes[l];
    ++(r == kBatch ? p.batch_labels : r == kM ? p.m_labels : r == kN ? p.n_labels : p.k_labels);
  }
  return p;
}

}  // namespace sparsecol::graph
