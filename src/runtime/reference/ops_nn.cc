// Reference execution of the nn ops: parses the node with graph/op_params.h (the same parser
// shape inference uses), converts the parameters to the kernel's plain geometry and calls the
// naive kernel of kernels/reference.
#include <algorithm>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "graph/op_params.h"
#include "reference/conv.h"
#include "reference/gemm.h"
#include "reference/normalization.h"
#include "reference/pool.h"
#include "reference/recurrent.h"
#include "reference/softmax.h"
#include "runtime/kernel_bindings.h"
#include "runtime/reference/reference_ops.h"

namespace sparsecol::runtime {

namespace {

namespace ref = kernels::reference;
using Shape = std::vector<int64_t>;

const Tensor* optional_input(const RefOpContext& ctx, std::size_t i) {
  return i < ctx.inputs.size() ? ctx.inputs[i] : nullptr;
}

const Tensor& input(const RefOpContext& ctx, std::size_t i) {
  const Tensor* t = optional_input(ctx, i);
  if (t == nullptr) {
    ctx.fail(ErrorCode::kInvalidModel, fmt::format("required input {} is missing", i));
  }
  return *t;
}

std::optional<Shape> optional_shape(const RefOpContext& ctx, std::size_t i) {
  const Tensor* t = optional_input(ctx, i);
  if (t == nullptr) return std::nullopt;
  return t->shape();
}

// Input i's elements, or nullptr when the optional input is omitted. Every nn op computes in
// float32 for now.
const float* floats(const RefOpContext& ctx, std::size_t i) {
  const Tensor* t = optional_input(ctx, i);
  if (t == nullptr) return nullptr;
  if (t->dtype() != DType::kFloat32) {
    ctx.fail(ErrorCode::kUnsupported,
             fmt::format("input {} has dtype {}; supported: float32", i, to_string(t->dtype())));
  }
  return t->data<float>();
}

// Output i, checked against the shape the op computes: the caller allocated it from shape
// inference, and a disagreement would make the kernel write out of bounds. nullptr when the
// node does not use this (optional) output.
float* optional_output(const RefOpContext& ctx, std::size_t i, const Shape& shape) {
  if (i >= ctx.outputs.size() || ctx.outputs[i] == nullptr) return nullptr;
  Tensor& t = *ctx.outputs[i];
  if (t.dtype() != DType::kFloat32 || t.shape() != shape) {
    ctx.fail(ErrorCode::kInternal,
             fmt::format("output {} was allocated as {} [{}], the op computes float32 [{}]", i,
                         to_string(t.dtype()), fmt::join(t.shape(), ", "), fmt::join(shape, ", ")));
  }
  return t.data<float>();
}

float* output(const RefOpContext& ctx, std::size_t i, const Shape& shape) {
  float* data = optional_output(ctx, i, shape);
  if (data == nullptr) ctx.fail(ErrorCode::kInternal, fmt::format("output {} is missing", i));
  return data;
}

// src (shape `from`) repeated to shape `to` under numpy broadcasting; the caller has checked
// graph::broadcasts_to(from, to). Lets the kernels take full-size operands.
std::vector<float> broadcast(const float* src, const Shape& from, const Shape& to) {
  const std::size_t rank = to.size(), shift = rank - from.size();
  Shape strides(rank, 0);  // element stride of src along each dimension of `to`, 0 if repeated
  int64_t stride = 1;
  for (std::size_t d = rank; d-- > shift;) {
    const int64_t size = from[d - shift];
    strides[d] = size == 1 ? 0 : stride;
    stride *= size;
  }
  std::vector<float> dst(static_cast<std::size_t>(checked_numel(to)));
  Shape index(rank, 0);
  for (float& value : dst) {
    int64_t offset = 0;
    for (std::size_t d = 0; d < rank; ++d) offset += index[d] * strides[d];
    value = src[offset];
    for (std::size_t d = rank; d-- > 0;) {
      if (++index[d] < to[d]) break;
      index[d] = 0;
    }
  }
  return dst;
}

ref::Window to_window(const graph::WindowParams& params) {
  ref::Window w;
  w.rank = params.rank();
  for (int d = 0; d < w.rank; ++d) {
    const auto i = static_cast<std::size_t>(d);
    w.in_size[i] = params.in_size[i];
    w.out_size[i] = params.out_size[i];
    w.kernel[i] = params.kernel[i];
    w.stride[i] = params.strides[i];
    w.dilation[i] = params.dilations[i];
    w.pad_begin[i] = params.pads_begin[i];
    w.pad_end[i] = params.pads_end[i];
  }
  return w;
}

void run_conv(RefOpContext& ctx) {
  const graph::ConvParams p = graph::parse_conv(ctx.graph, ctx.node, input(ctx, 0).shape(),
                                                input(ctx, 1).shape(), optional_shape(ctx, 2));
  const ref::ConvShape shape{p.batch, p.in_channels, p.out_channels, p.group, to_window(p.window)};
  ref::conv_reference(floats(ctx, 0), floats(ctx, 1), floats(ctx, 2),
                      output(ctx, 0, p.output_shape()), shape);
}

void run_conv_transpose(RefOpContext& ctx) {
  const graph::ConvParams p = graph::parse_conv_transpose(
      ctx.graph, ctx.node, input(ctx, 0).shape(), input(ctx, 1).shape(), optional_shape(ctx, 2));
  const ref::ConvShape shape{p.batch, p.in_channels, p.out_channels, p.group, to_window(p.window)};
  ref::conv_transpose_reference(floats(ctx, 0), floats(ctx, 1), floats(ctx, 2),
                                output(ctx, 0, p.output_shape()), shape);
}

ref::PoolShape pool_shape(const RefOpContext& ctx, Shape* out_shape) {
  const graph::PoolParams p = graph::parse_pool(ctx.graph, ctx.node, input(ctx, 0).shape());
  *out_shape = p.output_shape();
  return {p.batch, p.channels, to_window(p.window), p.count_include_pad};
}

void run_max_pool(RefOpContext& ctx) {
  Shape out_shape;
  const ref::PoolShape shape = pool_shape(ctx, &out_shape);
  ref::max_pool_reference(floats(ctx, 0), output(ctx, 0, out_shape), shape);
}

void run_average_pool(RefOpContext& ctx) {
  Shape out_shape;
  const ref::PoolShape shape = pool_shape(ctx, &out_shape);
  ref::average_pool_reference(floats(ctx, 0), output(ctx, 0, out_shape), shape);
}

template <void (*Kernel)(const float*, float*, int64_t, int64_t)>
void run_global_pool(RefOpContext& ctx) {
  Shape shape = input(ctx, 0).shape();
  const graph::ChannelLayout layout = graph::parse_channel_layout(ctx.graph, ctx.node, shape);
  std::fill(shape.begin() + 2, shape.end(), 1);
  Kernel(floats(ctx, 0), output(ctx, 0, shape), layout.batch * layout.channels, layout.inner);
}

void run_batch_norm(RefOpContext& ctx) {
  const Shape& x_shape = input(ctx, 0).shape();
  const graph::ChannelNormParams p = graph::parse_batch_norm(
      ctx.graph, ctx.node, x_shape,
      {input(ctx, 1).shape(), input(ctx, 2).shape(), input(ctx, 3).shape(), input(ctx, 4).shape()});
  ref::batch_norm_inference_reference(floats(ctx, 0), floats(ctx, 1), floats(ctx, 2),
                                      floats(ctx, 3), floats(ctx, 4), output(ctx, 0, x_shape),
                                      p.layout.batch, p.layout.channels, p.layout.inner, p.epsilon);
}

void run_instance_norm(RefOpContext& ctx) {
  const Shape& x_shape = input(ctx, 0).shape();
  const graph::ChannelNormParams p = graph::parse_instance_norm(
      ctx.graph, ctx.node, x_shape, input(ctx, 1).shape(), input(ctx, 2).shape());
  ref::instance_norm_reference(floats(ctx, 0), floats(ctx, 1), floats(ctx, 2),
                               output(ctx, 0, x_shape), p.layout.batch, p.layout.channels,
                               p.layout.inner, p.epsilon);
}

void run_layer_norm(RefOpContext& ctx) {
  const Shape& x_shape = input(ctx, 0).shape();
  const graph::LayerNormParams p = graph::parse_layer_norm(
      ctx.graph, ctx.node, x_shape, input(ctx, 1).shape(), optional_shape(ctx, 2));
  const std::vector<float> scale =
      broadcast(floats(ctx, 1), input(ctx, 1).shape(), p.normalized_shape);
  std::vector<float> bias;
  if (const Tensor* b = optional_input(ctx, 2)) {
    bias = broadcast(floats(ctx, 2), b->shape(), p.normalized_shape);
  }
  ref::layer_norm_reference(floats(ctx, 0), scale.data(), bias.empty() ? nullptr : bias.data(),
                            output(ctx, 0, x_shape), optional_output(ctx, 1, p.stats_shape),
                            optional_output(ctx, 2, p.stats_shape), p.outer, p.inner, p.epsilon);
}

void run_lrn(RefOpContext& ctx) {
  const Shape& x_shape = input(ctx, 0).shape();
  const graph::LrnParams p = graph::parse_lrn(ctx.graph, ctx.node, x_shape);
  ref::lrn_reference(floats(ctx, 0), output(ctx, 0, x_shape), p.layout.batch, p.layout.channels,
                     p.layout.inner, p.size, p.alpha, p.beta, p.bias);
}

void run_gemm(RefOpContext& ctx) {
  const graph::GemmParams p = graph::parse_gemm(ctx.graph, ctx.node, input(ctx, 0).shape(),
                                                input(ctx, 1).shape(), optional_shape(ctx, 2));
  std::vector<float> c;
  if (const Tensor* t = optional_input(ctx, 2)) {
    c = broadcast(floats(ctx, 2), t->shape(), {p.m, p.n});
  }
  const ref::GemmShape shape{p.m, p.k, p.n, p.trans_a, p.trans_b, p.alpha, p.beta};
  ref::gemm_reference(floats(ctx, 0), floats(ctx, 1), c.empty() ? nullptr : c.data(),
                      output(ctx, 0, {p.m, p.n}), shape);
}

// Element strides between consecutive matrices of an operand along each batch dimension of
// the product: 0 where the operand's dimension is 1 (broadcast, or simply size 1).
Shape batch_strides(const Shape& operand_batch, int64_t matrix_size) {
  Shape strides(operand_batch.size(), 0);
  int64_t stride = matrix_size;
  for (std::size_t d = operand_batch.size(); d-- > 0;) {
    strides[d] = operand_batch[d] == 1 ? 0 : stride;
    stride *= operand_batch[d];
  }
  return strides;
}

void run_matmul(RefOpContext& ctx) {
  const graph::MatMulParams p =
      graph::parse_matmul(ctx.graph, ctx.node, input(ctx, 0).shape(), input(ctx, 1).shape());
  ref::MatMulShape shape;
  shape.m = p.m;
  shape.k = p.k;
  shape.n = p.n;
  shape.batch = p.batch;
  shape.a_batch_stride = batch_strides(p.a_batch, p.m * p.k);
  shape.b_batch_stride = batch_strides(p.b_batch, p.k * p.n);
  ref::matmul_reference(floats(ctx, 0), floats(ctx, 1), output(ctx, 0, p.output_shape), shape);
}

template <void (*Kernel)(const float*, float*, const ref::SoftmaxShape&)>
void run_softmax(RefOpContext& ctx) {
  const Shape& x_shape = input(ctx, 0).shape();
  const graph::SoftmaxParams p = graph::parse_softmax(ctx.graph, ctx.node, x_shape);
  Kernel(floats(ctx, 0), output(ctx, 0, x_shape), {p.outer, p.axis_size, p.inner});
}

void run_recurrent(RefOpContext& ctx) {
  std::vector<std::optional<Shape>> shapes;
  for (std::size_t i = 0; i < ctx.inputs.size(); ++i) shapes.push_back(optional_shape(ctx, i));
  const RecurrentBinding bound = bind_recurrent(ctx.graph, ctx.node, shapes);
  ref::RecurrentOperands o;
  o.x = floats(ctx, 0);
  o.w = floats(ctx, 1);
  o.r = floats(ctx, 2);
  o.b = floats(ctx, 3);
  if (const Tensor* lens = optional_input(ctx, 4)) {
    if (lens->dtype() != DType::kInt32) {
      ctx.fail(ErrorCode::kUnsupported,
               fmt::format("sequence_lens has dtype {}; expected int32", to_string(lens->dtype())));
    }
    o.sequence_lens = lens->data<int32_t>();
    check_sequence_lens(ctx.graph, ctx.node, o.sequence_lens, bound.shape);
  }
  o.initial_h = floats(ctx, 5);
  o.initial_c = floats(ctx, 6);
  o.p = floats(ctx, 7);
  o.y = optional_output(ctx, 0, bound.params.y_shape);
  o.y_h = optional_output(ctx, 1, bound.params.state_shape);
  o.y_c = optional_output(ctx, 2, bound.params.state_shape);
  ref::recurrent_reference(bound.shape, o);
}

// NegativeLogLikelihoodLoss, and SoftmaxCrossEntropyLoss as log_softmax over the classes (its
// optional second output) followed by the same loss.
void run_loss(RefOpContext& ctx) {
  const Tensor& x = input(ctx, 0);
  const Tensor& target = input(ctx, 1);
  const graph::NllLossParams p =
      graph::parse_nll_loss(ctx.graph, ctx.node, x.shape(), target.shape(), optional_shape(ctx, 2));
  std::vector<int64_t> targets(static_cast<std::size_t>(target.numel()));
  for (int64_t i = 0; i < target.numel(); ++i) {
    const int64_t t =
        target.dtype() == DType::kInt64 ? target.data<int64_t>()[i] : target.data<int32_t>()[i];
    if ((!p.ignore_index || t != *p.ignore_index) && (t < 0 || t >= p.classes)) {
      ctx.fail(ErrorCode::kInvalidArgument,
               fmt::format("target {} (element {}) is not a class in [0, {}){}", t, i, p.classes,
                           p.ignore_index ? fmt::format(" nor ignore_index {}", *p.ignore_index)
                                          : std::string()));
    }
    targets[static_cast<std::size_t>(i)] = t;
  }
  ref::NllLossShape shape{p.n,
                          p.classes,
                          p.inner,
                          p.reduction == "none"  ? ref::LossReduction::kNone
                          : p.reduction == "sum" ? ref::LossReduction::kSum
                                                 : ref::LossReduction::kMean,
                          p.ignore_index.has_value(),
                          p.ignore_index.value_or(0)};
  const float* log_prob = floats(ctx, 0);
  std::vector<float> computed;
  if (ctx.node.op_type == "SoftmaxCrossEntropyLoss") {
    float* out = optional_output(ctx, 1, x.shape());
    if (out == nullptr) {
      computed.resize(static_cast<std::size_t>(x.numel()));
      out = computed.data();
    }
    ref::log_softmax_reference(log_prob, out, {p.n, p.classes, p.inner});
    log_prob = out;
  }
  ref::nll_loss_reference(log_prob, targets.data(), floats(ctx, 2), output(ctx, 0, p.output_shape),
                          shape);
}

constexpr RefOp kNnReferenceOps[] = {
    {"AveragePool", run_average_pool},
    {"BatchNormalization", run_batch_norm},
    {"Conv", run_conv},
    {"ConvTranspose", run_conv_transpose},
    {"GRU", run_recurrent},
    {"Gemm", run_gemm},
    {"GlobalAveragePool", run_global_pool<ref::global_average_pool_reference>},
    {"GlobalMaxPool", run_global_pool<ref::global_max_pool_reference>},
    {"Hardmax", run_softmax<ref::hardmax_reference>},
    {"InstanceNormalization", run_instance_norm},
    {"LRN", run_lrn},
    {"LSTM", run_recurrent},
    {"LayerNormalization", run_layer_norm},
    {"LogSoftmax", run_softmax<ref::log_softmax_reference>},
    {"MatMul", run_matmul},
    {"MaxPool", run_max_pool},
    {"NegativeLogLikelihoodLoss", run_loss},
    {"RNN", run_recurrent},
    {"Softmax", run_softmax<ref::softmax_reference>},
    {"SoftmaxCrossEntropyLoss", run_loss},
};

}  // namespace

std::span<const RefOp> nn_reference_ops() { return kNnReferenceOps; }

}  // namespace sparsecol::runtime
