// Peak floating-point throughput of one core: unrolled independent multiply-add chains, long
// enough to hide the FMA latency (Zen 5: 2 FMA pipes x 4 cycles = 8 chains minimum; 24 are used,
// as many as a GEMM micro-kernel keeps) and free of loads. The result is the denominator of the
// "fraction of peak" counters in gemm_bench.cc. Run single-threaded, pinned (taskset -c N).
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
  const int lanes = isa == Isa::kAvx512 ? 16 : 4;
  return 2.0 * lanes * kChains * static_cast<double>(kSteps);
}

float run_loop(Isa isa) {
  return isa == Isa::kAvx512 ? multiply_add_avx512(kSteps) : multiply_add_portable(kSteps);
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
BENCHMARK_CAPTURE(BM_PeakFlops, portable_mul_add, Isa::kPortable);

}  // namespace

double measured_peak_gflops(Isa isa) {
  static const double peaks[2] = {measure_peak(Isa::kPortable), measure_peak(Isa::kAvx512)};
  return peaks[static_cast<int>(isa)];
}

}  // namespace sparsecol::bench
