#include "runtime/topology.h"

#include <hwloc.h>

#include <algorithm>

namespace sparsecol::runtime {

namespace {

int64_t cache_size(hwloc_topology_t topology, hwloc_obj_type_t type) {
  hwloc_obj_t cache = hwloc_get_obj_by_type(topology, type, 0);
  return cache != nullptr && cache->attr != nullptr ? static_cast<int64_t>(cache->attr->cache.size)
                                                    : 0;
}

Topology read_topology() {
  Topology t;
  hwloc_topology_t topology;
  if (hwloc_topology_init(&topology) != 0) return t;
  if (hwloc_topology_load(topology) == 0) {
    t.physical_cores = std::max(1, hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_CORE));
    t.numa_nodes = std::max(1, hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_NUMANODE));
    t.l2_bytes_per_core = cache_size(topology, HWLOC_OBJ_L2CACHE);
    t.l3_bytes = cache_size(topology, HWLOC_OBJ_L3CACHE);
  }
  hwloc_topology_destroy(topology);
  return t;
}

}  // namespace

const Topology& machine_topology() {
  static const Topology topology = read_topology();
  return topology;
}

}  // namespace sparsecol::runtime
