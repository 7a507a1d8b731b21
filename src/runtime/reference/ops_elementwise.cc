// Reference execution of the element-wise ops and the reductions: reads attributes, picks the
// element type, calls kernels/reference/elementwise.h and reduce.h. Shapes and dtypes were
// checked by inference (graph/ops_elementwise.cc); what is re-checked here is only what would
// otherwise make a kernel read or write out of bounds.
#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "graph/ops_elementwise.h"
#include "reference/elementwise.h"
#include "reference/quantize.h"
#include "reference/reduce.h"
#include "runtime/reference/reference_ops.h"

namespace sparsecol::runtime {

namespace {

namespace ref = kernels::reference;
using ref::BinaryOp;
using ref::CompareOp;
using ref::ReduceOp;
using ref::UnaryOp;

template <typename... Ts>
struct TypeList {};
using FloatTypes = TypeList<float, double>;
using NumericTypes = TypeList<float, double, int64_t, int32_t, int8_t, uint8_t>;
using AllTypes = TypeList<float, double, int64_t, int32_t, int8_t, uint8_t, bool>;

// Calls fn(T{}) with T the C++ element type of `dtype`, which must be one of Ts.
template <typename... Ts, typename Fn>
void dispatch(const RefOpContext& ctx, DType dtype, TypeList<Ts...> /*types*/, Fn&& fn) {
  const bool done = ((dtype == DTypeOf<Ts>::kValue ? (fn(Ts{}), true) : false) || ...);
  if (!done) {
    ctx.fail(ErrorCode::kUnsupported, fmt::format("the reference {} does not support dtype {}",
                                                  ctx.node.op_type, to_string(dtype)));
  }
}

const Tensor& input(const RefOpContext& ctx, std::size_t i) {
  if (i >= ctx.inputs.size() || ctx.inputs[i] == nullptr) {
    ctx.fail(ErrorCode::kInvalidModel, fmt::format("input {} is missing", i));
  }
  return *ctx.inputs[i];
}

const Tensor* optional_input(const RefOpContext& ctx, std::size_t i) {
  return i < ctx.inputs.size() ? ctx.inputs[i] : nullptr;
}

// Output i, checked to have `shape` (an executor bug otherwise, not a model error).
Tensor& output(const RefOpContext& ctx, std::size_t i, const std::vector<int64_t>& shape) {
  if (i >= ctx.outputs.size() || ctx.outputs[i] == nullptr) {
    ctx.fail(ErrorCode::kInternal, fmt::format("output {} is not allocated", i));
  }
  Tensor& t = *ctx.outputs[i];
  if (t.shape() != shape) {
    ctx.fail(ErrorCode::kInternal,
             fmt::format("output {} was allocated as [{}], the op computes [{}]", i,
                         fmt::join(t.shape(), ", "), fmt::join(shape, ", ")));
  }
  return t;
}

// Output i of a broadcasting op, whose shape the kernel checks against the operands.
Tensor& broadcast_output(const RefOpContext& ctx, std::size_t i) {
  if (i >= ctx.outputs.size() || ctx.outputs[i] == nullptr) {
    ctx.fail(ErrorCode::kInternal, fmt::format("output {} is not allocated", i));
  }
  return *ctx.outputs[i];
}

ref::Dims dims(const Tensor& t) { return t.shape(); }

// ---- unary ----

// ONNX's attribute defaults of the parameterized activations.
ref::UnaryParams unary_params(const graph::Node& node, UnaryOp op) {
  ref::UnaryParams p;
  switch (op) {
    case UnaryOp::kLeakyRelu:
      p.alpha = node.attr_float("alpha", 0.01f);
      break;
    case UnaryOp::kElu:
    case UnaryOp::kCelu:
    case UnaryOp::kThresholdedRelu:
      p.alpha = node.attr_float("alpha", 1.0f);
      break;
    case UnaryOp::kSelu:
      p.alpha = node.attr_float("alpha", 1.67326319217681884765625f);
      p.gamma = node.attr_float("gamma", 1.05070102214813232421875f);
      break;
    case UnaryOp::kHardSigmoid:
      p.alpha = node.attr_float("alpha", 0.2f);
      p.beta = node.attr_float("beta", 0.5f);
      break;
    case UnaryOp::kShrink:
      p.alpha = node.attr_float("lambd", 0.5f);
      p.beta = node.attr_float("bias", 0.0f);
      break;
    default:
      break;
  }
  return p;
}

template <UnaryOp kOp>
void run_unary(RefOpContext& ctx) {
  const Tensor& x = input(ctx, 0);
  Tensor& y = output(ctx, 0, x.shape());
  const ref::UnaryParams params = unary_params(ctx.node, kOp);
  using Types = std::conditional_t<ref::is_integer_unary(kOp), NumericTypes, FloatTypes>;
  dispatch(ctx, x.dtype(), Types{}, [&](auto type) {
    using T = decltype(type);
    ref::unary<T>(kOp, params, x.data<T>(), y.data<T>(), x.numel());
  });
}

void run_not(RefOpContext& ctx) {
  const Tensor& x = input(ctx, 0);
  Tensor& y = output(ctx, 0, x.shape());
  ref::logical_not(x.data<bool>(), y.data<bool>(), x.numel());
}

void run_is_nan(RefOpContext& ctx) {
  const Tensor& x = input(ctx, 0);
  Tensor& y = output(ctx, 0, x.shape());
  dispatch(ctx, x.dtype(), FloatTypes{}, [&](auto type) {
    using T = decltype(type);
    ref::is_nan<T>(x.data<T>(), y.data<bool>(), x.numel());
  });
}

void run_is_inf(RefOpContext& ctx) {
  const Tensor& x = input(ctx, 0);
  Tensor& y = output(ctx, 0, x.shape());
  const bool negative = ctx.node.attr_int("detect_negative", 1) != 0;
  const bool positive = ctx.node.attr_int("detect_positive", 1) != 0;
  dispatch(ctx, x.dtype(), FloatTypes{}, [&](auto type) {
    using T = decltype(type);
    ref::is_inf<T>(x.data<T>(), y.data<bool>(), x.numel(), negative, positive);
  });
}

void copy_to(const RefOpContext& ctx, const Tensor& x, Tensor& y) {
  if (y.dtype() != x.dtype()) {
    ctx.fail(ErrorCode::kInternal,
             fmt::format("output is {}, input is {}", to_string(y.dtype()), to_string(x.dtype())));
  }
  if (x.nbytes() > 0) std::memcpy(y.raw_data(), x.raw_data(), x.nbytes());
}

void run_identity(RefOpContext& ctx) {
  const Tensor& x = input(ctx, 0);
  copy_to(ctx, x, output(ctx, 0, x.shape()));
}

// Inference mode only (inference rejects random training-mode dropout): the identity, and a
// mask of all true.
void run_dropout(RefOpContext& ctx) {
  const Tensor& x = input(ctx, 0);
  copy_to(ctx, x, output(ctx, 0, x.shape()));
  if (ctx.outputs.size() > 1 && ctx.outputs[1] != nullptr) {
    Tensor& mask = output(ctx, 1, x.shape());
    std::fill_n(mask.data<bool>(), mask.numel(), true);
  }
}

// Cast and CastLike: the target type is the output's.
// ---- quantization ----

// x as [outer, channels, inner] for its scale and zero point (graph::resolve_quant_axis).
struct QuantView {
  int64_t outer = 1, channels = 1, inner = 1;
};
QuantView quant_view(const RefOpContext& ctx, const Tensor& x) {
  const graph::QuantAxis q = graph::resolve_quant_axis(graph::InferContext(ctx.graph, ctx.node));
  return {x.numel() / std::max<int64_t>(1, q.channels * q.inner), q.channels, q.inner};
}

// QuantizeLinear (float32 to Q) and DequantizeLinear (Q to float32).
template <bool kQuantize>
void run_linear_quantization(RefOpContext& ctx) {
  const Tensor& x = input(ctx, 0);
  const Tensor& scale = input(ctx, 1);
  const Tensor* zero_point = optional_input(ctx, 2);
  Tensor& y = output(ctx, 0, x.shape());
  const QuantView v = quant_view(ctx, x);
  using Types =
      std::conditional_t<kQuantize, TypeList<uint8_t, int8_t>, TypeList<uint8_t, int8_t, int32_t>>;
  dispatch(ctx, kQuantize ? y.dtype() : x.dtype(), Types{}, [&](auto type) {
    using Q = decltype(type);
    const Q* zero = zero_point != nullptr ? zero_point->data<Q>() : nullptr;
    if constexpr (kQuantize) {
      ref::quantize_linear<Q>(x.data<float>(), v.outer, v.channels, v.inner, scale.data<float>(),
                              zero, y.data<Q>());
    } else {
      ref::dequantize_linear<Q>(x.data<Q>(), v.outer, v.channels, v.inner, scale.data<float>(),
                                zero, y.data<float>());
    }
  });
}

void run_cast(RefOpContext& ctx) {
  const Tensor& x = input(ctx, 0);
  Tensor& y = output(ctx, 0, x.shape());
  ref::cast(x.dtype(), x.raw_data(), y.dtype(), y.raw_data(), x.numel());
}

// A scalar bound of Clip: input i if given (opset 11+), else attribute `name` (opset 6), else
// unbounded.
template <typename T>
T clip_bound(const RefOpContext& ctx, std::size_t i, const char* name, bool is_min) {
  if (const Tensor* bound = optional_input(ctx, i)) {
    if (bound->numel() != 1) {
      ctx.fail(ErrorCode::kShapeMismatch, fmt::format("{} must be a scalar, got shape [{}]", name,
                                                      fmt::join(bound->shape(), ", ")));
    }
    return *bound->data<T>();
  }
  if (ctx.node.has_attr(name)) return static_cast<T>(ctx.node.attr_float(name, 0.0f));
  if constexpr (std::is_floating_point_v<T>) {
    return is_min ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
  } else {
    return is_min ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max();
  }
}

void run_clip(RefOpContext& ctx) {
  const Tensor& x = input(ctx, 0);
  Tensor& y = output(ctx, 0, x.shape());
  dispatch(ctx, x.dtype(), NumericTypes{}, [&](auto type) {
    using T = decltype(type);
    ref::clip<T>(x.data<T>(), y.data<T>(), x.numel(), clip_bound<T>(ctx, 1, "min", true),
                 clip_bound<T>(ctx, 2, "max", false));
  });
}

// ---- broadcasting binary and variadic ----

template <typename Types>
void binary_op(RefOpContext& ctx, BinaryOp op) {
  const Tensor& a = input(ctx, 0);
  const Tensor& b = input(ctx, 1);
  Tensor& y = broadcast_output(ctx, 0);
  dispatch(ctx, a.dtype(), Types{}, [&](auto type) {
    using T = decltype(type);
    ref::binary<T>(op, a.data<T>(), dims(a), b.data<T>(), dims(b), y.data<T>(), dims(y));
  });
}

template <BinaryOp kOp, typename Types>
void run_binary(RefOpContext& ctx) {
  binary_op<Types>(ctx, kOp);
}

void run_mod(RefOpContext& ctx) {
  binary_op<NumericTypes>(ctx,
                          ctx.node.attr_int("fmod", 0) != 0 ? BinaryOp::kFmod : BinaryOp::kMod);
}

void run_bit_shift(RefOpContext& ctx) {
  const std::string direction = ctx.node.attr_string("direction", "");
  binary_op<TypeList<uint8_t>>(
      ctx, direction == "LEFT" ? BinaryOp::kBitShiftLeft : BinaryOp::kBitShiftRight);
}

template <CompareOp kOp, typename Types>
void run_compare(RefOpContext& ctx) {
  const Tensor& a = input(ctx, 0);
  const Tensor& b = input(ctx, 1);
  Tensor& y = broadcast_output(ctx, 0);
  dispatch(ctx, a.dtype(), Types{}, [&](auto type) {
    using T = decltype(type);
    ref::compare<T>(kOp, a.data<T>(), dims(a), b.data<T>(), dims(b), y.data<bool>(), dims(y));
  });
}

void run_pow(RefOpContext& ctx) {
  const Tensor& base = input(ctx, 0);
  const Tensor& exponent = input(ctx, 1);
  Tensor& y = broadcast_output(ctx, 0);
  dispatch(ctx, base.dtype(), TypeList<float, double, int64_t, int32_t>{}, [&](auto base_type) {
    dispatch(ctx, exponent.dtype(), NumericTypes{}, [&](auto exponent_type) {
      using T = decltype(base_type);
      using E = decltype(exponent_type);
      ref::pow<T, E>(base.data<T>(), dims(base), exponent.data<E>(), dims(exponent), y.data<T>(),
                     dims(y));
    });
  });
}

void run_where(RefOpContext& ctx) {
  const Tensor& cond = input(ctx, 0);
  const Tensor& x = input(ctx, 1);
  const Tensor& y = input(ctx, 2);
  Tensor& out = broadcast_output(ctx, 0);
  dispatch(ctx, x.dtype(), AllTypes{}, [&](auto type) {
    using T = decltype(type);
    ref::where<T>(cond.data<bool>(), dims(cond), x.data<T>(), dims(x), y.data<T>(), dims(y),
                  out.data<T>(), dims(out));
  });
}

// Folds every input into the output with `op`, in place: out = in0 broadcast, then
// out = out op in_k for each further input.
template <typename T>
void fold_inputs(const RefOpContext& ctx, BinaryOp op, Tensor& out) {
  const Tensor& first = input(ctx, 0);
  ref::broadcast_to<T>(first.data<T>(), dims(first), out.data<T>(), dims(out));
  for (std::size_t k = 1; k < ctx.inputs.size(); ++k) {
    const Tensor& in = input(ctx, k);
    ref::binary<T>(op, out.data<T>(), dims(out), in.data<T>(), dims(in), out.data<T>(), dims(out));
  }
}

template <BinaryOp kOp>
void run_variadic(RefOpContext& ctx) {
  Tensor& out = broadcast_output(ctx, 0);
  dispatch(ctx, input(ctx, 0).dtype(), NumericTypes{},
           [&](auto type) { fold_inputs<decltype(type)>(ctx, kOp, out); });
}

void run_mean(RefOpContext& ctx) {
  Tensor& out = broadcast_output(ctx, 0);
  dispatch(ctx, input(ctx, 0).dtype(), FloatTypes{}, [&](auto type) {
    using T = decltype(type);
    fold_inputs<T>(ctx, BinaryOp::kAdd, out);
    const T count = static_cast<T>(ctx.inputs.size());
    T* data = out.data<T>();
    for (int64_t i = 0; i < out.numel(); ++i) data[i] /= count;
  });
}

// ---- reductions ----

template <ReduceOp kOp>
void run_reduce(RefOpContext& ctx) {
  const Tensor& x = input(ctx, 0);
  Tensor& y = broadcast_output(ctx, 0);
  const std::vector<int64_t> axes =
      graph::reduce_axes(graph::InferContext(ctx.graph, ctx.node), x.rank());
  int64_t kept = 1;
  for (int64_t d = 0; d < x.rank(); ++d) {
    if (!std::binary_search(axes.begin(), axes.end(), d)) kept *= x.dim(static_cast<int>(d));
  }
  if (y.numel() != kept) {
    ctx.fail(ErrorCode::kInternal, fmt::format("output [{}] does not hold the {} reduced values",
                                               fmt::join(y.shape(), ", "), kept));
  }
  dispatch(ctx, x.dtype(), NumericTypes{}, [&](auto type) {
    using T = decltype(type);
    ref::reduce<T>(kOp, x.data<T>(), dims(x), axes, y.data<T>());
  });
}

template <bool kIsMax>
void run_arg_reduce(RefOpContext& ctx) {
  const Tensor& x = input(ctx, 0);
  Tensor& y = broadcast_output(ctx, 0);
  const int64_t rank = x.rank();
  int64_t axis = ctx.node.attr_int("axis", 0);
  if (axis < -rank || axis >= rank || x.dim(static_cast<int>(axis < 0 ? axis + rank : axis)) == 0) {
    ctx.fail(ErrorCode::kInvalidModel,
             fmt::format("axis {} is out of range or empty for shape [{}]", axis,
                         fmt::join(x.shape(), ", ")));
  }
  if (axis < 0) axis += rank;
  if (y.numel() != x.numel() / x.dim(static_cast<int>(axis))) {
    ctx.fail(ErrorCode::kInternal,
             fmt::format("output [{}] does not fit the input [{}]", fmt::join(y.shape(), ", "),
                         fmt::join(x.shape(), ", ")));
  }
  const bool last = ctx.node.attr_int("select_last_index", 0) != 0;
  dispatch(ctx, x.dtype(), NumericTypes{}, [&](auto type) {
    using T = decltype(type);
    ref::arg_reduce<T>(kIsMax, last, x.data<T>(), dims(x), axis, y.data<int64_t>());
  });
}

constexpr RefOp kOps[] = {
    {"Abs", run_unary<UnaryOp::kAbs>},
    {"Neg", run_unary<UnaryOp::kNeg>},
    {"Sign", run_unary<UnaryOp::kSign>},
    {"Relu", run_unary<UnaryOp::kRelu>},
    {"Sqrt", run_unary<UnaryOp::kSqrt>},
    {"Exp", run_unary<UnaryOp::kExp>},
    {"Log", run_unary<UnaryOp::kLog>},
    {"Erf", run_unary<UnaryOp::kErf>},
    {"Reciprocal", run_unary<UnaryOp::kReciprocal>},
    {"Floor", run_unary<UnaryOp::kFloor>},
    {"Ceil", run_unary<UnaryOp::kCeil>},
    {"Round", run_unary<UnaryOp::kRound>},
    {"Sin", run_unary<UnaryOp::kSin>},
    {"Cos", run_unary<UnaryOp::kCos>},
    {"Tan", run_unary<UnaryOp::kTan>},
    {"Asin", run_unary<UnaryOp::kAsin>},
    {"Acos", run_unary<UnaryOp::kAcos>},
    {"Atan", run_unary<UnaryOp::kAtan>},
    {"Sinh", run_unary<UnaryOp::kSinh>},
    {"Cosh", run_unary<UnaryOp::kCosh>},
    {"Asinh", run_unary<UnaryOp::kAsinh>},
    {"Acosh", run_unary<UnaryOp::kAcosh>},
    {"Atanh", run_unary<UnaryOp::kAtanh>},
    {"Tanh", run_unary<UnaryOp::kTanh>},
    {"Sigmoid", run_unary<UnaryOp::kSigmoid>},
    {"LeakyRelu", run_unary<UnaryOp::kLeakyRelu>},
    {"Elu", run_unary<UnaryOp::kElu>},
    {"Selu", run_unary<UnaryOp::kSelu>},
    {"Celu", run_unary<UnaryOp::kCelu>},
    {"HardSigmoid", run_unary<UnaryOp::kHardSigmoid>},
    {"Shrink", run_unary<UnaryOp::kShrink>},
    {"HardSwish", run_unary<UnaryOp::kHardSwish>},
    {"Softplus", run_unary<UnaryOp::kSoftplus>},
    {"Softsign", run_unary<UnaryOp::kSoftsign>},
    {"ThresholdedRelu", run_unary<UnaryOp::kThresholdedRelu>},
    {"Not", run_not},
    {"IsNaN", run_is_nan},
    {"IsInf", run_is_inf},
    {"Identity", run_identity},
    {"Dropout", run_dropout},
    {"Cast", run_cast},
    {"DequantizeLinear", run_linear_quantization<false>},
    {"QuantizeLinear", run_linear_quantization<true>},
    {"CastLike", run_cast},
    {"Clip", run_clip},
    {"Add", run_binary<BinaryOp::kAdd, NumericTypes>},
    {"Sub", run_binary<BinaryOp::kSub, NumericTypes>},
    {"Mul", run_binary<BinaryOp::kMul, NumericTypes>},
    {"Div", run_binary<BinaryOp::kDiv, NumericTypes>},
    {"Mod", run_mod},
    {"Pow", run_pow},
    {"PRelu", run_binary<BinaryOp::kPRelu, NumericTypes>},
    {"BitShift", run_bit_shift},
    {"Max", run_variadic<BinaryOp::kMax>},
    {"Min", run_variadic<BinaryOp::kMin>},
    {"Sum", run_variadic<BinaryOp::kAdd>},
    {"Mean", run_mean},
    {"Equal", run_compare<CompareOp::kEqual, AllTypes>},
    {"Less", run_compare<CompareOp::kLess, NumericTypes>},
    {"Greater", run_compare<CompareOp::kGreater, NumericTypes>},
    {"LessOrEqual", run_compare<CompareOp::kLessOrEqual, NumericTypes>},
    {"GreaterOrEqual", run_compare<CompareOp::kGreaterOrEqual, NumericTypes>},
    {"And", run_binary<BinaryOp::kAnd, TypeList<bool>>},
    {"Or", run_binary<BinaryOp::kOr, TypeList<bool>>},
    {"Xor", run_binary<BinaryOp::kXor, TypeList<bool>>},
    {"Where", run_where},
    {"ReduceSum", run_reduce<ReduceOp::kSum>},
    {"ReduceMean", run_reduce<ReduceOp::kMean>},
    {"ReduceMax", run_reduce<ReduceOp::kMax>},
    {"ReduceMin", run_reduce<ReduceOp::kMin>},
    {"ReduceProd", run_reduce<ReduceOp::kProd>},
    {"ReduceL1", run_reduce<ReduceOp::kL1>},
    {"ReduceL2", run_reduce<ReduceOp::kL2>},
    {"ReduceLogSum", run_reduce<ReduceOp::kLogSum>},
    {"ReduceLogSumExp", run_reduce<ReduceOp::kLogSumExp>},
    {"ReduceSumSquare", run_reduce<ReduceOp::kSumSquare>},
    {"ArgMax", run_arg_reduce<true>},
    {"ArgMin", run_arg_reduce<false>},
};

}  // namespace

std::span<const RefOp> elementwise_reference_ops() { return kOps; }

}  // namespace sparsecol::runtime
