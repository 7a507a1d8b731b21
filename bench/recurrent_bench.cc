// LSTM and GRU layers of a speech or text model's size (input and hidden 256, 32 steps, one
// direction), at batch 1 and 16: kernels::PackedRecurrent against the reference it replaced on
// every CPU schedule (kernels/reference/recurrent.h). GFLOPs counts 2 per multiply-add of the
// two products (gates x hidden x (input + hidden) per step and entry), the gates' element-wise
// work not counted. Single-threaded: the layer-by-layer step runs directions and blocks of 4
// batch entries as tasks across threads.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "f32-rnn/recurrent.h"
#include "random_data.h"
#include "reference/recurrent.h"

namespace sparsecol::bench {
namespace {

using kernels::reference::RecurrentCell;
using kernels::reference::RecurrentShape;

constexpr int64_t kSteps = 32, kInput = 256, kHidden = 256;

struct Layer {
  RecurrentShape shape;
  Floats x, w, r, b, y, y_h;
};

Layer make_layer(RecurrentCell cell, int64_t batch) {
  Layer l;
  RecurrentShape& s = l.shape;
  s.cell = cell;
  s.seq_length = kSteps;
  s.batch = batch;
  s.input_size = kInput;
  s.hidden_size = kHidden;
  using Kind = kernels::reference::RnnActivation::Kind;
  s.activations = {{Kind::kSigmoid}, {Kind::kTanh}};
  if (cell == RecurrentCell::kLstm) s.activations.push_back({Kind::kTanh});
  const int64_t gh = kernels::reference::gate_count(cell) * kHidden;
  std::mt19937 rng(7);
  // Weights small enough that the gates do not saturate (as trained ones mostly do not).
  auto values = [&](int64_t n, float scale) {
    Floats v = random_floats(n, rng);
    for (float& f : v) f *= scale;
    return v;
  };
  l.x = values(kSteps * batch * kInput, 1.0f);
  l.w = values(gh * kInput, 0.06f);
  l.r = values(gh * kHidden, 0.06f);
  l.b = values(2 * gh, 0.1f);
  l.y = Floats(kSteps * batch * kHidden);
  l.y_h = Floats(batch * kHidden);
  return l;
}

kernels::reference::RecurrentOperands operands(Layer& l) {
  kernels::reference::RecurrentOperands o;
  o.x = l.x.data();
  o.w = l.w.data();
  o.r = l.r.data();
  o.b = l.b.data();
  o.y = l.y.data();
  o.y_h = l.y_h.data();
  return o;
}

void set_counters(benchmark::State& state, const RecurrentShape& s) {
  const double flops =
      2.0 * static_cast<double>(kernels::reference::gate_count(s.cell) * s.hidden_size *
                                (s.input_size + s.hidden_size) * s.seq_length * s.batch);
  state.counters["GFLOPs"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_RecurrentFast(benchmark::State& state, RecurrentCell cell, int64_t batch) {
  Layer l = make_layer(cell, batch);
  const kernels::PackedRecurrent kernel(l.shape, l.w.data(), l.r.data(), l.b.data(), nullptr);
  const kernels::reference::RecurrentOperands o = operands(l);
  std::vector<float> buffers, gemm_scratch;
  for (auto _ : state) {
    for (int64_t b0 = 0; b0 < batch; b0 += 4) {
      kernel.run(o, 0, b0, std::min<int64_t>(b0 + 4, batch), buffers, gemm_scratch);
    }
    benchmark::DoNotOptimize(l.y.data());
  }
  set_counters(state, l.shape);
  state.SetLabel(kernel.implementation());
}

void BM_RecurrentReference(benchmark::State& state, RecurrentCell cell, int64_t batch) {
  Layer l = make_layer(cell, batch);
  const kernels::reference::RecurrentOperands o = operands(l);
  for (auto _ : state) {
    kernels::reference::recurrent_reference(l.shape, o);
    benchmark::DoNotOptimize(l.y.data());
  }
  set_counters(state, l.shape);
}

const bool kRegistered = [] {
  for (const auto& [name, cell] :
       {std::pair{"lstm", RecurrentCell::kLstm}, std::pair{"gru", RecurrentCell::kGru}}) {
    for (int64_t batch : {1, 16}) {
      const std::string shape =
          std::string(name) + "_256x256_32_steps/batch_" + std::to_string(batch);
      benchmark::RegisterBenchmark(("recurrent/" + shape + "/gemm").c_str(), BM_RecurrentFast, cell,
                                   batch)
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("recurrent/" + shape + "/reference").c_str(),
                                   BM_RecurrentReference, cell, batch)
          ->Unit(benchmark::kMillisecond);
    }
  }
  return true;
}();

}  // namespace
}  // namespace sparsecol::bench
