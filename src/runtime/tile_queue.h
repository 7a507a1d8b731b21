// Hands out the tiles of one column (image x row block) to a thread team spread over NUMA
// nodes. The images of a batch are split into contiguous blocks, one per node, in proportion to
// the node's threads (their column inputs and outputs were first touched, hence placed, by that
// node's threads); a node's tiles are split again into one contiguous range per thread of the
// node. A thread takes its own range front to back, so that it runs consecutive tiles of an
// image (what the rolling line buffers need: a tile reuses the rows its predecessor computed);
// when its range is empty it steals the back half of another thread's range, its own node's
// first, so that no thread idles while tiles remain. Which thread runs a tile never changes its
// result: every output element is computed the same way wherever it runs.
//
// The layer-by-layer schedule hands out its tasks (images or row blocks, in order) through the
// same queue (layerwise/steps.cc, parallel_for): a thread then runs the same images in every
// layer and reads what it wrote itself, from its own caches.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace sparsecol::runtime {

class TileQueue {
 public:
  // thread_node[i]: the NUMA node (0 ... nodes-1) of worker i. Throws Error(kInvalidArgument)
  // when the tiles do not fit the queue's 32-bit range bounds.
  TileQueue(std::vector<int> thread_node, int64_t images, int64_t tiles_per_image);

  // Makes every tile available again (between runs of the column). Not thread-safe.
  void reset();
  // The next tile for worker `thread` (tile = image * tiles_per_image + row block), or -1
  // when none is left. Thread-safe. A worker outside the team (thread >= the team's size)
  // only steals, one tile at a time.
  int64_t next(int thread);

  // The node whose threads own image `image`'s tiles.
  int node_of_image(int64_t image) const;
  // Worker `thread`'s range [first, last) before any stealing.
  std::pair<int64_t, int64_t> initial_range(int thread) const;
  int64_t tiles() const { return images_ * tiles_per_image_; }

 private:
  // [begin, end) packed in one word (begin high, end low), so that the owner's take from the
  // front and a thief's cut of the back are one compare-and-swap each. One cache line each:
  // threads do not contend on one line.
  struct alignas(64) Range {
    std::atomic<uint64_t> span{0};
  };
  int64_t steal(int thread, int victim);

  std::vector<int> thread_node_;
  int64_t images_, tiles_per_image_;
  std::vector<int64_t> first_image_;                  // per node, plus one past the end
  std::vector<std::pair<int64_t, int64_t>> initial_;  // per thread: its range after reset()
  std::vector<std::vector<int>> node_threads_;        // per node: its threads, to steal from
  std::unique_ptr<Range[]> ranges_;                   // per thread
};

}  // namespace sparsecol::runtime
