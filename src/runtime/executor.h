// An executor runs one specialized graph (every shape concrete). Each schedule is one
// implementation; a Session keeps one executor per distinct set of input shapes.
#pragma once

#include <memory>

#include "graph/graph.h"

namespace sparsecol::runtime {

class Executor {
 public:
  virtual ~Executor() = default;
  // Inputs are already checked against the graph's input shapes and dtypes.
  virtual NamedTensors run(const NamedTensors& inputs) = 0;
};

std::unique_ptr<Executor> make_reference_executor(graph::Graph graph);
// The fast kernels op by op, `threads` OpenMP threads (src/runtime/layerwise/).
std::unique_ptr<Executor> make_layerwise_executor(graph::Graph graph, int threads);
// oneDNN primitives op by op (src/backends/onednn/).
std::unique_ptr<Executor> make_onednn_executor(graph::Graph graph, int threads);

}  // namespace sparsecol::runtime
