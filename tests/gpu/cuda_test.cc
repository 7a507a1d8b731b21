// The cuda and cuda-sparse schedules against the reference schedule: small hand-built graphs
// (each library mapping, each fused epilogue, a host fallback in the middle, CUDA Graph replay,
// TF32), then whole models. Every test needs a CUDA device and reports SKIPPED with the reason
// (cuda_unavailable_reason()) where there is none, never PASSED.
//
// Tolerance, FP32: max |cuda - reference| <= 1e-4 * max(1, max |reference|) on the small graphs,
// 1e-3 on whole models (50+ layers of FP32 sums in another order: cuDNN's and cuBLASLt's
// blocked reductions, FMA math only). TF32 keeps 10 mantissa bits per product: 2e-2 on small
// graphs. A wrong layout, transpose, padding or epilogue gives errors of the order of the values.
//
// CudaAvailability and CudaLibraries run everywhere: without a device they check the Error a user
// gets and that the run-time loaded libraries resolve.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_libraries.h"
#include "graph/passes.h"
#include "graph_builder.h"
#include "runtime/executor.h"
#include "runtime/reference/reference_ops.h"
#include "sparsecol/io.h"
#include "sparsecol/sparsecol.h"
#include "test_models.h"

namespace sparsecol {
namespace {

using testing::GraphBuilder;
using testing::random_tensor;

#define SKIP_WITHOUT_CUDA()                                        \
  do {                                                             \
    const std::string reason = runtime::cuda_unavailable_reason(); \
    if (!reason.empty()) GTEST_SKIP() << reason;                   \
  } while (false)

graph::Graph optimized_for(graph::Graph g, const NamedTensors& inputs) {
  graph::optimize(g, runtime::evaluate_node);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, t] : inputs) shapes[name] = t.shape();
  return graph::specialize(g, shapes, runtime::evaluate_node);
}

// Runs the specialized graph on the reference and on `options`' cuda schedule, checks every
// output within `tolerance` relative to the largest reference value, returns the executor's
// layers (to check what ran where).
std::vector<LayerInfo> expect_matches_reference(const graph::Graph& g, const NamedTensors& inputs,
                                                const Options& options, float tolerance = 1e-4f,
                                                int runs = 1) {
  const graph::Graph s = optimized_for(g, inputs);
  const NamedTensors expected = runtime::make_reference_executor(s)->run(inputs);
  auto executor = runtime::make_cuda_executor(s, options);
  for (int run = 0; run < runs; ++run) {  // runs > 1: CUDA Graph replays after the first
    EXPECT_TRUE(testing::outputs_near(executor->run(inputs), expected, tolerance)) << "run " << run;
  }
  return executor->layers();
}

std::map<std::string, graph::AttrValue> conv_attrs(std::vector<int64_t> pads,
                                                   std::vector<int64_t> strides = {1, 1},
                                                   int64_t group = 1) {
  return {{"pads", pads},
          {"strides", strides},
          {"dilations", std::vector<int64_t>{1, 1}},
          {"group", group}};
}

// A weight with `zeros` of its entries set to exactly 0 (every k-th entry kept).
Tensor pruned_tensor(std::vector<int64_t> shape, uint32_t seed, double zeros) {
  Tensor t = random_tensor(std::move(shape), seed, -0.3f, 0.3f);
  const auto keep_every = static_cast<int64_t>(std::lround(1.0 / (1.0 - zeros)));
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (i % keep_every != 0) t.data<float>()[i] = 0.0f;
  }
  return t;
}

bool any_layer_uses(const std::vector<LayerInfo>& layers, const std::string& what) {
  for (const LayerInfo& l : layers) {
    if (l.implementation.find(what) != std::string::npos) return true;
  }
  return false;
}

class CudaScheduleTest : public ::testing::TestWithParam<Schedule> {
 protected:
  void SetUp() override { SKIP_WITHOUT_CUDA(); }
  Options options() const {
    Options o;
    o.schedule = GetParam();
    return o;
  }
};

TEST_P(CudaScheduleTest, ConvBiasReluAndResidualMatchReference) {
  GraphBuilder b;
  const int x = b.input("x", {2, 16, 10, 10});
  const int w1 = b.constant("w1", random_tensor({16, 16, 3, 3}, 1, -0.2f, 0.2f));
  const int b1 = b.constant("b1", random_tensor({16}, 2));
  const int w2 = b.constant("w2", pruned_tensor({16, 16, 1, 1}, 3, 0.9));
  const int c1 = b.node("Relu", {b.node("Conv", {x, w1, b1}, conv_attrs({1, 1, 1, 1}))});
  const int c2 = b.node("Conv", {c1, w2}, conv_attrs({0, 0, 0, 0}));
  const int y = b.node("Relu", {b.node("Add", {c2, x})});
  const std::vector<LayerInfo> layers = expect_matches_reference(
      b.finish({y}), {{"x", random_tensor({2, 16, 10, 10}, 4)}}, options());
  // The 90%-zero 1x1 weight goes to cuSPARSE in cuda-sparse, to cuDNN in cuda.
  EXPECT_EQ(any_layer_uses(layers, "cusparse"), GetParam() == Schedule::kCudaSparse);
}

TEST_P(CudaScheduleTest, StridedGroupedAndPaddedConvsMatchReference) {
  GraphBuilder b;
  const int x = b.input("x", {3, 8, 13, 11});
  const int w1 = b.constant("w1", pruned_tensor({12, 8, 3, 3}, 5, 0.8));
  const int w2 = b.constant("w2", random_tensor({12, 1, 3, 3}, 6));  // depthwise
  const int w3 = b.constant("w3", random_tensor({4, 12, 5, 5}, 7, -0.1f, 0.1f));
  const int c1 = b.node("Conv", {x, w1}, conv_attrs({1, 1, 1, 1}, {2, 2}));
  const int c2 = b.node("Conv", {c1, w2}, conv_attrs({1, 1, 1, 1}, {1, 1}, 12));
  const int c3 = b.node("Conv", {c2, w3}, conv_attrs({2, 2, 2, 2}));
  expect_matches_reference(b.finish({c3}), {{"x", random_tensor({3, 8, 13, 11}, 8)}}, options());
}

TEST_P(CudaScheduleTest, PoolingMatchesReference) {
  GraphBuilder b;
  const int x = b.input("x", {2, 5, 9, 9});
  const int m = b.node("MaxPool", {x},
                       {{"kernel_shape", std::vector<int64_t>{3, 3}},
                        {"strides", std::vector<int64_t>{2, 2}},
                        {"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  const int a = b.node(
      "AveragePool", {m},
      {{"kernel_shape", std::vector<int64_t>{2, 2}}, {"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  const int g = b.node("GlobalAveragePool", {a});
  expect_matches_reference(b.finish({a, g}), {{"x", random_tensor({2, 5, 9, 9}, 9)}}, options());
}

TEST_P(CudaScheduleTest, GemmWithTransposedWeightAndBiasMatchesReference) {
  GraphBuilder b;
  const int x = b.input("x", {5, 37});
  const int w = b.constant("w", pruned_tensor({19, 37}, 10, 0.9));
  const int c = b.constant("c", random_tensor({19}, 11));
  const int y =
      b.node("Gemm", {x, w, c}, {{"transB", int64_t{1}}, {"alpha", 0.5f}, {"beta", 2.0f}});
  expect_matches_reference(b.finish({b.node("Relu", {y})}), {{"x", random_tensor({5, 37}, 12)}},
                           options());
}

// A transformer block's shapes: linear layers with bias (and GELU), attention as batched
// MatMul over heads with a transpose, softmax, a residual and LayerNorm.
TEST_P(CudaScheduleTest, AttentionBlockMatchesReference) {
  constexpr int64_t kTokens = 12, kModel = 32, kHeads = 4, kHead = kModel / kHeads;
  GraphBuilder b;
  const int x = b.input("x", {2, kTokens, kModel});
  auto linear = [&](int in, int64_t out_features, uint32_t seed) {
    const int w =
        b.constant("w" + std::to_string(seed), pruned_tensor({kModel, out_features}, seed, 0.9));
    const int bias =
        b.constant("b" + std::to_string(seed), random_tensor({out_features}, seed + 1));
    return b.node("Add", {b.node("MatMul", {in, w}), bias});
  };
  auto heads = [&](int v, std::vector<int64_t> perm) {
    const int shape = b.constant("s" + std::to_string(v), [&] {
      Tensor t = Tensor::zeros(DType::kInt64, {4});
      const int64_t dims[] = {2, kTokens, kHeads, kHead};
      std::copy(dims, dims + 4, t.data<int64_t>());
      return t;
    }());
    return b.node("Transpose", {b.node("Reshape", {v, shape})}, {{"perm", perm}});
  };
  const int q = heads(linear(x, kModel, 20), {0, 2, 1, 3});
  const int k = heads(linear(x, kModel, 22), {0, 2, 3, 1});
  const int v = heads(linear(x, kModel, 24), {0, 2, 1, 3});
  const int scores =
      b.node("Div", {b.node("MatMul", {q, k}), b.constant("d", testing::scalar(3.0f))});
  const int context = b.node("MatMul", {b.node("Softmax", {scores}, {{"axis", int64_t{-1}}}), v});
  const int merged_shape = b.constant("merged", [&] {
    Tensor t = Tensor::zeros(DType::kInt64, {3});
    const int64_t dims[] = {2, kTokens, kModel};
    std::copy(dims, dims + 3, t.data<int64_t>());
    return t;
  }());
  const int merged = b.node(
      "Reshape",
      {b.node("Transpose", {context}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}}), merged_shape});
  const int residual = b.node("Add", {linear(merged, kModel, 26), x});
  const int norm = b.node("LayerNormalization",
                          {residual, b.constant("gamma", random_tensor({kModel}, 28)),
                           b.constant("beta", random_tensor({kModel}, 29))},
                          {{"axis", int64_t{-1}}, {"epsilon", 1e-5f}});
  // GELU, erf form, as PyTorch exports it: x * 0.5 * (1 + erf(x / sqrt 2)).
  const int h = linear(norm, kModel, 30);
  const int erf =
      b.node("Erf", {b.node("Div", {h, b.constant("sqrt2", testing::scalar(1.4142135f))})});
  const int gelu = b.node("Mul", {b.node("Mul", {h, b.constant("half", testing::scalar(0.5f))}),
                                  b.node("Add", {erf, b.constant("one", testing::scalar(1.0f))})});
  expect_matches_reference(b.finish({gelu}), {{"x", random_tensor({2, kTokens, kModel}, 31)}},
                           options());
}

TEST_P(CudaScheduleTest, ConcatBroadcastAndHostFallbackMatchReference) {
  GraphBuilder b;
  const int x = b.input("x", {2, 3, 4, 5});
  const int row = b.constant("row", random_tensor({5}, 40));
  const int sum = b.node("Add", {x, row});
  const int floor = b.node("Floor", {b.node("Mul", {sum, b.constant("k", testing::scalar(4.0f))})});
  const int cat = b.node("Concat", {sum, floor, x}, {{"axis", int64_t{1}}});
  const int y =
      b.node("Sigmoid", {b.node("Max", {cat, b.constant("zero", testing::scalar(0.1f))})});
  const std::vector<LayerInfo> layers =
      expect_matches_reference(b.finish({y}), {{"x", random_tensor({2, 3, 4, 5}, 41)}}, options());
  EXPECT_TRUE(any_layer_uses(layers, "host reference")) << "Floor has no device kernel";
}

TEST_P(CudaScheduleTest, CudaGraphReplayMatchesReference) {
  GraphBuilder b;
  const int x = b.input("x", {1, 8, 6, 6});
  const int w = b.constant("w", pruned_tensor({8, 8, 3, 3}, 50, 0.9));
  const int y = b.node("Relu", {b.node("Conv", {x, w}, conv_attrs({1, 1, 1, 1}))});
  const int z = b.node("Floor", {y});  // a host fallback inside the captured graph
  Options o = options();
  o.cuda_graphs = true;
  expect_matches_reference(b.finish({z}), {{"x", random_tensor({1, 8, 6, 6}, 51)}}, o, 1e-4f,
                           /*runs=*/3);
}

TEST_P(CudaScheduleTest, Tf32StaysWithinItsTolerance) {
  GraphBuilder b;
  const int x = b.input("x", {4, 64});
  const int w = b.constant("w", random_tensor({64, 48}, 60));
  Options o = options();
  o.gpu_precision = GpuPrecision::kTf32;
  expect_matches_reference(b.finish({b.node("MatMul", {x, w})}),
                           {{"x", random_tensor({4, 64}, 61)}}, o, 2e-2f);
}

INSTANTIATE_TEST_SUITE_P(Schedules, CudaScheduleTest,
                         ::testing::Values(Schedule::kCuda, Schedule::kCudaSparse),
                         [](const ::testing::TestParamInfo<Schedule>& info) {
                           return info.param == Schedule::kCuda ? "cuda" : "cuda_sparse";
                         });

// ---- whole models ----

struct ModelCase {
  const char* model;
  Schedule schedule;
};

class CudaModelTest : public ::testing::TestWithParam<ModelCase> {};

TEST_P(CudaModelTest, MatchesReferenceExecutor) {
  SKIP_WITHOUT_CUDA();
  // SPARSECOL_MODEL_DIR in the environment points a packed build (tools/pack_for_device.sh) at
  // the models on the machine it runs on.
  const char* env_dir = std::getenv("SPARSECOL_MODEL_DIR");
  const std::string dir = env_dir != nullptr ? env_dir : SPARSECOL_MODEL_DIR;
  const std::string name = GetParam().model;
  const std::string path = dir + "/" + name + ".onnx";
  // Pruned models share the dense model's input.
  const std::string base = name.substr(0, name.find("_s"));
  const std::string input = dir + "/" + base + ".input.npy";
  if (!std::filesystem::exists(path) || !std::filesystem::exists(input)) {
    GTEST_SKIP() << path << " or " << input << " not exported (ctest -R export_models)";
  }
  Options reference_options;
  reference_options.schedule = Schedule::kReference;
  Engine reference = Engine::load(path, reference_options);
  Options cuda_options;
  cuda_options.schedule = GetParam().schedule;
  Engine cuda = Engine::load(path, cuda_options);
  const NamedTensors inputs = {{reference.inputs().at(0).name, read_npy(input)}};
  const NamedTensors expected = reference.session().run(inputs);
  const NamedTensors actual = cuda.session().run(inputs);
  EXPECT_TRUE(testing::outputs_near(actual, expected, 1e-3f)) << name;
}

INSTANTIATE_TEST_SUITE_P(Models, CudaModelTest,
                         ::testing::Values(ModelCase{"small_cnn", Schedule::kCuda},
                                           ModelCase{"resnet50", Schedule::kCuda},
                                           ModelCase{"resnet50", Schedule::kCudaSparse},
                                           ModelCase{"resnet50_s90", Schedule::kCuda},
                                           ModelCase{"resnet50_s90", Schedule::kCudaSparse},
                                           ModelCase{"mobilenet_v2", Schedule::kCuda},
                                           ModelCase{"bert", Schedule::kCuda},
                                           ModelCase{"bert_s90", Schedule::kCuda},
                                           ModelCase{"bert_s90", Schedule::kCudaSparse}),
                         [](const ::testing::TestParamInfo<ModelCase>& info) {
                           return std::string(info.param.model) +
                                  (info.param.schedule == Schedule::kCuda ? "_cuda"
                                                                          : "_cuda_sparse");
                         });

// ---- runs everywhere ----

// Through the public API, as a user meets it: loading works anywhere (the executor is made at
// the first run); running fails with Error(kUnsupported, "no CUDA device: ...") on a machine
// without one, and gives the reference's result on a machine with one.
TEST(CudaAvailability, RunFailsWithTheReasonOrMatchesReference) {
  onnx::ModelProto model = testing::make_model();
  testing::add_input(model, "x", {int64_t{2}, int64_t{3}});
  testing::add_node(model, "Relu", {"x"}, {"y"}, "relu");
  testing::add_output(model, "y", {int64_t{2}, int64_t{3}});
  testing::TempDir dir;
  const std::string path = dir.write("relu.onnx", model.SerializeAsString());
  Options options;
  options.schedule = Schedule::kCuda;
  Engine engine = Engine::load(path, options);
  Session session = engine.session();
  const Tensor x = random_tensor({2, 3}, 70);
  const std::string reason = runtime::cuda_unavailable_reason();
  if (!reason.empty()) {
    EXPECT_EQ(reason.rfind("no CUDA device: ", 0), 0u) << reason;
    try {
      session.run({{"x", x}});
      ADD_FAILURE() << "run without a CUDA device did not throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
      EXPECT_EQ(std::string(e.what()), reason);
    }
    return;
  }
  const NamedTensors out = session.run({{"x", x}});
  for (int64_t i = 0; i < x.numel(); ++i) {
    EXPECT_EQ(out.at("y").data<float>()[i], std::max(0.0f, x.data<float>()[i]));
  }
}

// cuBLASLt and cuSPARSE are opened at run time (cuda_libraries.h): every function the backend
// calls must resolve in the toolkit this was built against, GPU or not.
TEST(CudaLibraries, EveryFunctionResolves) {
  EXPECT_EQ(cuda::libraries_problem(), "");
  EXPECT_NE(cuda::libraries().cublasLtMatmul, nullptr);
  EXPECT_NE(cuda::libraries().cusparseSpMM, nullptr);
}

}  // namespace
}  // namespace sparsecol
