// Hands out the tiles of one column (image x row block) to a thread team spread over NUMA
// nodes. The images of a batch are split into contiguous blocks, one per node, in proportion to
// the node's threads; a thread takes the tiles of its own node's images first (their column
// inputs and outputs were first touched, hence placed, by that node's threads), then helps the
// other nodes, so that no thread idles while tiles remain. Which thread runs a tile never
// changes its result: every tile is computed the same way wherever it runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace sparsecol::runtime::depthwise {

class TileQueue {
 public:
  // thread_node[i]: the NUMA node (0 ... nodes-1) of worker i.
  TileQueue(std::vector<int> thread_node, int64_t images, int64_t tiles_per_image);

  // Makes every tile available again (between runs of the column). Not thread-safe.
  void reset();
  // The next tile for worker `thread` (tile = image * tiles_per_image + row block), or -1
  // when none is left. Thread-safe.
  int64_t next(int thread);

  // The node whose threads own image `image`'s tiles.
  int node_of_image(int64_t image) const;
  int64_t tiles() const { return images_ * tiles_per_image_; }

 private:
  struct alignas(64) Cursor {  // one cache line each: nodes do not contend on one line
    std::atomic<int64_t> next{0};
  };
  std::vector<int> thread_node_;
  int64_t images_, tiles_per_image_;
  std::vector<int64_t> first_image_;   // per node, plus one past the end
  std::unique_ptr<Cursor[]> cursors_;  // per node: next tile of its range
};

}  // namespace sparsecol::runtime::depthwise
