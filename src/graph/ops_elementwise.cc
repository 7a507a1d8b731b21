// Shape and dtype inference of the element-wise ops (unary, broadcasting binary and variadic,
// Where, Cast, Clip, Dropout) and of the reductions (Reduce*, ArgMax, ArgMin). ONNX semantics;
// the dtype rules are ONNX's restricted to the element types sparsecol has.
#include <algorithm>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "graph/ops_elementwise.h"

namespace sparsecol::graph {

namespace {

// The element types an op accepts.
enum class Types { kFloat, kNumeric, kNumericOrBool, kBool, kUInt8 };

void expect_types(const InferContext& ctx, std::size_t i, Types types) {
  using enum DType;
  switch (types) {
    case Types::kFloat:
      return ctx.expect_dtype(i, {kFloat32, kFloat64});
    case Types::kNumeric:
      return ctx.expect_dtype(i, {kFloat32, kFloat64, kInt64, kInt32, kInt8, kUInt8});
    case Types::kNumericOrBool:
      return ctx.expect_dtype(i, {kFloat32, kFloat64, kInt64, kInt32, kInt8, kUInt8, kBool});
    case Types::kBool:
      return ctx.expect_dtype(i, {kBool});
    case Types::kUInt8:
      return ctx.expect_dtype(i, {kUInt8});
  }
}

void expect_same_dtype(const InferContext& ctx, std::size_t i, std::size_t j) {
  if (ctx.dtype(i) != ctx.dtype(j)) {
    ctx.fail(ErrorCode::kDtypeMismatch,
             fmt::format("input {} has dtype {} but input {} has {}; they must match", j,
                         to_string(ctx.dtype(j)), i, to_string(ctx.dtype(i))));
  }
}

// The broadcast shape of inputs [first, end), which must all have input `first`'s dtype.
std::vector<int64_t> broadcast_inputs(const InferContext& ctx, std::size_t first, std::size_t end) {
  std::vector<int64_t> shape = ctx.shape(first);
  for (std::size_t i = first + 1; i < end; ++i) {
    expect_same_dtype(ctx, first, i);
    shape = broadcast_shapes(ctx, shape, ctx.shape(i));
  }
  return shape;
}

template <Types kTypes>
void infer_unary(InferContext& ctx) {
  ctx.expect_inputs(1, 1);
  expect_types(ctx, 0, kTypes);
  ctx.set_output(0, ctx.dtype(0), ctx.shape(0));
}

// IsNaN, IsInf: float in, bool out.
void infer_float_predicate(InferContext& ctx) {
  ctx.expect_inputs(1, 1);
  expect_types(ctx, 0, Types::kFloat);
  ctx.set_output(0, DType::kBool, ctx.shape(0));
}

template <Types kTypes, bool kBoolOutput>
void infer_binary(InferContext& ctx) {
  ctx.expect_inputs(2, 2);
  expect_types(ctx, 0, kTypes);
  ctx.set_output(0, kBoolOutput ? DType::kBool : ctx.dtype(0), broadcast_inputs(ctx, 0, 2));
}

// Sum, Mean, Max, Min: one or more inputs.
template <Types kTypes>
void infer_variadic(InferContext& ctx) {
  ctx.expect_inputs(1, std::numeric_limits<std::size_t>::max());
  for (std::size_t i = 0; i < ctx.input_count(); ++i) {
    if (!ctx.has_input(i)) ctx.fail(ErrorCode::kInvalidModel, fmt::format("input {} is empty", i));
  }
  expect_types(ctx, 0, kTypes);
  ctx.set_output(0, ctx.dtype(0), broadcast_inputs(ctx, 0, ctx.input_count()));
}

void infer_mod(InferContext& ctx) {
  infer_binary<Types::kNumeric, false>(ctx);
  const int64_t fmod = ctx.node().attr_int("fmod", 0);
  if (fmod != 0 && fmod != 1) {
    ctx.fail(ErrorCode::kInvalidModel, fmt::format("attribute fmod must be 0 or 1, got {}", fmod));
  }
  const DType dtype = ctx.dtype(0);
  if (fmod == 0 && (dtype == DType::kFloat32 || dtype == DType::kFloat64)) {
    ctx.fail(ErrorCode::kInvalidModel,
             fmt::format("Mod of {} requires fmod=1 (ONNX defines integer mod only for integers)",
                         to_string(dtype)));
  }
}

void infer_bit_shift(InferContext& ctx) {
  infer_binary<Types::kUInt8, false>(ctx);
  const std::string direction = ctx.node().attr_string("direction", "");
  if (direction != "LEFT" && direction != "RIGHT") {
    ctx.fail(ErrorCode::kInvalidModel,
             fmt::format("attribute direction must be LEFT or RIGHT, got '{}'", direction));
  }
}

// Pow: the exponent may have another numeric type than the base.
void infer_pow(InferContext& ctx) {
  ctx.expect_inputs(2, 2);
  ctx.expect_dtype(0, {DType::kFloat32, DType::kFloat64, DType::kInt64, DType::kInt32});
  expect_types(ctx, 1, Types::kNumeric);
  ctx.set_output(0, ctx.dtype(0), broadcast_shapes(ctx, ctx.shape(0), ctx.shape(1)));
}

// PRelu: the slope broadcasts to X one way only; the output has X's shape.
void infer_prelu(InferContext& ctx) {
  ctx.expect_inputs(2, 2);
  expect_types(ctx, 0, Types::kNumeric);
  expect_same_dtype(ctx, 0, 1);
  const std::vector<int64_t> x = ctx.shape(0);
  if (broadcast_shapes(ctx, x, ctx.shape(1)) != x) {
    ctx.fail(ErrorCode::kShapeMismatch,
             fmt::format("slope of shape [{}] does not broadcast to the input's shape [{}]",
                         fmt::join(ctx.shape(1), ", "), fmt::join(x, ", ")));
  }
  ctx.set_output(0, ctx.dtype(0), x);
}

void infer_where(InferContext& ctx) {
  ctx.expect_inputs(3, 3);
  expect_types(ctx, 0, Types::kBool);
  expect_types(ctx, 1, Types::kNumericOrBool);
  ctx.set_output(0, ctx.dtype(1), broadcast_shapes(ctx, ctx.shape(0), broadcast_inputs(ctx, 1, 3)));
}

// Clip: optional scalar min and max inputs (opset 11+), or min/max attributes before.
void infer_clip(InferContext& ctx) {
  ctx.expect_inputs(1, 3);
  expect_types(ctx, 0, Types::kNumeric);
  for (std::size_t i = 1; i < 3; ++i) {
    if (!ctx.has_input(i)) continue;
    expect_same_dtype(ctx, 0, i);
    const std::vector<int64_t> bound = ctx.shape(i);
    if (bound.size() > 1 || (bound.size() == 1 && bound[0] != 1)) {
      ctx.fail(ErrorCode::kShapeMismatch,
               fmt::format("{} (input {}) must be a scalar, got shape [{}]", i == 1 ? "min" : "max",
                           i, fmt::join(bound, ", ")));
    }
  }
  ctx.set_output(0, ctx.dtype(0), ctx.shape(0));
}

// Dropout at inference is the identity; the optional mask output is all true. Training mode
// (opset 12+: a boolean input) drops random elements, which an inference engine does not do,
// except with ratio 0 where it also is the identity.
void infer_dropout(InferContext& ctx) {
  ctx.expect_inputs(1, 3);
  expect_types(ctx, 0, Types::kFloat);
  if (ctx.has_input(2)) {
    const Tensor& training = ctx.required_constant(2, "training_mode");
    if (training.dtype() != DType::kBool || training.numel() != 1) {
      ctx.fail(ErrorCode::kInvalidModel, "training_mode must be a boolean scalar");
    }
    if (*training.data<bool>()) {
      const Tensor* ratio = ctx.has_input(1) ? &ctx.required_constant(1, "ratio") : nullptr;
      const bool zero_ratio = ratio != nullptr && ratio->numel() == 1 &&
                              ((ratio->dtype() == DType::kFloat32 && *ratio->data<float>() == 0) ||
                               (ratio->dtype() == DType::kFloat64 && *ratio->data<double>() == 0));
      if (!zero_ratio) {
        ctx.fail(ErrorCode::kUnsupported,
                 "training_mode=true (random dropout) is not supported for inference");
      }
    }
  }
  ctx.set_output(0, ctx.dtype(0), ctx.shape(0));
  ctx.set_output(1, DType::kBool, ctx.shape(0));
}

// ONNX's TensorProto.DataType numbering, as Cast's `to` attribute carries it.

void infer_cast(InferContext& ctx) {
  ctx.expect_inputs(1, 1);
  expect_types(ctx, 0, Types::kNumericOrBool);
  if (!ctx.node().has_attr("to")) ctx.fail(ErrorCode::kInvalidModel, "attribute 'to' is missing");
  ctx.set_output(0, dtype_from_onnx_code(ctx, ctx.node().attr_int("to", 0)), ctx.shape(0));
}

void infer_cast_like(InferContext& ctx) {
  ctx.expect_inputs(2, 2);
  expect_types(ctx, 0, Types::kNumericOrBool);
  expect_types(ctx, 1, Types::kNumericOrBool);
  ctx.set_output(0, ctx.dtype(1), ctx.shape(0));
}

// ---- quantization ----

void infer_quantize_linear(InferContext& ctx) {
  resolve_quant_axis(ctx);
  ctx.expect_dtype(0, {DType::kFloat32});
  if (ctx.has_input(2)) ctx.expect_dtype(2, {DType::kUInt8, DType::kInt8});
  ctx.set_output(0, ctx.has_input(2) ? ctx.dtype(2) : DType::kUInt8, ctx.shape(0));
}

void infer_dequantize_linear(InferContext& ctx) {
  resolve_quant_axis(ctx);
  ctx.expect_dtype(0, {DType::kUInt8, DType::kInt8, DType::kInt32});
  if (ctx.has_input(2) && ctx.dtype(2) != ctx.dtype(0)) {
    ctx.fail(ErrorCode::kDtypeMismatch,
             fmt::format("the zero point is {} but the input is {}", to_string(ctx.dtype(2)),
                         to_string(ctx.dtype(0))));
  }
  ctx.set_output(0, DType::kFloat32, ctx.shape(0));
}

// ---- reductions ----

// Whether this node's op takes `axes` as an input rather than an attribute: ReduceSum from
// opset 13, the other Reduce* ops from opset 18.
bool axes_from_input(const InferContext& ctx) {
  const int64_t since = ctx.node().op_type == "ReduceSum" ? 13 : 18;
  return ctx.graph().opset >= since;
}

}  // namespace

std::vector<int64_t> reduce_axes(const InferContext& ctx, int64_t rank) {
  std::vector<int64_t> axes;
  if (axes_from_input(ctx)) {
    ctx.expect_inputs(1, 2);
    if (ctx.has_input(1)) {
      const Tensor& t = ctx.required_constant(1, "axes");
      if (t.dtype() != DType::kInt64 || t.rank() > 1) {
        ctx.fail(ErrorCode::kInvalidModel,
                 fmt::format("axes must be a 1-D int64 tensor, got {} of rank {}",
                             to_string(t.dtype()), t.rank()));
      }
      axes.assign(t.data<int64_t>(), t.data<int64_t>() + t.numel());
    }
  } else {
    ctx.expect_inputs(1, 1);
    axes = ctx.node().attr_ints("axes");
  }
  if (axes.empty()) {
    if (ctx.node().attr_int("noop_with_empty_axes", 0) != 0) return {};
    axes.resize(static_cast<std::size_t>(rank));
    for (int64_t d = 0; d < rank; ++d) axes[static_cast<std::size_t>(d)] = d;
    return axes;
  }
  const std::vector<int64_t> given = axes;
  for (int64_t& axis : axes) axis = normalize_axis(ctx, axis, rank);
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end()) {
    ctx.fail(ErrorCode::kInvalidModel,
             fmt::format("axes [{}] name an axis twice (rank {})", fmt::join(given, ", "), rank));
  }
  return axes;
}

QuantAxis resolve_quant_axis(const InferContext& ctx) {
  ctx.expect_inputs(2, 3);
  ctx.expect_dtype(1, {DType::kFloat32});
  const std::vector<int64_t> x = ctx.shape(0), scale = ctx.shape(1);
  if (ctx.has_input(2) && ctx.shape(2) != scale) {
    ctx.fail(ErrorCode::kShapeMismatch,
             fmt::format("the zero point has shape [{}], the scale [{}]",
                         fmt::join(ctx.shape(2), ", "), fmt::join(scale, ", ")));
  }
  QuantAxis q;
  if (scale.empty() || (scale.size() == 1 && scale[0] == 1)) {
    for (int64_t d : x) q.inner *= d;
    return q;
  }
  const auto rank = static_cast<int64_t>(x.size());
  const int64_t axis =
      ctx.graph().opset >= 13 ? normalize_axis(ctx, ctx.node().attr_int("axis", 1), rank) : -1;
  if (axis < 0 || scale.size() != 1 || scale[0] != x[static_cast<std::size_t>(axis)]) {
    ctx.fail(ErrorCode::kShapeMismatch,
             fmt::format("the scale has shape [{}]: one value, or from opset 13 one per index "
                         "of axis {} of [{}]",
                         fmt::join(scale, ", "), axis, fmt::join(x, ", ")));
  }
  q.channels = scale[0];
  for (int64_t a = axis + 1; a < rank; ++a) q.inner *= x[static_cast<std::size_t>(a)];
  return q;
}

namespace {

// The shape after reducing `axes`: reduced dimensions become 1, or vanish without keepdims.
std::vector<int64_t> reduced_shape(const std::vector<int64_t>& shape,
                                   const std::vector<int64_t>& axes, bool keepdims) {
  std::vector<int64_t> out;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    const bool reduced = std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(d));
    if (!reduced)
      out.push_back(shape[d]);
    else if (keepdims)
      out.push_back(1);
  }
  return out;
}

void infer_reduce(InferContext& ctx) {
  if (!ctx.has_input(0)) ctx.fail(ErrorCode::kInvalidModel, "required input 0 is empty");
  expect_types(ctx, 0, Types::kNumeric);
  const std::vector<int64_t> shape = ctx.shape(0);
  const std::vector<int64_t> axes = reduce_axes(ctx, static_cast<int64_t>(shape.size()));
  ctx.set_output(0, ctx.dtype(0),
                 reduced_shape(shape, axes, ctx.node().attr_int("keepdims", 1) != 0));
}

void infer_arg_reduce(InferContext& ctx) {
  ctx.expect_inputs(1, 1);
  expect_types(ctx, 0, Types::kNumeric);
  const std::vector<int64_t> shape = ctx.shape(0);
  const auto rank = static_cast<int64_t>(shape.size());
  if (rank == 0)
    ctx.fail(ErrorCode::kShapeMismatch, "input must have rank 1 or more, got a scalar");
  const int64_t axis = normalize_axis(ctx, ctx.node().attr_int("axis", 0), rank);
  if (shape[static_cast<std::size_t>(axis)] == 0) {
    ctx.fail(ErrorCode::kShapeMismatch,
             fmt::format("axis {} of shape [{}] is empty: there is no index to return", axis,
                         fmt::join(shape, ", ")));
  }
  ctx.set_output(0, DType::kInt64,
                 reduced_shape(shape, {axis}, ctx.node().attr_int("keepdims", 1) != 0));
}

constexpr OpDef kOps[] = {
    // Unary, any numeric type.
    {"Abs", infer_unary<Types::kNumeric>},
    {"Neg", infer_unary<Types::kNumeric>},
    {"Sign", infer_unary<Types::kNumeric>},
    {"Relu", infer_unary<Types::kNumeric>},
    // Unary, floating point.
    {"Sqrt", infer_unary<Types::kFloat>},
    {"Exp", infer_unary<Types::kFloat>},
    {"Log", infer_unary<Types::kFloat>},
    {"Erf", infer_unary<Types::kFloat>},
    {"Reciprocal", infer_unary<Types::kFloat>},
    {"Floor", infer_unary<Types::kFloat>},
    {"Ceil", infer_unary<Types::kFloat>},
    {"Round", infer_unary<Types::kFloat>},
    {"Sin", infer_unary<Types::kFloat>},
    {"Cos", infer_unary<Types::kFloat>},
    {"Tan", infer_unary<Types::kFloat>},
    {"Asin", infer_unary<Types::kFloat>},
    {"Acos", infer_unary<Types::kFloat>},
    {"Atan", infer_unary<Types::kFloat>},
    {"Sinh", infer_unary<Types::kFloat>},
    {"Cosh", infer_unary<Types::kFloat>},
    {"Asinh", infer_unary<Types::kFloat>},
    {"Acosh", infer_unary<Types::kFloat>},
    {"Atanh", infer_unary<Types::kFloat>},
    {"Tanh", infer_unary<Types::kFloat>},
    {"Sigmoid", infer_unary<Types::kFloat>},
    {"LeakyRelu", infer_unary<Types::kFloat>},
    {"Elu", infer_unary<Types::kFloat>},
    {"Selu", infer_unary<Types::kFloat>},
    {"Celu", infer_unary<Types::kFloat>},
    {"HardSigmoid", infer_unary<Types::kFloat>},
    {"Shrink", infer_unary<Types::kFloat>},
    {"HardSwish", infer_unary<Types::kFloat>},
    {"Softplus", infer_unary<Types::kFloat>},
    {"Softsign", infer_unary<Types::kFloat>},
    {"ThresholdedRelu", infer_unary<Types::kFloat>},
    // Unary, other.
    {"Not", infer_unary<Types::kBool>},
    {"IsNaN", infer_float_predicate},
    {"IsInf", infer_float_predicate},
    {"Identity", infer_unary<Types::kNumericOrBool>},
    {"Dropout", infer_dropout},
    {"Cast", infer_cast},
    {"DequantizeLinear", infer_dequantize_linear},
    {"QuantizeLinear", infer_quantize_linear},
    {"CastLike", infer_cast_like},
    {"Clip", infer_clip},
    // Binary and variadic, broadcasting.
    {"Add", infer_binary<Types::kNumeric, false>},
    {"Sub", infer_binary<Types::kNumeric, false>},
    {"Mul", infer_binary<Types::kNumeric, false>},
    {"Div", infer_binary<Types::kNumeric, false>},
    {"Mod", infer_mod},
    {"Pow", infer_pow},
    {"PRelu", infer_prelu},
    {"BitShift", infer_bit_shift},
    {"Max", infer_variadic<Types::kNumeric>},
    {"Min", infer_variadic<Types::kNumeric>},
    {"Sum", infer_variadic<Types::kNumeric>},
    {"Mean", infer_variadic<Types::kFloat>},
    {"Equal", infer_binary<Types::kNumericOrBool, true>},
    {"Less", infer_binary<Types::kNumeric, true>},
    {"Greater", infer_binary<Types::kNumeric, true>},
    {"LessOrEqual", infer_binary<Types::kNumeric, true>},
    {"GreaterOrEqual", infer_binary<Types::kNumeric, true>},
    {"And", infer_binary<Types::kBool, true>},
    {"Or", infer_binary<Types::kBool, true>},
    {"Xor", infer_binary<Types::kBool, true>},
    {"Where", infer_where},
    // Reductions.
    {"ReduceSum", infer_reduce},
    {"ReduceMean", infer_reduce},
    {"ReduceMax", infer_reduce},
    {"ReduceMin", infer_reduce},
    {"ReduceProd", infer_reduce},
    {"ReduceL1", infer_reduce},
    {"ReduceL2", infer_reduce},
    {"ReduceLogSum", infer_reduce},
    {"ReduceLogSumExp", infer_reduce},
    {"ReduceSumSquare", infer_reduce},
    {"ArgMax", infer_arg_reduce},
    {"ArgMin", infer_arg_reduce},
};

}  // namespace

std::span<const OpDef> elementwise_op_defs() { return kOps; }

}  // namespace sparsecol::graph
