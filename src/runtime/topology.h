// What the machine is: cores, NUMA nodes and caches, read with hwloc (never hard-coded), and
// pinning of worker threads to cores.
#pragma once

#include <cstdint>
#include <optional>
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

// How long one cache line takes to go from core `a` to core `b` and back (ns; the median of a
// few batches of hand-offs between two threads pinned there). It says how far apart the cores
// are: tens of ns within a shared L3, hundreds across dies or sockets, and on a virtual machine
// also when the host has moved its virtual CPUs apart or onto busy cores, which is when
// multi-thread figures fall. nullopt when a or b is not a core of this machine, a == b, or a
// thread cannot be pinned.
std::optional<double> core_round_trip_ns(int a, int b);

}  // namespace sparsecol::runtime
