#include "runtime/kernel_bindings.h"

#include <limits>
#include <utility>

#include <fmt/format.h>

#include "f32-norm/norm.h"
#include "reference/recurrent.h"

namespace sparsecol::runtime {

namespace {

// The window fields ConvGeometry and PoolGeometry share (2-D: index 0 is H, 1 is W).
template <typename Geometry>
void set_window(const graph::WindowParams& w, Geometry& g) {
  g.in_h = w.in_size[0];
  g.in_w = w.in_size[1];
  g.out_h = w.out_size[0];
  g.out_w = w.out_size[1];
  g.kernel_h = w.kernel[0];
  g.kernel_w = w.kernel[1];
  g.stride_h = w.strides[0];
  g.stride_w = w.strides[1];
  g.pad_top = w.pads_begin[0];
  g.pad_left = w.pads_begin[1];
  g.dilation_h = w.dilations[0];
  g.dilation_w = w.dilations[1];
}

template <typename Kind, std::size_t N>
std::optional<Kind> find_kind(const std::pair<std::string_view, Kind> (&table)[N],
                              std::string_view op_type) {
  for (const auto& [name, kind] : table) {
    if (name == op_type) return kind;
  }
  return std::nullopt;
}

namespace ref = kernels::reference;

// The node's activation functions (attribute activations, with activation_alpha and
// activation_beta consumed in order by the functions that take them), activation_count per
// direction: the defaults when absent; a list for one direction serves both.
std::vector<ref::RnnActivation> rnn_activations(const graph::Graph& graph, const graph::Node& node,
                                                ref::RecurrentCell cell, int64_t directions) {
  using Kind = ref::RnnActivation::Kind;
  struct Function {
    const char* name;
    Kind kind;
    bool takes_alpha, takes_beta;
    float alpha, beta;  // ONNX's defaults of the op of that name
  };
  static constexpr Function kFunctions[] = {
      {"Sigmoid", Kind::kSigmoid, false, false, 0.0f, 0.0f},
      {"Tanh", Kind::kTanh, false, false, 0.0f, 0.0f},
      {"Relu", Kind::kRelu, false, false, 0.0f, 0.0f},
      {"Affine", Kind::kAffine, true, true, 1.0f, 0.0f},
      {"LeakyRelu", Kind::kLeakyRelu, true, false, 0.01f, 0.0f},
      {"ThresholdedRelu", Kind::kThresholdedRelu, true, false, 1.0f, 0.0f},
      {"ScaledTanh", Kind::kScaledTanh, true, true, 1.0f, 1.0f},
      {"HardSigmoid", Kind::kHardSigmoid, true, true, 0.2f, 0.5f},
      {"Elu", Kind::kElu, true, false, 1.0f, 0.0f},
      {"Softsign", Kind::kSoftsign, false, false, 0.0f, 0.0f},
      {"Softplus", Kind::kSoftplus, false, false, 0.0f, 0.0f},
  };
  const auto per_direction = static_cast<std::size_t>(ref::activation_count(cell));
  std::vector<std::string> names = node.attr_strings("activations");
  if (names.empty()) {
    names = cell == ref::RecurrentCell::kRnn ? std::vector<std::string>{"Tanh"}
            : cell == ref::RecurrentCell::kGru
                ? std::vector<std::string>{"Sigmoid", "Tanh"}
                : std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"};
  }
  const auto wanted = per_direction * static_cast<std::size_t>(directions);
  if (names.size() == per_direction && wanted > per_direction) {
    const std::vector<std::string> one_direction = names;
    names.insert(names.end(), one_direction.begin(), one_direction.end());
  }
  if (names.size() != wanted) {
    graph::fail(
        graph, node, ErrorCode::kInvalidModel,
        fmt::format("attribute activations names {} functions, expected {} ({} per direction)",
                    names.size(), wanted, per_direction));
  }
  const std::vector<float> alphas = node.attr_floats("activation_alpha");
  const std::vector<float> betas = node.attr_floats("activation_beta");
  std::size_t next_alpha = 0, next_beta = 0;
  std::vector<ref::RnnActivation> out;
  for (const std::string& name : names) {
    const auto* f = std::find_if(std::begin(kFunctions), std::end(kFunctions),
                                 [&](const Function& fn) { return name == fn.name; });
    if (f == std::end(kFunctions)) {
      graph::fail(graph, node, ErrorCode::kUnsupported,
                  fmt::format("activation function '{}' is not supported", name));
    }
    ref::RnnActivation a{f->kind, f->alpha, f->beta};
    if (f->takes_alpha && next_alpha < alphas.size()) a.alpha = alphas[next_alpha++];
    if (f->takes_beta && next_beta < betas.size()) a.beta = betas[next_beta++];
    out.push_back(a);
  }
  return out;
}

}  // namespace

kernels::ConvGeometry conv_geometry(const graph::ConvParams& params) {
  kernels::ConvGeometry g;
  set_window(params.window, g);
  g.in_c = params.in_channels;
  g.out_c = params.out_channels;
  g.groups = params.group;
  return g;
}

kernels::PoolGeometry pool_geometry(const graph::PoolParams& params) {
  kernels::PoolGeometry g;
  set_window(params.window, g);
  g.channels = params.channels;
  g.pad_bottom = params.window.pads_end[0];
  g.pad_right = params.window.pads_end[1];
  g.count_include_pad = params.count_include_pad;
  return g;
}

kernels::PoolKind pool_kind(const graph::Node& node) {
  return node.op_type == "MaxPool" ? kernels::PoolKind::kMax : kernels::PoolKind::kAverage;
}

std::string pool_rows_implementation(kernels::PoolKind kind) {
  return fmt::format("{}-pool-rows/{}", kind == kernels::PoolKind::kMax ? "max" : "avg",
                     kernels::to_string(kernels::active_isa()));
}

std::optional<kernels::BinaryKind> binary_kind(std::string_view op_type) {
  static constexpr std::pair<std::string_view, kernels::BinaryKind> kBinary[] = {
      {"Add", kernels::BinaryKind::kAdd},
      {"Sub", kernels::BinaryKind::kSub},
      {"Mul", kernels::BinaryKind::kMul},
      {"Div", kernels::BinaryKind::kDiv}};
  return find_kind(kBinary, op_type);
}

std::optional<kernels::UnaryKind> unary_kind(std::string_view op_type) {
  static constexpr std::pair<std::string_view, kernels::UnaryKind> kUnary[] = {
      {"Relu", kernels::UnaryKind::kRelu},       {"Clip", kernels::UnaryKind::kClip},
      {"Sigmoid", kernels::UnaryKind::kSigmoid}, {"Tanh", kernels::UnaryKind::kTanh},
      {"Erf", kernels::UnaryKind::kErf},         {"Exp", kernels::UnaryKind::kExp},
      {"Sqrt", kernels::UnaryKind::kSqrt},       {"Neg", kernels::UnaryKind::kNeg}};
  return find_kind(kUnary, op_type);
}

std::optional<ClipBounds> clip_bounds(const graph::Graph& graph, const graph::Node& node) {
  ClipBounds bounds{node.attr_float("min", -std::numeric_limits<float>::infinity()),
                    node.attr_float("max", std::numeric_limits<float>::infinity())};
  for (std::size_t i = 1; i <= 2; ++i) {
    const int v = node.input(i);
    if (v < 0) continue;
    const auto& bound = graph.values[static_cast<std::size_t>(v)].constant;
    if (!bound || bound->dtype() != DType::kFloat32 || bound->numel() != 1) return std::nullopt;
    (i == 1 ? bounds.lo : bounds.hi) = bound->data<float>()[0];
  }
  return bounds;
}

kernels::Activation to_activation(graph::EpilogueOp::Kind kind) {
  switch (kind) {
    case graph::EpilogueOp::Kind::kRelu:
      return kernels::Activation::kRelu;
    case graph::EpilogueOp::Kind::kClip:
      return kernels::Activation::kClip;
    case graph::EpilogueOp::Kind::kGelu:
      return kernels::Activation::kGelu;
    case graph::EpilogueOp::Kind::kAdd:
      break;
  }
  return kernels::Activation::kNone;
}

RowNormalization::RowNormalization(const graph::Graph& graph, const graph::Node& node, int64_t n)
    : n_(n) {
  if (node.op_type != "LayerNormalization") return;
  auto constant = [&](int id) -> const Tensor* {
    return id >= 0 ? &*graph.values[static_cast<std::size_t>(id)].constant : nullptr;
  };
  const Tensor* scale = constant(node.input(1));
  const Tensor* bias = constant(node.input(2));
  gamma_.assign(scale->data<float>(), scale->data<float>() + n);
  if (bias != nullptr) beta_.assign(bias->data<float>(), bias->data<float>() + n);
  epsilon_ = graph::parse_layer_norm(graph, node, graph.concrete_dims(node.input(0)),
                                     scale->shape(), std::nullopt)
                 .epsilon;
}

void RowNormalization::run(const float* src, float* dst, int64_t rows) const {
  if (gamma_.empty()) {
    kernels::softmax_rows(src, n_, dst, n_, rows, n_);
  } else {
    kernels::layer_norm_rows(src, n_, dst, n_, rows, n_, gamma_.data(),
                             beta_.empty() ? nullptr : beta_.data(), epsilon_);
  }
}

std::string RowNormalization::implementation() const {
  return fmt::format("{}-rows/{}", gamma_.empty() ? "softmax" : "layer-norm",
                     kernels::to_string(kernels::active_isa()));
}

std::optional<FusedEpilogue> fuse_epilogue(const graph::Node& node, const AddOperandJudge& judge) {
  FusedEpilogue fused;
  enum Stage { kStart, kBias, kPre, kResidual, kPost } stage = kStart;
  bool clip_used = false;
  for (const graph::EpilogueOp& op : node.epilogue) {
    if (op.kind == graph::EpilogueOp::Kind::kAdd) {
      const bool known = op.input >= 0 && static_cast<std::size_t>(op.input) < node.inputs.size();
      const AddOperandUse use = known ? judge(op.input) : AddOperandUse{};
      if (use.bias != nullptr && stage == kStart) {
        fused.kernel.col_bias = use.bias;
        stage = kBias;
      } else if (use.residual && stage <= kPre) {
        fused.residual_input = op.input;
        stage = kResidual;
      } else {
        return std::nullopt;
      }
      continue;
    }
    // The kernel has one pair of Clip bounds for both activation slots.
    if (op.kind == graph::EpilogueOp::Kind::kClip) {
      if (clip_used && (fused.kernel.clip_min != op.min || fused.kernel.clip_max != op.max)) {
        return std::nullopt;
      }
      clip_used = true;
      fused.kernel.clip_min = op.min;
      fused.kernel.clip_max = op.max;
    }
    if (stage <= kBias) {
      fused.kernel.pre_residual = to_activation(op.kind);
      stage = kPre;
    } else if (stage == kResidual) {
      fused.kernel.post_residual = to_activation(op.kind);
      stage = kPost;
    } else {
      return std::nullopt;
    }
  }
  return fused;
}

RecurrentBinding bind_recurrent(const graph::Graph& graph, const graph::Node& node,
                                const std::vector<std::optional<std::vector<int64_t>>>& shapes) {
  RecurrentBinding b{graph::parse_recurrent(graph, node, shapes), {}};
  const graph::RecurrentParams& p = b.params;
  ref::RecurrentShape& shape = b.shape;
  shape.cell = p.gates == 4   ? ref::RecurrentCell::kLstm
               : p.gates == 3 ? ref::RecurrentCell::kGru
                              : ref::RecurrentCell::kRnn;
  shape.seq_length = p.seq_length;
  shape.batch = p.batch;
  shape.input_size = p.input_size;
  shape.hidden_size = p.hidden_size;
  shape.directions = p.directions;
  shape.reverse = p.reverse;
  shape.batch_major = p.batch_major;
  shape.linear_before_reset = node.attr_int("linear_before_reset", 0) != 0;
  shape.input_forget = node.attr_int("input_forget", 0) != 0;
  shape.clip = node.attr_float("clip", 0.0f);
  shape.activations = rnn_activations(graph, node, shape.cell, p.directions);
  return b;
}

void check_sequence_lens(const graph::Graph& graph, const graph::Node& node, const int32_t* lens,
                         const kernels::reference::RecurrentShape& shape) {
  for (int64_t b = 0; b < shape.batch; ++b) {
    if (lens[b] < 0 || lens[b] > shape.seq_length) {
      graph::fail(graph, node, ErrorCode::kInvalidArgument,
                  fmt::format("sequence_lens[{}] = {} is outside [0, {}] (the sequence length)", b,
                              lens[b], shape.seq_length));
    }
  }
}

}  // namespace sparsecol::runtime
