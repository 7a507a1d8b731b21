// Scratch memory the kernels carve out of a caller's std::vector<float>, one per thread.
//
// Why aligned: operator new (glibc malloc) aligns to 16 bytes only, and a 64-byte vector load
// from such an address straddles two cache lines, which costs two loads' worth of L1 bandwidth.
// The sparse kernels are bound by exactly that bandwidth (one B load per FMA, see spmm.h), so
// every B buffer they read starts on a cache line and its planes are whole lines apart.
#pragma once

#include <cstdint>
#include <vector>

namespace sparsecol::kernels {

// Floats per 64-byte cache line: the alignment of scratch buffers and of the planes in them.
inline constexpr int64_t kLineFloats = 16;

inline int64_t round_up_to_line(int64_t floats) {
  return (floats + kLineFloats - 1) / kLineFloats * kLineFloats;
}

inline bool line_aligned(const float* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

// The first line-aligned float of `scratch` after growing it (never shrinking) so that `floats`
// floats fit from there.
inline float* aligned_scratch(std::vector<float>& scratch, int64_t floats) {
  const std::size_t need = static_cast<std::size_t>(floats + kLineFloats - 1);
  if (scratch.size() < need) scratch.resize(need);
  float* p = scratch.data();
  while (!line_aligned(p)) ++p;
  return p;
}

}  // namespace sparsecol::kernels
