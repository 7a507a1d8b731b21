// BatchNormalization (inference) after a Conv or ConvTranspose folds into its weights and bias:
//   y = gamma * (conv(x) + b - mean) / sqrt(var + eps) + beta
//     = conv_{W * s}(x) + (b - mean) * s + beta,   with s = gamma / sqrt(var + eps) per output
// channel. Conv's weight is [M, C / group, kernel...], ConvTranspose's [C, M / group, kernel...].
#include <cmath>

#include <fmt/format.h>

#include "graph/passes.h"

namespace sparsecol::graph {

namespace {

const Tensor* constant_f32(const Graph& graph, int id) {
  if (id < 0) return nullptr;
  const Value& v = graph.values[static_cast<std::size_t>(id)];
  return v.constant && v.constant->dtype() == DType::kFloat32 ? &*v.constant : nullptr;
}

}  // namespace

void fold_batchnorm(Graph& graph) {
  const std::vector<std::vector<int>> readers = graph.consumers();
  std::vector<bool> removed(graph.nodes.size(), false);
  for (std::size_t b = 0; b < graph.nodes.size(); ++b) {
    Node& bn = graph.nodes[b];
    if (bn.op_type != "BatchNormalization" || bn.outputs.size() != 1 ||
        bn.attr_int("training_mode", 0) != 0) {
      continue;
    }
    const int conv_out = bn.input(0);
    const Value& conv_value = graph.values[static_cast<std::size_t>(conv_out)];
    if (conv_value.producer < 0) continue;
    Node& conv = graph.nodes[static_cast<std::size_t>(conv_value.producer)];
    const bool transposed = conv.op_type == "ConvTranspose";
    if ((conv.op_type != "Conv" && !transposed) || !conv.epilogue.empty() ||
        readers[static_cast<std::size_t>(conv_out)].size() != 1 || graph.is_output(conv_out)) {
      continue;
    }
    const Tensor* weight = constant_f32(graph, conv.input(1));
    const Tensor* bias = conv.input(2) >= 0 ? constant_f32(graph, conv.input(2)) : nullptr;
    const Tensor* gamma = constant_f32(graph, bn.input(1));
    const Tensor* beta = constant_f32(graph, bn.input(2));
    const Tensor* mean = constant_f32(graph, bn.input(3));
    const Tensor* var = constant_f32(graph, bn.input(4));
    if (!weight || (conv.input(2) >= 0 && !bias) || !gamma || !beta || !mean || !var) continue;
    if (weight->rank() < 2) continue;  // shape inference refuses such a model
    const int64_t rows = weight->dim(0), cols = weight->dim(1);
    const int64_t group = transposed ? conv.attr_int("group", 1) : 1;
    if (group < 1 || rows % group != 0) continue;
    const int64_t channels = transposed ? cols * group : rows;
    if (channels == 0 || gamma->numel() != channels || beta->numel() != channels ||
        mean->numel() != channels || var->numel() != channels ||
        (bias && bias->numel() != channels)) {
      fail(graph, bn, ErrorCode::kShapeMismatch,
           fmt::format("BatchNormalization parameters do not match the {} output channels of "
                       "the preceding {} '{}'",
                       channels, conv.op_type, conv.name));
    }
    const float epsilon = bn.attr_float("epsilon", 1e-5f);
    std::vector<double> scale(static_cast<std::size_t>(channels));
    for (int64_t c = 0; c < channels; ++c) {
      scale[static_cast<std::size_t>(c)] =
          gamma->data<float>()[c] / std::sqrt(static_cast<double>(var->data<float>()[c]) + epsilon);
    }
    // The weight as runs of `taps` elements, one per (dim 0, dim 1) pair. Run (i, j) belongs to
    // output channel i for Conv ([M, C / group, kernel...]), and for ConvTranspose ([C, M /
    // group, kernel...]) to channel j of input channel i's group.
    Tensor new_weight = weight->clone();
    float* w = new_weight.data<float>();
    const int64_t taps = rows * cols == 0 ? 0 : weight->numel() / (rows * cols);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        const double s =
            scale[static_cast<std::size_t>(transposed ? i / (rows / group) * cols + j : i)];
        float* run = w + (i * cols + j) * taps;
        for (int64_t t = 0; t < taps; ++t) run[t] = static_cast<float>(run[t] * s);
      }
    }
    Tensor new_bias = Tensor::zeros(DType::kFloat32, {channels});
    for (int64_t c = 0; c < channels; ++c) {
      const double b0 = bias ? bias->data<float>()[c] : 0.0;
      new_bias.data<float>()[c] =
          static_cast<float>((b0 - mean->data<float>()[c]) * scale[static_cast<std::size_t>(c)] +
                             beta->data<float>()[c]);
    }
    Value weight_value{conv.name + ".folded_weight",   DType::kFloat32, true,
                       make_shape(new_weight.shape()), new_weight,      -1};
    Value bias_value{conv.name + ".folded_bias", DType::kFloat32, true,
                     make_shape({channels}),     new_bias,        -1};
    const int weight_id = graph.add_value(std::move(weight_value));
    const int bias_id = graph.add_value(std::move(bias_value));
    conv.inputs.resize(3, -1);
    conv.inputs[1] = weight_id;
    conv.inputs[2] = bias_id;
    conv.outputs[0] = bn.outputs[0];  // the Conv now writes what the BatchNormalization wrote
    removed[b] = true;
  }
  std::vector<Node> kept;
  for (std::size_t n = 0; n < graph.nodes.size(); ++n) {
    if (!removed[n]) kept.push_back(std::move(graph.nodes[n]));
  }
  graph.nodes = std::move(kept);
  graph.remove_dead();
}

}  // namespace sparsecol::graph
