// Per-NUMA-node copies of a column's packed weights (Options::replicate_weights): on a machine
// with several nodes every tile reads all of its column's weights, and a worker on a node that
// does not hold them reads them across the interconnect on every tile; a copy per node, built
// (hence first touched, hence placed: Linux allocates a page on the node of the thread that
// first writes it) by a thread bound to that node, keeps those reads local. One node: one copy.
#pragma once

#include <algorithm>
#include <vector>

namespace sparsecol::runtime::depthwise {

struct ReplicaPlan {
  std::vector<int> replica_of_thread;  // per worker: the copy it reads
  // Per copy: the worker (= core, workers run on cores 0, 1, ...) that builds it, or -1 for the
  // caller's thread (one copy: built where the executor is made, as without replication).
  std::vector<int> builder;
  int replicas() const { return static_cast<int>(builder.size()); }
};

// thread_nodes[i]: the NUMA node of worker i (runtime::thread_nodes). Copy k serves the k-th
// node that has workers, in node order, so that on a machine whose nodes all have workers the
// workers of node k read copy k.
inline ReplicaPlan plan_replicas(const std::vector<int>& thread_nodes, bool replicate) {
  ReplicaPlan plan;
  plan.replica_of_thread.assign(thread_nodes.size(), 0);
  plan.builder = {-1};
  std::vector<int> nodes = thread_nodes;  // the nodes that have workers, in order
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  if (!replicate || nodes.size() <= 1) return plan;
  plan.builder.assign(nodes.size(), -1);
  for (std::size_t i = 0; i < thread_nodes.size(); ++i) {
    const auto r = static_cast<std::size_t>(
        std::lower_bound(nodes.begin(), nodes.end(), thread_nodes[i]) - nodes.begin());
    plan.replica_of_thread[i] = static_cast<int>(r);
    if (plan.builder[r] < 0) plan.builder[r] = static_cast<int>(i);
  }
  return plan;
}

}  // namespace sparsecol::runtime::depthwise
