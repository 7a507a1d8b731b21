// Whole models exported by PyTorch (tests/models/export_models.py, run by ctest's export_models
// fixture) run through the engine on every schedule (reference, layerwise, onednn) and match
// PyTorch's outputs and the reference schedule's.
//
// Tolerance: max |engine - pytorch| <= 1e-4 * max |pytorch output|, over the whole output. Both
// sides compute in float32 but sum in different orders, so errors grow with depth: a relative
// bound on the largest element keeps one rule for small logits and large BERT activations.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

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

// The thread count of the main runs; ThreadCountDoesNotChangeOutput tries others.
constexpr int kThreads = 2;

// Loading and running a large model with the reference kernels takes a while: each test
// process does it once per model and schedule (ctest runs every test in its own process
// anyway). A schedule that cannot run the model (kUnsupported, say) throws here, which fails
// the test: an unbuilt schedule is a failure, never a skip.
struct ModelRun {
  Engine engine;
  Tensor input, expected, actual;
};

const ModelRun& model_run(const std::string& name, const ModelFiles& files, Schedule schedule,
                          int threads = kThreads) {
  static std::map<std::tuple<std::string, Schedule, int>, ModelRun> runs;
  const auto key = std::make_tuple(name, schedule, threads);
  auto it = runs.find(key);
  if (it == runs.end()) {
    Options options;
    options.schedule = schedule;
    options.threads = threads;
    Engine engine = Engine::load(files.onnx, options);
    Tensor input = read_npy(files.input);
    Tensor expected = read_npy(files.output);
    Tensor actual = run_model(engine, input);
    it = runs.emplace(key, ModelRun{std::move(engine), input, expected, actual}).first;
  }
  return it->second;
}

struct ModelCase {
  std::string model;
  Schedule schedule;
  friend void PrintTo(const ModelCase& c, std::ostream* os) {  // readable names in test logs
    *os << c.model << " on " << to_string(c.schedule);
  }
};

class ModelTest : public ::testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override { ASSERT_TRUE(find_model_files(model(), &files_)); }
  const std::string& model() const { return GetParam().model; }
  Schedule schedule() const { return GetParam().schedule; }
  const ModelRun& run(int threads = kThreads) const {
    return model_run(model(), files_, schedule(), threads);
  }
  ModelFiles files_;
};

TEST_P(ModelTest, MatchesPyTorch) {
  const ModelRun& r = run();
  const test::TensorDiff diff = test::diff_tensors(r.actual, r.expected, 0, 0);
  const double tolerance = kRelativeTolerance * diff.max_abs_expected;
  std::cout << fmt::format(
      "{} ({}): output {}, {} (tolerance: max abs err <= {:.3g} = {} * max|ref|)\n", model(),
      to_string(schedule()), test::shape_string(r.actual.shape()), test::describe_errors(diff),
      tolerance, kRelativeTolerance);
  RecordProperty("max_abs_err", fmt::format("{:.3g}", diff.max_abs_err));
  EXPECT_TRUE(test::tensors_near(r.actual, r.expected, 0, tolerance));
}

// Every schedule against the oracle, with PyTorch's tolerance: the schedules must agree with
// each other, not only each with PyTorch.
TEST_P(ModelTest, MatchesReferenceSchedule) {
  const ModelRun& r = run();
  const ModelRun& oracle = model_run(model(), files_, Schedule::kReference);
  const test::TensorDiff diff = test::diff_tensors(r.actual, oracle.actual, 0, 0);
  const double tolerance = kRelativeTolerance * diff.max_abs_expected;
  std::cout << fmt::format("{} ({} vs reference): {}\n", model(), to_string(schedule()),
                           test::describe_errors(diff));
  EXPECT_TRUE(test::tensors_near(r.actual, oracle.actual, 0, tolerance));
}

TEST_P(ModelTest, BatchOfOneEqualsFirstRowOfBatch) {
  const ModelRun& r = run();
  ASSERT_GE(r.input.dim(0), 2) << "the export script saves a batch of at least 2";
  const Tensor single = run_model(r.engine, test::slice_batch(r.input, 0, 1));
  const Tensor row = test::slice_batch(r.actual, 0, 1);
  // Each sample's arithmetic is the same whatever the batch, up to summation order in kernels
  // that block over the batch: far tighter than the PyTorch tolerance.
  const double tolerance = 1e-6 * test::diff_tensors(row, row, 0, 0).max_abs_expected;
  EXPECT_TRUE(test::tensors_near(single, row, 0, tolerance));
}

// DESIGN.md: results do not change with the thread count. Each output element is computed by
// one thread in a fixed order, so up to rounding in libraries that re-block per thread count.
// Instantiated for the multi-threaded schedules only (the reference schedule is serial).
class ParallelModelTest : public ModelTest {};

TEST_P(ParallelModelTest, ThreadCountDoesNotChangeOutput) {
  const ModelRun& base = run();
  for (int threads : {1, 3}) {
    const Tensor& actual = run(threads).actual;
    const double tolerance =
        1e-6 * test::diff_tensors(base.actual, base.actual, 0, 0).max_abs_expected;
    EXPECT_TRUE(test::tensors_near(actual, base.actual, 0, tolerance))
        << threads << " threads vs " << kThreads;
  }
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
                           model(), diff.max_abs_err, diff.max_abs_err / tolerance);
  EXPECT_GT(diff.max_abs_err, kMinInputEffect * tolerance)
      << "the output barely depends on the input: re-check the export's random weights";
}

std::vector<ModelCase> all_cases() {
  std::vector<ModelCase> cases;
  for (const char* model : {"small_cnn", "resnet50", "mobilenet_v2", "bert"}) {
    for (Schedule s : {Schedule::kReference, Schedule::kLayerWise, Schedule::kOneDnn}) {
      cases.push_back({model, s});
    }
  }
  return cases;
}

std::string case_name(const ::testing::TestParamInfo<ModelCase>& info) {
  return info.param.model + "_" + to_string(info.param.schedule);
}

std::vector<ModelCase> parallel_cases() {
  std::vector<ModelCase> cases;
  for (const ModelCase& c : all_cases()) {
    if (c.schedule != Schedule::kReference) cases.push_back(c);
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Models, ModelTest, ::testing::ValuesIn(all_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Models, ParallelModelTest, ::testing::ValuesIn(parallel_cases()),
                         case_name);

}  // namespace
}  // namespace sparsecol
