#include "graph/ops.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace sparsecol::graph {

namespace {

const std::map<std::string, const OpDef*>& registry() {
  static const std::map<std::string, const OpDef*> ops = [] {
    std::map<std::string, const OpDef*> all;
    for (auto family : {elementwise_op_defs(), nn_op_defs(), tensor_op_defs()}) {
      for (const OpDef& def : family) all[def.op_type] = &def;
    }
    return all;
  }();
  return ops;
}

}  // namespace

const OpDef* find_op(const std::string& op_type) {
  auto it = registry().find(op_type);
  return it == registry().end() ? nullptr : it->second;
}

std::vector<std::string> supported_ops() {
  std::vector<std::string> names;
  for (const auto& [name, def] : registry()) names.push_back(name);
  return names;
}

InferContext::InferContext(const Graph& graph, const Node& node)
    : graph_(graph), node_(node), outputs_(node.outputs.size()) {}

const Value& InferContext::value(std::size_t i) const {
  if (!has_input(i)) fail(ErrorCode::kInvalidModel, fmt::format("input {} is missing", i));
  return graph_.values[static_cast<std::size_t>(node_.inputs[i])];
}

bool InferContext::has_input(std::size_t i) const {
  return i < input_count() && node_.inputs[i] >= 0;
}

DType InferContext::dtype(std::size_t i) const { return value(i).dtype; }

std::vector<int64_t> InferContext::shape(std::size_t i) const {
  const Value& v = value(i);
  if (v.constant) return v.constant->shape();
  std::optional<std::vector<int64_t>> dims = v.shape ? concrete(*v.shape) : std::nullopt;
  if (!dims) {
    fail(ErrorCode::kShapeMismatch, fmt::format("shape of input '{}' is not known", v.name));
  }
  return *dims;
}

const Tensor* InferContext::constant(std::size_t i) const {
  if (!has_input(i)) return nullptr;
  const Value& v = value(i);
  return v.constant ? &*v.constant : nullptr;
}

const Tensor& InferContext::required_constant(std::size_t i, const char* what) const {
  const Tensor* t = constant(i);
  if (t == nullptr) {
    fail(ErrorCode::kUnsupported,
         fmt::format("{} (input {}) must be a constant once input shapes are fixed", what, i));
  }
  return *t;
}

void InferContext::expect_inputs(std::size_t lo, std::size_t hi) const {
  const std::size_t n = input_count();
  if (n < lo || n > hi) {
    fail(ErrorCode::kInvalidModel,
         lo == hi ? fmt::format("expected {} inputs, got {}", lo, n)
                  : fmt::format("expected {} to {} inputs, got {}", lo, hi, n));
  }
  for (std::size_t i = 0; i < lo; ++i) {
    if (!has_input(i)) fail(ErrorCode::kInvalidModel, fmt::format("required input {} is empty", i));
  }
}

void InferContext::expect_dtype(std::size_t i, std::initializer_list<DType> allowed) const {
  const DType actual = dtype(i);
  if (std::find(allowed.begin(), allowed.end(), actual) != allowed.end()) return;
  std::vector<std::string> names;
  for (DType d : allowed) names.push_back(to_string(d));
  fail(ErrorCode::kUnsupported,
       fmt::format("input {} ('{}') has dtype {}; supported: {}", i, value(i).name,
                   to_string(actual), fmt::join(names, ", ")));
}

void InferContext::expect_rank(std::size_t i, int rank) const {
  const std::vector<int64_t> s = shape(i);
  if (static_cast<int>(s.size()) != rank) {
    fail(ErrorCode::kShapeMismatch, fmt::format("input {} ('{}') must have rank {}, got shape [{}]",
                                                i, value(i).name, rank, fmt::join(s, ", ")));
  }
}

void InferContext::set_output(std::size_t i, DType dtype, std::vector<int64_t> shape) {
  if (i >= outputs_.size()) return;  // optional outputs the model does not use
  for (int64_t d : shape) {
    if (d < 0) {
      fail(ErrorCode::kShapeMismatch,
           fmt::format("output {} would have negative dimension: [{}]", i, fmt::join(shape, ", ")));
    }
  }
  outputs_[i] = Output{dtype, std::move(shape), true};
}

void InferContext::fail(ErrorCode code, const std::string& message) const {
  graph::fail(graph_, node_, code, message);
}

int64_t normalize_axis(const InferContext& ctx, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank) {
    ctx.fail(ErrorCode::kInvalidModel,
             fmt::format("axis {} is out of range for rank {}", axis, rank));
  }
  return axis < 0 ? axis + rank : axis;
}

std::vector<int64_t> broadcast_shapes(const InferContext& ctx, const std::vector<int64_t>& a,
                                      const std::vector<int64_t>& b) {
  const std::size_t rank = std::max(a.size(), b.size());
  std::vector<int64_t> out(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1) {
      ctx.fail(ErrorCode::kShapeMismatch, fmt::format("shapes [{}] and [{}] do not broadcast",
                                                      fmt::join(a, ", "), fmt::join(b, ", ")));
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

DType dtype_from_onnx_code(const InferContext& ctx, int64_t code) {
  switch (code) {
    case 1:
      return DType::kFloat32;
    case 2:
      return DType::kUInt8;
    case 3:
      return DType::kInt8;
    case 6:
      return DType::kInt32;
    case 7:
      return DType::kInt64;
    case 9:
      return DType::kBool;
    case 11:
      return DType::kFloat64;
    default:
      break;
  }
  static constexpr const char* kNames[] = {"UNDEFINED",  "FLOAT",   "UINT8",  "INT8",   "UINT16",
                                           "INT16",      "INT32",   "INT64",  "STRING", "BOOL",
                                           "FLOAT16",    "DOUBLE",  "UINT32", "UINT64", "COMPLEX64",
                                           "COMPLEX128", "BFLOAT16"};
  const std::string name = code >= 0 && code < static_cast<int64_t>(std::size(kNames))
                               ? kNames[code]
                               : fmt::format("unknown type #{}", code);
  ctx.fail(ErrorCode::kUnsupported,
           fmt::format("element type {} is not supported (supported: float32, float64, int64, "
                       "int32, int8, uint8, bool)",
                       name));
}

}  // namespace sparsecol::graph
