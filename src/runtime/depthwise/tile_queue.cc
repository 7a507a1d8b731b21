#include "runtime/depthwise/tile_queue.h"

#include <algorithm>

namespace sparsecol::runtime::depthwise {

TileQueue::TileQueue(std::vector<int> thread_node, int64_t images, int64_t tiles_per_image)
    : thread_node_(std::move(thread_node)), images_(images), tiles_per_image_(tiles_per_image) {
  int nodes = 1;
  for (int n : thread_node_) nodes = std::max(nodes, n + 1);
  std::vector<int64_t> threads_of(static_cast<std::size_t>(nodes), 0);
  for (int n : thread_node_) ++threads_of[static_cast<std::size_t>(std::max(0, n))];
  if (thread_node_.empty()) threads_of[0] = 1;
  const auto team = static_cast<int64_t>(std::max<std::size_t>(1, thread_node_.size()));
  // Node k's images: [first_image_[k], first_image_[k+1]), proportional to its threads.
  first_image_.assign(static_cast<std::size_t>(nodes) + 1, 0);
  int64_t threads_before = 0;
  for (int k = 0; k < nodes; ++k) {
    threads_before += threads_of[static_cast<std::size_t>(k)];
    first_image_[static_cast<std::size_t>(k) + 1] = images_ * threads_before / team;
  }
  cursors_ = std::make_unique<Cursor[]>(static_cast<std::size_t>(nodes));
  reset();
}

void TileQueue::reset() {
  for (std::size_t k = 0; k + 1 < first_image_.size(); ++k) {
    cursors_[k].next.store(first_image_[k] * tiles_per_image_, std::memory_order_relaxed);
  }
}

int64_t TileQueue::next(int thread) {
  const auto nodes = static_cast<int>(first_image_.size()) - 1;
  const int home = thread >= 0 && static_cast<std::size_t>(thread) < thread_node_.size()
                       ? thread_node_[static_cast<std::size_t>(thread)]
                       : 0;
  for (int i = 0; i < nodes; ++i) {
    const auto k = static_cast<std::size_t>((home + i) % nodes);
    const int64_t end = first_image_[k + 1] * tiles_per_image_;
    // A relaxed check first keeps exhausted nodes from growing their cursor without bound.
    if (cursors_[k].next.load(std::memory_order_relaxed) >= end) continue;
    const int64_t tile = cursors_[k].next.fetch_add(1, std::memory_order_relaxed);
    if (tile < end) return tile;
  }
  return -1;
}

int TileQueue::node_of_image(int64_t image) const {
  const auto it = std::upper_bound(first_image_.begin(), first_image_.end(), image);
  return std::clamp(static_cast<int>(it - first_image_.begin()) - 1, 0,
                    static_cast<int>(first_image_.size()) - 2);
}

}  // namespace sparsecol::runtime::depthwise
