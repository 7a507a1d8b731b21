#include "runtime/tile_queue.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "sparsecol/sparsecol.h"

namespace sparsecol::runtime {

namespace {

uint64_t pack(int64_t begin, int64_t end) {
  return (static_cast<uint64_t>(begin) << 32) | static_cast<uint64_t>(end);
}
int64_t begin_of(uint64_t span) { return static_cast<int64_t>(span >> 32); }
int64_t end_of(uint64_t span) { return static_cast<int64_t>(span & 0xffffffffu); }

}  // namespace

TileQueue::TileQueue(std::vector<int> thread_node, int64_t images, int64_t tiles_per_image)
    : thread_node_(std::move(thread_node)), images_(images), tiles_per_image_(tiles_per_image) {
  if (images_ < 0 || tiles_per_image_ < 0 ||
      (tiles_per_image_ > 0 && images_ > std::numeric_limits<int32_t>::max() / tiles_per_image_)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("tile queue: {} images of {} tiles exceed its 2^31 tiles", images_,
                            tiles_per_image_));
  }
  int nodes = 1;
  for (int n : thread_node_) nodes = std::max(nodes, n + 1);
  node_threads_.resize(static_cast<std::size_t>(nodes));
  for (std::size_t i = 0; i < thread_node_.size(); ++i) {
    node_threads_[static_cast<std::size_t>(std::max(0, thread_node_[i]))].push_back(
        static_cast<int>(i));
  }
  const auto team = static_cast<int64_t>(std::max<std::size_t>(1, thread_node_.size()));
  // Node k's images: [first_image_[k], first_image_[k+1]), proportional to its threads; its
  // tiles split evenly between its threads, in thread order.
  first_image_.assign(static_cast<std::size_t>(nodes) + 1, 0);
  initial_.assign(thread_node_.size(), {0, 0});
  int64_t threads_before = thread_node_.empty() ? 1 : 0;
  for (std::size_t k = 0; k < node_threads_.size(); ++k) {
    const std::vector<int>& threads = node_threads_[k];
    threads_before += static_cast<int64_t>(threads.size());
    first_image_[k + 1] = images_ * threads_before / team;
    const int64_t first = first_image_[k] * tiles_per_image_;
    const int64_t count = first_image_[k + 1] * tiles_per_image_ - first;
    const auto p = static_cast<int64_t>(threads.size());
    for (int64_t j = 0; j < p; ++j) {
      initial_[static_cast<std::size_t>(threads[static_cast<std::size_t>(j)])] = {
          first + count * j / p, first + count * (j + 1) / p};
    }
  }
  ranges_ = std::make_unique<Range[]>(std::max<std::size_t>(1, thread_node_.size()));
  reset();
}

void TileQueue::reset() {
  // No threads: one range for the strays to steal from.
  if (thread_node_.empty()) ranges_[0].span.store(pack(0, tiles()), std::memory_order_relaxed);
  for (std::size_t i = 0; i < initial_.size(); ++i) {
    ranges_[i].span.store(pack(initial_[i].first, initial_[i].second), std::memory_order_relaxed);
  }
}

int64_t TileQueue::next(int thread) {
  const bool member = thread >= 0 && static_cast<std::size_t>(thread) < thread_node_.size();
  if (member) {
    std::atomic<uint64_t>& own = ranges_[static_cast<std::size_t>(thread)].span;
    for (uint64_t span = own.load(std::memory_order_relaxed); begin_of(span) < end_of(span);) {
      if (own.compare_exchange_weak(span, pack(begin_of(span) + 1, end_of(span)),
                                    std::memory_order_relaxed)) {
        return begin_of(span);
      }
    }
  }
  const auto nodes = static_cast<int>(node_threads_.size());
  const int home = member ? std::max(0, thread_node_[static_cast<std::size_t>(thread)]) : 0;
  for (int i = 0; i < nodes; ++i) {
    for (int victim : node_threads_[static_cast<std::size_t>((home + i) % nodes)]) {
      if (victim == thread) continue;
      const int64_t tile = steal(member ? thread : -1, victim);
      if (tile >= 0) return tile;
    }
  }
  return thread_node_.empty() ? steal(-1, 0) : -1;
}

// Cuts the back half of `victim`'s range (the single tile left, if one): the thief runs its
// first tile now and keeps the rest as its own range (a thief outside the team cuts one tile).
// The half keeps the thief's next tiles consecutive, and halving bounds the steals per thread
// by the log of the range.
int64_t TileQueue::steal(int thief, int victim) {
  std::atomic<uint64_t>& from = ranges_[static_cast<std::size_t>(victim)].span;
  for (uint64_t span = from.load(std::memory_order_relaxed); begin_of(span) < end_of(span);) {
    const int64_t b = begin_of(span), e = end_of(span);
    const int64_t cut = thief >= 0 ? e - (e - b + 1) / 2 : e - 1;
    if (from.compare_exchange_weak(span, pack(b, cut), std::memory_order_relaxed)) {
      // The thief's own range is empty, and nobody changes an empty range: a plain store.
      if (thief >= 0) {
        ranges_[static_cast<std::size_t>(thief)].span.store(pack(cut + 1, e),
                                                            std::memory_order_relaxed);
      }
      return cut;
    }
  }
  return -1;
}

int TileQueue::node_of_image(int64_t image) const {
  const auto it = std::upper_bound(first_image_.begin(), first_image_.end(), image);
  return std::clamp(static_cast<int>(it - first_image_.begin()) - 1, 0,
                    static_cast<int>(first_image_.size()) - 2);
}

std::pair<int64_t, int64_t> TileQueue::initial_range(int thread) const {
  return initial_.at(static_cast<std::size_t>(thread));
}

}  // namespace sparsecol::runtime
