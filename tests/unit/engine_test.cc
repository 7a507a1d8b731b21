// The public API end to end on a small hand-made model: results, input checks, threads.
#include <thread>

#include <gtest/gtest.h>

#include "graph_builder.h"
#include "sparsecol/sparsecol.h"
#include "test_models.h"

namespace sparsecol::testing {
namespace {

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override { path_ = dir_.write("mlp.onnx", serialize(make_mlp_model())); }

  // What make_mlp_model computes: relu(x W + b), W[4,3] = 0.1 * (i + 1), b = {-1, 0, 1}.
  static std::vector<float> expected(const Tensor& x) {
    const int64_t rows = x.dim(0);
    std::vector<float> y(static_cast<std::size_t>(rows * 3));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < 3; ++j) {
        double acc = j - 1.0;
        for (int64_t k = 0; k < 4; ++k) acc += x.data<float>()[r * 4 + k] * 0.1 * (k * 3 + j + 1);
        y[static_cast<std::size_t>(r * 3 + j)] = static_cast<float>(std::max(acc, 0.0));
      }
    }
    return y;
  }

  static void expect_error(const std::function<void()>& f, ErrorCode code,
                           std::vector<std::string> fragments) {
    try {
      f();
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      for (const std::string& s : fragments) {
        EXPECT_NE(std::string(e.what()).find(s), std::string::npos)
            << "'" << s << "' not in: " << e.what();
      }
    }
  }

  TempDir dir_;
  std::string path_;
};

TEST_F(EngineTest, RunsAndMatchesTheModelsMathAtSeveralBatchSizes) {
  const Engine engine = Engine::load(path_);
  Session session = engine.session();
  for (int64_t batch : {1, 5, 2, 5}) {
    const Tensor x = random_tensor({batch, 4}, static_cast<uint32_t>(batch), -3.0f, 3.0f);
    const NamedTensors out = session.run({{"x", x}});
    const Tensor& y = out.at("y");
    ASSERT_EQ(y.shape(), (std::vector<int64_t>{batch, 3}));
    const std::vector<float> want = expected(x);
    for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(y.data<float>()[i], want[i], 1e-5f);
  }
}

TEST_F(EngineTest, ReportsSymbolicBatchInInputInfo) {
  const Engine engine = Engine::load(path_);
  ASSERT_EQ(engine.inputs().size(), 1u);
  EXPECT_EQ(engine.inputs()[0].name, "x");
  EXPECT_EQ(engine.inputs()[0].shape, (std::vector<int64_t>{-1, 4}));
  EXPECT_EQ(engine.inputs()[0].dim_names[0], "batch");
  EXPECT_NE(engine.describe().find("MatMul"), std::string::npos);
}

TEST_F(EngineTest, WrongDtypeNamesInputExpectedAndActual) {
  const Engine engine = Engine::load(path_);
  Session session = engine.session();
  Tensor x = Tensor::zeros(DType::kInt32, {2, 4});
  expect_error(
      [&] {
        session.run({{"x", x}});
      },
      ErrorCode::kDtypeMismatch, {"'x'", "float32", "int32", "mlp.onnx"});
}

TEST_F(EngineTest, WrongShapeNamesInputExpectedAndActual) {
  const Engine engine = Engine::load(path_);
  Session session = engine.session();
  expect_error(
      [&] {
        session.run({{"x", random_tensor({2, 5}, 1)}});
      },
      ErrorCode::kShapeMismatch, {"'x'", "[batch, 4]", "[2, 5]"});
  expect_error(
      [&] {
        session.run({{"x", random_tensor({8}, 1)}});
      },
      ErrorCode::kShapeMismatch, {"'x'", "[8]"});
}

TEST_F(EngineTest, MissingAndUnknownInputsAreRefusedWithTheInputList) {
  const Engine engine = Engine::load(path_);
  Session session = engine.session();
  expect_error([&] { session.run({}); }, ErrorCode::kInvalidArgument, {"'x'", "missing"});
  expect_error(
      [&] {
        session.run({{"x", random_tensor({1, 4}, 1)}, {"z", random_tensor({1}, 1)}});
      },
      ErrorCode::kInvalidArgument, {"'z'", "inputs: x"});
}

TEST_F(EngineTest, MissingFileIsNotFound) {
  expect_error([&] { Engine::load(dir_.file("nope.onnx")); }, ErrorCode::kNotFound, {"nope.onnx"});
}

TEST_F(EngineTest, ScheduleNamesParseAndUnknownOnesListTheChoices) {
  for (Schedule s : {Schedule::kReference, Schedule::kLayerWise, Schedule::kOneDnn}) {
    EXPECT_EQ(parse_schedule(to_string(s)), s);
  }
  EXPECT_EQ(parse_schedule("layerwise"), Schedule::kLayerWise);
  expect_error([] { parse_schedule("fastest"); }, ErrorCode::kInvalidArgument,
               {"'fastest'", "reference"});
}

// One Engine shared by threads, each with its own Session, each on its own inputs.
TEST_F(EngineTest, SessionsOnManyThreadsMatchSingleThreadedResults) {
  const Engine engine = Engine::load(path_);
  constexpr int kThreads = 4, kRuns = 25;
  std::vector<std::vector<Tensor>> inputs(kThreads), single(kThreads), threaded(kThreads);
  Session reference = engine.session();
  for (int t = 0; t < kThreads; ++t) {
    for (int r = 0; r < kRuns; ++r) {
      inputs[t].push_back(
          random_tensor({1 + r % 3, 4}, static_cast<uint32_t>(t * 1000 + r), -2, 2));
      single[t].push_back(reference.run({{"x", inputs[t].back()}}).at("y"));
    }
  }
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t) {
    pool.emplace_back([&, t] {
      Session session = engine.session();
      for (int r = 0; r < kRuns; ++r)
        threaded[t].push_back(session.run({{"x", inputs[t][r]}}).at("y"));
    });
  }
  for (std::thread& th : pool) th.join();
  for (int t = 0; t < kThreads; ++t) {
    for (int r = 0; r < kRuns; ++r) EXPECT_EQ(max_abs_diff(single[t][r], threaded[t][r]), 0.0f);
  }
}

}  // namespace
}  // namespace sparsecol::testing
