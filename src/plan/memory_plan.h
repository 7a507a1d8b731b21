// Static buffer planning: every intermediate tensor of a schedule gets an offset in one arena,
// and a buffer's bytes are reused once its last reader has run.
//
// The problem is offline dynamic storage allocation (NP-hard in general); we use the "greedy by
// size" heuristic of TensorFlow Lite's arena planner (Pisarchyk & Lee, "Efficient Memory
// Management for Deep Neural Net Inference", 2020): place buffers largest first, each at the
// lowest offset (best-fitting gap) that no lifetime-overlapping, already placed buffer uses. On
// CNN and transformer chains it lands within a few percent of the lower bound (the largest sum
// of sizes live at one step).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace sparsecol::plan {

// One buffer: its size in bytes and the steps [first_step, last_step] (inclusive) during which
// it must hold its contents. A node's outputs are live from its step; its inputs until their
// last reader's step, so an input and an output of the same node never share bytes.
struct BufferRequest {
  int64_t size = 0;
  int first_step = 0;
  int last_step = 0;
};

struct MemoryPlan {
  std::vector<int64_t> offsets;  // one per request, each a multiple of the alignment
  int64_t arena_size = 0;        // bytes the arena needs
};

// Places every request; sizes are rounded up to `alignment` (a power of two, 64 by default:
// one cache line, and the alignment AVX-512 loads prefer). Throws Error(kInvalidArgument) on a
// negative size, an empty lifetime or a bad alignment.
MemoryPlan plan_memory(const std::vector<BufferRequest>& requests, int64_t alignment = 64);

// True when two requests are live at a common step.
inline bool lifetimes_overlap(const BufferRequest& a, const BufferRequest& b) {
  return a.first_step <= b.last_step && b.first_step <= a.last_step;
}

// The block a plan's offsets point into: 64-byte aligned (a cache line, and a zmm register's
// width, so that every buffer planned at an aligned offset starts on a line). Null for 0 bytes.
struct ArenaDelete {
  void operator()(std::byte* p) const;
};
using Arena = std::unique_ptr<std::byte, ArenaDelete>;
Arena allocate_arena(int64_t bytes);

}  // namespace sparsecol::plan
