#include "runtime/topology.h"

#include <hwloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "sparsecol/sparsecol.h"

namespace sparsecol::runtime {

namespace {

int64_t cache_size(hwloc_topology_t topology, hwloc_obj_type_t type) {
  hwloc_obj_t cache = hwloc_get_obj_by_type(topology, type, 0);
  return cache != nullptr && cache->attr != nullptr ? static_cast<int64_t>(cache->attr->cache.size)
                                                    : 0;
}

// The NUMA node whose memory is local to `core`: the first node in its nodeset.
int node_of(hwloc_topology_t topology, hwloc_obj_t core) {
  if (core == nullptr || core->nodeset == nullptr) return 0;
  const int os_index = hwloc_bitmap_first(core->nodeset);
  if (os_index < 0) return 0;
  hwloc_obj_t node = hwloc_get_numanode_obj_by_os_index(topology, static_cast<unsigned>(os_index));
  return node != nullptr ? static_cast<int>(node->logical_index) : 0;
}

Topology read_loaded(hwloc_topology_t topology) {
  Topology t;
  t.physical_cores = std::max(1, hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_CORE));
  t.numa_nodes = std::max(1, hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_NUMANODE));
  t.l2_bytes_per_core = cache_size(topology, HWLOC_OBJ_L2CACHE);
  t.l3_bytes = cache_size(topology, HWLOC_OBJ_L3CACHE);
  t.core_node.assign(static_cast<std::size_t>(t.physical_cores), 0);
  for (int c = 0; c < hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_CORE); ++c) {
    t.core_node[static_cast<std::size_t>(c)] = std::min(
        t.numa_nodes - 1, node_of(topology, hwloc_get_obj_by_type(topology, HWLOC_OBJ_CORE,
                                                                  static_cast<unsigned>(c))));
  }
  return t;
}

// The process's hwloc topology, loaded once and kept for pinning.
struct MachineTopology {
  hwloc_topology_t handle = nullptr;
  Topology topology;
  MachineTopology() {
    topology.core_node = {0};
    if (hwloc_topology_init(&handle) != 0) {
      handle = nullptr;
      return;
    }
    if (hwloc_topology_load(handle) != 0) {
      hwloc_topology_destroy(handle);
      handle = nullptr;
      return;
    }
    topology = read_loaded(handle);
  }
  ~MachineTopology() {
    if (handle != nullptr) hwloc_topology_destroy(handle);
  }
};

MachineTopology& machine() {
  static MachineTopology m;
  return m;
}

}  // namespace

const Topology& machine_topology() { return machine().topology; }

Topology synthetic_topology(const std::string& description) {
  hwloc_topology_t topology;
  if (hwloc_topology_init(&topology) != 0) {
    throw Error(ErrorCode::kInternal, "hwloc: cannot initialize a topology");
  }
  if (hwloc_topology_set_synthetic(topology, description.c_str()) != 0 ||
      hwloc_topology_load(topology) != 0) {
    hwloc_topology_destroy(topology);
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("hwloc refuses the synthetic topology '{}'", description));
  }
  Topology t = read_loaded(topology);
  hwloc_topology_destroy(topology);
  return t;
}

std::vector<int> thread_nodes(const Topology& topology, int threads) {
  std::vector<int> nodes(static_cast<std::size_t>(std::max(0, threads)), 0);
  if (topology.core_node.empty()) return nodes;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    nodes[i] = topology.core_node[i % topology.core_node.size()];
  }
  return nodes;
}

bool pin_current_thread(int core) {
  MachineTopology& m = machine();
  if (m.handle == nullptr) return false;
  hwloc_obj_t obj =
      hwloc_get_obj_by_type(m.handle, HWLOC_OBJ_CORE, static_cast<unsigned>(std::max(0, core)));
  if (obj == nullptr || obj->cpuset == nullptr) return false;
  return hwloc_set_cpubind(m.handle, obj->cpuset, HWLOC_CPUBIND_THREAD) == 0;
}

std::optional<double> core_round_trip_ns(int a, int b) {
  const int cores = machine_topology().physical_cores;
  if (a == b || std::min(a, b) < 0 || std::max(a, b) >= cores) return std::nullopt;
  constexpr int64_t kBatches = 5, kTripsPerBatch = 2000, kTripsPerClockRead = 64;
  constexpr int64_t kSpinsPerClockRead = 1 << 16;
  // A time limit, so that cores which only take turns (a CPU quota below the cores shown: every
  // hand-off waits for a time slice) cost a bench run 50 ms, not minutes.
  constexpr std::chrono::milliseconds kBudget(50);
  // One line, written in turn: odd values by the caller's side, even ones by the partner; -1
  // tells the partner to stop.
  struct alignas(64) Line {
    std::atomic<int64_t> value{0};
  } line;
  // Both sides pin first and agree to go on (0: waiting, 1: pinned, -1: could not pin), so
  // that two unpinned threads never spin against each other on one CPU.
  std::atomic<int> partner_state{0}, caller_state{0};
  std::thread partner([&] {
    partner_state.store(pin_current_thread(b) ? 1 : -1);
    int go = 0;
    while ((go = caller_state.load()) == 0) std::this_thread::yield();
    if (go < 0 || partner_state.load() < 0) return;
    for (int64_t i = 0;; ++i) {
      int64_t seen = 0;
      while ((seen = line.value.load(std::memory_order_acquire)) != 2 * i + 1) {
        if (seen < 0) return;
      }
      // Only if the caller has not given up meanwhile (it writes -1 and leaves).
      int64_t expected = 2 * i + 1;
      if (!line.value.compare_exchange_strong(expected, 2 * i + 2, std::memory_order_acq_rel)) {
        return;
      }
    }
  });
  std::vector<double> batches;  // ns per trip
  // The caller's own thread keeps its binding: the probe runs on a thread of its own.
  std::thread caller([&] {
    const bool pinned = pin_current_thread(a);
    while (partner_state.load() == 0) std::this_thread::yield();
    const bool go = pinned && partner_state.load() > 0;
    caller_state.store(go ? 1 : -1);
    if (!go) return;
    const auto deadline = std::chrono::steady_clock::now() + kBudget;
    bool late = false;
    for (int64_t batch = 0, i = 0; batch < kBatches && !late; ++batch) {
      const auto start = std::chrono::steady_clock::now();
      auto timed = start;       // the clock at the last reading...
      int64_t timed_trips = 0;  // ...and the trips done by then
      for (int64_t trips = 1; trips <= kTripsPerBatch && !late; ++trips, ++i) {
        line.value.store(2 * i + 1, std::memory_order_release);
        // A reply that keeps the caller spinning this long is a time slice away: look at the
        // clock while waiting too.
        for (int64_t spins = 1; line.value.load(std::memory_order_acquire) != 2 * i + 2; ++spins) {
          if (spins % kSpinsPerClockRead == 0 && std::chrono::steady_clock::now() > deadline) {
            late = true;
            break;
          }
        }
        if (!late && (trips % kTripsPerClockRead == 0 || trips == kTripsPerBatch)) {
          timed = std::chrono::steady_clock::now();
          timed_trips = trips;
          late = timed > deadline;
        }
      }
      if (timed_trips > 0) {
        batches.push_back(std::chrono::duration<double, std::nano>(timed - start).count() /
                          static_cast<double>(timed_trips));
      }
    }
    line.value.store(-1, std::memory_order_release);
  });
  caller.join();
  partner.join();
  if (batches.empty()) return std::nullopt;
  const auto middle = batches.begin() + static_cast<std::ptrdiff_t>(batches.size() / 2);
  std::nth_element(batches.begin(), middle, batches.end());
  return *middle;
}

}  // namespace sparsecol::runtime
