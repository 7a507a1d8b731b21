// The thread team's view of the machine (runtime/topology.h) and the NUMA-aware tile queue
// (runtime/depthwise/tile_queue.h), checked on hwloc synthetic topologies: machines with several
// packages and NUMA nodes that this one is not.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "runtime/depthwise/tile_queue.h"
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
  depthwise::TileQueue queue(nodes, 16, 5);
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
  depthwise::TileQueue queue(nodes, 7, 3);
  std::vector<int> seen(static_cast<std::size_t>(queue.tiles()), 0);
  for (int64_t tile; (tile = queue.next(9)) >= 0;) ++seen[static_cast<std::size_t>(tile)];
  for (int count : seen) EXPECT_EQ(count, 1);
  queue.reset();
  EXPECT_GE(queue.next(0), 0) << "reset makes the tiles available again";
}

TEST(TileQueue, EveryTileOnceUnderConcurrentThreads) {
  const std::vector<int> nodes = thread_nodes(synthetic_topology("numa:2 core:4 pu:1"), 8);
  depthwise::TileQueue queue(nodes, 13, 17);
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

// One node (this machine): the same queue, every image on node 0.
TEST(TileQueue, OneNodeBehavesLikeASharedCounter) {
  depthwise::TileQueue queue({0, 0}, 1, 4);
  EXPECT_EQ(queue.next(1), 0);
  EXPECT_EQ(queue.next(0), 1);
  EXPECT_EQ(queue.next(1), 2);
  EXPECT_EQ(queue.next(1), 3);
  EXPECT_EQ(queue.next(0), -1);
}

}  // namespace
}  // namespace sparsecol::runtime
