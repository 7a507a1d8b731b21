// The thread team's view of the machine (runtime/topology.h) and the NUMA-aware tile queue
// (runtime/tile_queue.h), checked on hwloc synthetic topologies: machines with several
// packages and NUMA nodes that this one is not.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "runtime/depthwise/replicas.h"
#include "runtime/tile_queue.h"
#include "runtime/topology.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol::runtime {
namespace {

constexpr const char* kTwoByTwo = "package:2 numa:2 core:8 pu:1";  // 2 x 2 nodes x 8 cores

TEST(Topology, SyntheticMachineHasItsNodesAndCores) {
  const Topology t = synthetic_topology(kTwoByTwo);
  EXPECT_EQ(t.physical_cores, 32);
  EXPECT_EQ(t.numa_nodes, 4);
  ASSERT_EQ(t.core_node.size(), 32u);
  for (int c = 0; c < 32; ++c) EXPECT_EQ(t.core_node[static_cast<std::size_t>(c)], c / 8) << c;
}

TEST(Topology, RefusesAMalformedDescription) {
  EXPECT_THROW(synthetic_topology("package:two"), Error);
}

TEST(Topology, ThisMachineHasAtLeastOneCoreOnANode) {
  const Topology& t = machine_topology();
  EXPECT_GE(t.physical_cores, 1);
  EXPECT_EQ(t.core_node.size(), static_cast<std::size_t>(t.physical_cores));
  for (int n : t.core_node) EXPECT_LT(n, t.numa_nodes);
}

TEST(Topology, WorkersWrapAroundTheCores) {
  const Topology t = synthetic_topology("numa:2 core:2 pu:2");
  EXPECT_EQ(thread_nodes(t, 6), (std::vector<int>{0, 0, 1, 1, 0, 0}));
}

// Images go to nodes in proportion to their threads; each thread first takes its own node's.
TEST(TileQueue, ThreadsTakeTheirNodesImagesFirst) {
  const Topology t = synthetic_topology(kTwoByTwo);
  const std::vector<int> nodes = thread_nodes(t, 32);
  TileQueue queue(nodes, 16, 5);
  for (int64_t image = 0; image < 16; ++image) EXPECT_EQ(queue.node_of_image(image), image / 4);
  for (int thread = 0; thread < 32; ++thread) {
    const int64_t tile = queue.next(thread);
    ASSERT_GE(tile, 0);
    EXPECT_EQ(queue.node_of_image(tile / 5), nodes[static_cast<std::size_t>(thread)])
        << "thread " << thread;
  }
}

// Every tile is handed out exactly once, with threads of one node only (the others idle): the
// busy node's threads steal the other nodes' tiles.
TEST(TileQueue, EveryTileOnceEvenWhenOneNodeWorks) {
  const std::vector<int> nodes = thread_nodes(synthetic_topology(kTwoByTwo), 32);
  TileQueue queue(nodes, 7, 3);
  std::vector<int> seen(static_cast<std::size_t>(queue.tiles()), 0);
  for (int64_t tile; (tile = queue.next(9)) >= 0;) ++seen[static_cast<std::size_t>(tile)];
  for (int count : seen) EXPECT_EQ(count, 1);
  queue.reset();
  EXPECT_GE(queue.next(0), 0) << "reset makes the tiles available again";
}

TEST(TileQueue, EveryTileOnceUnderConcurrentThreads) {
  const std::vector<int> nodes = thread_nodes(synthetic_topology("numa:2 core:4 pu:1"), 8);
  TileQueue queue(nodes, 13, 17);
  std::vector<std::atomic<int>> seen(static_cast<std::size_t>(queue.tiles()));
  std::vector<std::thread> team;
  for (int thread = 0; thread < 8; ++thread) {
    team.emplace_back([&, thread] {
      for (int64_t tile; (tile = queue.next(thread)) >= 0;) ++seen[static_cast<std::size_t>(tile)];
    });
  }
  for (std::thread& th : team) th.join();
  for (const auto& count : seen) EXPECT_EQ(count.load(), 1);
}

// One node (this machine): every image on node 0, each thread a contiguous run of tiles (what
// the rolling line buffers need); a thread whose run is done steals the rest of another's.
TEST(TileQueue, OneNodeGivesEachThreadAContiguousRun) {
  TileQueue queue({0, 0}, 1, 4);
  EXPECT_EQ(queue.initial_range(0), (std::pair<int64_t, int64_t>{0, 2}));
  EXPECT_EQ(queue.initial_range(1), (std::pair<int64_t, int64_t>{2, 4}));
  EXPECT_EQ(queue.next(1), 2);
  EXPECT_EQ(queue.next(0), 0);
  EXPECT_EQ(queue.next(1), 3);
  EXPECT_EQ(queue.next(1), 1) << "thread 1 steals thread 0's last tile";
  EXPECT_EQ(queue.next(0), -1);
}

// Each thread's first range is contiguous and within its node's images; the ranges partition
// the tiles; a thread drained alone runs its own range in order, then steals back halves (each
// stolen half again in order), so that its tiles come in few runs.
TEST(TileQueue, RangesPartitionTheTilesAndStealingKeepsRuns) {
  const std::vector<int> nodes = thread_nodes(synthetic_topology(kTwoByTwo), 32);
  TileQueue queue(nodes, 16, 6);
  std::vector<int> owner(static_cast<std::size_t>(queue.tiles()), -1);
  for (int thread = 0; thread < 32; ++thread) {
    const auto [first, last] = queue.initial_range(thread);
    EXPECT_EQ(last - first, 3) << "16 images x 6 tiles over 32 threads";
    for (int64_t tile = first; tile < last; ++tile) {
      EXPECT_EQ(owner[static_cast<std::size_t>(tile)], -1) << tile;
      owner[static_cast<std::size_t>(tile)] = thread;
      EXPECT_EQ(queue.node_of_image(tile / 6), nodes[static_cast<std::size_t>(thread)]);
    }
  }
  for (int o : owner) EXPECT_GE(o, 0);
  std::vector<int64_t> order;
  for (int64_t tile; (tile = queue.next(5)) >= 0;) order.push_back(tile);
  ASSERT_EQ(order.size(), static_cast<std::size_t>(queue.tiles()));
  int runs = 1;
  for (std::size_t i = 1; i < order.size(); ++i) runs += order[i] != order[i - 1] + 1;
  // Its own run, then per other thread's 3 tiles a back half of 2 and the 1 left.
  EXPECT_EQ(runs, 1 + 2 * 31);
  EXPECT_EQ(queue.node_of_image(order[0] / 6), nodes[5]) << "its own node's tiles first";
  EXPECT_EQ(queue.node_of_image(order[3] / 6), nodes[5]) << "then its node's other threads'";
}

// A batch smaller than the team: some threads start with nothing and steal.
TEST(TileQueue, ThreadsWithoutTilesSteal) {
  TileQueue queue({0, 0, 0, 0}, 1, 2);
  EXPECT_EQ(queue.initial_range(0).second - queue.initial_range(0).first, 0);
  std::vector<int> seen(2, 0);
  for (int thread = 0; thread < 4; ++thread) {
    for (int64_t tile; (tile = queue.next(thread)) >= 0;) ++seen[static_cast<std::size_t>(tile)];
  }
  EXPECT_EQ(seen, (std::vector<int>{1, 1}));
}

// Options::replicate_weights: one copy of the weights per node, read by that node's workers and
// built by one of them (so that its pages are first touched there).
TEST(WeightReplicas, WorkersOfNodeKReadCopyK) {
  const std::vector<int> nodes = thread_nodes(synthetic_topology(kTwoByTwo), 32);
  const depthwise::ReplicaPlan plan = depthwise::plan_replicas(nodes, true);
  ASSERT_EQ(plan.replicas(), 4);
  for (int thread = 0; thread < 32; ++thread) {
    EXPECT_EQ(plan.replica_of_thread[static_cast<std::size_t>(thread)], thread / 8) << thread;
  }
  for (int k = 0; k < 4; ++k) {
    const int builder = plan.builder[static_cast<std::size_t>(k)];
    ASSERT_GE(builder, 0);
    EXPECT_EQ(nodes[static_cast<std::size_t>(builder)], k) << "copy " << k << " built on its node";
  }
}

// Fewer workers than cores: only the nodes that have workers get a copy.
TEST(WeightReplicas, NodesWithoutWorkersGetNoCopy) {
  const std::vector<int> nodes = thread_nodes(synthetic_topology(kTwoByTwo), 12);  // nodes 0, 1
  const depthwise::ReplicaPlan plan = depthwise::plan_replicas(nodes, true);
  ASSERT_EQ(plan.replicas(), 2);
  EXPECT_EQ(plan.replica_of_thread[7], 0);
  EXPECT_EQ(plan.replica_of_thread[8], 1);
  EXPECT_EQ(plan.replica_of_thread[11], 1);
}

// One node, or the option off: one copy, built by the caller, as without replication.
TEST(WeightReplicas, OneNodeOrOptionOffIsOneCopy) {
  const depthwise::ReplicaPlan one_node = depthwise::plan_replicas({0, 0, 0}, true);
  const depthwise::ReplicaPlan off =
      depthwise::plan_replicas(thread_nodes(synthetic_topology(kTwoByTwo), 32), false);
  for (const depthwise::ReplicaPlan& plan : {one_node, off}) {
    ASSERT_EQ(plan.replicas(), 1);
    EXPECT_EQ(plan.builder[0], -1);
    for (int r : plan.replica_of_thread) EXPECT_EQ(r, 0);
  }
}

}  // namespace
}  // namespace sparsecol::runtime
