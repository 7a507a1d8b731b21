// What the machine is: cores, NUMA nodes and caches, read with hwloc (never hard-coded), and
// pinning of worker threads to cores.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sparsecol::runtime {

struct Topology {
  int physical_cores = 1;
  int numa_nodes = 1;
  int64_t l2_bytes_per_core = 0;  // 0 when hwloc reports none
  int64_t l3_bytes = 0;
  // The NUMA node (0 ... numa_nodes-1, hwloc's logical order) of each core, in hwloc's logical
  // core order; all 0 on a machine with one node.
  std::vector<int> core_node;
};

// The machine this process runs on, read once.
const Topology& machine_topology();

// A machine described in hwloc's synthetic syntax, e.g. "package:2 numa:2 core:8 pu:1"
// (2 packages x 2 NUMA nodes x 8 cores): lets tests plan for machines they do not run on.
// Throws Error(kInvalidArgument) when hwloc refuses the description.
Topology synthetic_topology(const std::string& description);

// The NUMA node of each of `threads` workers when worker i runs on core i (mod the cores).
std::vector<int> thread_nodes(const Topology& topology, int threads);

// Binds the calling thread to core `core` (hwloc's logical order) of this machine. Returns
// false when hwloc cannot (no such core, or the OS refuses); the thread then stays unbound.
bool pin_current_thread(int core);

}  // namespace sparsecol::runtime
