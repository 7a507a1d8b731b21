// The dense f32 GEMM on the shapes real layers give it, through every micro-kernel this CPU can
// run: ResNet-50's 1x1 convolutions (A = weights [OC x IC], B = activations [IC x H*W]) and its
// 3x3 convolutions as im2col GEMMs (K = 9 IC), MobileNetV2's pointwise convolutions (small K,
// wide N), with the fused bias + Relu; BERT-base's linear layers at 128 tokens (A = activations
// [128 x K] packed on every call, B = weights [K x N]) with the fused column bias, and its
// attention products per head (both operands activations); and one large
// square problem, the "large shape" of the >= 80%-of-peak goal. Counters: GFLOPs (2 M N K per call)
// and peak_fraction against the measured peak of the micro-kernel's ISA (peak_bench.cc).
// Single-threaded by contract.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "f32-gemm/gemm.h"
#include "f32-gemm/ukernels.h"
#include "peak.h"
#include "random_data.h"

namespace sparsecol::bench {
namespace {

using kernels::Epilogue;
using kernels::GemmShape;
using kernels::GemmUkernel;

struct LayerShape {
  const char* name;
  int64_t m, k, n;
  bool a_is_weight;  // conv: A packed once at load; linear: A = activations, packed per call
};

constexpr LayerShape kShapes[] = {
    {"resnet50_conv2_1x1_reduce", 64, 256, 3136, true},
    {"resnet50_conv2_1x1_expand", 256, 64, 3136, true},
    {"resnet50_conv3_1x1_reduce", 128, 512, 784, true},
    {"resnet50_conv4_1x1_expand", 1024, 256, 196, true},
    {"resnet50_conv5_1x1_reduce", 512, 2048, 49, true},
    {"resnet50_conv5_1x1_expand", 2048, 512, 49, true},
    {"resnet50_conv2_3x3_im2col", 64, 576, 3136, true},
    {"resnet50_conv3_3x3_im2col", 128, 1152, 784, true},
    {"resnet50_conv4_3x3_im2col", 256, 2304, 196, true},
    {"resnet50_conv5_3x3_im2col", 512, 4608, 49, true},
    {"mobilenetv2_pw_32to16_112", 16, 32, 12544, true},
    {"mobilenetv2_pw_16to96_112", 96, 16, 12544, true},
    {"mobilenetv2_pw_144to24_56", 24, 144, 3136, true},
    {"mobilenetv2_pw_64to384_14", 384, 64, 196, true},
    {"mobilenetv2_pw_160to960_7", 960, 160, 49, true},
    {"mobilenetv2_pw_320to1280_7", 1280, 320, 49, true},
    {"bert_attention_proj_768x768", 128, 768, 768, false},
    {"bert_ffn_up_768x3072", 128, 768, 3072, false},
    {"bert_ffn_down_3072x768", 128, 3072, 768, false},
    // The attention products per head, as the layer-by-layer step splits them (64-row blocks):
    // Q K^T (K = 64, 128 keys) and softmax(.) V (K = 128 keys, 64 features).
    {"bert_attention_scores", 64, 64, 128, false},
    {"bert_attention_context", 64, 128, 64, false},
    {"square_1024", 1024, 1024, 1024, true},
};

sparsecol::bench::Floats random_values(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  return sparsecol::bench::random_floats(count, rng);
}

void BM_Gemm(benchmark::State& state, LayerShape shape, const GemmUkernel* ukernel) {
  if (!kernels::isa_available(ukernel->isa)) {
    state.SkipWithError(("ISA not available: " + kernels::isa_reason()).c_str());
    return;
  }
  const sparsecol::bench::Floats a = random_values(shape.m * shape.k, 1);
  const sparsecol::bench::Floats b = random_values(shape.k * shape.n, 2);
  const sparsecol::bench::Floats bias = random_values(std::max(shape.m, shape.n), 3);
  sparsecol::bench::Floats c(shape.m * shape.n);
  Epilogue epilogue;
  if (shape.a_is_weight) {
    epilogue.row_bias = bias.data();
    epilogue.post_residual = kernels::Activation::kRelu;
  } else {
    epilogue.col_bias = bias.data();
  }
  std::vector<float> packed(kernels::packed_a_size(shape.m, shape.k, ukernel->mr));
  kernels::pack_a_panels(a.data(), shape.m, shape.k, shape.k, ukernel->mr, packed.data());
  std::vector<float> scratch;
  for (auto _ : state) {
    if (shape.a_is_weight) {
      kernels::gemm_packed_with_ukernel(*ukernel, packed.data(), shape.m, shape.k, b.data(),
                                        shape.n, c.data(), shape.n, shape.n, epilogue);
    } else {
      kernels::gemm_with_ukernel(*ukernel, GemmShape{shape.m, shape.n, shape.k}, a.data(), shape.k,
                                 b.data(), shape.n, c.data(), shape.n, epilogue, scratch);
    }
    benchmark::ClobberMemory();
  }
  const double flops = 2.0 * shape.m * shape.n * shape.k;
  state.counters["GFLOPs"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  // (calls / s) x (flops / call) / (peak flops / s).
  const double peak = measured_peak_gflops(ukernel->isa) * 1e9;
  state.counters["peak_fraction"] =
      benchmark::Counter(flops / peak, benchmark::Counter::kIsIterationInvariantRate);
}

// BERT's attention scores of one head, 128 tokens: Q K^T with Q and K read in place from the
// token-major [128 x 768] projections (12 heads x 64), K^T as a transposed B packed per call
// (gemm_transposed_b: the Einsum step after graph::fold_matmul_transposes), against the same
// product on a dense Q and a K^T transposed beforehand (the layout the Transposes used to
// produce).
void BM_AttentionScores(benchmark::State& state, bool in_place, const GemmUkernel* ukernel) {
  if (!kernels::isa_available(ukernel->isa)) {
    state.SkipWithError(("ISA not available: " + kernels::isa_reason()).c_str());
    return;
  }
  constexpr int64_t kTokens = 128, kDepth = 64, kWidth = 768;
  const sparsecol::bench::Floats q = random_values(kTokens * kWidth, 1);
  const sparsecol::bench::Floats k = random_values(kTokens * kWidth, 2);
  sparsecol::bench::Floats dense_q(kTokens * kDepth), k_transposed(kDepth * kTokens);
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t d = 0; d < kDepth; ++d) {
      dense_q[t * kDepth + d] = q[t * kWidth + d];
      k_transposed[d * kTokens + t] = k[t * kWidth + d];
    }
  }
  sparsecol::bench::Floats c(kTokens * kTokens);
  std::vector<float> scratch;
  const GemmShape shape{kTokens, kTokens, kDepth};
  for (auto _ : state) {
    if (in_place) {
      kernels::gemm_transposed_b_with_ukernel(*ukernel, shape, q.data(), kWidth, k.data(), kWidth,
                                              c.data(), kTokens, Epilogue{}, scratch);
    } else {
      kernels::gemm_with_ukernel(*ukernel, shape, dense_q.data(), kDepth, k_transposed.data(),
                                 kTokens, c.data(), kTokens, Epilogue{}, scratch);
    }
    benchmark::ClobberMemory();
  }
  state.counters["GFLOPs"] = benchmark::Counter(2e-9 * kTokens * kTokens * kDepth,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

// One benchmark per (shape, micro-kernel): a kernel added to ukernels.h is benchmarked here.
const bool kRegistered = [] {
  for (const LayerShape& shape : kShapes) {
    for (const GemmUkernel& u : kernels::gemm_ukernels()) {
      const std::string name = std::string("gemm/") + shape.name + "/M" + std::to_string(shape.m) +
                               "_K" + std::to_string(shape.k) + "_N" + std::to_string(shape.n) +
                               "/" + u.name;
      benchmark::RegisterBenchmark(name.c_str(), BM_Gemm, shape, &u)->Unit(benchmark::kMicrosecond);
    }
  }
  for (const GemmUkernel& u : kernels::gemm_ukernels()) {
    for (bool in_place : {true, false}) {
      const std::string name = std::string("gemm/bert_attention_scores_") +
                               (in_place ? "k_in_place" : "k_transposed") + "/M128_K64_N128/" +
                               u.name;
      benchmark::RegisterBenchmark(name.c_str(), BM_AttentionScores, in_place, &u)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  return true;
}();

}  // namespace
}  // namespace sparsecol::bench
