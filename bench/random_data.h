// Benchmark inputs: the values do not change the speed of the dense or sparse kernels (no
// denormals, no data-dependent branches), only their count does; seeded so runs are comparable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <random>
#include <vector>

namespace sparsecol::bench {

// Allocates on 64-byte cache lines, as the engine's tensors and arenas are (api/tensor.cc,
// plan/memory_plan.h): the kernels run faster on aligned planes and copy misaligned ones
// (kernels/scratch.h), so a benchmark on malloc's 16-byte alignment would time a case the
// engine never sees, and change with the heap's state.
template <class T>
struct LineAllocator {
  using value_type = T;
  LineAllocator() = default;
  template <class U>
  LineAllocator(const LineAllocator<U>&) {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{64}));
  }
  void deallocate(T* p, std::size_t) { ::operator delete (p, std::align_val_t{64}); }
  template <class U>
  bool operator==(const LineAllocator<U>&) const {
    return true;
  }
};

using Floats = std::vector<float, LineAllocator<float>>;

// `count` floats uniform in [-1, 1) from `rng`.
inline Floats random_floats(int64_t count, std::mt19937& rng) {
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  Floats v(static_cast<std::size_t>(count));
  for (float& x : v) x = value(rng);
  return v;
}

}  // namespace sparsecol::bench
