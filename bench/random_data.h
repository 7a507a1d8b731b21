// Benchmark inputs: the values do not change the speed of the dense or sparse kernels (no
// denormals, no data-dependent branches), only their count does; seeded so runs are comparable.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace sparsecol::bench {

// `count` floats uniform in [-1, 1) from `rng`.
inline std::vector<float> random_floats(int64_t count, std::mt19937& rng) {
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(count));
  for (float& x : v) x = value(rng);
  return v;
}

}  // namespace sparsecol::bench
