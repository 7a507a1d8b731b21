// Per-op shape and dtype inference on concrete shapes, and the list of supported ops.
//
// Inference runs when a session has fixed every input shape (see passes.h: specialize), so
// every dimension here is a concrete number. Each op validates its attributes and input
// shapes and fails with an Error naming the node, the op, and expected vs actual.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace sparsecol::graph {

class InferContext {
 public:
  InferContext(const Graph& graph, const Node& node);

  const Graph& graph() const { return graph_; }
  const Node& node() const { return node_; }
  // Number of the op's own inputs (epilogue operands excluded), omitted optionals included.
  std::size_t input_count() const { return node_.own_input_count(); }
  bool has_input(std::size_t i) const;  // false for omitted optional inputs
  DType dtype(std::size_t i) const;
  std::vector<int64_t> shape(std::size_t i) const;  // fails if not concrete
  const Tensor* constant(std::size_t i) const;  // the input's contents if constant, else nullptr
  // Like constant(), but fails with a clear message when the input is not constant: for ops
  // whose output shape depends on an input's contents (Reshape's shape, Slice's starts, ...).
  const Tensor& required_constant(std::size_t i, const char* what) const;
  // Fails unless the op has between lo and hi inputs (counting omitted optionals).
  void expect_inputs(std::size_t lo, std::size_t hi) const;
  void expect_dtype(std::size_t i, std::initializer_list<DType> allowed) const;
  void expect_rank(std::size_t i, int rank) const;

  void set_output(std::size_t i, DType dtype, std::vector<int64_t> shape);
  [[noreturn]] void fail(ErrorCode code, const std::string& message) const;

  struct Output {
    DType dtype = DType::kFloat32;
    std::vector<int64_t> shape;
    bool set = false;
  };
  const std::vector<Output>& outputs() const { return outputs_; }

 private:
  const Value& value(std::size_t i) const;
  const Graph& graph_;
  const Node& node_;
  std::vector<Output> outputs_;
};

using InferFn = void (*)(InferContext&);

struct OpDef {
  const char* op_type;
  InferFn infer;
};

// The op's definition in the default ONNX domain, or nullptr when unsupported.
const OpDef* find_op(const std::string& op_type);
// Every supported op type, sorted.
std::vector<std::string> supported_ops();

// The op families, one file each (ops_<family>.cc); the registry in ops.cc lists them.
// Adding an op touches its family's table only.
std::span<const OpDef> elementwise_op_defs();
std::span<const OpDef> nn_op_defs();
std::span<const OpDef> tensor_op_defs();

// Normalizes a possibly negative axis against a rank; fails naming the node if out of range.
int64_t normalize_axis(const InferContext& ctx, int64_t axis, int64_t rank);
// Numpy-style broadcast of two shapes; fails naming the node if incompatible.
std::vector<int64_t> broadcast_shapes(const InferContext& ctx, const std::vector<int64_t>& a,
                                      const std::vector<int64_t>& b);

// The DType of an ONNX TensorProto.DataType code, as attributes such as Cast's `to` or
// EyeLike's `dtype` carry it; fails with kUnsupported naming the type for the ones sparsecol
// does not hold (float16, string, ...).
DType dtype_from_onnx_code(const InferContext& ctx, int64_t code);

}  // namespace sparsecol::graph
