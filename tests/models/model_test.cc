// Whole models exported by PyTorch (tests/models/export_models.py, run by ctest's export_models
// fixture) run through the engine and match PyTorch's outputs.
//
// Tolerance: max |engine - pytorch| <= 1e-4 * max |pytorch output|, over the whole output. Both
// sides compute in float32 but sum in different orders, so errors grow with depth: a relative
// bound on the largest element keeps one rule for small logits and large BERT activations.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <string>

#include <fmt/format.h>

#include "../test_util.h"
#include "sparsecol/io.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol {
namespace {

constexpr double kRelativeTolerance = 1e-4;
// Two different inputs must change the output by this many tolerances at least: a model whose
// output barely depends on its input (a washed-out random network, see DESIGN.md) would pass a
// comparison with PyTorch trivially.
constexpr double kMinInputEffect = 100;

std::string model_file(const std::string& name, const std::string& suffix) {
  return (std::filesystem::path(SPARSECOL_MODEL_DIR) / (name + suffix)).string();
}

// The files the export script writes for one model; fails the test if any is missing.
struct ModelFiles {
  std::string onnx, input, output;
};

::testing::AssertionResult find_model_files(const std::string& name, ModelFiles* files) {
  *files = {model_file(name, ".onnx"), model_file(name, ".input.npy"),
            model_file(name, ".output.npy")};
  for (const std::string& path : {files->onnx, files->input, files->output}) {
    if (!std::filesystem::exists(path)) {
      return ::testing::AssertionFailure()
             << path << " does not exist: run the export fixture first (`ctest -R export_models`, "
             << "or `/usr/bin/python3 tests/models/export_models.py --out " << SPARSECOL_MODEL_DIR
             << "`)";
    }
  }
  return ::testing::AssertionSuccess();
}

Tensor run_model(const Engine& engine, const Tensor& input) {
  Session session = engine.session();
  NamedTensors outputs = session.run({{"input", input}});
  auto it = outputs.find("output");
  if (it == outputs.end()) throw Error(ErrorCode::kInternal, "the model returned no 'output'");
  return it->second;
}

// Loading and running a large model with the reference kernels takes a while: each test
// process does it once per model (ctest runs every test in its own process anyway).
struct ModelRun {
  Engine engine;
  Tensor input, expected, actual;
};

const ModelRun& model_run(const std::string& name, const ModelFiles& files) {
  static std::map<std::string, ModelRun> runs;
  auto it = runs.find(name);
  if (it == runs.end()) {
    Engine engine = Engine::load(files.onnx);
    Tensor input = read_npy(files.input);
    Tensor expected = read_npy(files.output);
    Tensor actual = run_model(engine, input);
    it = runs.emplace(name, ModelRun{std::move(engine), input, expected, actual}).first;
  }
  return it->second;
}

class ModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { ASSERT_TRUE(find_model_files(GetParam(), &files_)); }
  ModelFiles files_;
};

TEST_P(ModelTest, MatchesPyTorch) {
  const ModelRun& run = model_run(GetParam(), files_);
  const test::TensorDiff diff = test::diff_tensors(run.actual, run.expected, 0, 0);
  const double tolerance = kRelativeTolerance * diff.max_abs_expected;
  std::cout << fmt::format("{}: output {}, {} (tolerance: max abs err <= {:.3g} = {} * max|ref|)\n",
                           GetParam(), test::shape_string(run.actual.shape()),
                           test::describe_errors(diff), tolerance, kRelativeTolerance);
  RecordProperty("max_abs_err", fmt::format("{:.3g}", diff.max_abs_err));
  EXPECT_TRUE(test::tensors_near(run.actual, run.expected, 0, tolerance));
}

TEST_P(ModelTest, BatchOfOneEqualsFirstRowOfBatch) {
  const ModelRun& run = model_run(GetParam(), files_);
  ASSERT_GE(run.input.dim(0), 2) << "the export script saves a batch of at least 2";
  const Tensor single = run_model(run.engine, test::slice_batch(run.input, 0, 1));
  const Tensor row = test::slice_batch(run.actual, 0, 1);
  // Each sample's arithmetic is the same whatever the batch, up to summation order in kernels
  // that block over the batch: far tighter than the PyTorch tolerance.
  const double tolerance = 1e-6 * test::diff_tensors(row, row, 0, 0).max_abs_expected;
  EXPECT_TRUE(test::tensors_near(single, row, 0, tolerance));
}

// Guards the comparison itself: PyTorch's outputs for the two saved samples must differ by far
// more than the tolerance, or a constant output would match.
TEST_P(ModelTest, OutputDependsOnInput) {
  const Tensor expected = read_npy(files_.output);
  ASSERT_GE(expected.dim(0), 2) << "the export script saves a batch of at least 2";
  const test::TensorDiff diff = test::diff_tensors(test::slice_batch(expected, 0, 1),
                                                   test::slice_batch(expected, 1, 1), 0, 0);
  const double tolerance = kRelativeTolerance * diff.max_abs_expected;
  std::cout << fmt::format("{}: samples 0 and 1 differ by up to {:.3g} ({:.0f} tolerances)\n",
                           GetParam(), diff.max_abs_err, diff.max_abs_err / tolerance);
  EXPECT_GT(diff.max_abs_err, kMinInputEffect * tolerance)
      << "the output barely depends on the input: re-check the export's random weights";
}

INSTANTIATE_TEST_SUITE_P(Models, ModelTest,
                         ::testing::Values("small_cnn", "resnet50", "mobilenet_v2", "bert"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace sparsecol
