// Whole models exported by PyTorch (tests/models/export_models.py, run by ctest's export_models
// fixture), dense and pruned, run through the engine on every CPU schedule (reference,
// layerwise, onednn, depthwise) and match PyTorch's outputs and intermediate activations, and the
// reference schedule's. bert_s90 is made here from bert with the engine's own pruner
// (sparsecol::prune_model): BERT has no BatchNorm to re-calibrate after pruning, so PyTorch adds
// nothing, and the pruner is tested on a real 340 MB model; its oracle is the reference schedule on
// the same pruned model.
//
// Tolerance: max |engine - pytorch| <= 1e-4 * max |pytorch output|, over the whole output (and
// over each recorded activation). Both sides compute in float32 but sum in different orders, so
// errors grow with depth: a relative bound on the largest element keeps one rule for small
// logits and large BERT activations. The same bound holds for the pruned models whichever
// kernels run them (dense kernels over zeros, or sparse kernels over the non-zeros): a sparse
// kernel sums the same non-zero products in another order, and fewer terms round less.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <fstream>

#include "../test_util.h"
#include "sparsecol/io.h"
#include "sparsecol/prune.h"
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

// Models the tests make from an exported one with the engine's pruner (default options: per
// layer, first convolution dense), run on the original's input.
struct PrunedByEngine {
  const char* name;
  const char* original;
  double sparsity;
};
constexpr PrunedByEngine kPrunedByEngine[] = {{"bert_s90", "bert", 0.9}};

const PrunedByEngine* pruned_by_engine(const std::string& name) {
  for (const PrunedByEngine& m : kPrunedByEngine) {
    if (name == m.name) return &m;
  }
  return nullptr;
}

// The files of one model. For a model pruned by the engine, the input and the activation names
// are the original's, and there is no PyTorch output: the reference schedule is the oracle.
struct ModelFiles {
  std::string onnx, input;
  std::string output;               // PyTorch's output; empty when PyTorch did not run this model
  std::string activations;          // .npz of intermediate activations keyed by ONNX value name
  bool pytorch_activations = true;  // false: only the names in `activations` are used
};

::testing::AssertionResult missing(const std::string& path) {
  return ::testing::AssertionFailure()
         << path << " does not exist: run the export fixture first (`ctest -R export_models`, "
         << "or `/usr/bin/python3 tests/models/export_models.py --out " << SPARSECOL_MODEL_DIR
         << "`)";
}

// Prunes `m.original` into `m.name` unless an up-to-date file exists. Concurrent test processes
// may both write it: prune_model writes through a temporary file and a rename, so a reader sees
// the old file or a complete new one.
void make_pruned_model(const PrunedByEngine& m, const std::string& original,
                       const std::string& pruned) {
  namespace fs = std::filesystem;
  if (fs::exists(pruned) && fs::last_write_time(pruned) >= fs::last_write_time(original)) return;
  PruneOptions options;
  options.sparsity = m.sparsity;
  const PruneReport report = prune_model(original, pruned, options);
  std::cout << fmt::format(
      "pruned {} into {}: {} weights, {:.3f} zero\n", original, pruned, report.elements,
      static_cast<double>(report.zeros_after) / static_cast<double>(report.elements));
}

::testing::AssertionResult find_model_files(const std::string& name, ModelFiles* files) {
  const PrunedByEngine* pruned = pruned_by_engine(name);
  const std::string source = pruned != nullptr ? pruned->original : name;
  *files = {model_file(name, ".onnx"), model_file(source, ".input.npy"),
            pruned != nullptr ? std::string() : model_file(name, ".output.npy"),
            model_file(source, ".activations.npz"), pruned == nullptr};
  for (const std::string& path :
       {model_file(source, ".onnx"), files->input, files->output, files->activations}) {
    if (!path.empty() && !std::filesystem::exists(path)) return missing(path);
  }
  if (pruned != nullptr) make_pruned_model(*pruned, model_file(source, ".onnx"), files->onnx);
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

// The options a schedule runs the models with. The depth-wise schedule gets a cache budget of
// its own (3/4 of a 1 MiB L2, what the planner takes on the development machine), so that it
// forms L2 columns on every model: with the machine's budget it leaves the dense models'
// compute-bound blocks layer by layer where the L3 holds their activations
// (plan/tile_plan.cc), and these tests would not run a tile of them.
Options schedule_options(Schedule schedule, int threads) {
  Options options;
  options.schedule = schedule;
  options.threads = threads;
  if (schedule == Schedule::kDepthWise) options.cache_budget_bytes = 768 << 10;
  return options;
}

const ModelRun& model_run(const std::string& name, const ModelFiles& files, Schedule schedule,
                          int threads = kThreads) {
  static std::map<std::tuple<std::string, Schedule, int>, ModelRun> runs;
  const auto key = std::make_tuple(name, schedule, threads);
  auto it = runs.find(key);
  if (it == runs.end()) {
    Engine engine = Engine::load(files.onnx, schedule_options(schedule, threads));
    Tensor input = read_npy(files.input);
    Tensor expected = files.output.empty() ? Tensor() : read_npy(files.output);
    Tensor actual = run_model(engine, input);
    it = runs.emplace(key, ModelRun{std::move(engine), input, expected, actual}).first;
  }
  return it->second;
}

// Writes a copy of `model` whose graph also outputs the values named in `activations` (with
// their shapes, the batch axis symbolic), so that the engine returns them. A value that is a
// graph output survives every pass under its name, so the copy computes what the model does.
void write_with_outputs(const std::string& model, const NamedTensors& activations,
                        const std::string& path) {
  onnx::ModelProto proto;
  {
    std::ifstream in(model, std::ios::binary);
    ASSERT_TRUE(proto.ParseFromIstream(&in)) << model;
  }
  std::set<std::string> outputs;
  for (const onnx::ValueInfoProto& output : proto.graph().output()) outputs.insert(output.name());
  for (const auto& [name, tensor] : activations) {
    if (outputs.count(name) != 0) continue;  // the last layer's output may be the model's
    onnx::ValueInfoProto* output = proto.mutable_graph()->add_output();
    output->set_name(name);
    onnx::TypeProto::Tensor* type = output->mutable_type()->mutable_tensor_type();
    type->set_elem_type(onnx::TensorProto::FLOAT);
    for (int axis = 0; axis < tensor.rank(); ++axis) {
      onnx::TensorShapeProto::Dimension* dim = type->mutable_shape()->add_dim();
      if (axis == 0) {
        dim->set_dim_param("batch");
      } else {
        dim->set_dim_value(tensor.dim(axis));
      }
    }
  }
  std::ofstream out(path, std::ios::binary);
  ASSERT_TRUE(proto.SerializeToOstream(&out)) << path;
}

// The model's output and recorded intermediate activations as one schedule computes them, on
// the saved input: from a temporary copy of the model with those values as extra outputs.
NamedTensors run_with_activations(const std::string& name, const ModelFiles& files,
                                  Schedule schedule) {
  const NamedTensors recorded = read_npz(files.activations);
  const std::string path = (std::filesystem::temp_directory_path() /
                            fmt::format("sparsecol-{}-activations-{}.onnx", name, ::getpid()))
                               .string();
  write_with_outputs(files.onnx, recorded, path);
  Engine engine = Engine::load(path, schedule_options(schedule, kThreads));
  std::filesystem::remove(path);
  return engine.session().run({{"input", read_npy(files.input)}});
}

// The oracle of most tests here: run_with_activations on the reference schedule. Its naive
// kernels take ~15 s on BERT, and ctest runs each test in a process of its own, so it is computed
// once per test run rather than once per test: kept beside the model in <model>.reference.npz,
// and read back while that file is newer than the model, its input and activation files and this
// test executable (a rebuilt engine computes it again). Concurrent processes may both compute it;
// write_npz renames a complete file into place.
const NamedTensors& reference_outputs(const std::string& name, const ModelFiles& files) {
  static std::map<std::string, NamedTensors> loaded;
  auto it = loaded.find(name);
  if (it != loaded.end()) return it->second;
  namespace fs = std::filesystem;
  const std::string saved = model_file(name, ".reference.npz");
  // A link (.ci/run links the Release build's model files into the sanitizer build's) is another
  // build's result: computed again, which replaces the link.
  bool fresh = fs::is_regular_file(fs::symlink_status(saved));
  for (const std::string& source :
       {files.onnx, files.input, files.activations, fs::read_symlink("/proc/self/exe").string()}) {
    fresh = fresh && fs::last_write_time(saved) >= fs::last_write_time(source);
  }
  NamedTensors outputs;
  if (fresh) {
    outputs = read_npz(saved);
  } else {
    outputs = run_with_activations(name, files, Schedule::kReference);
    write_npz(saved, outputs);
  }
  return loaded.emplace(name, std::move(outputs)).first->second;
}

// run_with_activations once per process and schedule.
const NamedTensors& activation_run(const std::string& name, const ModelFiles& files,
                                   Schedule schedule) {
  if (schedule == Schedule::kReference) return reference_outputs(name, files);
  static std::map<std::pair<std::string, Schedule>, NamedTensors> runs;
  const auto key = std::make_pair(name, schedule);
  auto it = runs.find(key);
  if (it == runs.end()) it = runs.emplace(key, run_with_activations(name, files, schedule)).first;
  return it->second;
}

// The reference schedule's output on the saved input.
const Tensor& reference_output(const std::string& name, const ModelFiles& files) {
  const NamedTensors& outputs = reference_outputs(name, files);
  auto it = outputs.find("output");
  if (it == outputs.end()) throw Error(ErrorCode::kInternal, "the model returned no 'output'");
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

// Instantiated for the models PyTorch ran (not those pruned by the engine).
class PyTorchModelTest : public ModelTest {};

TEST_P(PyTorchModelTest, MatchesPyTorch) {
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

// Intermediate activations, not only the final output (DESIGN.md): a network whose signal is
// washed out can match at the output while its layers differ. Each recorded activation must match
// PyTorch's (when PyTorch ran this model) and the reference schedule's, with the output's rule
// applied to each tensor.
// Instantiated for every case with an oracle: all but the reference schedule of a model pruned by
// the engine (whose only oracle is itself).
class ActivationTest : public ModelTest {};

TEST_P(ActivationTest, IntermediateActivationsMatch) {
  const NamedTensors& actual = activation_run(model(), files_, schedule());
  std::vector<std::pair<std::string, const NamedTensors*>> oracles;
  const NamedTensors pytorch =
      files_.pytorch_activations ? read_npz(files_.activations) : NamedTensors();
  if (files_.pytorch_activations) oracles.emplace_back("pytorch", &pytorch);
  if (schedule() != Schedule::kReference) {
    oracles.emplace_back("reference", &activation_run(model(), files_, Schedule::kReference));
  }
  ASSERT_FALSE(oracles.empty()) << "no oracle for " << model() << " on " << to_string(schedule());
  const NamedTensors names = read_npz(files_.activations);
  ASSERT_FALSE(names.empty()) << files_.activations << " records no activation";
  for (const auto& [oracle_name, oracle] : oracles) {
    for (const auto& [value, unused] : names) {
      const auto got = actual.find(value), want = oracle->find(value);
      ASSERT_NE(got, actual.end()) << "the engine did not return '" << value << "'";
      ASSERT_NE(want, oracle->end()) << oracle_name << " has no '" << value << "'";
      const test::TensorDiff diff = test::diff_tensors(got->second, want->second, 0, 0);
      const double tolerance = kRelativeTolerance * diff.max_abs_expected;
      std::cout << fmt::format("{} ({} vs {}): {} {}: {}\n", model(), to_string(schedule()),
                               oracle_name, value, test::shape_string(got->second.shape()),
                               test::describe_errors(diff));
      EXPECT_TRUE(test::tensors_near(got->second, want->second, 0, tolerance))
          << value << " vs " << oracle_name;
    }
  }
}

// Every schedule against the oracle, with PyTorch's tolerance: the schedules must agree with
// each other, not only each with PyTorch.
// (The oracle runs the model with its recorded activations as extra outputs, which keeps those
// values from being fused away; its output is the same computation.)
TEST_P(ModelTest, MatchesReferenceSchedule) {
  const ModelRun& r = run();
  const Tensor& oracle = reference_output(model(), files_);
  const test::TensorDiff diff = test::diff_tensors(r.actual, oracle, 0, 0);
  const double tolerance = kRelativeTolerance * diff.max_abs_expected;
  std::cout << fmt::format("{} ({} vs reference): {}\n", model(), to_string(schedule()),
                           test::describe_errors(diff));
  EXPECT_TRUE(test::tensors_near(r.actual, oracle, 0, tolerance));
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
  for (int threads : {1, 3, 4}) {
    const Tensor& actual = run(threads).actual;
    const double tolerance =
        1e-6 * test::diff_tensors(base.actual, base.actual, 0, 0).max_abs_expected;
    EXPECT_TRUE(test::tensors_near(actual, base.actual, 0, tolerance))
        << threads << " threads vs " << kThreads;
  }
}

// Guards the comparison itself: the oracle's outputs for the two saved samples (PyTorch's, or
// the reference schedule's for a model PyTorch did not run) must differ by far more than the
// tolerance, or a constant output would match. Instantiated once per model (the oracle does not
// depend on the schedule under test).
class OracleTest : public ModelTest {};

TEST_P(OracleTest, OutputDependsOnInput) {
  const Tensor expected =
      files_.output.empty() ? reference_output(model(), files_) : read_npy(files_.output);
  ASSERT_GE(expected.dim(0), 2) << "the export script saves a batch of at least 2";
  const test::TensorDiff diff = test::diff_tensors(test::slice_batch(expected, 0, 1),
                                                   test::slice_batch(expected, 1, 1), 0, 0);
  const double tolerance = kRelativeTolerance * diff.max_abs_expected;
  std::cout << fmt::format("{}: samples 0 and 1 differ by up to {:.3g} ({:.0f} tolerances)\n",
                           model(), diff.max_abs_err, diff.max_abs_err / tolerance);
  EXPECT_GT(diff.max_abs_err, kMinInputEffect * tolerance)
      << "the output barely depends on the input: re-check the export's random weights (and, "
         "for a pruned CNN, the BatchNorm re-calibration)";
}

std::vector<ModelCase> all_cases() {
  std::vector<ModelCase> cases;
  for (const char* model :
       {"small_cnn", "resnet50", "mobilenet_v2", "bert", "resnet50_s90", "resnet50_s95",
        "mobilenet_v2_s80", "bert_s90", "vit_tiny", "small_segmenter", "small_seq"}) {
    for (Schedule s :
         {Schedule::kReference, Schedule::kLayerWise, Schedule::kOneDnn, Schedule::kDepthWise}) {
      cases.push_back({model, s});
    }
  }
  return cases;
}

// The cases of all_cases() that `keep` accepts.
template <typename Keep>
std::vector<ModelCase> cases_where(Keep keep) {
  std::vector<ModelCase> cases;
  for (const ModelCase& c : all_cases()) {
    if (keep(c)) cases.push_back(c);
  }
  return cases;
}

std::string case_name(const ::testing::TestParamInfo<ModelCase>& info) {
  return info.param.model + "_" + to_string(info.param.schedule);
}

// The depth-wise schedule with forced tile heights: one row (every conv needs a halo from its
// neighbours' tiles), a prime that divides no image height, and taller than any image (one tile).
// Same rule as ThreadCountDoesNotChangeOutput: tiles change where work is cut, not the
// arithmetic of an output element.
class DepthwiseTileTest : public ModelTest {};

// Both ways a tile gets its halo rows (recomputed, or kept in rolling line buffers from the
// thread's previous tile, which depends on how the threads split the tiles): one thread (every
// tile continues its predecessor) and three (ranges split unevenly, stolen in halves).
// ParallelModelTest covers 1 to 4 threads on the planner's own tiles.
TEST_P(DepthwiseTileTest, ForcedTileHeightsDoNotChangeOutput) {
  const ModelRun& base = run();
  for (TileReuse reuse : {TileReuse::kHalo, TileReuse::kRolling}) {
    for (int threads : {1, 3}) {
      for (int rows : {1, 7, 1000}) {
        Options options;
        options.schedule = Schedule::kDepthWise;
        options.threads = threads;
        options.tile_rows = rows;
        options.tile_reuse = reuse;
        const Tensor actual = run_model(Engine::load(files_.onnx, options), base.input);
        const double tolerance =
            1e-6 * test::diff_tensors(base.actual, base.actual, 0, 0).max_abs_expected;
        EXPECT_TRUE(test::tensors_near(actual, base.actual, 0, tolerance))
            << (reuse == TileReuse::kHalo ? "halo" : "rolling") << ", " << threads << " threads, "
            << rows << " tile rows";
      }
    }
  }
}

// Options::measure_columns: a session's first runs run the columns as tiles and with their ops
// whole, alternately, each way with its own buffers, then the faster way, so the runs after
// the first see other placements of every intermediate: each must give the first run's output
// (whichever way it settles: the same arithmetic).
TEST_P(DepthwiseTileTest, MeasuringRunsDoNotChangeOutput) {
  const ModelRun& base = run();
  Session session = base.engine.session();
  const double tolerance =
      1e-6 * test::diff_tensors(base.actual, base.actual, 0, 0).max_abs_expected;
  for (int i = 0; i < kColumnMeasuringRuns + 2; ++i) {
    const NamedTensors outputs = session.run({{"input", base.input}});
    EXPECT_TRUE(test::tensors_near(outputs.at("output"), base.actual, 0, tolerance)) << "run " << i;
  }
}

TEST_P(DepthwiseTileTest, PlanReportComparesWithLayerByLayer) {
  const std::string report = run().engine.plan_report();
  std::cout << report;
  EXPECT_NE(report.find("layer by layer"), std::string::npos);
  // Every model has columns (BERT's along its tokens), so the tests above run tiles.
  EXPECT_NE(report.find("  column 0 "), std::string::npos) << "no columns";
}

INSTANTIATE_TEST_SUITE_P(Models, ModelTest, ::testing::ValuesIn(all_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Models, OracleTest,
                         ::testing::ValuesIn(cases_where([](const ModelCase& c) {
                           return c.schedule == Schedule::kReference;
                         })),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Models, ActivationTest,
                         ::testing::ValuesIn(cases_where([](const ModelCase& c) {
                           return pruned_by_engine(c.model) == nullptr ||
                                  c.schedule != Schedule::kReference;
                         })),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Models, PyTorchModelTest,
                         ::testing::ValuesIn(cases_where([](const ModelCase& c) {
                           return pruned_by_engine(c.model) == nullptr;
                         })),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Models, ParallelModelTest,
                         ::testing::ValuesIn(cases_where([](const ModelCase& c) {
                           return c.schedule != Schedule::kReference;
                         })),
                         case_name);
// The models with columns: small_seq has none (its recurrent, Einsum and Softmax nodes run
// whole), so the depth-wise schedule runs it layer by layer, which the other tests check.
INSTANTIATE_TEST_SUITE_P(Models, DepthwiseTileTest,
                         ::testing::ValuesIn(cases_where([](const ModelCase& c) {
                           return c.schedule == Schedule::kDepthWise && c.model != "small_seq";
                         })),
                         case_name);

}  // namespace
}  // namespace sparsecol
