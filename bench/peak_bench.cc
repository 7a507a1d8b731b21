// Peak floating-point throughput of one core, per ISA tier: unrolled independent multiply-add
// chains, enough to hide the FMA latency (Zen 3 and Zen 5 alike: 2 FMA pipes x 4 cycles = 8
// chains minimum) and free of loads. AVX-512 and portable use 24 chains (32 and 16 registers:
// as many as their GEMM micro-kernels keep, the portable one in pairs); AVX2 uses 12, the
// accumulators of f32_gemm_6x16__avx2, because 24 would not fit its 16 ymm registers and the
// spills would measure the load/store units instead. The result is the denominator of the
// "fraction of peak" counters in gemm_bench.cc and conv_bench.cc. Run single-threaded, pinned
// (taskset -c N).
#include <immintrin.h>

#include <time.h>

#include <algorithm>
#include <cstdint>

#include <benchmark/benchmark.h>

#include "f32-gemm/ukernels.h"
#include "peak.h"

namespace sparsecol::bench {
namespace {

using kernels::Isa;

constexpr int kChains = 24;
constexpr int64_t kSteps = 4096;  // multiply-adds per chain per call

// x86-64-v2 has no FMA: a 4-lane multiply and a 4-lane add, 8 flops per step and chain.
typedef float Float4 __attribute__((vector_size(16)));

float multiply_add_portable(int64_t steps) {
  Float4 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = Float4{} + 1.0f + 0.001f * c;
  const Float4 x = Float4{} + 0.999999f, y = Float4{} + 1e-7f;
  for (int64_t s = 0; s < steps; ++s) {
#pragma GCC unroll 24
    for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * x + y;
  }
  Float4 sum = {};
  for (int c = 0; c < kChains; ++c) sum += acc[c];
  return sum[0] + sum[1] + sum[2] + sum[3];
}

// Only called after isa_available(kAvx2); the target attribute keeps the rest of this file at
// the x86-64-v2 baseline.
constexpr int kChainsAvx2 = 12;
__attribute__((target("avx2,fma"))) float multiply_add_avx2(int64_t steps) {
  __m256 acc[kChainsAvx2];
  for (int c = 0; c < kChainsAvx2; ++c) acc[c] = _mm256_set1_ps(1.0f + 0.001f * c);
  const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
  for (int64_t s = 0; s < steps; ++s) {
#pragma GCC unroll 12
    for (int c = 0; c < kChainsAvx2; ++c) acc[c] = _mm256_fmadd_ps(acc[c], x, y);
  }
  __m256 sum = _mm256_setzero_ps();
  for (int c = 0; c < kChainsAvx2; ++c) sum = _mm256_add_ps(sum, acc[c]);
  float lanes[8];
  _mm256_storeu_ps(lanes, sum);
  return lanes[0] + lanes[7];
}

// Only called after isa_available(kAvx512); the target attribute keeps the rest of this file at
// the x86-64-v2 baseline.
__attribute__((target("avx512f,fma"))) float multiply_add_avx512(int64_t steps) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(1.0f + 0.001f * c);
  const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
  for (int64_t s = 0; s < steps; ++s) {
#pragma GCC unroll 24
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], x, y);
  }
  __m512 sum = _mm512_setzero_ps();
  for (int c = 0; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  float lanes[16];  // not _mm512_reduce_add_ps: GCC 12 warns inside it (bug 105593)
  _mm512_storeu_ps(lanes, sum);
  return lanes[0] + lanes[15];
}

// Flops of one call of the loop for `isa`.
double flops_per_call(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return 2.0 * 16 * kChains * static_cast<double>(kSteps);
    case Isa::kAvx2:
      return 2.0 * 8 * kChainsAvx2 * static_cast<double>(kSteps);
    case Isa::kPortable:
      break;
  }
  return 2.0 * 4 * kChains * static_cast<double>(kSteps);
}

// One call of the loop for `isa`. The step count passes through DoNotOptimize so that it is
// opaque: otherwise GCC may see that every call computes the same value from constants and run
// the loop once for many calls (measured: a "peak" 190x too high).
float run_loop(Isa isa) {
  int64_t steps = kSteps;
  benchmark::DoNotOptimize(steps);
  switch (isa) {
    case Isa::kAvx512:
      return multiply_add_avx512(steps);
    case Isa::kAvx2:
      return multiply_add_avx2(steps);
    case Isa::kPortable:
      break;
  }
  return multiply_add_portable(steps);
}

// Thread CPU time, as Google Benchmark's rate counters use: on a shared machine wall time would
// charge other processes' slices to the peak.
double thread_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

double measure_peak(Isa isa) {
  if (!kernels::isa_available(isa)) return 0.0;
  double best = 0.0;
  for (int trial = 0; trial < 7; ++trial) {
    const double start = thread_seconds();
    constexpr int kCalls = 200;
    for (int i = 0; i < kCalls; ++i) benchmark::DoNotOptimize(run_loop(isa));
    const double seconds = thread_seconds() - start;
    best = std::max(best, kCalls * flops_per_call(isa) / seconds * 1e-9);
  }
  return best;
}

void BM_PeakFlops(benchmark::State& state, Isa isa) {
  if (!kernels::isa_available(isa)) {
    state.SkipWithError(("ISA not available: " + kernels::isa_reason()).c_str());
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(run_loop(isa));
  state.counters["GFLOPs"] =
      benchmark::Counter(flops_per_call(isa) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK_CAPTURE(BM_PeakFlops, avx512_fma, Isa::kAvx512);
BENCHMARK_CAPTURE(BM_PeakFlops, avx2_fma, Isa::kAvx2);
BENCHMARK_CAPTURE(BM_PeakFlops, portable_mul_add, Isa::kPortable);

}  // namespace

double measured_peak_gflops(Isa isa) {
  static const double peaks[3] = {measure_peak(Isa::kPortable), measure_peak(Isa::kAvx2),
                                  measure_peak(Isa::kAvx512)};
  return peaks[static_cast<int>(isa)];
}

}  // namespace sparsecol::bench
