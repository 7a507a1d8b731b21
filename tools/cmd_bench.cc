// `sparsecol bench MODEL --schedule reference,layerwise,onednn --batch 1,16 --threads 1,2`:
// the execution paths side by side, in one process, on the same inputs.
//
// For each (batch, threads) point every path gets its own Engine and Session. Each path is
// warmed up, then the paths' outputs are compared with the first path's (a fast path that is
// fast because it is wrong must not look good), then the paths take turns, one run each
// (A B C A B C ...), until the point's time budget is spent: frequency scaling, thermal drift
// or a noisy neighbour then hit every path alike instead of whichever happened to run last.
// A path that cannot run (not built, unsupported op) gets an error row; the others go on.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "bench_report.h"
#include "commands.h"
#include "sparsecol/io.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol::cli {
namespace {

using Clock = std::chrono::steady_clock;

// Outputs further apart than this (relative to the largest reference magnitude) are reported
// as a mismatch: float32 kernels that sum in another order differ by ~1e-6 relative on these
// models; a wrong kernel differs by far more.
constexpr double kAgreementTolerance = 1e-3;

struct BenchArgs {
  std::string model;
  std::vector<std::string> schedules = {"reference", "layerwise", "onednn"};
  std::vector<int64_t> batches = {1};
  std::vector<int> threads = {0};
  double time = 10;
  int warmup = 2;
  int64_t min_reps = 3;
  uint32_t seed = 1;
  std::vector<std::string> inputs;
  std::string json, plot;
  bool strict = false;
  bool quiet = false;
};

// One entry of --schedule. A schedule listed twice is measured twice (a way to see the noise).
struct PathSpec {
  std::string label;
  Schedule schedule;
};

// One path at one thread count.
struct PathState {
  const PathSpec* spec;
  std::optional<Engine> engine;
  std::optional<Session> session;
  std::string load_error;
  ErrorCode load_code = ErrorCode::kInternal;
};

std::vector<PathSpec> path_specs(const std::vector<std::string>& names) {
  std::vector<PathSpec> specs;
  for (auto name = names.begin(); name != names.end(); ++name) {
    const auto seen = std::count(names.begin(), name, *name);
    specs.push_back(
        {seen == 0 ? *name : fmt::format("{}#{}", *name, seen + 1), parse_schedule(*name)});
  }
  return specs;
}

// ---- inputs ----

template <typename T>
void fill_random(Tensor& tensor, std::mt19937& rng) {
  T* dst = tensor.data<T>();
  if constexpr (std::is_floating_point_v<T>) {
    std::normal_distribution<T> dist(0, 1);
    for (int64_t i = 0; i < tensor.numel(); ++i) dst[i] = dist(rng);
  } else {
    // 0 or 1: a valid token id, attention mask, index or flag for most models; anything
    // else needs the user's data (--input).
    std::bernoulli_distribution dist(0.5);
    for (int64_t i = 0; i < tensor.numel(); ++i) dst[i] = static_cast<T>(dist(rng));
  }
}

Tensor random_tensor(DType dtype, const std::vector<int64_t>& shape, std::mt19937& rng) {
  Tensor tensor = Tensor::zeros(dtype, shape);
  switch (dtype) {
    case DType::kFloat32:
      fill_random<float>(tensor, rng);
      break;
    case DType::kFloat64:
      fill_random<double>(tensor, rng);
      break;
    case DType::kInt64:
      fill_random<int64_t>(tensor, rng);
      break;
    case DType::kInt32:
      fill_random<int32_t>(tensor, rng);
      break;
    case DType::kInt8:
      fill_random<int8_t>(tensor, rng);
      break;
    case DType::kUInt8:
      fill_random<uint8_t>(tensor, rng);
      break;
    case DType::kBool:
      fill_random<bool>(tensor, rng);
      break;
  }
  return tensor;
}

// The model's inputs, each with its --input file's contents when one was given.
class InputSource {
 public:
  InputSource(const std::vector<TensorInfo>& infos, const std::vector<std::string>& specs,
              uint32_t seed)
      : infos_(infos), seed_(seed) {
    for (const std::string& spec : specs) {
      const std::size_t eq = spec.find('=');
      std::string name, path = spec;
      if (eq != std::string::npos) {
        name = spec.substr(0, eq);
        path = spec.substr(eq + 1);
      } else if (infos.size() == 1) {
        name = infos.front().name;
      } else {
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("--input {}: the model has {} inputs ({}); name each with --input "
                                "NAME=FILE.npy",
                                spec, infos.size(), input_names()));
      }
      if (find(name) == nullptr) {
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("--input {}: the model has no input named '{}' (inputs: {})", spec,
                                name, input_names()));
      }
      if (files_.count(name) != 0) {
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("input '{}' is given twice by --input", name));
      }
      files_.emplace(name, std::make_pair(path, read_npy(path)));
    }
  }

  // Every model input at batch size `batch`: the first `batch` samples of its file, or seeded
  // random values. Throws Error when a shape cannot be made.
  NamedTensors feed(int64_t batch) const {
    NamedTensors feed;
    std::mt19937 rng(seed_);
    for (const TensorInfo& info : infos_) {
      const auto file = files_.find(info.name);
      feed.emplace(info.name, file == files_.end() ? random_input(info, batch, rng)
                                                   : file_input(info, batch, file->second.first,
                                                                file->second.second));
    }
    return feed;
  }

 private:
  const TensorInfo* find(const std::string& name) const {
    for (const TensorInfo& info : infos_) {
      if (info.name == name) return &info;
    }
    return nullptr;
  }

  std::string input_names() const {
    std::vector<std::string> names;
    for (const TensorInfo& info : infos_) names.push_back(info.name);
    return fmt::format("{}", fmt::join(names, ", "));
  }

  static void check_batch_axis(const TensorInfo& info, int64_t batch) {
    if (info.shape.empty() || info.shape.front() < 0 || info.shape.front() == batch) return;
    throw Error(
        ErrorCode::kShapeMismatch,
        fmt::format("input '{}' has a fixed batch size of {} (shape {}); run with --batch {}",
                    info.name, info.shape.front(), shape_string(info), info.shape.front()));
  }

  static Tensor random_input(const TensorInfo& info, int64_t batch, std::mt19937& rng) {
    if (!info.shape_known) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("input '{}' has no shape in the model; give its data with --input "
                              "{}=FILE.npy",
                              info.name, info.name));
    }
    check_batch_axis(info, batch);
    std::vector<int64_t> shape = info.shape;
    for (std::size_t axis = 0; axis < shape.size(); ++axis) {
      if (shape[axis] >= 0) continue;
      if (axis == 0) {
        shape[axis] = batch;
        continue;
      }
      // Only axis 0 is the batch; a sequence length, image size... is the user's choice.
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("input '{}' {} has a symbolic dimension at axis {} that --batch "
                              "does not set; give its data with --input {}=FILE.npy",
                              info.name, shape_string(info), axis, info.name));
    }
    return random_tensor(info.dtype, shape, rng);
  }

  static Tensor file_input(const TensorInfo& info, int64_t batch, const std::string& path,
                           const Tensor& data) {
    const std::string where = fmt::format("input '{}' ({})", info.name, path);
    if (data.dtype() != info.dtype) {
      throw Error(ErrorCode::kDtypeMismatch,
                  fmt::format("{}: the model expects dtype {}, the file holds {}", where,
                              to_string(info.dtype), to_string(data.dtype())));
    }
    if (data.rank() == 0) {
      throw Error(ErrorCode::kShapeMismatch,
                  fmt::format("{}: a scalar has no sample axis to take a batch from", where));
    }
    if (info.shape_known) {
      bool fits = static_cast<std::size_t>(data.rank()) == info.shape.size();
      for (std::size_t axis = 1; fits && axis < info.shape.size(); ++axis) {
        fits = info.shape[axis] < 0 || info.shape[axis] == data.shape()[axis];
      }
      if (!fits) {
        throw Error(ErrorCode::kShapeMismatch,
                    fmt::format("{}: the file's shape {} does not fit the model's {} (axis 0 is "
                                "the sample axis)",
                                where, shape_string(data.shape()), shape_string(info)));
      }
      check_batch_axis(info, batch);
    }
    if (data.dim(0) < batch) {
      throw Error(ErrorCode::kShapeMismatch,
                  fmt::format("{}: the file has {} samples, --batch {} needs at least {}", where,
                              data.dim(0), batch, batch));
    }
    // The first `batch` samples are contiguous at the start: a view, no copy.
    std::vector<int64_t> shape = data.shape();
    shape[0] = batch;
    return Tensor::view(const_cast<void*>(data.raw_data()), data.dtype(), shape);
  }

  std::vector<TensorInfo> infos_;
  uint32_t seed_;
  std::map<std::string, std::pair<std::string, Tensor>> files_;  // name -> (path, contents)
};

// ---- agreement ----

std::vector<double> as_doubles(const Tensor& tensor) {
  std::vector<double> values(static_cast<std::size_t>(tensor.numel()));
  const auto copy = [&](const auto* src) { std::copy(src, src + values.size(), values.begin()); };
  switch (tensor.dtype()) {
    case DType::kFloat32:
      copy(tensor.data<float>());
      break;
    case DType::kFloat64:
      copy(tensor.data<double>());
      break;
    case DType::kInt64:
      copy(tensor.data<int64_t>());
      break;
    case DType::kInt32:
      copy(tensor.data<int32_t>());
      break;
    case DType::kInt8:
      copy(tensor.data<int8_t>());
      break;
    case DType::kUInt8:
      copy(tensor.data<uint8_t>());
      break;
    case DType::kBool:
      copy(tensor.data<bool>());
      break;
  }
  return values;
}

// max |actual - expected| / max |expected| for one output; infinity for NaN against a number.
double relative_diff(const Tensor& actual, const Tensor& expected) {
  const std::vector<double> a = as_doubles(actual), e = as_doubles(expected);
  double max_err = 0, max_ref = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(e[i])) continue;
    if (a[i] == e[i]) continue;  // equal infinities too
    const double err = std::abs(a[i] - e[i]);
    if (!std::isfinite(err)) return HUGE_VAL;
    max_err = std::max(max_err, err);
  }
  for (double v : e) {
    if (std::isfinite(v)) max_ref = std::max(max_ref, std::abs(v));
  }
  return max_ref > 0 ? max_err / max_ref : max_err;
}

// The worst relative_diff over every output; infinity, with `why` set, when the outputs do not
// even have the same names, dtypes or shapes.
double max_rel_diff(const NamedTensors& actual, const NamedTensors& expected, std::string& why) {
  double worst = 0;
  for (const auto& [name, want] : expected) {
    const auto found = actual.find(name);
    if (found == actual.end()) {
      why = fmt::format("output '{}' is missing", name);
      return HUGE_VAL;
    }
    const Tensor& got = found->second;
    if (got.dtype() != want.dtype() || got.shape() != want.shape()) {
      why = fmt::format("output '{}' is {} {}, expected {} {}", name, to_string(got.dtype()),
                        shape_string(got.shape()), to_string(want.dtype()),
                        shape_string(want.shape()));
      return HUGE_VAL;
    }
    worst = std::max(worst, relative_diff(got, want));
  }
  return worst;
}

// ---- measuring ----

std::string describe_exception() {
  try {
    throw;
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return fmt::format("internal error: {}", e.what());
  }
}

// Measures every path at one (batch, threads) point and appends one row per path.
void measure_point(std::vector<PathState>& paths, const NamedTensors& feed, int64_t batch,
                   int threads, const BenchArgs& args, std::vector<BenchRow>& rows) {
  const std::size_t first_row = rows.size();
  std::vector<NamedTensors> first_outputs(paths.size());
  std::vector<std::size_t> live;  // indices of the paths still running
  for (std::size_t p = 0; p < paths.size(); ++p) {
    BenchRow& row = rows.emplace_back();
    row.path = paths[p].spec->label;
    row.batch = batch;
    row.threads = threads;
    row.error = paths[p].load_error;
    if (!row.error.empty()) continue;
    try {
      // The first run builds the path's executor for this shape and gives the outputs that
      // the paths are compared on; the others warm caches, allocator and thread pool.
      first_outputs[p] = paths[p].session->run(feed);
      for (int i = 1; i < args.warmup; ++i) paths[p].session->run(feed);
      live.push_back(p);
    } catch (...) {
      row.error = describe_exception();
    }
  }
  const auto point_text = fmt::format("batch {}, threads {}", batch,
                                      threads == 0 ? std::string("auto") : std::to_string(threads));
  for (std::size_t p = 0; p < paths.size(); ++p) {
    if (!rows[first_row + p].error.empty() && !args.quiet) {
      fmt::print(stderr, "sparsecol bench: {} failed at {}: {}\n", paths[p].spec->label, point_text,
                 rows[first_row + p].error);
    }
  }
  if (live.empty()) return;

  const std::size_t baseline = live.front();
  for (std::size_t p : live) {
    BenchRow& row = rows[first_row + p];
    row.baseline = paths[baseline].spec->label;
    if (p == baseline) continue;
    std::string why;
    row.max_rel_diff = max_rel_diff(first_outputs[p], first_outputs[baseline], why);
    if (!(*row.max_rel_diff <= kAgreementTolerance)) {
      fmt::print(stderr,
                 "sparsecol bench: WARNING: {} DISAGREES with {} at {}: max rel diff {:.2e} > "
                 "{:.0e}{}\n",
                 row.path, row.baseline, point_text, *row.max_rel_diff, kAgreementTolerance,
                 why.empty() ? "" : "; " + why);
    }
  }
  first_outputs.clear();

  // Take turns until the budget is spent and every path has its minimum of runs.
  std::vector<std::vector<double>> seconds(paths.size());
  const auto start = Clock::now();
  while (!live.empty()) {
    for (auto it = live.begin(); it != live.end();) {
      try {
        const auto run_start = Clock::now();
        paths[*it].session->run(feed);
        seconds[*it].push_back(seconds_since(run_start));
        ++it;
      } catch (...) {
        rows[first_row + *it].error = describe_exception();
        it = live.erase(it);
      }
    }
    const bool enough = std::all_of(live.begin(), live.end(), [&](std::size_t p) {
      return static_cast<int64_t>(seconds[p].size()) >= args.min_reps;
    });
    if (enough && seconds_since(start) >= args.time) break;
  }

  for (std::size_t p = 0; p < paths.size(); ++p) {
    BenchRow& row = rows[first_row + p];
    if (!row.error.empty() || seconds[p].empty()) continue;
    const LatencyStats stats = latency_stats(seconds[p]);
    row.reps = static_cast<int64_t>(seconds[p].size());
    row.p50 = stats.p50;
    row.p90 = stats.p90;
    row.p99 = stats.p99;
    row.min = *std::min_element(seconds[p].begin(), seconds[p].end());
    double sum = 0;
    for (double s : seconds[p]) sum += s;
    row.mean = sum / static_cast<double>(seconds[p].size());
    row.items_per_s = static_cast<double>(batch) / row.p50;
  }
  const BenchRow& base = rows[first_row + baseline];
  for (std::size_t p = 0; p < paths.size(); ++p) {
    BenchRow& row = rows[first_row + p];
    if (row.error.empty() && base.error.empty()) row.speedup = base.p50 / row.p50;
  }
}

int bench(const BenchArgs& args) {
  const std::vector<PathSpec> specs = path_specs(args.schedules);
  check_writable_folder(args.json);
  check_writable_folder(args.plot);

  BenchReport report;
  report.model = args.model;
  report.agreement_tolerance = kAgreementTolerance;
  report.time_budget_s = args.time;
  report.warmup = args.warmup;
  report.min_reps = args.min_reps;
  report.seed = args.seed;
  report.input_files = args.inputs;
  report.machine = describe_machine();

  std::optional<InputSource> source;
  std::vector<NamedTensors> feeds;  // per --batch
  for (int threads : args.threads) {
    std::vector<PathState> paths;
    for (const PathSpec& spec : specs) {
      PathState& state = paths.emplace_back();
      state.spec = &spec;
      try {
        Options options;
        options.schedule = spec.schedule;
        options.threads = threads;
        state.engine.emplace(Engine::load(args.model, options));
        state.session.emplace(state.engine->session());
      } catch (const Error& e) {
        state.load_error = e.what();
        state.load_code = e.code();
      }
    }
    const auto loaded = std::find_if(paths.begin(), paths.end(),
                                     [](const PathState& s) { return s.engine.has_value(); });
    // The model itself is broken or missing: one error line, no table of copies of it.
    if (loaded == paths.end()) throw Error(paths.front().load_code, paths.front().load_error);
    if (!source) {
      // Every input at every batch size is made now, so that a bad --input or --batch fails
      // before any time is spent measuring.
      source.emplace(loaded->engine->inputs(), args.inputs, args.seed);
      for (int64_t batch : args.batches) feeds.push_back(source->feed(batch));
    }
    for (std::size_t b = 0; b < args.batches.size(); ++b) {
      if (!args.quiet) {
        fmt::print(stderr, "sparsecol bench: batch {}, threads {}: measuring {} for {}...\n",
                   args.batches[b], threads == 0 ? std::string("auto") : std::to_string(threads),
                   fmt::join(args.schedules, ", "), format_duration(args.time));
      }
      measure_point(paths, feeds[b], args.batches[b], threads, args, report.rows);
    }
  }
  // Grouped by batch, then threads (measured threads-first so that engines load once per count).
  std::stable_sort(report.rows.begin(), report.rows.end(),
                   [](const BenchRow& a, const BenchRow& b) {
                     return std::pair(a.batch, a.threads) < std::pair(b.batch, b.threads);
                   });

  fmt::print("{}", format_table(report));
  if (!args.json.empty()) write_text_file(args.json, format_json(report));
  if (!args.plot.empty()) write_text_file(args.plot, format_svg(report));

  std::set<std::string> errors;
  int failed = 0, mismatched = 0;
  for (const BenchRow& row : report.rows) {
    if (!row.error.empty()) {
      ++failed;
      errors.insert(fmt::format("{}: {}", row.path, row.error));
    } else if (row.max_rel_diff && !(*row.max_rel_diff <= kAgreementTolerance)) {
      ++mismatched;
    }
  }
  if (failed == static_cast<int>(report.rows.size())) {
    throw Error(ErrorCode::kUnsupported,
                fmt::format("no execution path ran ({})", fmt::join(errors, "; ")));
  }
  if (args.strict && (failed > 0 || mismatched > 0)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("--strict: {} row(s) failed, {} row(s) disagree with their baseline",
                            failed, mismatched));
  }
  return kExitOk;
}

CLI::Validator schedule_validator() {
  return CLI::Validator(
      [](std::string& name) {
        try {
          parse_schedule(name);
          return std::string();
        } catch (const Error& e) {
          return std::string(e.what());
        }
      },
      "SCHEDULE");
}

CommandAction setup(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  app.add_option("MODEL", args->model, "the .onnx model")->required();
  const auto list = [](CLI::Option* option) {
    return option->delimiter(',')->expected(1)->allow_extra_args(false)->multi_option_policy(
        CLI::MultiOptionPolicy::TakeAll);
  };
  list(app.add_option("-s,--schedule", args->schedules,
                      "comma-separated execution paths to compare (reference, layerwise, onednn); "
                      "the first one is the baseline for speedup and agreement"))
      ->check(schedule_validator())
      ->capture_default_str();
  list(app.add_option("-b,--batch", args->batches, "comma-separated batch sizes"))
      ->check(at_least(1))
      ->capture_default_str();
  list(app.add_option("-t,--threads", args->threads,
                      "comma-separated thread counts (0: one per physical core)"))
      ->check(at_least(0))
      ->capture_default_str();
  app.add_option("--time", args->time,
                 "seconds of measuring per (batch, threads) point, shared by all paths")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--warmup", args->warmup,
                 "untimed runs of each path first; the first one's outputs are compared")
      ->check(at_least(1))
      ->capture_default_str();
  app.add_option("--min-reps", args->min_reps, "timed runs of each path at least, even past --time")
      ->check(at_least(1))
      ->capture_default_str();
  app.add_option("--seed", args->seed, "seed of the random inputs")->capture_default_str();
  app.add_option("-i,--input", args->inputs,
                 "input data instead of random values: FILE.npy for a model with one input, or "
                 "NAME=FILE.npy (repeatable); batches are its first samples")
      ->expected(1)
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--json", args->json, "also write the results and machine info as JSON here");
  app.add_option("--plot", args->plot, "also write a bar chart of items/s here (SVG)");
  app.add_flag("--strict", args->strict,
               "exit 2 when a path fails or its outputs disagree with the baseline's")
      ->capture_default_str();
  app.add_flag("-q,--quiet", args->quiet, "no progress lines on stderr")->capture_default_str();
  return [args] { return bench(*args); };
}

const bool kRegistered = register_command(
    {"bench", "Compare execution paths side by side: latency, items/s, speedup, agreement", 20,
     setup});

}  // namespace
}  // namespace sparsecol::cli
