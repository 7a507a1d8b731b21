// Builds small IR graphs by hand for pass and executor tests.
#pragma once

#include <random>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "graph/passes.h"
#include "runtime/executor.h"
#include "runtime/reference/reference_ops.h"

namespace sparsecol::testing {

inline Tensor random_tensor(std::vector<int64_t> shape, uint32_t seed, float lo = -1.0f,
                            float hi = 1.0f) {
  Tensor t = Tensor::zeros(DType::kFloat32, std::move(shape));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

inline Tensor scalar(float v) {
  Tensor t = Tensor::zeros(DType::kFloat32, {});
  t.data<float>()[0] = v;
  return t;
}

class GraphBuilder {
 public:
  GraphBuilder() {
    graph_.source = "test.onnx";
    graph_.opset = 13;
  }

  // A graph input; dims < 0 are symbolic and named by `symbol`.
  int input(const std::string& name, std::vector<int64_t> dims, const std::string& symbol = "N") {
    graph::Shape shape;
    for (int64_t d : dims) shape.push_back(d < 0 ? graph::Dim{-1, symbol} : graph::Dim{d, {}});
    const int id = graph_.add_value({name, DType::kFloat32, true, shape, std::nullopt, -1});
    graph_.inputs.push_back(id);
    return id;
  }

  int constant(const std::string& name, Tensor t) {
    const graph::Shape shape = graph::make_shape(t.shape());
    return graph_.add_value({name, t.dtype(), true, shape, std::move(t), -1});
  }

  // Adds a node with one output; `shape` (optional) is what ONNX shape inference would record.
  int node(const std::string& op, std::vector<int> inputs,
           std::map<std::string, graph::AttrValue> attrs = {},
           std::optional<graph::Shape> shape = std::nullopt) {
    const std::string name = op + "_" + std::to_string(graph_.nodes.size());
    const int out = graph_.add_value(
        {name + "_out", DType::kFloat32, shape.has_value(), shape, std::nullopt, -1});
    graph_.nodes.push_back(
        graph::Node{name, op, "", std::move(inputs), {out}, std::move(attrs), {}});
    return out;
  }

  graph::Graph finish(std::vector<int> outputs) {
    graph_.outputs = std::move(outputs);
    graph_.link();
    return graph_;
  }

 private:
  graph::Graph graph_;
};

// Runs `graph` on the reference executor with the given inputs (shapes fixed from them).
inline NamedTensors run_reference(const graph::Graph& graph, const NamedTensors& inputs) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, t] : inputs) shapes[name] = t.shape();
  return runtime::make_reference_executor(graph::specialize(graph, shapes, runtime::evaluate_node))
      ->run(inputs);
}

inline float max_abs_diff(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return std::numeric_limits<float>::infinity();
  float worst = 0.0f;
  for (int64_t i = 0; i < a.numel(); ++i) {
    worst = std::max(worst, std::fabs(a.data<float>()[i] - b.data<float>()[i]));
  }
  return worst;
}

}  // namespace sparsecol::testing
