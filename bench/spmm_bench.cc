// Sparse vs dense side by side on the layer shapes the sparse goals name: ResNet-50's 1x1 and
// 3x3 convolutions (224x224 input, batch 1, whole image per call) and BERT-base's linear layers
// (128 tokens) and two CNN classifiers at batch 1 (one token), each dense and at 50/70/80/90/95%
// unstructured sparsity, one thread. Counters: FLOP/s on the non-zeros (2 per multiply-add actually
// done) and dense-equivalent FLOP/s (2 per multiply-add of the dense layer: the speed a dense
// kernel would need to match). The label names the implementation. Ratios: run with
// --benchmark_format=json and compare the "dense" entry of a shape with its sparse ones (same
// process, same run). The convolutions at 90% and 95% also run as ".../16_images/..." (16 images
// in turn, as a layer-by-layer step at batch 16 runs them: B then comes from the L3 or memory).
//   build/bench/sparsecol_bench --benchmark_filter=spmm
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "conv_layer.h"
#include "f32-conv/conv.h"
#include "f32-gemm/gemm.h"
#include "f32-spmm/spmm.h"
#include "random_data.h"

namespace {

using namespace sparsecol::kernels;

const double kSparsities[] = {0.5, 0.7, 0.8, 0.9, 0.95};

using sparsecol::bench::ConvLayer;

const ConvLayer kConvLayers[] = {
    {"resnet50/l1_1x1_64to64", 64, 64, 56, 1, 1},
    {"resnet50/l1_3x3_64", 64, 64, 56, 3, 1},
    {"resnet50/l1_1x1_64to256", 64, 256, 56, 1, 1},
    {"resnet50/l1_1x1_256to64", 256, 64, 56, 1, 1},
    {"resnet50/l2_3x3s2_128", 128, 128, 56, 3, 2},
    {"resnet50/l2_1x1s2_256to512", 256, 512, 56, 1, 2},
    {"resnet50/l2_3x3_128", 128, 128, 28, 3, 1},
    {"resnet50/l2_1x1_512to128", 512, 128, 28, 1, 1},
    {"resnet50/l3_3x3_256", 256, 256, 14, 3, 1},
    {"resnet50/l3_1x1_1024to256", 1024, 256, 14, 1, 1},
    {"resnet50/l3_1x1_256to1024", 256, 1024, 14, 1, 1},
    {"resnet50/l4_3x3s2_512", 512, 512, 14, 3, 2},
    {"resnet50/l4_1x1s2_1024to2048", 1024, 2048, 14, 1, 2},
    {"resnet50/l4_3x3_512", 512, 512, 7, 3, 1},
    {"resnet50/l4_1x1_2048to512", 2048, 512, 7, 1, 1},
};

struct LinearLayer {
  const char* name;
  int64_t k, n, tokens;
};

// BERT-base's on a sequence of 128 tokens, and two CNN classifiers at batch 1 (one token).
const LinearLayer kLinearLayers[] = {
    {"bert/qkv_768x768", 768, 768, 128},
    {"bert/ffn_up_768x3072", 768, 3072, 128},
    {"bert/ffn_down_3072x768", 3072, 768, 128},
    {"mobilenetv2/classifier_1280x1000_1_token", 1280, 1000, 1},
    {"resnet50/fc_2048x1000_1_token", 2048, 1000, 1},
};

using sparsecol::bench::Floats;
using sparsecol::bench::random_floats;

// Zeroes a `sparsity` fraction of the elements at random (what magnitude pruning of random
// weights leaves: unstructured).
void prune(Floats& w, double sparsity, std::mt19937& rng) {
  std::bernoulli_distribution zero(sparsity);
  for (float& x : w) {
    if (zero(rng)) x = 0.0f;
  }
}

void set_counters(benchmark::State& state, double dense_flops, double sparsity) {
  state.counters["nnz_FLOP/s"] = benchmark::Counter(dense_flops * (1.0 - sparsity),
                                                    benchmark::Counter::kIsIterationInvariantRate);
  state.counters["dense_eq_FLOP/s"] =
      benchmark::Counter(dense_flops, benchmark::Counter::kIsIterationInvariantRate);
}

// sparsity < 0: the dense implementation on an unpruned weight.
void conv_layer(benchmark::State& state, const ConvLayer& layer, double sparsity, int64_t images) {
  const ConvGeometry g = sparsecol::bench::geometry_of(layer);
  std::mt19937 rng(1);
  const int64_t depth = g.in_c * g.kernel_h * g.kernel_w;
  const int64_t in_image = g.in_c * g.in_h * g.in_w, out_image = g.out_c * g.out_h * g.out_w;
  const Floats src = random_floats(images * in_image, rng);
  Floats weight = random_floats(g.out_c * depth, rng);
  if (sparsity > 0.0) prune(weight, sparsity, rng);
  const Floats bias = random_floats(g.out_c, rng);
  Floats dst(static_cast<std::size_t>(images * out_image));
  const PackedConv conv(g, weight.data(), bias.data(), sparsity < 0.0 ? kAlwaysDense : 0.0);
  Epilogue epilogue;
  epilogue.post_residual = Activation::kRelu;
  std::vector<float> scratch;
  for (auto _ : state) {
    for (int64_t n = 0; n < images; ++n) {
      conv2d_rows(conv, {const_cast<float*>(src.data()) + n * in_image, 0, g.in_h * g.in_w},
                  {dst.data() + n * out_image, 0, g.out_h * g.out_w}, 0, g.out_h, epilogue, nullptr,
                  scratch);
    }
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, 2.0 * static_cast<double>(images * out_image * depth),
               std::max(sparsity, 0.0));
  state.SetLabel(conv.implementation());
}

// Y[T x N] = X[T x K] W[K x N] + bias: dense through gemm() (what the layerwise MatMul step
// runs), sparse through sparse_linear().
void linear_layer(benchmark::State& state, const LinearLayer& layer, double sparsity) {
  std::mt19937 rng(2);
  const Floats x = random_floats(layer.tokens * layer.k, rng);
  Floats w = random_floats(layer.k * layer.n, rng);
  if (sparsity > 0.0) prune(w, sparsity, rng);
  const Floats bias = random_floats(layer.n, rng);
  Floats y(static_cast<std::size_t>(layer.tokens * layer.n));
  std::vector<float> scratch;
  Epilogue epilogue;
  epilogue.col_bias = bias.data();
  if (sparsity < 0.0) {
    for (auto _ : state) {
      gemm({layer.tokens, layer.n, layer.k}, x.data(), layer.k, w.data(), layer.n, y.data(),
           layer.n, epilogue, scratch);
      benchmark::DoNotOptimize(y.data());
      benchmark::ClobberMemory();
    }
    state.SetLabel(fmt::format("gemm/{}", to_string(active_isa())));
  } else {
    const SparseLinear sparse(w.data(), layer.k, layer.n, layer.n, 1);
    for (auto _ : state) {
      // A one-token shape stands for a CNN's classifier at batch 1, whose whole input is that
      // token: the schedules then take the one-token kernel (sparse_linear).
      sparse_linear(sparse, x.data(), layer.k, layer.tokens, 0, layer.n, y.data(), layer.n,
                    epilogue, scratch, active_isa(), {}, /*one_token_tensor=*/layer.tokens == 1);
      benchmark::DoNotOptimize(y.data());
      benchmark::ClobberMemory();
    }
    state.SetLabel(fmt::format("spmm/{}", to_string(active_isa())));
  }
  set_counters(state, 2.0 * static_cast<double>(layer.tokens * layer.k * layer.n),
               std::max(sparsity, 0.0));
}

std::string variant(double sparsity) {
  return sparsity < 0.0 ? "dense" : fmt::format("sparse{:.0f}", 100 * sparsity);
}

// The dense variant (-1) first, then each sparsity.
std::vector<double> variants() {
  std::vector<double> v = {-1.0};
  v.insert(v.end(), std::begin(kSparsities), std::end(kSparsities));
  return v;
}

const bool kRegistered = [] {
  for (const ConvLayer& layer : kConvLayers) {
    for (double s : variants()) {
      benchmark::RegisterBenchmark(fmt::format("spmm_conv/{}/{}", layer.name, variant(s)).c_str(),
                                   conv_layer, layer, s, int64_t{1})
          ->Unit(benchmark::kMicrosecond);
    }
  }
  for (const ConvLayer& layer : kConvLayers) {
    for (double s : {-1.0, 0.9, 0.95}) {
      benchmark::RegisterBenchmark(
          fmt::format("spmm_conv/{}/16_images/{}", layer.name, variant(s)).c_str(), conv_layer,
          layer, s, int64_t{16})
          ->Unit(benchmark::kMicrosecond);
    }
  }
  for (const LinearLayer& layer : kLinearLayers) {
    for (double s : variants()) {
      benchmark::RegisterBenchmark(fmt::format("spmm_linear/{}/{}", layer.name, variant(s)).c_str(),
                                   linear_layer, layer, s)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  return true;
}();

}  // namespace
