// The intermediate representation: values (typed, shaped, maybe constant) and nodes over them.
//
// Nothing here knows ONNX or kernels. Node op types and attribute names follow ONNX's because
// they are the vocabulary users read in error messages and in `sparsecol inspect`.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "sparsecol/sparsecol.h"

namespace sparsecol::graph {

// One dimension: a fixed size, or a symbol (e.g. "batch") until a session fixes it.
struct Dim {
  int64_t value = -1;  // -1 while not known
  std::string symbol;  // name of a symbolic dimension, may be empty
  bool known() const { return value >= 0; }
  bool operator==(const Dim& other) const {
    return known() ? value == other.value : (!symbol.empty() && symbol == other.symbol);
  }
};
using Shape = std::vector<Dim>;

std::string to_string(const Shape& shape);  // "[batch, 3, 224, 224]"
Shape make_shape(const std::vector<int64_t>& dims);
// The concrete dimensions; nullopt if any dimension is not known.
std::optional<std::vector<int64_t>> concrete(const Shape& shape);

struct Value {
  std::string name;
  DType dtype = DType::kFloat32;
  bool dtype_known = false;
  std::optional<Shape> shape;      // nullopt: not even the rank is known
  std::optional<Tensor> constant;  // set for initializers and folded values
  int producer = -1;               // index of the node that writes it, -1 for inputs/constants
};

using AttrValue = std::variant<int64_t, float, std::string, std::vector<int64_t>,
                               std::vector<float>, std::vector<std::string>, Tensor>;

// An operation fused onto the end of a node's computation (applied element-wise to its output,
// in order). Marked by the epilogue pass; every executor must honour it.
struct EpilogueOp {
  enum class Kind { kRelu, kClip, kGelu, kAdd };
  Kind kind = Kind::kRelu;
  float min = 0.0f, max = 0.0f;  // kClip bounds
  int input = -1;  // kAdd: index into Node::inputs of the tensor to add (bias or residual),
                   // broadcast over the output the way ONNX Add broadcasts
};
const char* to_string(EpilogueOp::Kind kind);

struct Node {
  std::string name;
  std::string op_type;
  std::string domain;       // "" for the default ONNX domain
  std::vector<int> inputs;  // value ids; -1 for an omitted optional input
  std::vector<int> outputs;
  std::map<std::string, AttrValue> attrs;
  std::vector<EpilogueOp> epilogue;

  bool has_attr(const std::string& key) const { return attrs.count(key) != 0; }
  // Typed attribute access; a wrong type throws Error(kInvalidModel) naming node, op and attr.
  int64_t attr_int(const std::string& key, int64_t fallback) const;
  float attr_float(const std::string& key, float fallback) const;
  std::string attr_string(const std::string& key, const std::string& fallback) const;
  std::vector<int64_t> attr_ints(const std::string& key,
                                 const std::vector<int64_t>& fallback = {}) const;
  std::vector<float> attr_floats(const std::string& key,
                                 const std::vector<float>& fallback = {}) const;
  std::vector<std::string> attr_strings(const std::string& key) const;  // empty when absent
  const Tensor* attr_tensor(const std::string& key) const;              // nullptr when absent

  // The op's own inputs come first; operands of kAdd epilogue ops are appended after them.
  std::size_t own_input_count() const;
  int input(std::size_t i) const { return i < own_input_count() ? inputs[i] : -1; }
  int output(std::size_t i) const { return i < outputs.size() ? outputs[i] : -1; }
};

// Reshape, Flatten, Squeeze, Unsqueeze, Identity of the default domain: the output holds the
// input's elements in the same order under another shape (the executors run them as views).
bool keeps_element_order(const Node& node);

struct Graph {
  std::string source;  // the model file, for error messages
  int64_t opset = 0;   // the default domain's opset version
  std::vector<Value> values;
  std::vector<Node> nodes;  // always in topological order
  std::vector<int> inputs;  // value ids fed by the caller (never constants)
  std::vector<int> outputs;

  int add_value(Value value);
  int find_value(const std::string& name) const;  // -1 if absent
  bool is_output(int id) const;                   // a graph output
  // The value's shape, every dimension known, as the executors of a specialized graph need it;
  // throws Error(kInternal) naming the value otherwise.
  std::vector<int64_t> concrete_dims(int id) const;
  // "node 'conv1' (Conv) in model.onnx": the prefix of every error about a node.
  std::string where(const Node& node) const;
  // Which nodes read each value (value id -> node indices), recomputed on demand.
  std::vector<std::vector<int>> consumers() const;
  // Recomputes Value::producer and checks the graph: every node input defined before it is
  // read (so nodes are in topological order and there is no cycle), every value written once,
  // graph inputs and outputs exist. Throws Error(kInvalidModel) naming the culprit.
  void link();
  // Drops nodes whose outputs nobody reads and values nobody references; renumbers ids.
  void remove_dead();
};

// Sums and products of dimensions that fail (kShapeMismatch, naming the node) instead of
// overflowing: sizes come from untrusted files.
int64_t checked_add(const Graph& graph, const Node& node, int64_t a, int64_t b);
int64_t checked_mul(const Graph& graph, const Node& node, int64_t a, int64_t b);

// Throws Error(code) with "<graph.where(node)>: <message>".
[[noreturn]] void fail(const Graph& graph, const Node& node, ErrorCode code,
                       const std::string& message);

}  // namespace sparsecol::graph
