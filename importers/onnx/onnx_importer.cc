#include "onnx/onnx_importer.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <filesystem>
#include <new>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <onnx/checker.h>
#include <onnx/defs/schema.h>
#include <onnx/shape_inference/implementation.h>

#include "graph/ops.h"
#include "onnx/tensor_proto.h"

namespace sparsecol::onnx_import {

namespace {

// ONNX names the default domain both "" and "ai.onnx".
bool is_default_domain(const std::string& domain) { return domain.empty() || domain == "ai.onnx"; }

// ONNX's messages span several lines ("...\n\n==> Context: ..."); ours are one line.
std::string one_line(const std::string& text) {
  std::string out;
  for (char c : text) {
    const bool space = c == '\n' || c == '\r' || c == '\t' || c == ' ';
    if (space && (out.empty() || out.back() == ' ')) continue;
    out.push_back(space ? ' ' : c);
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

// Rewrites an ONNX library message in our form, "node 'name' (Op) in file: step: text", when it
// names a node. ONNX 1.12 writes node-level errors as
//   shape inference: "[ShapeInferenceError] (op_type:Op, node name: name): text", and in strict
//     mode "...error(s): " followed by one such line per failing node: the first is the cause,
//     the later ones mostly follow from it (inputs left without a type);
//   checker: "text\n\n==> Context: Bad node spec for node. Name: name OpType: Op".
std::string format_onnx_error(const std::string& source, const char* step, std::string text) {
  std::string node_name, op_type;
  int more = 0;
  const std::string list_prefix = "Shape inference error(s): ";
  if (std::size_t at = text.find(list_prefix); at != std::string::npos) {
    text.erase(0, at + list_prefix.size());
    for (std::size_t line = text.find('\n'); line != std::string::npos;
         line = text.find('\n', line + 1)) {
      more += line + 1 < text.size() && text[line + 1] != '\n' ? 1 : 0;
    }
    text.erase(std::min(text.find('\n'), text.size()));
  }
  const std::string node_prefix = "(op_type:", name_prefix = ", node name: ";
  if (std::size_t at = text.find(node_prefix); at != std::string::npos) {
    const std::size_t name_at = text.find(name_prefix, at);
    const std::size_t end = text.find("): ", name_at == std::string::npos ? at : name_at);
    if (name_at != std::string::npos && end != std::string::npos) {
      op_type = text.substr(at + node_prefix.size(), name_at - at - node_prefix.size());
      node_name = text.substr(name_at + name_prefix.size(), end - name_at - name_prefix.size());
      text.erase(at, end + 3 - at);
    }
  }
  const std::string context = "==> Context: Bad node spec for node. Name: ";
  if (std::size_t at = text.find(context); at != std::string::npos) {
    const std::string rest = text.substr(at + context.size());
    if (std::size_t op_at = rest.find(" OpType: "); op_at != std::string::npos) {
      node_name = rest.substr(0, op_at);
      op_type = one_line(rest.substr(op_at + 9));
      text.erase(at);
    }
  }
  // The step already says what failed.
  for (const char* tag : {"[ShapeInferenceError] ", "[TypeInferenceError] "}) {
    for (std::size_t at = text.find(tag); at != std::string::npos; at = text.find(tag)) {
      text.erase(at, std::strlen(tag));
    }
  }
  text = one_line(text);
  if (more > 0) {
    text += fmt::format(" ({} more error(s) in later nodes, likely following from it)", more);
  }
  if (op_type.empty()) return fmt::format("{}: {}: {}", source, step, text);
  return fmt::format("node '{}' ({}) in {}: {}: {}", node_name, op_type, source, step, text);
}

// Runs a step of the ONNX library, which reports problems with its own exception types
// (onnx::checker::ValidationError, onnx::InferenceError, std::runtime_error): each becomes a
// sparsecol::Error naming the file.
template <typename Fn>
void run_onnx_step(const std::string& source, const char* step, Fn&& fn) {
  try {
    fn();
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::kOutOfMemory, fmt::format("{}: out of memory in {}", source, step));
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kInvalidModel, format_onnx_error(source, step, e.what()));
  }
}

// ONNX shape inference cannot read external data, yet reads the contents of some initializers:
// any small one an op's inference asks for (Reshape's shape, Resize's scales), and, with data
// propagation, every int32/int64 scalar or vector. Those are copied inline before it runs; large
// weights are never read.
constexpr int64_t kInlineForInferenceBytes = int64_t{64} * 1024;

bool inference_may_read(const Tensor& tensor) {
  const bool integer_vector =
      tensor.rank() <= 1 && (tensor.dtype() == DType::kInt64 || tensor.dtype() == DType::kInt32);
  return integer_vector || static_cast<int64_t>(tensor.nbytes()) <= kInlineForInferenceBytes;
}

class Importer {
 public:
  Importer(onnx::ModelProto& model, const std::string& source, std::string base_dir)
      : model_(model), base_dir_(std::move(base_dir)) {
    graph_.source = source;
  }

  graph::Graph run() {
    check_header();
    name_unnamed_nodes();
    const onnx::GraphProto& proto = model_.graph();
    if (proto.sparse_initializer_size() > 0) {
      fail(ErrorCode::kUnsupported,
           fmt::format("sparse initializer '{}' is not supported (store it dense)",
                       proto.sparse_initializer(0).values().name()));
    }
    add_initializers(proto);
    add_inputs(proto);
    for (const onnx::NodeProto& node : proto.node()) add_node(node);
    add_outputs(proto);
    graph_.link();
    run_checker();
    check_window_attributes(proto);
    const StaticShapes shapes = static_shapes(proto);
    check_layer_norm_axes(proto, shapes);
    check_conv_weights(shapes);
    run_shape_inference();
    apply_value_types();
    return std::move(graph_);
  }

 private:
  [[noreturn]] void fail(ErrorCode code, const std::string& message) const {
    throw Error(code, fmt::format("{}: {}", graph_.source, message));
  }

  void check_header() {
    if (model_.ir_version() <= 0) {
      fail(ErrorCode::kInvalidModel, "not an ONNX model (no ir_version)");
    }
    if (model_.ir_version() > onnx::Version::IR_VERSION) {
      // A newer ONNX writes its own IR version into every model it saves, also one that uses
      // nothing the older versions lack: say how to load such a model rather than only refuse it.
      const int supported = static_cast<int>(onnx::Version::IR_VERSION);
      fail(ErrorCode::kUnsupported,
           fmt::format("IR version {} is newer than this importer reads (at most {}); a model "
                       "that uses nothing newer loads once saved with ir_version {} (Python: "
                       "model.ir_version = {}; onnx.save(model, path))",
                       model_.ir_version(), supported, supported, supported));
    }
    if (!model_.has_graph()) fail(ErrorCode::kInvalidModel, "the model has no graph");
    bool found = false;
    std::vector<std::string> other_domains;
    for (const onnx::OperatorSetIdProto& opset : model_.opset_import()) {
      if (is_default_domain(opset.domain())) {
        found = true;
        graph_.opset = opset.version();
      } else {
        other_domains.push_back(fmt::format("'{}'", opset.domain()));
      }
    }
    if (!found && !other_domains.empty()) {
      fail(ErrorCode::kUnsupported,
           fmt::format("the model imports only the domains {}; sparsecol supports the default "
                       "ONNX domain",
                       fmt::join(other_domains, ", ")));
    }
    if (!found) fail(ErrorCode::kInvalidModel, "the model imports no opset");
    if (graph_.opset >= kOldestOpset && graph_.opset < kMinOpset) {
      accept_older_opset();
    } else if (graph_.opset < kMinOpset || graph_.opset > kMaxOpset) {
      fail(ErrorCode::kUnsupported,
           fmt::format("default-domain opset {} is not supported (supported: {} to {})",
                       graph_.opset, kMinOpset, kMaxOpset));
    }
  }

  // A model at an opset below kMinOpset means exactly what it would at kMinOpset when none of
  // its ops changed in between (ONNX versions each op separately: an op's definition at opset
  // v is its newest with since_version <= v). Such a model is read as kMinOpset; one using an
  // op that did change (Slice, Pad, Upsample, ...) is refused, naming the node.
  void accept_older_opset() {
    for (int i = 0; i < model_.graph().node_size(); ++i) {
      const onnx::NodeProto& node = model_.graph().node(i);
      if (!is_default_domain(node.domain())) continue;
      const auto* at_model =
          onnx::OpSchemaRegistry::Schema(node.op_type(), static_cast<int>(graph_.opset), "");
      const auto* at_min =
          onnx::OpSchemaRegistry::Schema(node.op_type(), static_cast<int>(kMinOpset), "");
      if (at_model == nullptr || at_min == nullptr ||
          at_model->since_version() != at_min->since_version()) {
        fail(ErrorCode::kUnsupported,
             fmt::format(
                 "default-domain opset {} is not supported (supported: {} to {}, or "
                 "older when no op changed up to {}): op {} of node '{}' changed since",
                 graph_.opset, kMinOpset, kMaxOpset, kMinOpset, node.op_type(),
                 node.name().empty() ? fmt::format("{}_{}", node.op_type(), i) : node.name()));
      }
    }
    graph_.opset = kMinOpset;
  }

  // Names unnamed nodes "<op_type>_<index>" in the proto itself, so that the ONNX checker's and
  // shape inference's messages use the names ours do.
  void name_unnamed_nodes() {
    onnx::GraphProto& proto = *model_.mutable_graph();
    for (int i = 0; i < proto.node_size(); ++i) {
      onnx::NodeProto& node = *proto.mutable_node(i);
      if (node.name().empty()) node.set_name(fmt::format("{}_{}", node.op_type(), i));
    }
  }

  // Registers a new value under a name that must not be taken yet.
  int define(const std::string& name, const char* what) {
    if (name.empty()) fail(ErrorCode::kInvalidModel, fmt::format("a {} has no name", what));
    if (ids_.count(name) != 0) {
      fail(ErrorCode::kInvalidModel, fmt::format("{} '{}' is defined twice", what, name));
    }
    graph::Value value;
    value.name = name;
    return ids_[name] = graph_.add_value(std::move(value));
  }

  // The id of a named value, created on first mention; Graph::link() later rejects values read
  // before (or without) being defined.
  int value_id(const std::string& name) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    graph::Value value;
    value.name = name;
    return ids_[name] = graph_.add_value(std::move(value));
  }

  void add_initializers(const onnx::GraphProto& proto) {
    for (const onnx::TensorProto& tensor : proto.initializer()) {
      const int id = define(tensor.name(), "initializer");
      graph::Value& value = graph_.values[static_cast<std::size_t>(id)];
      value.constant = tensor_from_proto(
          tensor, base_dir_, fmt::format("initializer '{}' in {}", tensor.name(), graph_.source));
      value.dtype = value.constant->dtype();
      value.dtype_known = true;
      value.shape = graph::make_shape(value.constant->shape());
    }
  }

  // The ONNX 1.12 checker requires these too, but its message does not say which value lacks
  // them.
  void require_type_and_shape(const onnx::ValueInfoProto& info, const char* what) const {
    if (!info.has_type()) {
      fail(ErrorCode::kInvalidModel, fmt::format("{} '{}' declares no type", what, info.name()));
    }
    if (info.type().has_tensor_type() && !info.type().tensor_type().has_shape()) {
      fail(ErrorCode::kInvalidModel,
           fmt::format("{} '{}' declares no shape (ONNX requires one for graph inputs and "
                       "outputs; unknown dimensions may be left empty or named)",
                       what, info.name()));
    }
  }

  void add_inputs(const onnx::GraphProto& proto) {
    for (const onnx::ValueInfoProto& input : proto.input()) {
      // Before IR version 4 initializers are listed as inputs too; they stay constants.
      auto it = ids_.find(input.name());
      if (it != ids_.end() && graph_.values[static_cast<std::size_t>(it->second)].constant) {
        continue;
      }
      require_type_and_shape(input, "graph input");
      graph_.inputs.push_back(define(input.name(), "graph input"));
    }
  }

  void add_outputs(const onnx::GraphProto& proto) {
    // ONNX allows it, but a model without outputs computes nothing a caller could read.
    if (proto.output_size() == 0) fail(ErrorCode::kInvalidModel, "the graph has no outputs");
    for (const onnx::ValueInfoProto& output : proto.output()) {
      if (output.name().empty()) fail(ErrorCode::kInvalidModel, "a graph output has no name");
      require_type_and_shape(output, "graph output");
      graph_.outputs.push_back(value_id(output.name()));
    }
  }

  void add_node(const onnx::NodeProto& proto) {
    graph::Node node;
    node.op_type = proto.op_type();
    node.name = proto.name();
    if (node.op_type.empty()) graph::fail(graph_, node, ErrorCode::kInvalidModel, "no op_type");
    if (!is_default_domain(proto.domain())) {
      graph::fail(graph_, node, ErrorCode::kUnsupported,
                  fmt::format("op {} of domain '{}' is not supported (only the default ONNX "
                              "domain is)",
                              node.op_type, proto.domain()));
    }
    if (graph::find_op(node.op_type) == nullptr) {
      graph::fail(graph_, node, ErrorCode::kUnsupported,
                  fmt::format("op {} is not supported (supported: {})", node.op_type,
                              fmt::join(graph::supported_ops(), ", ")));
    }
    for (const onnx::AttributeProto& attr : proto.attribute()) {
      if (!node.attrs.emplace(attr.name(), convert_attr(attr, node)).second) {
        graph::fail(graph_, node, ErrorCode::kInvalidModel,
                    fmt::format("attribute '{}' is given twice", attr.name()));
      }
    }
    for (const std::string& name : proto.input()) {
      node.inputs.push_back(name.empty() ? -1 : value_id(name));  // "": omitted optional input
    }
    // Omitted optional outputs are "": trailing ones are dropped, the others get a value of
    // their own (that nothing reads) so that output positions keep their meaning.
    int used = proto.output_size();
    while (used > 0 && proto.output(used - 1).empty()) --used;
    for (int i = 0; i < used; ++i) {
      if (!proto.output(i).empty()) {
        node.outputs.push_back(value_id(proto.output(i)));
        continue;
      }
      graph::Value unused;
      unused.name = fmt::format("{}_unused_output_{}", node.name, i);
      node.outputs.push_back(graph_.add_value(std::move(unused)));
    }
    graph_.nodes.push_back(std::move(node));
  }

  graph::AttrValue convert_attr(const onnx::AttributeProto& attr, const graph::Node& node) {
    using onnx::AttributeProto;
    switch (attr.type()) {
      case AttributeProto::INT:
        return attr.i();
      case AttributeProto::FLOAT:
        return attr.f();
      case AttributeProto::STRING:
        return attr.s();
      case AttributeProto::INTS:
        return std::vector<int64_t>(attr.ints().begin(), attr.ints().end());
      case AttributeProto::FLOATS:
        return std::vector<float>(attr.floats().begin(), attr.floats().end());
      case AttributeProto::STRINGS:
        return std::vector<std::string>(attr.strings().begin(), attr.strings().end());
      case AttributeProto::TENSOR:
        return tensor_from_proto(
            attr.t(), base_dir_,
            fmt::format("attribute '{}' of {}", attr.name(), graph_.where(node)));
      case AttributeProto::GRAPH:
      case AttributeProto::GRAPHS:
        graph::fail(graph_, node, ErrorCode::kUnsupported,
                    fmt::format("attribute '{}' is a subgraph; control flow (If, Loop, Scan) is "
                                "not supported",
                                attr.name()));
      case AttributeProto::UNDEFINED:
        graph::fail(graph_, node, ErrorCode::kInvalidModel,
                    fmt::format("attribute '{}' has no type", attr.name()));
      default:
        graph::fail(graph_, node, ErrorCode::kUnsupported,
                    fmt::format("attribute '{}' of type {} is not supported", attr.name(),
                                AttributeProto::AttributeType_IsValid(attr.type())
                                    ? AttributeProto::AttributeType_Name(attr.type())
                                    : std::to_string(attr.type())));
    }
  }

  void run_checker() {
    run_onnx_step(graph_.source, "ONNX checker", [&] {
      // What onnx::checker::check_model(model) does, plus the model's folder, which that
      // overload cannot be given and needs to find external data.
      onnx::checker::CheckerContext ctx;
      ctx.set_ir_version(static_cast<int>(model_.ir_version()));
      std::unordered_map<std::string, int> opsets;
      for (const onnx::OperatorSetIdProto& opset : model_.opset_import()) {
        opsets[opset.domain()] = static_cast<int>(opset.version());
      }
      ctx.set_opset_imports(opsets);
      ctx.set_model_dir(base_dir_);
      onnx::checker::LexicalScopeContext lexical_scope;
      onnx::checker::check_graph(model_.graph(), ctx, lexical_scope);
      onnx::checker::check_model_local_functions(model_, ctx, lexical_scope);
    });
  }

  // ONNX 1.12's shape inference for convolutions and pooling divides by each stride without
  // checking it (a stride of 0 raised SIGFPE inside libonnx: found by the importer fuzzer), and
  // its checker does not look at attribute values. So the window attributes of every op that
  // shares that inference are checked here first: strides, dilations and kernel sizes must be
  // positive.
  void check_window_attributes(const onnx::GraphProto& proto) const {
    static const char* const kWindowOps[] = {"Conv",        "ConvTranspose", "ConvInteger",
                                             "QLinearConv", "MaxPool",       "AveragePool",
                                             "LpPool",      "MaxUnpool",     "MaxRoiPool"};
    for (const onnx::NodeProto& node : proto.node()) {
      const bool window = std::any_of(std::begin(kWindowOps), std::end(kWindowOps),
                                      [&](const char* op) { return node.op_type() == op; });
      if (!window || !(node.domain().empty() || node.domain() == "ai.onnx")) continue;
      for (const onnx::AttributeProto& attr : node.attribute()) {
        if (attr.name() != "strides" && attr.name() != "dilations" &&
            attr.name() != "kernel_shape") {
          continue;
        }
        for (int64_t v : attr.ints()) {
          if (v <= 0) {
            fail(ErrorCode::kInvalidModel,
                 fmt::format("node '{}' ({}): attribute '{}' must be positive, got {}", node.name(),
                             node.op_type(), attr.name(), fmt::join(attr.ints(), ", ")));
          }
        }
      }
    }
  }

  // The shapes known before shape inference: each graph input's and value_info's declared shape
  // (unknown dimensions -1) and each initializer's dims (which win over a declaration). graph_'s
  // values take declared shapes only after inference (apply_value_types). Built once: a lookup
  // per node would scan every initializer and declaration.
  using StaticShapes = std::unordered_map<std::string, std::vector<int64_t>>;
  static StaticShapes static_shapes(const onnx::GraphProto& proto) {
    StaticShapes shapes;
    for (const auto* infos : {&proto.input(), &proto.value_info()}) {
      for (const onnx::ValueInfoProto& info : *infos) {
        if (!info.type().tensor_type().has_shape()) continue;
        std::vector<int64_t>& dims = shapes[info.name()];
        dims.clear();
        for (const onnx::TensorShapeProto_Dimension& d : info.type().tensor_type().shape().dim()) {
          dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
        }
      }
    }
    for (const onnx::TensorProto& tensor : proto.initializer()) {
      shapes[tensor.name()].assign(tensor.dims().begin(), tensor.dims().end());
    }
    return shapes;
  }

  // ONNX 1.12's shape inference for LayerNormalization normalizes `axis` against X's rank and
  // then reads X's dimensions up to it unchecked: a scalar X (found by the importer fuzzer)
  // crashed inside libonnx. Where X's rank is declared, the axis must fall inside it.
  void check_layer_norm_axes(const onnx::GraphProto& proto, const StaticShapes& shapes) const {
    for (const onnx::NodeProto& node : proto.node()) {
      if (node.op_type() != "LayerNormalization" || node.input_size() == 0 ||
          !(node.domain().empty() || node.domain() == "ai.onnx")) {
        continue;
      }
      const auto shape = shapes.find(node.input(0));
      if (shape == shapes.end()) continue;
      const auto rank = static_cast<int64_t>(shape->second.size());
      int64_t axis = -1;
      for (const onnx::AttributeProto& attr : node.attribute()) {
        if (attr.name() == "axis") axis = attr.i();
      }
      if (axis < -rank || axis >= rank) {
        fail(ErrorCode::kInvalidModel,
             fmt::format("node '{}' (LayerNormalization): axis {} is outside input '{}' of rank {}",
                         node.name(), axis, node.input(0), rank));
      }
    }
  }

  // ONNX 1.12's shape inference for a convolution without a kernel_shape attribute takes the
  // kernel from W's shape and then indexes X's spatial dimensions by it unchecked: a W of
  // higher rank than X (found by the importer fuzzer twice: a rank-2 X into a 2-D convolution
  // with W an initializer, a rank-3 X with W a declared graph input) read past X's shape, and a
  // W of lower rank (a rank-2 W into a 2-D ConvTranspose) read past the kernel it took from W;
  // both crashed inside libonnx. Where both ranks are known before inference they must agree.
  // Where only W's shape is known (an initializer, a graph input or value_info), kernel_shape is
  // set from it, which is what ONNX infers anyway, so that ONNX checks it against X's rank and
  // refuses such a node with its own message. (A W computed by other nodes, its shape known
  // only during inference, is not covered.)
  void check_conv_weights(const StaticShapes& shapes) {
    static const std::pair<const char*, int> kConvWeights[] = {
        {"Conv", 1}, {"ConvTranspose", 1}, {"ConvInteger", 1}, {"QLinearConv", 3}};
    for (onnx::NodeProto& node : *model_.mutable_graph()->mutable_node()) {
      if (!(node.domain().empty() || node.domain() == "ai.onnx")) continue;
      const auto conv = std::find_if(std::begin(kConvWeights), std::end(kConvWeights),
                                     [&](const auto& op) { return node.op_type() == op.first; });
      if (conv == std::end(kConvWeights) || node.input_size() <= conv->second) continue;
      const auto x = shapes.find(node.input(0));
      const auto w = shapes.find(node.input(conv->second));
      if (x != shapes.end() && w != shapes.end() && x->second.size() != w->second.size()) {
        fail(ErrorCode::kInvalidModel,
             fmt::format("node '{}' ({}): weight '{}' has rank {} but input '{}' has rank {}; "
                         "they must be equal",
                         node.name(), node.op_type(), w->first, w->second.size(), x->first,
                         x->second.size()));
      }
      const bool has_kernel = std::any_of(node.attribute().begin(), node.attribute().end(),
                                          [](const auto& a) { return a.name() == "kernel_shape"; });
      if (has_kernel) continue;
      if (w == shapes.end()) continue;
      const std::vector<int64_t>& shape = w->second;
      if (shape.size() < 3 ||
          !std::all_of(shape.begin() + 2, shape.end(), [](int64_t d) { return d >= 0; })) {
        continue;
      }
      onnx::AttributeProto* kernel = node.add_attribute();
      kernel->set_name("kernel_shape");
      kernel->set_type(onnx::AttributeProto::INTS);
      for (auto d = shape.begin() + 2; d != shape.end(); ++d) kernel->add_ints(*d);
    }
  }

  void run_shape_inference() {
    for (onnx::TensorProto& tensor : *model_.mutable_graph()->mutable_initializer()) {
      if (tensor.data_location() != onnx::TensorProto::EXTERNAL) continue;
      const Tensor& data =
          *graph_.values[static_cast<std::size_t>(ids_.at(tensor.name()))].constant;
      if (!inference_may_read(data)) continue;
      tensor.set_raw_data(data.raw_data(), data.nbytes());
      tensor.clear_external_data();
      tensor.clear_data_location();
    }
    run_onnx_step(graph_.source, "ONNX shape inference", [&] {
      // Strict: a node whose input types or shapes contradict its schema is refused here, at
      // load, with ONNX's message naming the node. Data propagation follows shape-computing
      // subgraphs (Shape -> Gather -> Concat -> Reshape) as PyTorch exports them.
      const onnx::ShapeInferenceOptions options(/*check_type_val=*/true, /*strict_mode_val=*/1,
                                                /*data_prop_val=*/true);
      onnx::shape_inference::InferShapes(model_, onnx::OpSchemaRegistry::Instance(), options);
    });
  }

  // Takes each value's dtype and shape from the graph's inputs, outputs and value_info, as
  // declared and as completed by shape inference.
  void apply_value_types() {
    const onnx::GraphProto& proto = model_.graph();
    std::unordered_map<std::string, const onnx::TypeProto*> types;
    for (const auto* list : {&proto.input(), &proto.output(), &proto.value_info()}) {
      for (const onnx::ValueInfoProto& info : *list) {
        if (info.has_type()) types.emplace(info.name(), &info.type());
      }
    }
    for (std::size_t id = 0; id < graph_.values.size(); ++id) {
      graph::Value& value = graph_.values[id];
      if (value.constant) continue;
      auto it = types.find(value.name);
      if (it != types.end()) apply_type(*it->second, value);
    }
  }

  [[noreturn]] void fail_value(const graph::Value& value, ErrorCode code,
                               const std::string& message) const {
    if (value.producer >= 0) {
      graph::fail(graph_, graph_.nodes[static_cast<std::size_t>(value.producer)], code,
                  fmt::format("output '{}' {}", value.name, message));
    }
    const bool input = std::find(graph_.inputs.begin(), graph_.inputs.end(),
                                 &value - graph_.values.data()) != graph_.inputs.end();
    fail(code, fmt::format("{} '{}' {}", input ? "graph input" : "value", value.name, message));
  }

  void apply_type(const onnx::TypeProto& type, graph::Value& value) const {
    if (!type.has_tensor_type()) {
      fail_value(value, ErrorCode::kUnsupported,
                 "is not a tensor (sequences, maps, optionals and sparse tensors are not "
                 "supported)");
    }
    const onnx::TypeProto::Tensor& tensor = type.tensor_type();
    if (tensor.elem_type() != onnx::TensorProto::UNDEFINED) {
      const std::optional<DType> dtype = dtype_from_onnx(tensor.elem_type());
      if (!dtype) {
        fail_value(value, ErrorCode::kUnsupported,
                   fmt::format("has element type {}, which is not supported (supported: {})",
                               onnx_type_name(tensor.elem_type()), supported_onnx_types()));
      }
      value.dtype = *dtype;
      value.dtype_known = true;
    }
    if (!tensor.has_shape()) return;
    graph::Shape shape;
    for (const onnx::TensorShapeProto::Dimension& dim : tensor.shape().dim()) {
      if (dim.has_dim_value()) {
        if (dim.dim_value() < 0) {
          fail_value(value, ErrorCode::kInvalidModel,
                     fmt::format("has a negative dimension ({})", dim.dim_value()));
        }
        shape.push_back(graph::Dim{dim.dim_value(), {}});
      } else {
        shape.push_back(graph::Dim{-1, dim.has_dim_param() ? dim.dim_param() : std::string()});
      }
    }
    value.shape = std::move(shape);
  }

  onnx::ModelProto& model_;
  std::string base_dir_;
  graph::Graph graph_;
  std::unordered_map<std::string, int> ids_;
};

// Protobuf parses at most 2 GiB; larger models keep their weights in external data.
void check_protobuf_size(uintmax_t size, const std::string& source) {
  if (size > static_cast<uintmax_t>(INT_MAX)) {
    throw Error(ErrorCode::kUnsupported,
                fmt::format("{}: the model is {} bytes; protobuf reads at most 2 GiB (store the "
                            "weights as external data)",
                            source, size));
  }
}

onnx::ModelProto parse_model(const void* data, std::size_t size, const std::string& source) {
  check_protobuf_size(size, source);
  onnx::ModelProto model;
  if ((data == nullptr && size > 0) || !model.ParseFromArray(data, static_cast<int>(size))) {
    throw Error(ErrorCode::kInvalidModel,
                fmt::format("{}: not a valid ONNX model (protobuf parse failed)", source));
  }
  return model;
}

graph::Graph import_parsed(onnx::ModelProto& model, const std::string& source,
                           const std::string& base_dir) {
  try {
    return Importer(model, source, base_dir).run();
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::kOutOfMemory, fmt::format("{}: out of memory while importing", source));
  }
}

}  // namespace

graph::Graph import_model_file(const std::string& path) {
  onnx::ModelProto model;
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (!ec) check_protobuf_size(size, path);  // before reading gigabytes for nothing
  {
    const std::string bytes = read_whole_file(path, "model");  // freed before conversion
    model = parse_model(bytes.data(), bytes.size(), path);
  }
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  return import_parsed(model, path, folder.empty() ? "." : folder.string());
}

graph::Graph import_model_bytes(const void* data, std::size_t size, const std::string& source_name,
                                const std::string& base_dir) {
  onnx::ModelProto model = parse_model(data, size, source_name);
  return import_parsed(model, source_name, base_dir);
}

}  // namespace sparsecol::onnx_import
