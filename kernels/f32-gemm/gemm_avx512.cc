// The AVX-512 micro-kernels, f32_gemm_<MR>x<NR>__avx512 (see ukernels.h for the choice of tile):
// the body of ukernel_impl.h on zmm registers. Column tails use __mmask16 masked loads and
// stores (masked-off lanes neither fault nor write). Only called when active_isa() is kAvx512
// (this file is compiled with -mavx512f/bw/vl/dq).
#include <immintrin.h>

#include <cstdint>

// GCC 12 warns that the merge operand of the unmasked min/max intrinsics (_mm512_undefined_ps)
// "may be used uninitialized" once inlined (GCC bug 105593); it is not read. (Clang has no such
// warning, and warns about the unknown name instead.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "f32-gemm/ukernel_impl.h"

namespace sparsecol::kernels {
namespace {

struct Avx512 {
  using Vec = __m512;
  using Mask = __mmask16;
  static constexpr int kLanes = 16;
  static Mask mask_first(int count) { return static_cast<Mask>((1u << count) - 1); }
  static Mask mask_bits(uint32_t bits) { return static_cast<Mask>(bits); }
  static Vec splat(float x) { return _mm512_set1_ps(x); }
  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  static Vec load_masked(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
  static void store(float* p, Vec x) { _mm512_storeu_ps(p, x); }
  static void store_masked(float* p, Mask m, Vec x) { _mm512_mask_storeu_ps(p, m, x); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
  static Vec div(Vec a, Vec b) { return _mm512_div_ps(a, b); }
  static Vec min(Vec a, Vec b) { return _mm512_min_ps(a, b); }
  static Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
};

}  // namespace

void f32_gemm_8x32__avx512(const GemmUkernelArgs& args) { ukernel<Avx512, 8, 2, true>(args); }
void f32_gemm_6x64__avx512(const GemmUkernelArgs& args) { ukernel<Avx512, 6, 4>(args); }

}  // namespace sparsecol::kernels
