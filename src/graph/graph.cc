#include "graph/graph.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace sparsecol::graph {

std::string to_string(const Shape& shape) {
  std::vector<std::string> parts;
  for (const Dim& d : shape) {
    parts.push_back(d.known() ? std::to_string(d.value) : (d.symbol.empty() ? "?" : d.symbol));
  }
  return fmt::format("[{}]", fmt::join(parts, ", "));
}

Shape make_shape(const std::vector<int64_t>& dims) {
  Shape shape;
  for (int64_t d : dims) shape.push_back(Dim{d, {}});
  return shape;
}

std::optional<std::vector<int64_t>> concrete(const Shape& shape) {
  std::vector<int64_t> dims;
  for (const Dim& d : shape) {
    if (!d.known()) return std::nullopt;
    dims.push_back(d.value);
  }
  return dims;
}

bool keeps_element_order(const Node& node) {
  static const char* const kOps[] = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"};
  return node.domain.empty() && std::any_of(std::begin(kOps), std::end(kOps),
                                            [&](const char* op) { return node.op_type == op; });
}

const char* to_string(EpilogueOp::Kind kind) {
  switch (kind) {
    case EpilogueOp::Kind::kRelu:
      return "Relu";
    case EpilogueOp::Kind::kClip:
      return "Clip";
    case EpilogueOp::Kind::kGelu:
      return "Gelu";
    case EpilogueOp::Kind::kAdd:
      return "Add";
  }
  return "?";
}

namespace {

template <typename T>
const T* typed_attr(const Node& node, const std::string& key, const char* type_name) {
  auto it = node.attrs.find(key);
  if (it == node.attrs.end()) return nullptr;
  if (const T* v = std::get_if<T>(&it->second)) return v;
  throw Error(ErrorCode::kInvalidModel, fmt::format("node '{}' ({}): attribute '{}' must be {}",
                                                    node.name, node.op_type, key, type_name));
}

}  // namespace

int64_t Node::attr_int(const std::string& key, int64_t fallback) const {
  const int64_t* v = typed_attr<int64_t>(*this, key, "an int");
  return v ? *v : fallback;
}

float Node::attr_float(const std::string& key, float fallback) const {
  const float* v = typed_attr<float>(*this, key, "a float");
  return v ? *v : fallback;
}

std::string Node::attr_string(const std::string& key, const std::string& fallback) const {
  const std::string* v = typed_attr<std::string>(*this, key, "a string");
  return v ? *v : fallback;
}

std::vector<int64_t> Node::attr_ints(const std::string& key,
                                     const std::vector<int64_t>& fallback) const {
  const auto* v = typed_attr<std::vector<int64_t>>(*this, key, "a list of ints");
  return v ? *v : fallback;
}

std::vector<float> Node::attr_floats(const std::string& key,
                                     const std::vector<float>& fallback) const {
  const auto* v = typed_attr<std::vector<float>>(*this, key, "a list of floats");
  return v ? *v : fallback;
}

std::vector<std::string> Node::attr_strings(const std::string& key) const {
  const auto* v = typed_attr<std::vector<std::string>>(*this, key, "a list of strings");
  return v ? *v : std::vector<std::string>{};
}

const Tensor* Node::attr_tensor(const std::string& key) const {
  return typed_attr<Tensor>(*this, key, "a tensor");
}

std::size_t Node::own_input_count() const {
  std::size_t appended = 0;
  for (const EpilogueOp& op : epilogue) appended += op.kind == EpilogueOp::Kind::kAdd ? 1 : 0;
  return inputs.size() - appended;
}

int Graph::add_value(Value value) {
  values.push_back(std::move(value));
  return static_cast<int>(values.size()) - 1;
}

bool Graph::is_output(int id) const {
  return std::find(outputs.begin(), outputs.end(), id) != outputs.end();
}

std::vector<int64_t> Graph::concrete_dims(int id) const {
  const Value& v = values[static_cast<std::size_t>(id)];
  const auto dims = v.shape ? concrete(*v.shape) : std::nullopt;
  if (!dims || !v.dtype_known) {
    throw Error(ErrorCode::kInternal,
                fmt::format("{}: value '{}' has no concrete shape or dtype", source, v.name));
  }
  return *dims;
}

int Graph::find_value(const std::string& name) const {
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (values[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::string Graph::where(const Node& node) const {
  return fmt::format("node '{}' ({}) in {}", node.name, node.op_type,
                     source.empty() ? "<memory>" : source);
}

void fail(const Graph& graph, const Node& node, ErrorCode code, const std::string& message) {
  throw Error(code, fmt::format("{}: {}", graph.where(node), message));
}

int64_t checked_add(const Graph& graph, const Node& node, int64_t a, int64_t b) {
  int64_t result = 0;
  if (__builtin_add_overflow(a, b, &result)) {
    fail(graph, node, ErrorCode::kShapeMismatch,
         fmt::format("dimension {} + {} overflows 64 bits", a, b));
  }
  return result;
}

int64_t checked_mul(const Graph& graph, const Node& node, int64_t a, int64_t b) {
  int64_t result = 0;
  if (__builtin_mul_overflow(a, b, &result)) {
    fail(graph, node, ErrorCode::kShapeMismatch,
         fmt::format("dimension {} * {} overflows 64 bits", a, b));
  }
  return result;
}

std::vector<std::vector<int>> Graph::consumers() const {
  std::vector<std::vector<int>> readers(values.size());
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    for (int v : nodes[n].inputs) {
      if (v >= 0) readers[static_cast<std::size_t>(v)].push_back(static_cast<int>(n));
    }
  }
  return readers;
}

void Graph::link() {
  const std::string file = source.empty() ? "<memory>" : source;
  const auto bad_id = [&](int v) { return v < -1 || v >= static_cast<int>(values.size()); };
  std::vector<bool> defined(values.size(), false);
  for (Value& value : values) value.producer = -1;
  for (int v : inputs) {
    if (v < 0 || bad_id(v)) throw Error(ErrorCode::kInvalidModel, file + ": bad graph input id");
    defined[static_cast<std::size_t>(v)] = true;
  }
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (values[i].constant) defined[i] = true;
  }
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    const Node& node = nodes[n];
    for (int v : node.inputs) {
      if (bad_id(v)) fail(*this, node, ErrorCode::kInvalidModel, "input id out of range");
      if (v >= 0 && !defined[static_cast<std::size_t>(v)]) {
        fail(*this, node, ErrorCode::kInvalidModel,
             fmt::format("input '{}' is not produced by any earlier node, initializer or graph "
                         "input (missing value, or a cycle)",
                         values[static_cast<std::size_t>(v)].name));
      }
    }
    for (int v : node.outputs) {
      if (v < 0 || bad_id(v)) fail(*this, node, ErrorCode::kInvalidModel, "bad output id");
      if (defined[static_cast<std::size_t>(v)]) {
        fail(*this, node, ErrorCode::kInvalidModel,
             fmt::format("output '{}' is already defined (values must be written once)",
                         values[static_cast<std::size_t>(v)].name));
      }
      defined[static_cast<std::size_t>(v)] = true;
      values[static_cast<std::size_t>(v)].producer = static_cast<int>(n);
    }
  }
  for (int v : outputs) {
    if (v < 0 || bad_id(v) || !defined[static_cast<std::size_t>(v)]) {
      throw Error(ErrorCode::kInvalidModel,
                  fmt::format("{}: graph output '{}' is never produced", file,
                              v >= 0 && !bad_id(v) ? values[static_cast<std::size_t>(v)].name
                                                   : std::string("?")));
    }
  }
}

void Graph::remove_dead() {
  // Walk backwards from the outputs, keeping the nodes that feed them.
  std::vector<bool> live_value(values.size(), false);
  for (int v : outputs) live_value[static_cast<std::size_t>(v)] = true;
  for (int v : inputs) live_value[static_cast<std::size_t>(v)] = true;  // inputs stay in the API
  std::vector<bool> live_node(nodes.size(), false);
  for (std::size_t n = nodes.size(); n-- > 0;) {
    bool needed = false;
    for (int v : nodes[n].outputs) needed = needed || live_value[static_cast<std::size_t>(v)];
    if (!needed) continue;
    live_node[n] = true;
    for (int v : nodes[n].inputs) {
      if (v >= 0) live_value[static_cast<std::size_t>(v)] = true;
    }
    for (int v : nodes[n].outputs) live_value[static_cast<std::size_t>(v)] = true;
  }
  std::vector<int> new_id(values.size(), -1);
  std::vector<Value> kept_values;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!live_value[i]) continue;
    new_id[i] = static_cast<int>(kept_values.size());
    kept_values.push_back(std::move(values[i]));
  }
  const auto remap = [&](std::vector<int>& ids) {
    for (int& v : ids) v = v >= 0 ? new_id[static_cast<std::size_t>(v)] : -1;
  };
  std::vector<Node> kept_nodes;
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    if (!live_node[n]) continue;
    Node node = std::move(nodes[n]);
    remap(node.inputs);
    remap(node.outputs);
    kept_nodes.push_back(std::move(node));
  }
  values = std::move(kept_values);
  nodes = std::move(kept_nodes);
  remap(inputs);
  remap(outputs);
  link();
}

}  // namespace sparsecol::graph
