// Shape and dtype inference of the nn ops: convolution, pooling, normalizations, matrix
// products, softmax. The attribute parsing and checks live in op_params.cc, shared with the
// reference ops so that both read a node the same way.
#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "graph/op_params.h"
#include "graph/ops.h"

namespace sparsecol::graph {

namespace {

// Every op here computes in float32 for now; other dtypes are valid ONNX, hence kUnsupported.
void expect_float_inputs(const InferContext& ctx) {
  for (std::size_t i = 0; i < ctx.input_count(); ++i) {
    if (ctx.has_input(i)) ctx.expect_dtype(i, {DType::kFloat32});
  }
}

std::optional<std::vector<int64_t>> optional_shape(const InferContext& ctx, std::size_t i) {
  if (!ctx.has_input(i)) return std::nullopt;
  return ctx.shape(i);
}

// The common preamble: input count (counting omitted optionals) and dtypes.
void expect_float_op(const InferContext& ctx, std::size_t lo, std::size_t hi) {
  ctx.expect_inputs(lo, hi);
  expect_float_inputs(ctx);
}

void infer_conv(InferContext& ctx) {
  expect_float_op(ctx, 2, 3);
  const ConvParams p =
      parse_conv(ctx.graph(), ctx.node(), ctx.shape(0), ctx.shape(1), optional_shape(ctx, 2));
  ctx.set_output(0, DType::kFloat32, p.output_shape());
}

void infer_conv_transpose(InferContext& ctx) {
  expect_float_op(ctx, 2, 3);
  const ConvParams p = parse_conv_transpose(ctx.graph(), ctx.node(), ctx.shape(0), ctx.shape(1),
                                            optional_shape(ctx, 2));
  ctx.set_output(0, DType::kFloat32, p.output_shape());
}

void infer_pool(InferContext& ctx) {
  expect_float_op(ctx, 1, 1);
  ctx.set_output(0, DType::kFloat32,
                 parse_pool(ctx.graph(), ctx.node(), ctx.shape(0)).output_shape());
}

void infer_global_pool(InferContext& ctx) {
  expect_float_op(ctx, 1, 1);
  std::vector<int64_t> shape = ctx.shape(0);
  parse_channel_layout(ctx.graph(), ctx.node(), shape);
  std::fill(shape.begin() + 2, shape.end(), 1);
  ctx.set_output(0, DType::kFloat32, std::move(shape));
}

void infer_batch_norm(InferContext& ctx) {
  expect_float_op(ctx, 5, 5);
  parse_batch_norm(ctx.graph(), ctx.node(), ctx.shape(0),
                   {ctx.shape(1), ctx.shape(2), ctx.shape(3), ctx.shape(4)});
  ctx.set_output(0, DType::kFloat32, ctx.shape(0));
}

void infer_instance_norm(InferContext& ctx) {
  expect_float_op(ctx, 3, 3);
  parse_instance_norm(ctx.graph(), ctx.node(), ctx.shape(0), ctx.shape(1), ctx.shape(2));
  ctx.set_output(0, DType::kFloat32, ctx.shape(0));
}

void infer_layer_norm(InferContext& ctx) {
  expect_float_op(ctx, 2, 3);
  const LayerNormParams p =
      parse_layer_norm(ctx.graph(), ctx.node(), ctx.shape(0), ctx.shape(1), optional_shape(ctx, 2));
  ctx.set_output(0, DType::kFloat32, ctx.shape(0));
  ctx.set_output(1, DType::kFloat32, p.stats_shape);  // Mean
  ctx.set_output(2, DType::kFloat32, p.stats_shape);  // InvStdDev
}

void infer_lrn(InferContext& ctx) {
  expect_float_op(ctx, 1, 1);
  parse_lrn(ctx.graph(), ctx.node(), ctx.shape(0));
  ctx.set_output(0, DType::kFloat32, ctx.shape(0));
}

void infer_gemm(InferContext& ctx) {
  expect_float_op(ctx, 2, 3);
  const GemmParams p =
      parse_gemm(ctx.graph(), ctx.node(), ctx.shape(0), ctx.shape(1), optional_shape(ctx, 2));
  ctx.set_output(0, DType::kFloat32, {p.m, p.n});
}

void infer_matmul(InferContext& ctx) {
  expect_float_op(ctx, 2, 2);
  ctx.set_output(0, DType::kFloat32,
                 parse_matmul(ctx.graph(), ctx.node(), ctx.shape(0), ctx.shape(1)).output_shape);
}

void infer_softmax(InferContext& ctx) {
  expect_float_op(ctx, 1, 1);
  parse_softmax(ctx.graph(), ctx.node(), ctx.shape(0));
  ctx.set_output(0, DType::kFloat32, ctx.shape(0));
}

void infer_recurrent(InferContext& ctx) {
  const bool lstm = ctx.node().op_type == "LSTM";
  ctx.expect_inputs(3, lstm ? 8 : 6);
  std::vector<std::optional<std::vector<int64_t>>> shapes;
  for (std::size_t i = 0; i < ctx.input_count(); ++i) {
    if (ctx.has_input(i)) ctx.expect_dtype(i, {i == 4 ? DType::kInt32 : DType::kFloat32});
    shapes.push_back(optional_shape(ctx, i));
  }
  const RecurrentParams p = parse_recurrent(ctx.graph(), ctx.node(), shapes);
  ctx.set_output(0, DType::kFloat32, p.y_shape);                // Y
  ctx.set_output(1, DType::kFloat32, p.state_shape);            // Y_h
  if (lstm) ctx.set_output(2, DType::kFloat32, p.state_shape);  // Y_c
}

// NegativeLogLikelihoodLoss (input, target, weight) and SoftmaxCrossEntropyLoss (scores,
// labels, weights; a second output, the log-probabilities).
void infer_loss(InferContext& ctx) {
  ctx.expect_inputs(2, 3);
  ctx.expect_dtype(0, {DType::kFloat32});
  ctx.expect_dtype(1, {DType::kInt64, DType::kInt32});
  if (ctx.has_input(2)) ctx.expect_dtype(2, {DType::kFloat32});
  const NllLossParams p =
      parse_nll_loss(ctx.graph(), ctx.node(), ctx.shape(0), ctx.shape(1), optional_shape(ctx, 2));
  ctx.set_output(0, DType::kFloat32, p.output_shape);
  if (ctx.node().op_type == "SoftmaxCrossEntropyLoss") {
    ctx.set_output(1, DType::kFloat32, ctx.shape(0));
  }
}

constexpr OpDef kNnOps[] = {
    {"AveragePool", infer_pool},
    {"BatchNormalization", infer_batch_norm},
    {"Conv", infer_conv},
    {"ConvTranspose", infer_conv_transpose},
    {"GRU", infer_recurrent},
    {"Gemm", infer_gemm},
    {"GlobalAveragePool", infer_global_pool},
    {"GlobalMaxPool", infer_global_pool},
    {"Hardmax", infer_softmax},
    {"InstanceNormalization", infer_instance_norm},
    {"LRN", infer_lrn},
    {"LSTM", infer_recurrent},
    {"LayerNormalization", infer_layer_norm},
    {"LogSoftmax", infer_softmax},
    {"MatMul", infer_matmul},
    {"MaxPool", infer_pool},
    {"NegativeLogLikelihoodLoss", infer_loss},
    {"RNN", infer_recurrent},
    {"Softmax", infer_softmax},
    {"SoftmaxCrossEntropyLoss", infer_loss},
};

}  // namespace

std::span<const OpDef> nn_op_defs() { return kNnOps; }

}  // namespace sparsecol::graph
