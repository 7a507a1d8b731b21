// `sparsecol bench` end to end: runs the built binary on tiny hand-made models and checks the
// table, the JSON and SVG reports, and the errors. Speed itself is never asserted here.
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "cli_util.h"
#include "sparsecol/io.h"
#include "sparsecol/sparsecol.h"
#include "test_models.h"

namespace sparsecol {
namespace {

namespace fs = std::filesystem;

using testing::CliResult;
using testing::contains;
using testing::read_text;

std::vector<std::string> split_words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> words;
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

class BenchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = (fs::path(SPARSECOL_TEST_TMPDIR) / "bench_test" / info->name()).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }

  std::string path(const std::string& file) const { return dir_ + "/" + file; }

  std::string save(const onnx::ModelProto& model, const std::string& file) const {
    std::ofstream(path(file), std::ios::binary) << testing::serialize(model);
    return path(file);
  }

  // x[batch, 4] -> MatMul -> Add -> Relu -> y[batch, 3].
  std::string mlp() const { return save(testing::make_mlp_model(), "mlp.onnx"); }

  testing::CliResult cli(const std::string& args) const { return testing::run_cli(args, dir_); }

  // The table's data rows: the lines of stdout that start with the model's file name.
  static std::vector<std::vector<std::string>> table_rows(const std::string& out,
                                                          const std::string& model) {
    std::vector<std::vector<std::string>> rows;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      if (line.starts_with(model + " ")) rows.push_back(split_words(line));
    }
    return rows;
  }

  std::string dir_;
};

TEST_F(BenchTest, HelpListsEveryOptionWithItsDefault) {
  const CliResult help = cli("bench --help");
  ASSERT_EQ(help.code, 0) << help.err;
  for (const char* expected : {"Usage: sparsecol bench",
                               "MODEL",
                               "--schedule",
                               "--batch",
                               "=[1]",
                               "--threads",
                               "=[0]",
                               "--time",
                               "=10",
                               "--warmup",
                               "=2",
                               "--min-reps",
                               "=3",
                               "--runs-per-turn",
                               "=1",
                               "--seed",
                               "=1",
                               "--input",
                               "--json",
                               "--plot",
                               "--per-layer",
                               "--per-layer-top",
                               "=20",
                               "--profile-reps",
                               "=3",
                               "--trace",
                               "--strict",
                               "--quiet"}) {
    EXPECT_TRUE(contains(help.out, expected)) << expected << " missing from\n" << help.out;
  }
}

TEST_F(BenchTest, TableHasOneRowPerPathAndPointWithSpeedupAndAgreement) {
  const CliResult result =
      cli(fmt::format("bench '{}' --schedule reference,reference --batch 1,2 --threads 1 "
                      "--time 0.2 --min-reps 4",
                      mlp()));
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_TRUE(contains(result.out, "speedup")) << result.out;
  EXPECT_TRUE(contains(result.out, "max rel diff")) << result.out;
  const auto rows = table_rows(result.out, "mlp.onnx");
  ASSERT_EQ(rows.size(), 4u) << result.out;
  // model, path, batch, threads, reps, median (2 words), p90 (2 words), items/s, speedup, diff.
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"reference", "1"}, {"reference#2", "1"}, {"reference", "2"}, {"reference#2", "2"}};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE(fmt::format("row {}: {}", i, fmt::join(rows[i], " ")));
    ASSERT_EQ(rows[i].size(), 12u);
    EXPECT_EQ(rows[i][1], expected[i].first);
    EXPECT_EQ(rows[i][2], expected[i].second);
    EXPECT_EQ(rows[i][3], "1");
    EXPECT_GE(std::stoi(rows[i][4]), 4);
    EXPECT_TRUE(rows[i][10].ends_with("x"));
    // The same schedule twice computes the same thing: no difference at all.
    EXPECT_EQ(rows[i][11], i % 2 == 0 ? "-" : "0.0e+00");
  }
  EXPECT_EQ(rows[0][10], "1.00x");
}

TEST_F(BenchTest, JsonHoldsEveryRowAndTheMachine) {
  const CliResult result =
      cli(fmt::format("bench '{}' --schedule reference,reference --batch 1,2 --time 0.2 --json "
                      "'{}' --quiet",
                      mlp(), path("out.json")));
  ASSERT_EQ(result.code, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(read_text(path("out.json")));
  EXPECT_EQ(json["model"], path("mlp.onnx"));
  EXPECT_FALSE(json["machine"]["cpu"].get<std::string>().empty());
  EXPECT_GE(json["machine"]["physical_cores"].get<int>(), 1);
  const nlohmann::json& round_trip = json["machine"]["core_round_trip_ns"];
  if (json["machine"]["physical_cores"].get<int>() >= 2) {
    for (const char* when : {"before", "after"}) {
      EXPECT_GT(round_trip[when].get<double>(), 0) << when;
      EXPECT_LT(round_trip[when].get<double>(), 1e6) << when;  // a millisecond: not a hand-off
    }
    EXPECT_NE(result.out.find("cores 0-1 round trip: "), std::string::npos) << result.out;
  } else {
    EXPECT_TRUE(round_trip.is_null()) << round_trip;
  }
  EXPECT_FALSE(json["date"].get<std::string>().empty());
  const nlohmann::json& results = json["results"];
  ASSERT_EQ(results.size(), 4u) << json.dump(2);
  for (const nlohmann::json& row : results) {
    SCOPED_TRACE(row.dump());
    EXPECT_EQ(row["status"], "ok");
    EXPECT_EQ(row["baseline"], "reference");
    EXPECT_GE(row["reps"].get<int>(), 3);
    const double median = row["median_s"].get<double>();
    EXPECT_GT(median, 0);
    EXPECT_LE(median, row["p90_s"].get<double>());
    EXPECT_NEAR(row["items_per_s"].get<double>() * median, row["batch"].get<double>(), 1e-6);
    EXPECT_TRUE(row["agrees"].get<bool>());
  }
  EXPECT_EQ(results[0]["path"], "reference");
  EXPECT_DOUBLE_EQ(results[0]["speedup"].get<double>(), 1.0);
  EXPECT_TRUE(results[0]["max_rel_diff"].is_null());
  EXPECT_EQ(results[1]["path"], "reference#2");
  EXPECT_EQ(results[1]["max_rel_diff"].get<double>(), 0.0);
}

TEST_F(BenchTest, PlotIsAnSvgDocumentWithTheBarsAndTheLegend) {
  const CliResult result =
      cli(fmt::format("bench '{}' --schedule reference,reference --batch 1,2 --time 0.1 --plot "
                      "'{}' --quiet",
                      mlp(), path("out.svg")));
  ASSERT_EQ(result.code, 0) << result.err;
  const std::string svg = read_text(path("out.svg"));
  EXPECT_TRUE(contains(svg, "<svg")) << svg;
  EXPECT_TRUE(contains(svg, "</svg>")) << svg;
  EXPECT_TRUE(contains(svg, "items/s")) << svg;
  EXPECT_TRUE(contains(svg, "reference#2")) << svg;
  EXPECT_EQ(std::count(svg.begin(), svg.end(), '\n') > 10, true);
  // One bar (a rect with a tooltip) per path at each of the 2 batch sizes.
  int bars = 0;
  for (std::size_t at = svg.find("</title></rect>"); at != std::string::npos;
       at = svg.find("</title></rect>", at + 1)) {
    ++bars;
  }
  EXPECT_EQ(bars, 4) << svg;
  const std::string check = fmt::format(
      "/usr/bin/python3 -c 'import sys, xml.etree.ElementTree as et; et.parse(sys.argv[1])' '{}'",
      path("out.svg"));
  EXPECT_EQ(std::system(check.c_str()), 0) << "not well-formed XML: " << path("out.svg");
}

// --per-layer: a table per path (oneDNN's too, timed per node around its primitives), slowest node
// first, shares adding up to 100%; the same numbers
// in the JSON. The timed table is measured before profiling starts.
TEST_F(BenchTest, PerLayerListsNodesSlowestFirstPerPath) {
  const CliResult result =
      cli(fmt::format("bench '{}' --schedule reference,layerwise,onednn --batch 2 --time 0.1 "
                      "--per-layer --profile-reps 2 --json '{}' --quiet",
                      mlp(), path("out.json")));
  ASSERT_EQ(result.code, 0) << result.err;
  for (const char* path_name : {"reference", "layerwise", "onednn"}) {
    SCOPED_TRACE(path_name);
    const std::string title =
        fmt::format("per layer: {}, batch 2, threads auto (mean of 2 profiled runs", path_name);
    const std::size_t at = result.out.find(title);
    ASSERT_NE(at, std::string::npos) << result.out;
    // The section's lines: a header, one per node, "total".
    std::istringstream lines(result.out.substr(at));
    std::string line;
    std::getline(lines, line);
    std::getline(lines, line);
    EXPECT_TRUE(contains(line, "node")) << line;
    double previous = HUGE_VAL, shares = 0;
    int nodes = 0;
    while (std::getline(lines, line) && !contains(line, "total")) {
      // node, op, time, unit, share, slices
      const std::vector<std::string> words = split_words(line);
      ASSERT_EQ(words.size(), 6u) << line;
      const double scale = words[3] == "us" ? 1e-6 : words[3] == "ms" ? 1e-3 : 1;
      const double seconds = std::stod(words[2]) * scale;
      EXPECT_LE(seconds, previous) << line;
      previous = seconds;
      shares += std::stod(words[4]);
      EXPECT_EQ(words[5], "1") << line;  // one slice per node and run layer by layer
      ++nodes;
    }
    EXPECT_GE(nodes, 1);
    EXPECT_NEAR(shares, 100, 0.1 * nodes);
  }
  const nlohmann::json json = nlohmann::json::parse(read_text(path("out.json")));
  for (const nlohmann::json& row : json["results"]) {
    SCOPED_TRACE(row.dump());
    EXPECT_EQ(row["per_layer"]["profiled_runs"], 2);
    const nlohmann::json& layers = row["per_layer"]["layers"];
    ASSERT_GE(layers.size(), 1u);
    for (std::size_t i = 1; i < layers.size(); ++i) {
      EXPECT_GE(layers[i - 1]["seconds"].get<double>(), layers[i]["seconds"].get<double>());
    }
  }
}

// --trace: one process per path and point, the profiled runs' slices on its thread tracks.
TEST_F(BenchTest, TraceHasAProcessPerPathWithTheProfiledRuns) {
  const CliResult result =
      cli(fmt::format("bench '{}' --schedule reference,layerwise --batch 1,2 --time 0.05 "
                      "--profile-reps 3 --trace '{}' --quiet",
                      mlp(), path("trace.json")));
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_FALSE(contains(result.out, "per layer")) << "--trace alone prints no per-layer table";
  const nlohmann::json trace = nlohmann::json::parse(read_text(path("trace.json")));
  std::map<int, std::string> processes;
  std::map<int, std::map<std::string, int>> slices;  // pid -> node -> count
  for (const nlohmann::json& event : trace["traceEvents"]) {
    if (event["ph"] == "M" && event["name"] == "process_name") {
      processes[event["pid"].get<int>()] = event["args"]["name"].get<std::string>();
    } else if (event["ph"] == "X") {
      ++slices[event["pid"].get<int>()][event["name"].get<std::string>()];
      EXPECT_TRUE(event["args"].contains("op")) << event.dump();
    }
  }
  ASSERT_EQ(processes.size(), 4u) << trace.dump(1);
  EXPECT_EQ(processes.begin()->second, "reference, batch 1, threads auto");
  for (const auto& [pid, name] : processes) {
    SCOPED_TRACE(name);
    ASSERT_FALSE(slices[pid].empty());
    for (const auto& [node, count] : slices[pid]) EXPECT_EQ(count, 3) << node;
  }
}

TEST_F(BenchTest, UnknownScheduleIsAUsageErrorListingTheAcceptedOnes) {
  const CliResult result = cli(fmt::format("bench '{}' --schedule reference,fast", mlp()));
  EXPECT_EQ(result.code, 1);
  EXPECT_TRUE(contains(result.err, "fast")) << result.err;
  EXPECT_TRUE(contains(result.err, "reference, layerwise, onednn")) << result.err;
}

// depthwise:halo and depthwise:rolling are the two ways tiles get their halo rows, and
// depthwise:tiles runs every column as tiles without measuring it against its ops whole: three
// paths of one run, the same bits. Any other variant is a usage error naming these.
TEST_F(BenchTest, DepthwiseVariantsAreThreePathsWithTheSameOutputs) {
  const CliResult result =
      cli(fmt::format("bench '{}' --schedule depthwise:halo,depthwise:rolling,depthwise:tiles "
                      "--batch 2 --threads 1 --time 0.2 --min-reps 2",
                      mlp()));
  ASSERT_EQ(result.code, 0) << result.err;
  const auto rows = table_rows(result.out, "mlp.onnx");
  ASSERT_EQ(rows.size(), 3u) << result.out;
  EXPECT_EQ(rows[0][1], "depthwise:halo");
  EXPECT_EQ(rows[1][1], "depthwise:rolling");
  EXPECT_EQ(rows[2][1], "depthwise:tiles");
  EXPECT_EQ(rows[1][11], "0.0e+00") << result.out;
  EXPECT_EQ(rows[2][11], "0.0e+00") << result.out;
  const CliResult unknown = cli(fmt::format("bench '{}' --schedule depthwise:fast", mlp()));
  EXPECT_EQ(unknown.code, 1);
  EXPECT_TRUE(contains(unknown.err, "depthwise:tiles")) << unknown.err;
}

// With turns of several runs, each turn's first run is not timed: turns of 3 give 2 timed runs
// each, so a minimum of 3 is met after two turns, with 4 (with --time 0 nothing else counts).
TEST_F(BenchTest, TurnsOfSeveralRunsTimeAllButTheirFirst) {
  for (const auto& [runs_per_turn, reps] : {std::pair{1, 3}, std::pair{3, 4}}) {
    SCOPED_TRACE(fmt::format("--runs-per-turn {}", runs_per_turn));
    const CliResult result =
        cli(fmt::format("bench '{}' --schedule reference,reference --threads 1 --time 0 "
                        "--min-reps 3 --runs-per-turn {} --json '{}' --quiet",
                        mlp(), runs_per_turn, path("turns.json")));
    ASSERT_EQ(result.code, 0) << result.err;
    const nlohmann::json json = nlohmann::json::parse(read_text(path("turns.json")));
    EXPECT_EQ(json["settings"]["runs_per_turn"], runs_per_turn);
    for (const nlohmann::json& row : json["results"]) EXPECT_EQ(row["reps"], reps) << row.dump();
  }
  EXPECT_EQ(cli(fmt::format("bench '{}' --runs-per-turn 0", mlp())).code, 1);
}

TEST_F(BenchTest, UnknownPathVariantIsAUsageErrorNamingTheVariants) {
  for (const char* path : {"depthwise:fast", "layerwise:halo"}) {
    const CliResult result = cli(fmt::format("bench '{}' --schedule {}", mlp(), path));
    EXPECT_EQ(result.code, 1) << path;
    EXPECT_TRUE(contains(result.err, path)) << result.err;
    EXPECT_TRUE(contains(result.err, "depthwise:halo and depthwise:rolling")) << result.err;
  }
}

TEST_F(BenchTest, MissingModelIsOneErrorLine) {
  const CliResult result =
      cli(fmt::format("bench '{}' --schedule reference --time 0 --quiet", path("absent.onnx")));
  EXPECT_EQ(result.code, 2);
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
  EXPECT_TRUE(contains(result.err, "absent.onnx")) << result.err;
  EXPECT_TRUE(result.out.empty()) << result.out;
}

TEST_F(BenchTest, SymbolicNonBatchDimensionAsksForInputData) {
  onnx::ModelProto model = testing::make_model();
  testing::add_input(model, "x", {"batch", "seq"});
  testing::add_node(model, "Relu", {"x"}, {"y"}, "relu");
  testing::add_output(model, "y", {"batch", "seq"});
  const std::string file = save(model, "seq.onnx");

  const CliResult random = cli(fmt::format("bench '{}' --schedule reference --quiet", file));
  EXPECT_EQ(random.code, 2);
  EXPECT_TRUE(contains(random.err, "axis 1")) << random.err;
  EXPECT_TRUE(contains(random.err, "--input x=FILE.npy")) << random.err;

  write_npy(path("x.npy"), test::random_tensor({4, 7}, 1));
  const CliResult given = cli(fmt::format(
      "bench '{}' --schedule reference --batch 2,4 --time 0.05 --input '{}'", file, path("x.npy")));
  EXPECT_EQ(given.code, 0) << given.err;
  EXPECT_EQ(table_rows(given.out, "seq.onnx").size(), 2u) << given.out;
}

TEST_F(BenchTest, InputFileMustHoldEnoughSamplesOfTheRightShape) {
  write_npy(path("x3.npy"), test::random_tensor({3, 4}, 1));
  const CliResult too_few = cli(fmt::format(
      "bench '{}' --schedule reference --batch 1,4 --input '{}' --quiet", mlp(), path("x3.npy")));
  EXPECT_EQ(too_few.code, 2);
  EXPECT_TRUE(contains(too_few.err, "3 samples")) << too_few.err;

  write_npy(path("x5.npy"), test::random_tensor({3, 5}, 1));
  const CliResult wrong_shape = cli(
      fmt::format("bench '{}' --schedule reference --input '{}' --quiet", mlp(), path("x5.npy")));
  EXPECT_EQ(wrong_shape.code, 2);
  EXPECT_TRUE(contains(wrong_shape.err, "[3, 5]")) << wrong_shape.err;
}

TEST_F(BenchTest, FixedBatchSizeIsEnforced) {
  onnx::ModelProto model = testing::make_model();
  testing::add_input(model, "x", {int64_t{2}, int64_t{4}});
  testing::add_node(model, "Relu", {"x"}, {"y"}, "relu");
  testing::add_output(model, "y", {int64_t{2}, int64_t{4}});
  const CliResult result = cli(
      fmt::format("bench '{}' --schedule reference --batch 1 --quiet", save(model, "fixed.onnx")));
  EXPECT_EQ(result.code, 2);
  EXPECT_TRUE(contains(result.err, "--batch 2")) << result.err;
}

// A Reshape to a fixed [2, 4] runs at batch 2 and fails at batch 1: the failure is a row of the
// table, the other rows are still measured, and --strict turns it into exit 2.
TEST_F(BenchTest, PathThatFailsIsReportedInTheTableAndStrictFailsTheRun) {
  onnx::ModelProto model = testing::make_model();
  testing::add_input(model, "x", {"batch", int64_t{4}});
  testing::add_initializer(model, testing::make_int64_tensor("shape", {2}, {2, 4}));
  testing::add_node(model, "Reshape", {"x", "shape"}, {"y"}, "reshape");
  testing::add_output(model, "y", {int64_t{2}, int64_t{4}});
  const std::string file = save(model, "reshape.onnx");

  const std::string args =
      fmt::format("bench '{}' --schedule reference --batch 1,2 --time 0.05 --json '{}'", file,
                  path("out.json"));
  const CliResult lenient = cli(args);
  EXPECT_EQ(lenient.code, 0) << lenient.err;
  const auto rows = table_rows(lenient.out, "reshape.onnx");
  ASSERT_EQ(rows.size(), 2u) << lenient.out;
  EXPECT_EQ(rows[0][4], "error:") << lenient.out;
  EXPECT_NE(rows[1][4], "error:") << lenient.out;
  EXPECT_TRUE(contains(lenient.err, "reference failed at batch 1")) << lenient.err;
  const nlohmann::json json = nlohmann::json::parse(read_text(path("out.json")));
  EXPECT_EQ(json["results"][0]["status"], "error");
  EXPECT_FALSE(json["results"][0]["error"].get<std::string>().empty());
  EXPECT_EQ(json["results"][1]["status"], "ok");

  const CliResult strict = cli(args + " --strict");
  EXPECT_EQ(strict.code, 2);
  EXPECT_TRUE(contains(strict.err, "--strict")) << strict.err;

  const CliResult none_ran =
      cli(fmt::format("bench '{}' --schedule reference --batch 1 --quiet", file));
  EXPECT_EQ(none_ran.code, 2);
  EXPECT_TRUE(contains(none_ran.err, "no execution path ran")) << none_ran.err;
}

}  // namespace
}  // namespace sparsecol
