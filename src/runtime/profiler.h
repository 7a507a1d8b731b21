// Per-run timing of steps (a node, or a node on one tile): what `bench --per-layer` sums and
// `--trace` draws. One event list per worker thread, so recording takes no lock; an executor
// calls begin_run() before its first step and reads events() after its last.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "graph/graph.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol::runtime {

class Profiler {
 public:
  // Forgets the previous run; `threads` is the number of workers that will record.
  void begin_run(int threads);
  int64_t now_ns() const;
  // Thread-safe for distinct event.thread values in [0, threads).
  void record(ProfileEvent event);
  // This run's events, every thread's, ordered by start time.
  std::vector<ProfileEvent> events() const;

  // Times its own lifetime as one event (a no-op when the profiler is null).
  class Scope {
   public:
    Scope(Profiler* profiler, int thread, const graph::Node& node, int tile = -1);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Profiler* profiler_;
    const graph::Node* node_;
    int thread_, tile_;
    int64_t start_ns_ = 0;
  };

 private:
  std::chrono::steady_clock::time_point start_{};
  std::vector<std::vector<ProfileEvent>> by_thread_;
};

// A node's description before any schedule fills in how it runs: op type with its fused
// epilogue, output shape, weight shape and sparsity (input 1 of Conv, Gemm, MatMul when it is
// a float constant).
LayerInfo describe_node(const graph::Graph& graph, const graph::Node& node);

}  // namespace sparsecol::runtime
