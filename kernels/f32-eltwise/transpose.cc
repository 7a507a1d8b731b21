// The 2-D transpose of eltwise.h (x86-64-v2 baseline: built without per-ISA flags).
#include <immintrin.h>

#include <algorithm>

#include "f32-eltwise/eltwise.h"

namespace sparsecol::kernels {

namespace {

inline void transpose_4x4(const float* s, int64_t lds, float* d, int64_t ldd) {
  __m128 a = _mm_loadu_ps(s), b = _mm_loadu_ps(s + lds);
  __m128 e = _mm_loadu_ps(s + 2 * lds), f = _mm_loadu_ps(s + 3 * lds);
  _MM_TRANSPOSE4_PS(a, b, e, f);
  _mm_storeu_ps(d, a);
  _mm_storeu_ps(d + ldd, b);
  _mm_storeu_ps(d + 2 * ldd, e);
  _mm_storeu_ps(d + 3 * ldd, f);
}

// A row stride that is a multiple of 4 KiB puts every row in the same L1 set (64 sets of 64
// bytes, 8 ways, on Zen 3 and Zen 5).
bool aliases(int64_t ld) { return ld * static_cast<int64_t>(sizeof(float)) % 4096 == 0; }

}  // namespace

void transpose_2d(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                  int64_t ldd) {
  // 16 x 16 tiles, 4 x 4 blocks within: each of the tile's 16 source and 16 destination rows
  // is read or written as one whole 64-byte line while it is in L1. The earlier order (4 source
  // rows at a time, across all columns) wrote 16 bytes of each destination row per pass, over
  // every destination row, so a line was written in 4 passes from L2. Where the source rows
  // alias in L1 (BERT's 3072-wide FFN input, read 64 tokens at a time), 16 of them evict one
  // another: there the 4-row strips across all columns stay; where the destination rows alias,
  // tiles are 8 destination rows tall. Measured (one thread, Zen 3, interleaved pairs, same
  // process): the sparse linear layer's transpose back, 256 features x 64 tokens into rows of
  // 768 or 3072 floats, 2.1-2.5x faster; its 64 x 768 token block 1.0-1.3x; the 128 x 64 head
  // of K 1.0-1.4x; the 64 x 3072 block unchanged (its strips are the old order).
  const int64_t tile_rows = aliases(lds) ? 4 : 16;
  const int64_t tile_cols = aliases(lds) ? cols : aliases(ldd) ? 8 : 16;
  for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
    const int64_t r1 = std::min(rows, r0 + tile_rows);
    for (int64_t c0 = 0; c0 < cols; c0 += tile_cols) {
      const int64_t c1 = std::min(cols, c0 + tile_cols);
      int64_t r = r0;
      for (; r + 4 <= r1; r += 4) {
        int64_t c = c0;
        for (; c + 4 <= c1; c += 4) transpose_4x4(src + r * lds + c, lds, dst + c * ldd + r, ldd);
        for (; c < c1; ++c) {
          for (int64_t i = 0; i < 4; ++i) dst[c * ldd + r + i] = src[(r + i) * lds + c];
        }
      }
      for (; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) dst[c * ldd + r] = src[r * lds + c];
      }
    }
  }
}

}  // namespace sparsecol::kernels
