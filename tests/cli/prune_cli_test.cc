// `sparsecol prune` and `sparsecol inspect` end to end: the built binary on a small model made
// here, its exit codes (0 ok, 1 usage, 2 model or file error), its tables and --help.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli_util.h"
#include "test_models.h"

namespace sparsecol {
namespace {

using testing::CliResult;
using testing::contains;

std::vector<float> random_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0F, 1.0F);
  std::vector<float> values(static_cast<std::size_t>(n));
  for (float& v : values) v = dist(rng);
  return values;
}

// x[N, 3, 8, 8] -> Conv stem -> Conv pw (1x1) -> GlobalAveragePool -> Flatten -> MatMul proj ->
// y[N, 10].
std::string small_model() {
  onnx::ModelProto model = testing::make_model();
  testing::add_input(model, "x", {"N", 3, 8, 8});
  testing::add_initializer(
      model, testing::make_float_tensor("stem.w", {8, 3, 3, 3}, random_values(216, 1)));
  testing::add_initializer(
      model, testing::make_float_tensor("pw.w", {16, 8, 1, 1}, random_values(128, 2)));
  testing::add_initializer(model,
                           testing::make_float_tensor("proj.w", {16, 10}, random_values(160, 3)));
  testing::add_node(model, "Conv", {"x", "stem.w"}, {"s"}, "stem");
  testing::add_node(model, "Conv", {"s", "pw.w"}, {"p"}, "pw");
  testing::add_node(model, "GlobalAveragePool", {"p"}, {"g"}, "pool");
  testing::add_node(model, "Flatten", {"g"}, {"f"}, "flatten");
  testing::add_node(model, "MatMul", {"f", "proj.w"}, {"y"}, "proj");
  testing::add_output(model, "y", {"N", 10});
  return testing::serialize(model);
}

class PruneCliTest : public ::testing::Test {
 protected:
  void SetUp() override { model_ = dir_.write("model.onnx", small_model()); }
  CliResult cli(const std::string& args) {
    return sparsecol::testing::run_cli(args, dir_.path().string());
  }
  std::string path(const std::string& name) const { return dir_.file(name); }
  // A failure prints exactly one line, on stderr.
  static void expect_one_error_line(const CliResult& r) {
    EXPECT_TRUE(r.err.starts_with("sparsecol: error: ")) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  sparsecol::testing::TempDir dir_;
  std::string model_;
};

TEST_F(PruneCliTest, HelpListsEveryOptionWithItsDefault) {
  const CliResult help = cli("prune --help");
  ASSERT_EQ(help.code, 0) << help.err;
  for (const char* expected : {"MODEL", "OUT", "--sparsity", "--global", "--prune-first-conv",
                               "--prune-depthwise", "--exclude", "--min-size", "=0"}) {
    EXPECT_TRUE(contains(help.out, expected)) << expected << " missing from\n" << help.out;
  }
  const CliResult inspect = cli("inspect --help");
  ASSERT_EQ(inspect.code, 0) << inspect.err;
  for (const char* expected : {"MODEL", "--schedule", "=layerwise", "--batch", "=1", "--plan"}) {
    EXPECT_TRUE(contains(inspect.out, expected)) << expected << " missing from\n" << inspect.out;
  }
}

TEST_F(PruneCliTest, PrunesAndPrintsEveryLayer) {
  const std::string out = path("pruned.onnx");
  const CliResult r = cli(fmt::format("prune '{}' '{}' --sparsity 0.9", model_, out));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(std::filesystem::exists(out));
  EXPECT_TRUE(contains(r.out, "kept dense: first convolution")) << r.out;
  EXPECT_TRUE(contains(r.out, "[16, 8, 1, 1]")) << r.out;
  EXPECT_TRUE(contains(r.out, "90.0%")) << r.out;  // pw: 115 of 128 -> 89.8%, proj: 144 of 160
  EXPECT_TRUE(contains(r.out, "total: 3 layers (2 pruned, 1 kept dense), 504 weights")) << r.out;
  // 115 + 144 of 504 weights.
  EXPECT_TRUE(contains(r.out, "sparsity 0.0% -> 51.4%")) << r.out;

  // The pruned model loads, and inspect shows the sparsity it measures per layer.
  const CliResult inspect = cli(fmt::format("inspect '{}' --batch 4", out));
  ASSERT_EQ(inspect.code, 0) << inspect.err;
  EXPECT_TRUE(contains(inspect.out, "batch 4")) << inspect.out;
  EXPECT_TRUE(contains(inspect.out, "[4, 10]")) << inspect.out;
  EXPECT_TRUE(contains(inspect.out, "90.0%")) << inspect.out;
  EXPECT_TRUE(contains(inspect.out, "implementation")) << inspect.out;
}

TEST_F(PruneCliTest, GlobalFirstConvAndExclude) {
  const std::string out = path("pruned.onnx");
  const CliResult r = cli(fmt::format(
      "prune '{}' '{}' --sparsity 0.5 --global --prune-first-conv --exclude proj", model_, out));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "kept dense: excluded")) << r.out;
  EXPECT_FALSE(contains(r.out, "first convolution")) << r.out;
  // Globally over stem (216) and pw (128): 172 of 344 zero.
  EXPECT_TRUE(contains(r.out,
                       "total: 3 layers (2 pruned, 1 kept dense), 504 weights: sparsity "
                       "0.0% -> 34.1%"))
      << r.out;
}

TEST_F(PruneCliTest, UsageErrorsExitWithOne) {
  const std::string out = path("pruned.onnx");
  for (const std::string& args :
       {fmt::format("prune '{}' '{}'", model_, out),  // no --sparsity
        fmt::format("prune '{}' '{}' --sparsity 1", model_, out),
        fmt::format("prune '{}' '{}' --sparsity -0.5", model_, out),
        fmt::format("prune '{}' '{}' --sparsity lots", model_, out),
        fmt::format("prune '{}' --sparsity 0.5", model_),  // no OUT
        fmt::format("prune '{}' '{}' --sparsity 0.5 --min-size -1", model_, out),
        fmt::format("inspect '{}' --batch 0", model_),
        fmt::format("inspect '{}' --schedule fastest", model_)}) {
    const CliResult r = cli(args);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.err;
    EXPECT_FALSE(std::filesystem::exists(out)) << args;
  }
}

TEST_F(PruneCliTest, ModelAndFileErrorsExitWithTwo) {
  const std::string out = path("pruned.onnx");
  struct Case {
    std::string args, message;
  };
  for (const Case& c : std::vector<Case>{
           {fmt::format("prune '{}' '{}' --sparsity 0.5", path("absent.onnx"), out), "absent.onnx"},
           {fmt::format("prune '{}' '{}' --sparsity 0.5 --exclude nosuch", model_, out), "nosuch"},
           {fmt::format("prune '{}' '{}' --sparsity 0.5 --exclude stem,pw,proj", model_, out),
            "nothing to prune"},
           {fmt::format("prune '{}' '{}' --sparsity 0.5", model_, path("no/such/dir/o.onnx")),
            "no/such/dir"},
           {fmt::format("inspect '{}'", path("absent.onnx")), "absent.onnx"}}) {
    const CliResult r = cli(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.err;
    expect_one_error_line(r);
    EXPECT_TRUE(contains(r.err, c.message)) << r.err;
    EXPECT_FALSE(std::filesystem::exists(out)) << c.args;
  }
}

// The depth-wise planner may not exist yet: then --plan must fail cleanly (one error line, exit
// code 2) after the layer table; once it exists, the plan is printed.
TEST_F(PruneCliTest, InspectPlanPrintsThePlanOrOneCleanError) {
  const CliResult r = cli(fmt::format("inspect '{}' --plan", model_));
  EXPECT_TRUE(contains(r.out, "implementation")) << r.out;
  if (r.code == 2) {
    expect_one_error_line(r);
  } else {
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(contains(r.out, "depth-wise plan")) << r.out;
  }
}

// The engine settings a user may override reach the engine: the plan's budget, shared cache and
// tile height, and the threshold that decides which weights are packed sparse; bad values are
// usage errors.
TEST_F(PruneCliTest, InspectTakesTheEngineTuningFlags) {
  const CliResult plan =
      cli(fmt::format("inspect '{}' --plan --tile-rows 3 --cache-budget 256", model_));
  ASSERT_EQ(plan.code, 0) << plan.err;
  EXPECT_TRUE(contains(plan.out, "L2 budget 256.0 KiB per core")) << plan.out;
  EXPECT_TRUE(contains(plan.out, "tile height forced to 3 rows")) << plan.out;
  // The columns are measured against their ops whole unless --keep-tiles.
  const std::string measured = "where the first 10 runs measure that faster";
  EXPECT_TRUE(contains(plan.out, measured)) << plan.out;
  const CliResult kept =
      cli(fmt::format("inspect '{}' --plan --tile-rows 3 --cache-budget 256 --keep-tiles", model_));
  ASSERT_EQ(kept.code, 0) << kept.err;
  EXPECT_TRUE(contains(kept.out, "tile height forced to 3 rows")) << kept.out;
  EXPECT_FALSE(contains(kept.out, measured)) << kept.out;
  // Whatever tier the planner then picks, the plan names the L3 size it assumed.
  const CliResult shared = cli(fmt::format("inspect '{}' --plan --shared-cache 12345", model_));
  ASSERT_EQ(shared.code, 0) << shared.err;
  EXPECT_TRUE(contains(shared.out, "12.1 MiB")) << shared.out;
  const CliResult dense = cli(fmt::format("inspect '{}' --sparse-threshold 2", model_));
  const CliResult sparse = cli(fmt::format("inspect '{}' --sparse-threshold 0", model_));
  ASSERT_EQ(dense.code, 0) << dense.err;
  ASSERT_EQ(sparse.code, 0) << sparse.err;
  EXPECT_TRUE(contains(dense.out, "(0 in a sparse format)")) << dense.out;
  EXPECT_FALSE(contains(sparse.out, "(0 in a sparse format)")) << sparse.out;
  for (const char* bad :
       {"--tile-rows -1", "--cache-budget -5", "--shared-cache -1", "--sparse-threshold lots"}) {
    const CliResult r = cli(fmt::format("inspect '{}' {}", model_, bad));
    EXPECT_EQ(r.code, 1) << bad << "\n" << r.err;
  }
}

}  // namespace
}  // namespace sparsecol
