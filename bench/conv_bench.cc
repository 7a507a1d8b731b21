// conv2d_rows on real ResNet-50 and MobileNetV2 layer shapes (224x224 input, whole image in one
// call, one thread), on the active ISA (SPARSECOL_MAX_ISA caps it): batch 1 (the layer's data in
// the core's caches) and "/16_images" (16 images in turn, as a layer-by-layer step at batch 16
// runs them: the inputs and outputs of most layers then come from the L3 or memory). Counters:
// GFLOPs (2 per multiply-add) and peak_fraction against the measured peak of the active ISA
// (peak_bench.cc); the label names the implementation the packing chose.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "conv_layer.h"
#include "f32-conv/conv.h"
#include "isa.h"
#include "peak.h"
#include "random_data.h"

namespace {

using sparsecol::kernels::ConvGeometry;

using sparsecol::bench::ConvLayer;

// Padding is (kernel - 1) / 2 throughout both networks.
const ConvLayer kLayers[] = {
    {"resnet50/conv1_7x7s2", 3, 64, 224, 7, 2, 1},
    {"resnet50/l1_1x1_64to64", 64, 64, 56, 1, 1, 1},
    {"resnet50/l1_3x3_64", 64, 64, 56, 3, 1, 1},
    {"resnet50/l1_1x1_64to256", 64, 256, 56, 1, 1, 1},
    {"resnet50/l1_1x1_256to64", 256, 64, 56, 1, 1, 1},
    {"resnet50/l2_3x3s2_128", 128, 128, 56, 3, 2, 1},
    {"resnet50/l2_down_1x1s2_256to512", 256, 512, 56, 1, 2, 1},
    {"resnet50/l2_3x3_128", 128, 128, 28, 3, 1, 1},
    {"resnet50/l2_1x1_512to128", 512, 128, 28, 1, 1, 1},
    {"resnet50/l3_3x3_256", 256, 256, 14, 3, 1, 1},
    {"resnet50/l3_1x1_1024to256", 1024, 256, 14, 1, 1, 1},
    {"resnet50/l3_1x1_256to1024", 256, 1024, 14, 1, 1, 1},
    {"resnet50/l4_3x3_512", 512, 512, 7, 3, 1, 1},
    {"resnet50/l4_1x1_2048to512", 2048, 512, 7, 1, 1, 1},
    {"mobilenetv2/conv1_3x3s2", 3, 32, 224, 3, 2, 1},
    {"mobilenetv2/dw_3x3_32_112", 32, 32, 112, 3, 1, 32},
    {"mobilenetv2/pw_1x1_32to16_112", 32, 16, 112, 1, 1, 1},
    {"mobilenetv2/pw_1x1_16to96_112", 16, 96, 112, 1, 1, 1},
    {"mobilenetv2/dw_3x3s2_96_112", 96, 96, 112, 3, 2, 96},
    {"mobilenetv2/dw_3x3_144_56", 144, 144, 56, 3, 1, 144},
    {"mobilenetv2/pw_1x1_144to24_56", 144, 24, 56, 1, 1, 1},
    {"mobilenetv2/dw_3x3s2_144_56", 144, 144, 56, 3, 2, 144},
    {"mobilenetv2/dw_3x3_192_28", 192, 192, 28, 3, 1, 192},
    {"mobilenetv2/dw_3x3_384_14", 384, 384, 14, 3, 1, 384},
    {"mobilenetv2/pw_1x1_64to384_14", 64, 384, 14, 1, 1, 1},
    {"mobilenetv2/dw_3x3s2_576_14", 576, 576, 14, 3, 2, 576},
    {"mobilenetv2/dw_3x3_960_7", 960, 960, 7, 3, 1, 960},
    {"mobilenetv2/pw_1x1_320to1280_7", 320, 1280, 7, 1, 1, 1},
    // The README's example model (tools/make_models.py small_cnn): few channels on a 32x32 image.
    {"small_cnn/conv1_3x3_3to16", 3, 16, 32, 3, 1, 1},
    {"small_cnn/conv2_3x3_16", 16, 16, 32, 3, 1, 1},
};

void conv_layer(benchmark::State& state, const ConvLayer& layer, int64_t images) {
  const ConvGeometry g = sparsecol::bench::geometry_of(layer);

  std::mt19937 rng(1);
  auto random = [&](int64_t n) { return sparsecol::bench::random_floats(n, rng); };
  const int64_t depth = g.in_c / g.groups * g.kernel_h * g.kernel_w;
  const int64_t in_image = g.in_c * g.in_h * g.in_w, out_image = g.out_c * g.out_h * g.out_w;
  sparsecol::bench::Floats src = random(images * in_image);
  const sparsecol::bench::Floats weight = random(g.out_c * depth);
  const sparsecol::bench::Floats bias = random(g.out_c);
  sparsecol::bench::Floats dst(images * out_image);
  const sparsecol::kernels::PackedConv conv(g, weight.data(), bias.data());
  sparsecol::kernels::Epilogue epilogue;
  epilogue.post_residual = sparsecol::kernels::Activation::kRelu;
  std::vector<float> scratch;
  for (auto _ : state) {
    for (int64_t n = 0; n < images; ++n) {
      sparsecol::kernels::conv2d_rows(conv, {src.data() + n * in_image, 0, g.in_h * g.in_w},
                                      {dst.data() + n * out_image, 0, g.out_h * g.out_w}, 0,
                                      g.out_h, epilogue, nullptr, scratch);
    }
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  const double flops = 2.0 * static_cast<double>(images * out_image * depth);
  state.counters["GFLOPs"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  const double peak =
      sparsecol::bench::measured_peak_gflops(sparsecol::kernels::active_isa()) * 1e9;
  state.counters["peak_fraction"] =
      benchmark::Counter(flops / peak, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(conv.implementation());
}

const bool kRegistered = [] {
  for (const auto& [images, suffix] : {std::pair<int64_t, const char*>{1, ""},
                                       std::pair<int64_t, const char*>{16, "/16_images"}}) {
    for (const ConvLayer& layer : kLayers) {
      benchmark::RegisterBenchmark((std::string("conv2d_rows/") + layer.name + suffix).c_str(),
                                   conv_layer, layer, images)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  return true;
}();

}  // namespace
