// The AVX2 + FMA micro-kernels, f32_gemm_<MR>x<NR>__avx2 (see ukernels.h for the choice of
// tile): the body of ukernel_impl.h on ymm registers. Column tails use vmaskmovps (AVX's masked
// load and store: masked-off lanes neither fault nor write). Only called when isa_available(
// kAvx2) (this file is compiled with -mavx2 -mfma).
#include <immintrin.h>

#include <cstdint>

#include "f32-gemm/ukernel_impl.h"

namespace sparsecol::kernels {
namespace {

struct Avx2 {
  using Vec = __m256;
  using Mask = __m256i;  // lane i taken when its sign bit is set
  static constexpr int kLanes = 8;
  static Mask mask_first(int count) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static Mask mask_bits(uint32_t bits) {
    const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(static_cast<int>(bits)), lane_bit),
                              lane_bit);
  }
  static Vec splat(float x) { return _mm256_set1_ps(x); }
  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec load(const float* p) { return _mm256_loadu_ps(p); }
  static Vec load_masked(const float* p, Mask m) { return _mm256_maskload_ps(p, m); }
  static void store(float* p, Vec x) { _mm256_storeu_ps(p, x); }
  static void store_masked(float* p, Mask m, Vec x) { _mm256_maskstore_ps(p, m, x); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
  static Vec div(Vec a, Vec b) { return _mm256_div_ps(a, b); }
  static Vec min(Vec a, Vec b) { return _mm256_min_ps(a, b); }
  static Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
};

}  // namespace

void f32_gemm_6x16__avx2(const GemmUkernelArgs& args) { ukernel<Avx2, 6, 2>(args); }
void f32_gemm_4x24__avx2(const GemmUkernelArgs& args) { ukernel<Avx2, 4, 3>(args); }

}  // namespace sparsecol::kernels
