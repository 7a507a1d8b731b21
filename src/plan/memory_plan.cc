#include "plan/memory_plan.h"

#include <algorithm>
#include <limits>
#include <new>
#include <numeric>

#include <fmt/format.h>

#include "sparsecol/sparsecol.h"

namespace sparsecol::plan {

namespace {

int64_t round_up(int64_t size, int64_t alignment) {
  return (size + alignment - 1) / alignment * alignment;
}

}  // namespace

MemoryPlan plan_memory(const std::vector<BufferRequest>& requests, int64_t alignment) {
  if (alignment <= 0 || (alignment & (alignment - 1)) != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("memory plan: alignment must be a power of two, got {}", alignment));
  }
  std::vector<int64_t> sizes(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const BufferRequest& r = requests[i];
    if (r.size < 0 || r.size > std::numeric_limits<int64_t>::max() / 2 ||
        r.first_step > r.last_step) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("memory plan: buffer {} has size {} and steps [{}, {}]", i, r.size,
                              r.first_step, r.last_step));
    }
    sizes[i] = round_up(r.size, alignment);
  }

  // Largest first (ties: earliest first, so that the order, hence the plan, is deterministic).
  std::vector<std::size_t> order(requests.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (sizes[a] != sizes[b]) return sizes[a] > sizes[b];
    return requests[a].first_step < requests[b].first_step;
  });

  MemoryPlan plan;
  plan.offsets.assign(requests.size(), 0);
  std::vector<std::size_t> placed;
  std::vector<std::pair<int64_t, int64_t>> busy;  // [begin, end) of overlapping placed buffers
  for (std::size_t i : order) {
    busy.clear();
    for (std::size_t j : placed) {
      if (lifetimes_overlap(requests[i], requests[j]) && sizes[j] > 0) {
        busy.emplace_back(plan.offsets[j], plan.offsets[j] + sizes[j]);
      }
    }
    std::sort(busy.begin(), busy.end());
    // Best fit: the smallest gap between busy ranges that holds the buffer; else after them.
    int64_t best = -1, best_gap = std::numeric_limits<int64_t>::max();
    int64_t cursor = 0;
    for (const auto& [begin, end] : busy) {
      const int64_t gap = begin - cursor;
      if (gap >= sizes[i] && gap < best_gap) {
        best = cursor;
        best_gap = gap;
      }
      cursor = std::max(cursor, end);
    }
    plan.offsets[i] = best >= 0 ? best : cursor;
    plan.arena_size = std::max(plan.arena_size, plan.offsets[i] + sizes[i]);
    placed.push_back(i);
  }
  return plan;
}

namespace {
constexpr std::align_val_t kArenaAlignment{64};
}  // namespace

void ArenaDelete::operator()(std::byte* p) const { ::operator delete(p, kArenaAlignment); }

Arena allocate_arena(int64_t bytes) {
  if (bytes <= 0) return Arena();
  return Arena(
      static_cast<std::byte*>(::operator new(static_cast<std::size_t>(bytes), kArenaAlignment)));
}

}  // namespace sparsecol::plan
