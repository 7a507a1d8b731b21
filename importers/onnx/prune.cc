// sparsecol::prune_model (include/sparsecol/prune.h): magnitude pruning on the ModelProto itself,
// so that everything but the pruned weights' values is written back as it was read.
#include "sparsecol/prune.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <new>
#include <set>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <onnx/checker.h>

#include "api/atomic_file.h"
#include "onnx/tensor_proto.h"

namespace sparsecol {
namespace {

using onnx::TensorProto;

// A weight tensor chosen for pruning, decoded to floats; written back to its proto when done.
struct Candidate {
  std::size_t layer;   // index into PruneReport::layers
  TensorProto* proto;  // the initializer in the model
  std::vector<float> values;
};

bool is_depthwise(const onnx::NodeProto& node, const std::vector<int64_t>& weight_shape) {
  int64_t group = 1;
  for (const onnx::AttributeProto& attr : node.attribute()) {
    if (attr.name() == "group") group = attr.i();
  }
  // Conv weights are [M, C/group, kh, kw]; depthwise means one input channel per group.
  return group > 1 && weight_shape.size() >= 2 && weight_shape[1] == 1;
}

int64_t count_zeros(const std::vector<float>& values) {
  return std::count(values.begin(), values.end(), 0.0f);
}

// The number of elements out of `elements` that a sparsity makes zero. Rounded to nearest, so
// that 0.9 of 1000 is 900 and the reported fraction is the requested one wherever it can be.
int64_t zeros_for(double sparsity, int64_t elements) {
  return std::llround(sparsity * static_cast<double>(elements));
}

// Sets the `count` smallest-magnitude values of `tensors` (taken together, in order) to zero.
// Ties at the threshold are broken by position (earlier first), so exactly `count` values end
// up zero (or the tensors' zeros, when there are already more) whatever the distribution of
// magnitudes: one nth_element over a copy of the magnitudes, O(n).
void zero_smallest(const std::vector<std::vector<float>*>& tensors, int64_t count) {
  if (count <= 0) return;
  std::vector<float> magnitudes;
  for (const std::vector<float>* t : tensors) {
    for (float v : *t) magnitudes.push_back(std::fabs(v));
  }
  const auto n = static_cast<int64_t>(magnitudes.size());
  count = std::min(count, n);
  std::nth_element(magnitudes.begin(), magnitudes.begin() + (count - 1), magnitudes.end());
  const float threshold = magnitudes[static_cast<std::size_t>(count - 1)];
  // Values strictly below the threshold all go; of those equal to it, the first `ties` go.
  int64_t below = 0;
  for (const std::vector<float>* t : tensors) {
    for (float v : *t) below += std::fabs(v) < threshold ? 1 : 0;
  }
  int64_t ties = count - below;
  for (std::vector<float>* t : tensors) {
    for (float& v : *t) {
      const float m = std::fabs(v);
      if (m < threshold) {
        v = 0.0f;
      } else if (m == threshold && ties > 0) {
        v = 0.0f;
        --ties;
      }
    }
  }
}

void write_back(TensorProto& proto, const std::vector<float>& values) {
  // raw_data holds little-endian floats (onnx.proto); this engine only builds for x86-64.
  proto.clear_float_data();
  proto.set_raw_data(values.data(), values.size() * sizeof(float));
}

// The whole file through a temporary file and a rename (io::AtomicFile), so that an interrupted
// prune never leaves a complete-looking model.
void write_atomically(const std::string& path, const std::string& bytes) {
  io::AtomicFile file(path);
  file.append(bytes.data(), bytes.size());
  file.commit();
}

std::string one_line(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  text.erase(
      std::unique(text.begin(), text.end(), [](char a, char b) { return a == ' ' && b == ' '; }),
      text.end());
  return text;
}

onnx::ModelProto read_model(const std::string& path) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (!ec && size > static_cast<uintmax_t>(INT_MAX)) {
    throw Error(ErrorCode::kUnsupported,
                fmt::format("{}: the model is {} bytes; protobuf reads at most 2 GiB", path, size));
  }
  const std::string bytes = onnx_import::read_whole_file(path, "model");
  onnx::ModelProto model;
  if (!model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    throw Error(ErrorCode::kInvalidModel,
                fmt::format("{}: not a valid ONNX model (protobuf parse failed)", path));
  }
  return model;
}

class Pruner {
 public:
  Pruner(onnx::ModelProto& model, const std::string& source, const PruneOptions& options)
      : model_(model), source_(source), options_(options) {}

  PruneReport run() {
    check_options();
    find_layers();
    check_excluded_names_exist();
    if (candidates_.empty()) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: nothing to prune: all {} Conv/ConvTranspose/Gemm/MatMul "
                              "weights are left dense (first convolution, excluded, depthwise, "
                              "too small or not float)",
                              source_, report_.layers.size()));
    }
    prune();
    return std::move(report_);
  }

 private:
  void check_options() const {
    if (!(options_.sparsity >= 0.0 && options_.sparsity < 1.0)) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("sparsity must be in [0, 1), got {}", options_.sparsity));
    }
    if (options_.min_weight_elements < 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("the minimum weight size must be >= 0, got {}",
                              options_.min_weight_elements));
    }
  }

  // Every Conv, ConvTranspose, Gemm and MatMul whose weight is a float initializer, in graph
  // order; a weight shared by several nodes is listed (and pruned) once, under its first node.
  void find_layers() {
    std::unordered_map<std::string, TensorProto*> initializers;
    for (TensorProto& tensor : *model_.mutable_graph()->mutable_initializer()) {
      initializers.emplace(tensor.name(), &tensor);
    }
    std::set<std::string> seen;
    bool first_conv = true;
    for (const onnx::NodeProto& node : model_.graph().node()) {
      const std::string& op = node.op_type();
      const bool default_domain = node.domain().empty() || node.domain() == "ai.onnx";
      const bool conv = op == "Conv" || op == "ConvTranspose";
      if (!default_domain || (!conv && op != "Gemm" && op != "MatMul")) continue;
      // A generator's first ConvTranspose sees the raw input (the latent vector) as a
      // classifier's first Conv does.
      const bool is_first_conv = conv && std::exchange(first_conv, false);
      // Conv's, ConvTranspose's and Gemm's weight is input 1; MatMul's is whichever input is an
      // initializer (input 1 as PyTorch exports a Linear, input 0 for W * x).
      std::vector<int> weight_inputs = {1};
      if (op == "MatMul") weight_inputs = {1, 0};
      for (int input : weight_inputs) {
        if (node.input_size() <= input) continue;
        auto it = initializers.find(node.input(input));
        if (it == initializers.end()) continue;
        if (seen.insert(it->first).second) add_layer(node, *it->second, is_first_conv);
        break;
      }
    }
    if (report_.layers.empty()) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: nothing to prune: no Conv, ConvTranspose, Gemm or MatMul node "
                              "has a weight stored as an initializer",
                              source_));
    }
  }

  void add_layer(const onnx::NodeProto& node, TensorProto& proto, bool is_first_conv) {
    const std::string where = fmt::format("weight '{}' of node '{}' ({}) in {}", proto.name(),
                                          node.name(), node.op_type(), source_);
    if (proto.data_location() == TensorProto::EXTERNAL) {
      throw Error(ErrorCode::kUnsupported,
                  fmt::format("{}: stored as external data, which prune does not rewrite; save "
                              "the model with its weights inline first",
                              where));
    }
    PrunedLayer layer;
    layer.node = node.name();
    layer.op = node.op_type();
    layer.weight = proto.name();
    layer.shape.assign(proto.dims().begin(), proto.dims().end());
    if (proto.data_type() != TensorProto::FLOAT) {
      try {
        layer.elements = checked_numel(layer.shape);
      } catch (const Error& e) {
        throw Error(ErrorCode::kInvalidModel, fmt::format("{}: {}", where, e.what()));
      }
      // Integer (quantized) or double weights: not what magnitude pruning of float models is for.
      layer.skipped =
          fmt::format("{} weight, not FLOAT", onnx_import::onnx_type_name(proto.data_type()));
      report_.layers.push_back(std::move(layer));
      return;
    }
    // tensor_from_proto checks dims against the data (raw or float_data) before decoding.
    const Tensor tensor = onnx_import::tensor_from_proto(proto, /*base_dir=*/"", where);
    const float* data = tensor.data<float>();
    std::vector<float> values(data, data + tensor.numel());
    if (std::any_of(values.begin(), values.end(), [](float v) { return !std::isfinite(v); })) {
      throw Error(
          ErrorCode::kInvalidModel,
          fmt::format("{}: holds NaN or infinite values; magnitudes cannot rank them", where));
    }
    layer.elements = tensor.numel();
    layer.sparsity_before = layer.elements == 0 ? 0.0
                                                : static_cast<double>(count_zeros(values)) /
                                                      static_cast<double>(layer.elements);
    layer.sparsity_after = layer.sparsity_before;
    layer.skipped = skip_reason(node, layer, is_first_conv);
    if (layer.skipped.empty()) {
      candidates_.push_back({report_.layers.size(), &proto, std::move(values)});
    }
    report_.layers.push_back(std::move(layer));
  }

  bool excluded(const std::string& name) const {
    return !name.empty() && std::find(options_.exclude.begin(), options_.exclude.end(), name) !=
                                options_.exclude.end();
  }

  std::string skip_reason(const onnx::NodeProto& node, const PrunedLayer& layer,
                          bool is_first_conv) const {
    if (excluded(node.name()) || excluded(layer.weight)) return "excluded";
    if (is_first_conv && !options_.prune_first_conv) return "first convolution";
    if (node.op_type() == "Conv" && !options_.prune_depthwise && is_depthwise(node, layer.shape)) {
      return "depthwise";
    }
    if (layer.elements < options_.min_weight_elements) {
      return fmt::format("fewer than {} weights", options_.min_weight_elements);
    }
    if (layer.elements == 0) return "empty";
    return {};
  }

  // A typo in --exclude would otherwise silently prune the layer the user meant to keep.
  void check_excluded_names_exist() const {
    std::set<std::string> names;
    for (const onnx::NodeProto& node : model_.graph().node()) names.insert(node.name());
    for (const TensorProto& tensor : model_.graph().initializer()) names.insert(tensor.name());
    for (const std::string& name : options_.exclude) {
      if (names.count(name) == 0) {
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("{}: cannot exclude '{}': no node or initializer has that name",
                                source_, name));
      }
    }
  }

  void prune() {
    if (options_.global) {
      std::vector<std::vector<float>*> all;
      int64_t elements = 0;
      for (Candidate& c : candidates_) {
        all.push_back(&c.values);
        elements += static_cast<int64_t>(c.values.size());
      }
      zero_smallest(all, zeros_for(options_.sparsity, elements));
    } else {
      for (Candidate& c : candidates_) {
        zero_smallest({&c.values},
                      zeros_for(options_.sparsity, static_cast<int64_t>(c.values.size())));
      }
    }
    for (Candidate& c : candidates_) {
      PrunedLayer& layer = report_.layers[c.layer];
      layer.sparsity_after =
          static_cast<double>(count_zeros(c.values)) / static_cast<double>(layer.elements);
      write_back(*c.proto, c.values);
    }
    for (const PrunedLayer& layer : report_.layers) {
      report_.elements += layer.elements;
      report_.zeros_before +=
          std::llround(layer.sparsity_before * static_cast<double>(layer.elements));
      report_.zeros_after +=
          std::llround(layer.sparsity_after * static_cast<double>(layer.elements));
    }
  }

  onnx::ModelProto& model_;
  const std::string& source_;
  const PruneOptions& options_;
  PruneReport report_;
  std::vector<Candidate> candidates_;
};

}  // namespace

PruneReport prune_model(const std::string& input_path, const std::string& output_path,
                        const PruneOptions& options) {
  try {
    onnx::ModelProto model = read_model(input_path);
    PruneReport report = Pruner(model, input_path, options).run();
    // Only initializer values changed, so a failure here means the input was already invalid;
    // either way the file we would write must load in any ONNX tool.
    try {
      onnx::checker::check_model(model);
    } catch (const std::bad_alloc&) {
      throw;
    } catch (const std::exception& e) {
      throw Error(ErrorCode::kInvalidModel, fmt::format("{}: the model fails the ONNX checker: {}",
                                                        input_path, one_line(e.what())));
    }
    std::string bytes;
    if (model.ByteSizeLong() > static_cast<std::size_t>(INT_MAX) ||
        !model.SerializeToString(&bytes)) {
      throw Error(ErrorCode::kUnsupported,
                  fmt::format("{}: the pruned model does not serialize (over 2 GiB?)", input_path));
    }
    write_atomically(output_path, bytes);
    return report;
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::kOutOfMemory,
                fmt::format("{}: out of memory while pruning", input_path));
  }
}

}  // namespace sparsecol
