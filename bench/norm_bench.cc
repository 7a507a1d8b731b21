// softmax_rows and layer_norm_rows on BERT-base's shapes, one thread: the softmax of one head's
// scores as a task of the attention product computes them (128 rows of 128 keys, in cache), and
// the layer norm of 128 tokens of 768 features. Counter: elements per second.
#include <benchmark/benchmark.h>

#include <random>

#include "f32-norm/norm.h"
#include "random_data.h"

namespace {

void softmax_scores(benchmark::State& state) {
  constexpr int64_t kRows = 128, kKeys = 128;
  std::mt19937 rng(1);
  const sparsecol::bench::Floats scores = sparsecol::bench::random_floats(kRows * kKeys, rng);
  sparsecol::bench::Floats probs(kRows * kKeys);
  for (auto _ : state) {
    sparsecol::kernels::softmax_rows(scores.data(), kKeys, probs.data(), kKeys, kRows, kKeys);
    benchmark::ClobberMemory();
  }
  state.counters["elements"] = benchmark::Counter(static_cast<double>(kRows * kKeys),
                                                  benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(softmax_scores)
    ->Name("norm/softmax_rows/bert_scores_128x128")
    ->Unit(benchmark::kMicrosecond);

void layer_norm_tokens(benchmark::State& state) {
  constexpr int64_t kTokens = 128, kFeatures = 768;
  std::mt19937 rng(2);
  const sparsecol::bench::Floats x = sparsecol::bench::random_floats(kTokens * kFeatures, rng);
  const sparsecol::bench::Floats gamma = sparsecol::bench::random_floats(kFeatures, rng);
  const sparsecol::bench::Floats beta = sparsecol::bench::random_floats(kFeatures, rng);
  sparsecol::bench::Floats y(kTokens * kFeatures);
  for (auto _ : state) {
    sparsecol::kernels::layer_norm_rows(x.data(), kFeatures, y.data(), kFeatures, kTokens,
                                        kFeatures, gamma.data(), beta.data(), 1e-5f);
    benchmark::ClobberMemory();
  }
  state.counters["elements"] = benchmark::Counter(static_cast<double>(kTokens * kFeatures),
                                                  benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(layer_norm_tokens)
    ->Name("norm/layer_norm_rows/bert_128x768")
    ->Unit(benchmark::kMicrosecond);

}  // namespace
