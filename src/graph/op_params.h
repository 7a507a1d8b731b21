// Parsed, validated parameters of the nn ops (Conv, pooling, Gemm, MatMul, Softmax,
// LayerNormalization), shared by shape inference, the reference ops, the fast kernels'
// bindings and the tile planner, so that every one of them reads an attribute the same way.
//
// Each parse_* function reads the node's attributes, checks them against the input shapes and
// fails with an Error naming node, op, expected and actual. Attribute defaults follow ONNX
// (opsets 11-17). Everything is in plain sizes; converting to a kernel's geometry struct is
// the runtime's job (the graph layer knows no kernels).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace sparsecol::graph {

// A sliding window over the spatial dimensions, with auto_pad already resolved to explicit
// pads. Each vector has one entry per spatial dimension.
struct WindowParams {
  std::vector<int64_t> in_size, out_size;
  std::vector<int64_t> kernel, strides, dilations;
  std::vector<int64_t> pads_begin, pads_end;
  int rank() const { return static_cast<int>(in_size.size()); }
};

struct ConvParams {
  int64_t batch = 0;
  int64_t in_channels = 0;   // C of X
  int64_t out_channels = 0;  // M of W
  int64_t group = 1;
  WindowParams window;
  std::vector<int64_t> output_shape() const;  // [N, M, out_size...]
};

// Conv: X is [N, C, spatial...] with 1 to 3 spatial dimensions, W is [M, C / group,
// kernel...]. The optional bias B, when given (bias_shape), must be [M].
ConvParams parse_conv(const Graph& graph, const Node& node, const std::vector<int64_t>& x_shape,
                      const std::vector<int64_t>& w_shape,
                      const std::optional<std::vector<int64_t>>& bias_shape = std::nullopt);

// ConvTranspose: X is [N, C, spatial...] with 1 to 3 spatial dimensions, W is [C, M / group,
// kernel...], the optional bias [M]. The window describes the output: out_size from
// output_shape, auto_pad or pads (ONNX's formulas), in_size X's; input position i reaches output
// position i * stride + k * dilation - pads_begin through tap k.
ConvParams parse_conv_transpose(
    const Graph& graph, const Node& node, const std::vector<int64_t>& x_shape,
    const std::vector<int64_t>& w_shape,
    const std::optional<std::vector<int64_t>>& bias_shape = std::nullopt);

struct PoolParams {
  int64_t batch = 0;
  int64_t channels = 0;
  WindowParams window;
  bool ceil_mode = false;
  bool count_include_pad = false;             // AveragePool only
  std::vector<int64_t> output_shape() const;  // [N, C, out_size...]
};

// MaxPool and AveragePool: X is [N, C, spatial...] with 1 to 3 spatial dimensions.
// MaxPool's optional output Indices is refused (kUnsupported).
PoolParams parse_pool(const Graph& graph, const Node& node, const std::vector<int64_t>& x_shape);

struct GemmParams {
  int64_t m = 0, k = 0, n = 0;
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f, beta = 1.0f;
};

// Gemm: A is [M, K] ([K, M] with transA), B is [K, N] ([N, K] with transB), the optional C
// (c_shape) must broadcast to [M, N].
GemmParams parse_gemm(const Graph& graph, const Node& node, const std::vector<int64_t>& a_shape,
                      const std::vector<int64_t>& b_shape,
                      const std::optional<std::vector<int64_t>>& c_shape = std::nullopt);

struct MatMulParams {
  int64_t m = 0, k = 0, n = 0;
  // Batch dimensions of the product, and each operand's batch dimensions right-aligned to
  // them (1 where the operand has none or broadcasts).
  std::vector<int64_t> batch, a_batch, b_batch;
  // The ONNX output shape: batch + [M, N], without M when A is 1-D and without N when B is.
  std::vector<int64_t> output_shape;
};

// MatMul with numpy semantics: a 1-D A is a row vector, a 1-D B a column vector, and batch
// dimensions broadcast.
MatMulParams parse_matmul(const Graph& graph, const Node& node, const std::vector<int64_t>& a_shape,
                          const std::vector<int64_t>& b_shape);

// Softmax and LogSoftmax: the input seen as outer x axis_size x inner, normalized along the
// middle. Opset 13 normalizes along one axis (default -1); opsets below 13 flatten the input
// to 2-D at the axis (default 1) and normalize each row, i.e. inner == 1.
struct SoftmaxParams {
  int64_t outer = 1, axis_size = 1, inner = 1;
};
SoftmaxParams parse_softmax(const Graph& graph, const Node& node,
                            const std::vector<int64_t>& x_shape);

// NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss: input (scores) [N, C, d1, ...], target
// [N, d1, ...], weight [C] (std::nullopt: none); reduction none, sum or mean.
struct NllLossParams {
  int64_t n = 0, classes = 0, inner = 1;
  std::string reduction;                // "none", "sum" or "mean"
  std::optional<int64_t> ignore_index;  // attribute ignore_index
  std::vector<int64_t> output_shape;    // target's shape for "none", else a scalar
};
NllLossParams parse_nll_loss(const Graph& graph, const Node& node,
                             const std::vector<int64_t>& input_shape,
                             const std::vector<int64_t>& target_shape,
                             const std::optional<std::vector<int64_t>>& weight_shape);

// LayerNormalization (opset 17): rows are X.shape[:axis], each normalized over
// X.shape[axis:]. Scale and B must broadcast to X.shape[axis:].
struct LayerNormParams {
  int64_t axis = -1;  // normalized, 0 <= axis < rank
  int64_t outer = 1, inner = 1;
  float epsilon = 1e-5f;
  std::vector<int64_t> normalized_shape;  // X.shape[axis:]
  std::vector<int64_t> stats_shape;       // shape of Mean and InvStdDev: X.shape[:axis] + 1s
};
LayerNormParams parse_layer_norm(const Graph& graph, const Node& node,
                                 const std::vector<int64_t>& x_shape,
                                 const std::vector<int64_t>& scale_shape,
                                 const std::optional<std::vector<int64_t>>& bias_shape);

// RNN, GRU and LSTM (opsets 7-14): sizes, direction and layout, checked against the shapes of
// the inputs present (X, W, R, then the optional B, sequence_lens, initial_h, and LSTM's
// initial_c and P; std::nullopt for omitted ones). The activation functions are the runtime's to
// read (their names map to kernel functions).
struct RecurrentParams {
  int64_t gates = 1;  // RNN 1, GRU 3, LSTM 4
  int64_t seq_length = 0, batch = 0, input_size = 0, hidden_size = 0, directions = 1;
  bool reverse = false;                       // direction = "reverse"
  bool batch_major = false;                   // layout = 1
  std::vector<int64_t> y_shape, state_shape;  // Y; Y_h, Y_c and the initial states
};
RecurrentParams parse_recurrent(const Graph& graph, const Node& node,
                                const std::vector<std::optional<std::vector<int64_t>>>& shapes);

// X seen as [N, C, inner], inner being the product of the dimensions after C.
struct ChannelLayout {
  int64_t batch = 0, channels = 0, inner = 1;
};
// Fails unless X has rank min_rank or more (at least N and C).
ChannelLayout parse_channel_layout(const Graph& graph, const Node& node,
                                   const std::vector<int64_t>& x_shape, std::size_t min_rank = 2);

struct ChannelNormParams {
  ChannelLayout layout;
  float epsilon = 1e-5f;
};
// BatchNormalization in inference form: param_shapes are those of scale, B, input_mean and
// input_var, each [C]. training_mode = 1 and the training outputs are refused (kUnsupported).
ChannelNormParams parse_batch_norm(const Graph& graph, const Node& node,
                                   const std::vector<int64_t>& x_shape,
                                   const std::vector<std::vector<int64_t>>& param_shapes);
// InstanceNormalization: X is [N, C, spatial...], scale and B are [C].
ChannelNormParams parse_instance_norm(const Graph& graph, const Node& node,
                                      const std::vector<int64_t>& x_shape,
                                      const std::vector<int64_t>& scale_shape,
                                      const std::vector<int64_t>& bias_shape);

// LRN: X is [N, C, spatial...]; the window spans `size` channels.
struct LrnParams {
  ChannelLayout layout;
  int64_t size = 1;
  float alpha = 1e-4f, beta = 0.75f, bias = 1.0f;
};
LrnParams parse_lrn(const Graph& graph, const Node& node, const std::vector<int64_t>& x_shape);

// True when `from` broadcasts to `to` in one direction (numpy rules, `to` unchanged).
bool broadcasts_to(const std::vector<int64_t>& from, const std::vector<int64_t>& to);

}  // namespace sparsecol::graph
