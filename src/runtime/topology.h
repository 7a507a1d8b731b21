// What the machine is: cores and caches, read with hwloc (never hard-coded).
#pragma once

#include <cstdint>

namespace sparsecol::runtime {

struct Topology {
  int physical_cores = 1;
  int numa_nodes = 1;
  int64_t l2_bytes_per_core = 0;  // 0 when hwloc reports none
  int64_t l3_bytes = 0;
};

// The machine this process runs on, read once.
const Topology& machine_topology();

}  // namespace sparsecol::runtime
