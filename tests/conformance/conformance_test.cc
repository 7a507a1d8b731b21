// The ONNX backend node tests (Debian's libonnx-testdata) for every op the engine claims.
//
// One test case per folder test_* whose model uses only ops in graph::supported_ops(). A case
// loads model.onnx with Engine::load, on the reference schedule and on the default (depth-wise)
// one, and for each test_data_set_* feeds input_N.pb to the model's N-th graph input that is not
// an initializer (or to the input the .pb names), and compares every output with output_N.pb.
//
// Tolerance: floats match when |actual - expected| <= 1e-5 + 1e-3 * |expected|, NaN matches
// NaN; integers and bools must be equal. ONNX's own runner uses rtol 1e-3 and atol 1e-7; our
// atol is 1e-5 because the expected outputs were computed by numpy, often in float64, and ours in
// float32: intermediates of magnitude ~1 carry rounding errors of ~1e-7 each (float32 epsilon),
// and where they cancel (a sum of mixed signs, sin near pi) the output is near zero and rtol
// gives no slack.
//
// Cases listed in frozen.txt feed the inputs that decide an output's shape (Resize's scales,
// Reshape's shape, ...) as graph inputs; sparsecol sizes its buffers from constants, as every
// exporter writes those inputs. Such a case runs once per data set on a copy of its model in
// which every graph input after the first is an initializer holding that data set's value: the
// op is tested on the same numbers, its data input still fed at run time.
//
// Cases listed in skipped.txt are reported as skipped with their reason. When the binary runs
// whole it ends with one summary line (ctest runs each case in its own process, so the lead's
// ctest entry that runs it whole is where the summary shows).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>
#include <onnx/onnx_pb.h>

#include "../test_util.h"
#include "graph/ops.h"
#include "sparsecol/io.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol {
namespace {

namespace fs = std::filesystem;

constexpr double kRtol = 1e-3;
constexpr double kAtol = 1e-5;
constexpr const char* kSuite = "Conformance";

// The environment variable `name` when set, else `fallback`. SPARSECOL_ONNX_TESTDATA runs another
// copy of the test data (a newer ONNX's, say); SPARSECOL_SKIP_LIST=/dev/null runs every case.
std::string env_or(const char* name, const char* fallback) {
  const char* env = std::getenv(name);
  return env != nullptr && *env != '\0' ? env : fallback;
}

std::string testdata_dir() { return env_or("SPARSECOL_ONNX_TESTDATA", SPARSECOL_ONNX_TESTDATA); }

// ---- skipped.txt and frozen.txt ----

// Format: a run of lines "# reason" gives the reason for the case names that follow it, one per
// line, until the next reason. Lines starting with "##" are comments; blank lines are ignored.
struct CaseList {
  std::map<std::string, std::string> reasons;  // case name -> reason
  std::vector<std::string> problems;           // malformed lines, duplicates
};

CaseList read_case_list(const std::string& path) {
  CaseList list;
  std::ifstream in(path);
  if (!in) {
    list.problems.push_back(fmt::format("cannot read {}", path));
    return list;
  }
  std::string line, reason;
  bool in_reason = false;  // the previous line was part of a reason
  for (int number = 1; std::getline(in, line); ++number) {
    line.erase(0, line.find_first_not_of(" \t"));
    line.erase(line.find_last_not_of(" \t\r") + 1);
    if (line.empty() || line.starts_with("##")) continue;
    if (line.starts_with("#")) {
      const std::size_t start = line.find_first_not_of("# \t");
      const std::string text = start == std::string::npos ? "" : line.substr(start);
      reason = in_reason ? reason + " " + text : text;
      in_reason = true;
      continue;
    }
    in_reason = false;
    if (reason.empty()) {
      list.problems.push_back(
          fmt::format("line {}: '{}' has no '# reason' above it", number, line));
    } else if (!list.reasons.emplace(line, reason).second) {
      list.problems.push_back(fmt::format("line {}: '{}' is listed twice", number, line));
    }
  }
  return list;
}

const CaseList& skip_list() {
  static const CaseList list = read_case_list(env_or("SPARSECOL_SKIP_LIST", SPARSECOL_SKIP_LIST));
  return list;
}

const CaseList& frozen_list() {
  static const CaseList list = read_case_list(SPARSECOL_FROZEN_LIST);
  return list;
}

// ---- discovering the cases ----

onnx::ModelProto read_model(const fs::path& path) {
  onnx::ModelProto model;
  std::ifstream in(path, std::ios::binary);
  if (!in || !model.ParseFromIstream(&in)) {
    throw Error(ErrorCode::kInvalidModel, fmt::format("cannot parse {}", path.string()));
  }
  return model;
}

// Op types of the model's nodes; ops of other domains are named "domain:op".
std::set<std::string> model_ops(const onnx::ModelProto& model) {
  std::set<std::string> ops;
  for (const onnx::NodeProto& node : model.graph().node()) {
    const bool default_domain = node.domain().empty() || node.domain() == "ai.onnx";
    ops.insert(default_domain ? node.op_type() : node.domain() + ":" + node.op_type());
  }
  return ops;
}

struct Discovery {
  std::vector<fs::path> cases;                      // folders whose ops are all supported
  std::set<std::string> all_names;                  // every test_* folder
  int unsupported_cases = 0;                        // folders needing an unsupported op
  std::map<std::string, int> missing_op_histogram;  // op -> cases that need it
  std::vector<std::string> problems;                // unreadable models
};

Discovery discover(const fs::path& root) {
  Discovery found;
  const std::vector<std::string> supported_list = graph::supported_ops();
  const std::set<std::string> supported(supported_list.begin(), supported_list.end());
  std::vector<fs::path> dirs;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    if (entry.is_directory() && entry.path().filename().string().starts_with("test_")) {
      dirs.push_back(entry.path());
    }
  }
  if (ec) found.problems.push_back(fmt::format("cannot list {}: {}", root.string(), ec.message()));
  std::sort(dirs.begin(), dirs.end());
  for (const fs::path& dir : dirs) {
    found.all_names.insert(dir.filename().string());
    std::set<std::string> missing;
    try {
      for (const std::string& op : model_ops(read_model(dir / "model.onnx"))) {
        if (!supported.contains(op)) missing.insert(op);
      }
    } catch (const Error& e) {
      found.problems.push_back(e.what());
      continue;
    }
    if (missing.empty()) {
      found.cases.push_back(dir);
    } else {
      ++found.unsupported_cases;
      for (const std::string& op : missing) ++found.missing_op_histogram[op];
    }
  }
  return found;
}

// ---- one case ----

std::vector<std::string> graph_input_names(const onnx::GraphProto& graph) {
  std::set<std::string> initializers;
  for (const auto& init : graph.initializer()) initializers.insert(init.name());
  std::vector<std::string> names;
  for (const auto& input : graph.input()) {
    if (!initializers.contains(input.name())) names.push_back(input.name());
  }
  return names;
}

std::vector<std::string> graph_output_names(const onnx::GraphProto& graph) {
  std::vector<std::string> names;
  for (const auto& output : graph.output()) names.push_back(output.name());
  return names;
}

// The name a tensor file feeds: the one it carries when the model has it, else the n-th.
std::string pick_name(const std::string& stored, std::size_t n,
                      const std::vector<std::string>& names) {
  if (!stored.empty() && std::find(names.begin(), names.end(), stored) != names.end()) {
    return stored;
  }
  return n < names.size() ? names[n] : std::string();
}

// What run_schedule runs: the case's model as it is, or (frozen.txt) a copy per data set.
struct CaseModel {
  fs::path path;
  const onnx::ModelProto* freeze = nullptr;  // non-null: freeze inputs after the first
  std::vector<std::string> input_names, output_names;
};

void run_schedule(const CaseModel& model, Schedule schedule,
                  const std::vector<fs::path>& data_sets);

void run_case(const fs::path& dir) {
  const std::string name = dir.filename().string();
  if (auto it = skip_list().reasons.find(name); it != skip_list().reasons.end()) {
    GTEST_SKIP() << "listed in skipped.txt: " << it->second;
  }
  const onnx::ModelProto proto = read_model(dir / "model.onnx");
  const CaseModel model{dir / "model.onnx", frozen_list().reasons.contains(name) ? &proto : nullptr,
                        graph_input_names(proto.graph()), graph_output_names(proto.graph())};

  std::vector<fs::path> data_sets;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_directory() && entry.path().filename().string().starts_with("test_data_set_")) {
      data_sets.push_back(entry.path());
    }
  }
  std::sort(data_sets.begin(), data_sets.end());
  ASSERT_FALSE(data_sets.empty()) << dir << " has no test_data_set_*";

  // The oracle every other path is tested against, and the default path users get (the
  // depth-wise schedule: tiles where the planner makes columns, the layer-by-layer fast steps
  // elsewhere, the reference ops where no fast kernel serves).
  for (Schedule schedule : {Schedule::kReference, Schedule::kDepthWise}) {
    SCOPED_TRACE(to_string(schedule));
    run_schedule(model, schedule, data_sets);
  }
}

// `model` with every graph input after the first turned into an initializer holding
// `data_set`'s input_N.pb, written to the temporary directory (the caller removes it).
fs::path freeze_parameters(const CaseModel& model, const fs::path& data_set) {
  onnx::ModelProto frozen = *model.freeze;
  onnx::GraphProto& graph = *frozen.mutable_graph();
  std::set<std::string> fixed;
  for (std::size_t n = 1;; ++n) {
    const fs::path file = data_set / fmt::format("input_{}.pb", n);
    if (!fs::exists(file)) break;
    onnx::TensorProto tensor;
    std::ifstream in(file, std::ios::binary);
    if (!in || !tensor.ParseFromIstream(&in)) {
      throw Error(ErrorCode::kInvalidModel, fmt::format("cannot parse {}", file.string()));
    }
    const std::string name = pick_name(tensor.name(), n, model.input_names);
    tensor.set_name(name);
    *graph.add_initializer() = tensor;
    fixed.insert(name);
  }
  google::protobuf::RepeatedPtrField<onnx::ValueInfoProto> inputs;
  for (const onnx::ValueInfoProto& input : graph.input()) {
    if (!fixed.contains(input.name())) *inputs.Add() = input;
  }
  *graph.mutable_input() = inputs;
  const ::testing::TestInfo& test = *::testing::UnitTest::GetInstance()->current_test_info();
  fs::path path = fs::temp_directory_path() / fmt::format("sparsecol_{}_{}_{}.onnx", test.name(),
                                                          data_set.filename().string(), ::getpid());
  std::ofstream out(path, std::ios::binary);
  if (!out || !frozen.SerializeToOstream(&out)) {
    throw Error(ErrorCode::kIoError, fmt::format("cannot write {}", path.string()));
  }
  return path;
}

void run_schedule(const CaseModel& model, Schedule schedule,
                  const std::vector<fs::path>& data_sets) {
  Options options;
  options.schedule = schedule;
  std::optional<Engine> engine;
  const auto load = [&](const fs::path& path) {
    engine.reset();
    try {
      engine = Engine::load(path.string(), options);
    } catch (const Error& e) {
      ADD_FAILURE() << "Engine::load failed (" << to_string(e.code()) << "): " << e.what();
    }
  };
  if (model.freeze == nullptr) load(model.path);

  for (const fs::path& data_set : data_sets) {
    SCOPED_TRACE(data_set.filename().string());
    if (model.freeze != nullptr) {
      const fs::path frozen = freeze_parameters(model, data_set);
      load(frozen);
      fs::remove(frozen);
    }
    if (!engine) return;
    NamedTensors inputs;
    for (std::size_t n = 0; n == 0 || model.freeze == nullptr; ++n) {
      const fs::path file = data_set / fmt::format("input_{}.pb", n);
      if (!fs::exists(file)) break;
      std::string stored;
      Tensor tensor = read_tensor_proto(file.string(), &stored);
      const std::string key = pick_name(stored, n, model.input_names);
      ASSERT_FALSE(key.empty()) << file << " has no matching graph input (the model has "
                                << model.input_names.size() << ")";
      inputs[key] = std::move(tensor);
    }
    Session session = engine->session();
    NamedTensors outputs;
    try {
      outputs = session.run(inputs);
    } catch (const Error& e) {
      FAIL() << "Session::run failed (" << to_string(e.code()) << "): " << e.what();
    }
    std::size_t compared = 0;
    for (std::size_t n = 0;; ++n) {
      const fs::path file = data_set / fmt::format("output_{}.pb", n);
      if (!fs::exists(file)) break;
      std::string stored;
      const Tensor expected = read_tensor_proto(file.string(), &stored);
      const std::string key = pick_name(stored, n, model.output_names);
      auto it = outputs.find(key);
      if (it == outputs.end()) {
        ADD_FAILURE() << "the engine returned no output '" << key << "'";
        continue;
      }
      EXPECT_TRUE(test::tensors_near(it->second, expected, kRtol, kAtol))
          << "output '" << key << "'";
      ++compared;
    }
    EXPECT_GT(compared, 0U) << data_set << " has no output_N.pb";
  }
}

// A test whose body is a function: the cases are found at run time, so they are registered
// with ::testing::RegisterTest rather than TEST().
class FunctionTest : public ::testing::Test {
 public:
  explicit FunctionTest(std::function<void()> body) : body_(std::move(body)) {}
  void TestBody() override { body_(); }

 private:
  std::function<void()> body_;
};

void register_test(const char* suite, const std::string& name, std::function<void()> body) {
  ::testing::RegisterTest(
      suite, name.c_str(), nullptr, nullptr, __FILE__, __LINE__,
      [body = std::move(body)]() -> ::testing::Test* { return new FunctionTest(body); });
}

// ---- the summary ----

void print_summary(const Discovery& found) {
  int run = 0, passed = 0, failed = 0, skipped = 0, frozen = 0;
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  for (int i = 0; i < unit.total_test_suite_count(); ++i) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(i);
    if (std::string(suite.name()) != kSuite) continue;
    for (int j = 0; j < suite.total_test_count(); ++j) {
      const ::testing::TestInfo& info = *suite.GetTestInfo(j);
      if (!info.should_run()) continue;
      ++run;
      if (info.result()->Skipped()) {
        ++skipped;
      } else if (info.result()->Failed()) {
        ++failed;
      } else {
        ++passed;
        frozen += frozen_list().reasons.contains(info.name()) ? 1 : 0;
      }
    }
  }
  const int total = static_cast<int>(found.cases.size());
  std::cout << fmt::format(
      "conformance: {} cases for supported ops, {} passed ({} with their shape inputs frozen, "
      "frozen.txt), {} failed, {} skipped (listed in skipped.txt), {} cases need unsupported "
      "ops{}\n",
      total, passed, frozen, failed, skipped, found.unsupported_cases,
      run == total ? "" : fmt::format(" (filtered: ran {} of {})", run, total));

  std::vector<std::pair<std::string, int>> needed(found.missing_op_histogram.begin(),
                                                  found.missing_op_histogram.end());
  std::stable_sort(needed.begin(), needed.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string line;
  for (std::size_t i = 0; i < needed.size() && i < 15; ++i) {
    line += fmt::format("{}{} ({})", i ? ", " : "", needed[i].first, needed[i].second);
  }
  if (!needed.empty()) {
    std::cout << "conformance: unsupported ops by cases needing them: " << line
              << (needed.size() > 15 ? ", ..." : "") << "\n";
  }
}

}  // namespace
}  // namespace sparsecol

int main(int argc, char** argv) {
  using namespace sparsecol;
  ::testing::InitGoogleTest(&argc, argv);
  static const Discovery found = discover(testdata_dir());

  // The data and the skip list are checked like everything else: an empty or unreadable test
  // folder must fail, not pass with zero cases.
  register_test("ConformanceSetup", "FindsTestDataAndReadsEveryModel", [] {
    EXPECT_FALSE(found.all_names.empty())
        << "no test_* folders in " << testdata_dir() << " (install Debian's libonnx-testdata)";
    for (const std::string& problem : found.problems) ADD_FAILURE() << problem;
  });
  register_test("ConformanceSetup", "SkipListNamesExistingCasesWithReasons", [] {
    for (const std::string& problem : skip_list().problems) ADD_FAILURE() << problem;
    for (const auto& [name, reason] : skip_list().reasons) {
      EXPECT_TRUE(found.all_names.contains(name))
          << "skipped.txt lists '" << name << "', which is not a case in " << testdata_dir();
    }
  });
  register_test("ConformanceSetup", "FrozenListNamesExistingCasesNotSkipped", [] {
    for (const std::string& problem : frozen_list().problems) ADD_FAILURE() << problem;
    for (const auto& [name, reason] : frozen_list().reasons) {
      EXPECT_TRUE(found.all_names.contains(name))
          << "frozen.txt lists '" << name << "', which is not a case in " << testdata_dir();
      EXPECT_FALSE(skip_list().reasons.contains(name))
          << "'" << name << "' is in both frozen.txt and skipped.txt";
    }
  });
  for (const fs::path& dir : found.cases) {
    register_test(kSuite, dir.filename().string(), [dir] { run_case(dir); });
  }
  const int status = RUN_ALL_TESTS();
  // gtest_discover_tests parses the output of --gtest_list_tests: print nothing else there.
  if (!GTEST_FLAG_GET(list_tests)) print_summary(found);
  return status;
}
