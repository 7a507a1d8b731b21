// One Engine shared by 8 threads, each with its own Session, 200 runs each on inputs of its own
// (three batch sizes, so that each Session also builds and caches several executors while the
// others run): every output must equal, bit for bit, what one thread computes alone. Run on a
// small hand-made CNN (Conv + BatchNormalization + Relu, a residual block, global pooling and a
// Gemm: every load-time pass has something to do) with each CPU schedule that has its own threads
// or state (reference, layerwise, depthwise; oneDNN's internals are not instrumented for TSan).
//
// The TSan build of .ci/run runs these tests: a data race in the Engine, the Session or the
// executors shows up there even when the outputs happen to agree. Also here: the cores' round
// trip probe (two threads handing one cache line back and forth).
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/topology.h"
#include "sparsecol/sparsecol.h"
#include "test_models.h"

namespace sparsecol::testing {
namespace {

// Two cores hand a line back and forth in tens to hundreds of ns, within the probe's time limit;
// a core with itself, or one the machine lacks, has no round trip. A probe that finds one of
// the cores busy with another process (ctest runs tests side by side; a fuzzer beside the tests
// made one probe in two fail) gives up after 50 ms by design, so the pair must be measured by
// at least 3 of up to 30 probes.
TEST(CoreRoundTrip, IsMeasuredBetweenTwoCoresOnly) {
  const int cores = runtime::machine_topology().physical_cores;
  EXPECT_FALSE(runtime::core_round_trip_ns(0, 0));
  EXPECT_FALSE(runtime::core_round_trip_ns(0, cores));
  EXPECT_FALSE(runtime::core_round_trip_ns(-1, 0));
  if (cores < 2) GTEST_SKIP() << "one core: no pair to measure";
  int measured = 0;
  for (int probe = 0; probe < 30 && measured < 3; ++probe) {
    const std::optional<double> ns = runtime::core_round_trip_ns(0, 1);
    if (!ns) continue;
    ++measured;
    EXPECT_GT(*ns, 1.0);
    EXPECT_LT(*ns, 1e6);
  }
  EXPECT_EQ(measured, 3) << "cores 0 and 1 measured by " << measured << " of 30 probes";
}

constexpr int kThreads = 8;
constexpr int kRuns = 200;
constexpr int64_t kChannels = 3, kSize = 10, kFeatures = 8, kClasses = 5;

std::vector<float> ramp(std::size_t count, float scale, int period) {
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i) {
    values[i] = scale * static_cast<float>(static_cast<int>(i % static_cast<std::size_t>(period)) -
                                           period / 2);
  }
  return values;
}

// x[N, 3, 10, 10] -> Conv 3x3 pad 1 (8 filters, bias) -> BatchNormalization -> Relu = a
//   -> Conv 3x3 pad 1 -> Add a -> Relu -> Conv 3x3 stride 2 pad 1 -> Relu
//   -> GlobalAveragePool -> Flatten -> Gemm (5 classes) -> y[N, 5]
onnx::ModelProto small_cnn() {
  onnx::ModelProto model = make_model();
  add_input(model, "x", {"N", kChannels, kSize, kSize});
  const auto conv = [&](const std::string& in, const std::string& out, int64_t in_channels,
                        int64_t stride) {
    const std::string w = out + "_w", b = out + "_b";
    add_initializer(
        model,
        make_float_tensor(w, {kFeatures, in_channels, 3, 3},
                          ramp(static_cast<std::size_t>(kFeatures * in_channels * 9), 0.02f, 7)));
    add_initializer(model, make_float_tensor(b, {kFeatures}, ramp(kFeatures, 0.05f, 5)));
    onnx::NodeProto& node = add_node(model, "Conv", {in, w, b}, {out}, out);
    set_attr(node, "kernel_shape", std::vector<int64_t>{3, 3});
    set_attr(node, "pads", std::vector<int64_t>{1, 1, 1, 1});
    set_attr(node, "strides", std::vector<int64_t>{stride, stride});
  };
  conv("x", "c1", kChannels, 1);
  add_initializer(model, make_float_tensor("bn_scale", {kFeatures}, ramp(kFeatures, 0.1f, 3)));
  add_initializer(model, make_float_tensor("bn_bias", {kFeatures}, ramp(kFeatures, 0.02f, 4)));
  add_initializer(model, make_float_tensor("bn_mean", {kFeatures}, ramp(kFeatures, 0.01f, 6)));
  std::vector<float> variance(kFeatures, 0.5f);
  add_initializer(model, make_float_tensor("bn_var", {kFeatures}, variance));
  add_node(model, "BatchNormalization", {"c1", "bn_scale", "bn_bias", "bn_mean", "bn_var"}, {"bn"},
           "bn");
  add_node(model, "Relu", {"bn"}, {"a"}, "relu1");
  conv("a", "c2", kFeatures, 1);
  add_node(model, "Add", {"c2", "a"}, {"res"}, "residual");
  add_node(model, "Relu", {"res"}, {"r2"}, "relu2");
  conv("r2", "c3", kFeatures, 2);
  add_node(model, "Relu", {"c3"}, {"r3"}, "relu3");
  add_node(model, "GlobalAveragePool", {"r3"}, {"pool"}, "pool");
  add_node(model, "Flatten", {"pool"}, {"flat"}, "flatten");
  add_initializer(
      model, make_float_tensor("fc_w", {kClasses, kFeatures}, ramp(kClasses * kFeatures, 0.1f, 9)));
  add_initializer(model, make_float_tensor("fc_b", {kClasses}, ramp(kClasses, 0.1f, 3)));
  set_attr(add_node(model, "Gemm", {"flat", "fc_w", "fc_b"}, {"y"}, "fc"), "transB", int64_t{1});
  add_output(model, "y", {"N", kClasses});
  return model;
}

Tensor input(int thread, int run) {
  const int64_t batch = 1 + (thread + run) % 3;
  Tensor x = Tensor::zeros(DType::kFloat32, {batch, kChannels, kSize, kSize});
  uint32_t state = static_cast<uint32_t>(thread * 100003 + run * 7919 + 1);
  float* p = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    state = state * 1664525u + 1013904223u;
    p[i] = static_cast<float>(state >> 8) / 16777216.0f * 4.0f - 2.0f;
  }
  return x;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

class ConcurrencyTest : public ::testing::TestWithParam<Schedule> {};

TEST_P(ConcurrencyTest, EightSessionsOnOneEngineMatchSingleThreadedResults) {
  TempDir dir;
  Options options;
  options.schedule = GetParam();
  options.threads = 2;  // each Session's own kernel threads, on top of the 8 callers
  const Engine engine = Engine::load(dir.write("cnn.onnx", serialize(small_cnn())), options);

  std::vector<std::vector<Tensor>> inputs(kThreads), expected(kThreads), actual(kThreads);
  {
    Session alone = engine.session();
    for (int t = 0; t < kThreads; ++t) {
      for (int r = 0; r < kRuns; ++r) {
        inputs[t].push_back(input(t, r));
        expected[t].push_back(alone.run({{"x", inputs[t].back()}}).at("y"));
      }
    }
  }
  std::vector<std::string> failures(kThreads);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t) {
    pool.emplace_back([&, t] {
      try {
        Session session = engine.session();
        for (int r = 0; r < kRuns; ++r) {
          actual[t].push_back(session.run({{"x", inputs[t][r]}}).at("y"));
        }
      } catch (const std::exception& e) {
        failures[t] = e.what();
      }
    });
  }
  for (std::thread& thread : pool) thread.join();

  int mismatches = 0;
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(failures[t], "") << "thread " << t;
    ASSERT_EQ(actual[t].size(), static_cast<std::size_t>(kRuns)) << "thread " << t;
    for (int r = 0; r < kRuns; ++r) {
      if (!bitwise_equal(actual[t][r], expected[t][r])) {
        if (++mismatches <= 5) ADD_FAILURE() << "thread " << t << " run " << r << " differs";
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << kThreads * kRuns << " runs";
  // Inputs differ, so outputs must too: equal outputs everywhere would make the check vacuous.
  EXPECT_FALSE(bitwise_equal(expected[0][0], expected[0][3]));  // both batch 1
}

INSTANTIATE_TEST_SUITE_P(Schedules, ConcurrencyTest,
                         ::testing::Values(Schedule::kReference, Schedule::kLayerWise,
                                           Schedule::kDepthWise),
                         [](const ::testing::TestParamInfo<Schedule>& info) {
                           return std::string(to_string(info.param));
                         });

}  // namespace
}  // namespace sparsecol::testing
