// `sparsecol check MODEL DIR`: runs a model on ONNX test data and compares its outputs with the
// expected ones.
//
// DIR holds test_data_set_N folders, each with input_K.pb and output_K.pb (serialized
// TensorProto files: the layout of ONNX's backend tests and model zoo); DIR may also be one such
// folder. input_K feeds the model input the file names, or the model's K-th input when it names
// none the model has; output_K is matched the same way. Every output is printed with its max
// absolute and relative error and PASS or FAIL.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "commands.h"
#include "input_files.h"
#include "sparsecol/io.h"
#include "sparsecol/sparsecol.h"
#include "tensor_compare.h"

namespace sparsecol::cli {
namespace {

namespace fs = std::filesystem;

struct CheckArgs {
  std::string model;
  EngineTuning tuning;
  std::string dir;
  // ONNX's backend test runner uses rtol 1e-3 and atol 1e-7; atol is 1e-5 here because the
  // expected outputs are often computed in float64 by numpy and ours in float32, so values that
  // cancel to near zero differ by ~1e-6 absolute (the conformance suite's tolerance too).
  double atol = 1e-5;
  double rtol = 1e-3;
  std::string schedule = kDefaultSchedule;
  int threads = 0;
};

// The files `prefix`_K.pb of a data set, ordered by K (input_10 after input_9).
std::vector<fs::path> numbered_files(const fs::path& dir, const std::string& prefix) {
  std::vector<std::pair<long, fs::path>> found;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(prefix + "_") || !name.ends_with(".pb")) continue;
    const std::string number = name.substr(prefix.size() + 1, name.size() - prefix.size() - 4);
    if (number.empty() || !std::all_of(number.begin(), number.end(),
                                       [](unsigned char c) { return std::isdigit(c) != 0; }))
      continue;
    found.emplace_back(std::stol(number), entry.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> files;
  for (auto& [number, path] : found) files.push_back(std::move(path));
  return files;
}

// The test_data_set_* folders of DIR, or DIR itself when it holds input_*.pb files.
std::vector<fs::path> data_sets(const std::string& dir) {
  std::error_code error;
  if (!fs::is_directory(dir, error)) {
    throw Error(ErrorCode::kNotFound, fmt::format("'{}' is not a folder", dir));
  }
  if (!numbered_files(dir, "input").empty()) return {fs::path(dir)};
  std::vector<fs::path> sets;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    if (entry.is_directory() && entry.path().filename().string().starts_with("test_data_set_")) {
      sets.push_back(entry.path());
    }
  }
  std::sort(sets.begin(), sets.end());
  if (sets.empty()) {
    throw Error(ErrorCode::kNotFound,
                fmt::format("'{}' holds no test_data_set_N folder and no input_N.pb file", dir));
  }
  return sets;
}

// Reads the numbered .pb files of one kind and names each after the model tensor it stands for.
NamedTensors read_named(const fs::path& set, const std::string& prefix,
                        const std::vector<TensorInfo>& infos) {
  const std::vector<fs::path> files = numbered_files(set, prefix);
  if (files.size() > infos.size()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: {} {}_N.pb files for a model with {} {}{} ({})", set.string(),
                            files.size(), prefix, infos.size(), prefix,
                            infos.size() == 1 ? "" : "s", list_tensors(infos)));
  }
  NamedTensors tensors;
  for (std::size_t k = 0; k < files.size(); ++k) {
    std::string stored;
    Tensor tensor = read_tensor_proto(files[k].string(), &stored);
    const std::string name = find_tensor(infos, stored) != nullptr ? stored : infos[k].name;
    if (!tensors.emplace(name, std::move(tensor)).second) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: two files give {} '{}'", set.string(), prefix, name));
    }
  }
  return tensors;
}

std::string error_text(double value) {
  return std::isfinite(value) ? fmt::format("{:.2e}", value) : "inf";
}

int check(const CheckArgs& args) {
  Options options;
  options.schedule = parse_schedule(args.schedule);
  options.threads = args.threads;
  args.tuning.apply_to(options);
  const Engine engine = Engine::load(args.model, options);
  Session session = engine.session();

  int passed = 0, failed = 0;
  const std::vector<fs::path> sets = data_sets(args.dir);
  for (const fs::path& set : sets) {
    const NamedTensors inputs = read_named(set, "input", engine.inputs());
    const NamedTensors expected = read_named(set, "output", engine.outputs());
    if (expected.empty()) {
      throw Error(ErrorCode::kNotFound, fmt::format("{}: no output_N.pb file", set.string()));
    }
    const NamedTensors actual = session.run(inputs);
    for (const auto& [name, want] : expected) {
      const Tensor& got = actual.at(name);
      std::string verdict;
      if (got.dtype() != want.dtype() || got.shape() != want.shape()) {
        verdict = fmt::format("FAIL (got {} {}, expected {} {})", to_string(got.dtype()),
                              shape_string(got.shape()), to_string(want.dtype()),
                              shape_string(want.shape()));
      } else {
        const Difference diff = compare(got, want, args.atol, args.rtol);
        verdict = fmt::format(
            "max abs {}  max rel {}  {}", error_text(diff.max_abs), error_text(diff.max_rel),
            diff.outside == 0
                ? "PASS"
                : fmt::format("FAIL ({} of {} elements outside)", diff.outside, want.numel()));
      }
      const bool ok = verdict.ends_with("PASS");
      (ok ? passed : failed) += 1;
      fmt::print("{}  {}  {} {}  {}\n", set.filename().string(), name, to_string(want.dtype()),
                 shape_string(want.shape()), verdict);
    }
  }
  fmt::print("{}: {} of {} outputs PASS in {} data set{} (atol {:g}, rtol {:g}, schedule {})\n",
             failed == 0 ? "PASS" : "FAIL", passed, passed + failed, sets.size(),
             sets.size() == 1 ? "" : "s", args.atol, args.rtol, args.schedule);
  return failed == 0 ? kExitOk : kExitMismatch;
}

CommandAction setup(CLI::App& app) {
  auto args = std::make_shared<CheckArgs>();
  app.add_option("MODEL", args->model, "the .onnx model")->required();
  app.add_option("DIR", args->dir,
                 "a folder of test_data_set_N folders holding input_K.pb and output_K.pb "
                 "(TensorProto files), or one such folder")
      ->required();
  app.add_option("--atol", args->atol,
                 "absolute tolerance: an element passes when |actual - expected| <= atol + "
                 "rtol * |expected| (integer and bool outputs must be equal)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--rtol", args->rtol, "relative tolerance (see --atol)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--schedule", args->schedule,
                 "execution schedule: depthwise, layerwise, onednn, cuda, cuda-sparse or "
                 "reference")
      ->check(schedule_validator())
      ->capture_default_str();
  app.add_option("-t,--threads", args->threads, "threads (0: one per physical core)")
      ->check(at_least(0))
      ->capture_default_str();
  app.footer(
      "Exit code 0 when every output passes, 4 when one does not, 2 when the model or a test "
      "file cannot be read or run.");
  args->tuning.add_to(app);
  return [args] { return check(*args); };
}

const bool kRegistered = register_command(
    {"check", "Compare a model's outputs with ONNX test data (input_N.pb, output_N.pb)", 40,
     setup});

}  // namespace
}  // namespace sparsecol::cli
