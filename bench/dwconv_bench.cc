// dwconv2d_rows on every depthwise layer shape of MobileNetV2 (224x224 input, whole image in one
// call, one thread, Clip(0, 6) fused as the network does), once per kernel (DwconvMethod):
// "planes" (per-plane vectors) and "lanes" (channels in the lanes) side by side, so that one
// noisy run compares them; at batch 1 (the layer's data in the core's caches) and "/16_images"
// (16 images in turn, as a layer-by-layer step at batch 16 runs them: the data then comes from
// the L3 or memory). Counters: GFLOPs (2 per multiply-add).
// Also pool2d_rows on ResNet-50's stem max pooling (3x3 stride 2 over 64x112x112), which takes
// the same channel-lane kernel on AVX2 and AVX-512; counter: outputs per second.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "conv_layer.h"
#include "f32-dwconv/dwconv.h"
#include "f32-pool/pool.h"
#include "random_data.h"

namespace {

using sparsecol::kernels::DwconvMethod;

struct Layer {
  const char* name;
  int64_t channels, in_hw, stride;
};

// All ten distinct depthwise shapes of MobileNetV2 (3x3, padding 1).
const Layer kLayers[] = {
    {"32_112", 32, 112, 1},    {"96_112_s2", 96, 112, 2}, {"144_56", 144, 56, 1},
    {"144_56_s2", 144, 56, 2}, {"192_28", 192, 28, 1},    {"192_28_s2", 192, 28, 2},
    {"384_14", 384, 14, 1},    {"576_14", 576, 14, 1},    {"576_14_s2", 576, 14, 2},
    {"960_7", 960, 7, 1},
};

void dwconv_layer(benchmark::State& state, const Layer& layer, DwconvMethod method,
                  int64_t images) {
  const sparsecol::kernels::ConvGeometry g = sparsecol::bench::geometry_of(
      {layer.name, layer.channels, layer.channels, layer.in_hw, 3, layer.stride, layer.channels});

  std::mt19937 rng(1);
  auto random = [&](int64_t n) { return sparsecol::bench::random_floats(n, rng); };
  const int64_t in_image = g.in_c * g.in_h * g.in_w, out_image = g.out_c * g.out_h * g.out_w;
  const sparsecol::bench::Floats src = random(images * in_image);
  const sparsecol::bench::Floats weight = random(g.in_c * 9);
  const sparsecol::bench::Floats bias = random(g.in_c);
  sparsecol::bench::Floats dst(images * out_image);
  // Relu6 as the executors fuse a Conv's Clip with no Add before it: the first activation slot.
  sparsecol::kernels::Epilogue epilogue;
  epilogue.pre_residual = sparsecol::kernels::Activation::kClip;
  epilogue.clip_max = 6.0f;
  std::vector<float> scratch;
  for (auto _ : state) {
    for (int64_t n = 0; n < images; ++n) {
      const sparsecol::kernels::PlaneView src_view{const_cast<float*>(src.data()) + n * in_image, 0,
                                                   g.in_h * g.in_w};
      const sparsecol::kernels::PlaneView dst_view{dst.data() + n * out_image, 0,
                                                   g.out_h * g.out_w};
      sparsecol::kernels::dwconv2d_rows(g, weight.data(), bias.data(), src_view, dst_view, 0,
                                        g.out_h, epilogue, nullptr, scratch,
                                        sparsecol::kernels::active_isa(), method);
    }
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  const double flops = 2.0 * 9.0 * static_cast<double>(images * out_image);
  state.counters["GFLOPs"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void resnet50_max_pool(benchmark::State& state) {
  sparsecol::kernels::PoolGeometry g;
  g.channels = 64;
  g.in_h = g.in_w = 112;
  g.kernel_h = g.kernel_w = 3;
  g.stride_h = g.stride_w = 2;
  g.pad_top = g.pad_left = g.pad_bottom = g.pad_right = 1;
  g.out_h = g.out_w = 56;
  std::mt19937 rng(1);
  const sparsecol::bench::Floats src = sparsecol::bench::random_floats(64 * 112 * 112, rng);
  sparsecol::bench::Floats dst(64 * 56 * 56);
  std::vector<float> scratch;
  for (auto _ : state) {
    sparsecol::kernels::pool2d_rows(sparsecol::kernels::PoolKind::kMax, g,
                                    {const_cast<float*>(src.data()), 0, 112 * 112},
                                    {dst.data(), 0, 56 * 56}, 0, 56, scratch);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.counters["outputs"] = benchmark::Counter(static_cast<double>(dst.size()),
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

const bool kRegistered = [] {
  benchmark::RegisterBenchmark("pool/resnet50/max_3x3s2_64x112", resnet50_max_pool)
      ->Unit(benchmark::kMicrosecond);
  for (const auto& [images, suffix] : {std::pair<int64_t, const char*>{1, ""},
                                       std::pair<int64_t, const char*>{16, "/16_images"}}) {
    for (const Layer& layer : kLayers) {
      for (const auto& [method, name] : {std::pair{DwconvMethod::kPlanes, "planes"},
                                         std::pair{DwconvMethod::kChannelLanes, "lanes"}}) {
        benchmark::RegisterBenchmark(
            (std::string("dwconv/mobilenetv2/") + layer.name + "/" + name + suffix).c_str(),
            dwconv_layer, layer, method, images)
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  return true;
}();

}  // namespace
