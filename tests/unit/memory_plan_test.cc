// The static buffer plan: buffers live at the same step never share bytes, and buffers whose
// lifetimes are disjoint do.
#include "plan/memory_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "sparsecol/sparsecol.h"

namespace sparsecol::plan {
namespace {

int64_t rounded(int64_t size) { return (size + 63) / 64 * 64; }

// Checks every invariant of a plan; returns the bytes live at the busiest step (a lower bound
// for any plan).
::testing::AssertionResult valid_plan(const std::vector<BufferRequest>& requests,
                                      const MemoryPlan& plan) {
  if (plan.offsets.size() != requests.size()) {
    return ::testing::AssertionFailure() << "one offset per request expected";
  }
  int64_t sum = 0;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    sum += rounded(requests[i].size);
    if (plan.offsets[i] % 64 != 0 || plan.offsets[i] < 0 ||
        plan.offsets[i] + requests[i].size > plan.arena_size) {
      return ::testing::AssertionFailure()
             << "buffer " << i << " at " << plan.offsets[i] << " size " << requests[i].size
             << " is misaligned or outside the arena of " << plan.arena_size;
    }
    for (std::size_t j = 0; j < i; ++j) {
      const bool bytes_overlap = plan.offsets[i] < plan.offsets[j] + requests[j].size &&
                                 plan.offsets[j] < plan.offsets[i] + requests[i].size;
      if (bytes_overlap && lifetimes_overlap(requests[i], requests[j])) {
        return ::testing::AssertionFailure()
               << "buffers " << j << " and " << i << " are live together and share bytes";
      }
    }
  }
  if (plan.arena_size > sum) {
    return ::testing::AssertionFailure()
           << "arena " << plan.arena_size << " exceeds the sum of sizes " << sum;
  }
  return ::testing::AssertionSuccess();
}

int64_t peak_live_bytes(const std::vector<BufferRequest>& requests) {
  int last = 0;
  for (const BufferRequest& r : requests) last = std::max(last, r.last_step);
  int64_t peak = 0;
  for (int step = 0; step <= last; ++step) {
    int64_t live = 0;
    for (const BufferRequest& r : requests) {
      if (r.first_step <= step && step <= r.last_step) live += r.size;
    }
    peak = std::max(peak, live);
  }
  return peak;
}

TEST(MemoryPlan, RandomLifetimesNeverShareBytesWhileBothLive) {
  for (uint32_t seed = 0; seed < 200; ++seed) {
    std::mt19937 rng(seed);
    const int count = std::uniform_int_distribution<int>(1, 40)(rng);
    std::vector<BufferRequest> requests;
    for (int i = 0; i < count; ++i) {
      const int first = std::uniform_int_distribution<int>(0, 30)(rng);
      requests.push_back({std::uniform_int_distribution<int64_t>(0, 5000)(rng), first,
                          first + std::uniform_int_distribution<int>(0, 8)(rng)});
    }
    const MemoryPlan plan = plan_memory(requests);
    ASSERT_TRUE(valid_plan(requests, plan)) << "seed " << seed;
    EXPECT_GE(plan.arena_size, peak_live_bytes(requests)) << "seed " << seed;
  }
}

TEST(MemoryPlan, ChainOfLayersReusesTwoBuffers) {
  // Layer i reads buffer i-1 and writes buffer i: two buffers are live at any step.
  std::vector<BufferRequest> chain;
  for (int i = 0; i < 10; ++i) chain.push_back({1000, i, i + 1});
  const MemoryPlan plan = plan_memory(chain);
  ASSERT_TRUE(valid_plan(chain, plan));
  EXPECT_EQ(plan.arena_size, 2 * rounded(1000));
}

TEST(MemoryPlan, SmallBufferFillsTheGapLeftByALargeOne) {
  // A and C are large and live together; B, live only before them, fits below C's offset.
  const std::vector<BufferRequest> requests = {{4096, 0, 1}, {1024, 0, 0}, {4096, 1, 2}};
  const MemoryPlan plan = plan_memory(requests);
  ASSERT_TRUE(valid_plan(requests, plan));
  EXPECT_EQ(plan.arena_size, 2 * 4096);
}

TEST(MemoryPlan, RejectsNegativeSizesEmptyLifetimesAndBadAlignment) {
  EXPECT_THROW(plan_memory({{-1, 0, 0}}), sparsecol::Error);
  EXPECT_THROW(plan_memory({{8, 3, 2}}), sparsecol::Error);
  EXPECT_THROW(plan_memory({{8, 0, 0}}, 48), sparsecol::Error);
  EXPECT_EQ(plan_memory({}).arena_size, 0);
}

}  // namespace
}  // namespace sparsecol::plan
