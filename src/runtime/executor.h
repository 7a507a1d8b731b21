// An executor runs one specialized graph (every shape concrete). Each schedule is one
// implementation; a Session keeps one executor per distinct set of input shapes.
#pragma once

#include <memory>
#include <vector>

#include "graph/graph.h"
#include "runtime/profiler.h"

namespace sparsecol {
struct Options;
}

namespace sparsecol::runtime {

class Executor {
 public:
  virtual ~Executor() = default;
  // Inputs are already checked against the graph's input shapes and dtypes.
  virtual NamedTensors run(const NamedTensors& inputs) = 0;
  // Every node as this executor runs it (describe_node() plus the implementation chosen).
  virtual std::vector<LayerInfo> layers() const = 0;
  // Events of each following run go to `profiler` (nullptr: none). Executors that time their
  // steps read profiler_; the others leave it unused.
  void set_profiler(Profiler* profiler) { profiler_ = profiler; }

 protected:
  Profiler* profiler_ = nullptr;
};

std::unique_ptr<Executor> make_reference_executor(graph::Graph graph);
// The fast kernels op by op, `options.threads` resolved to `threads` OpenMP threads
// (src/runtime/layerwise/).
std::unique_ptr<Executor> make_layerwise_executor(graph::Graph graph, int threads,
                                                  const Options& options);
// oneDNN primitives op by op (src/backends/onednn/).
std::unique_ptr<Executor> make_onednn_executor(graph::Graph graph, int threads);
// Columns of layers tile by tile on a pinned thread team (src/runtime/depthwise/).
std::unique_ptr<Executor> make_depthwise_executor(graph::Graph graph, int threads,
                                                  const Options& options);
// The depth-wise plan of a specialized graph as text (Engine::plan_report).
std::string describe_depthwise_plan(graph::Graph graph, int threads, const Options& options);
// cuDNN/cuBLAS (sparse: + cuSPARSE) on the first CUDA device (src/backends/cuda/). Throws
// Error(kUnsupported) saying why when the build has no CUDA or the machine no device.
std::unique_ptr<Executor> make_cuda_executor(graph::Graph graph, const Options& options);

}  // namespace sparsecol::runtime
