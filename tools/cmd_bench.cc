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
#include "input_files.h"
#include "runtime/topology.h"
#include "sparsecol/io.h"
#include "sparsecol/sparsecol.h"
#include "tensor_compare.h"
#include "trace.h"

namespace sparsecol::cli {
namespace {

using Clock = std::chrono::steady_clock;

// Outputs further apart than this (relative to the largest reference magnitude) are reported
// as a mismatch: float32 kernels that sum in another order differ by ~1e-6 relative on these
// models; a wrong kernel differs by far more.
constexpr double kAgreementTolerance = 1e-3;

// kDefaultBenchSchedules as a list.
std::vector<std::string> default_schedules() {
  std::vector<std::string> names;
  std::string list = kDefaultBenchSchedules;
  for (std::size_t start = 0; start <= list.size();) {
    const std::size_t comma = std::min(list.find(',', start), list.size());
    names.push_back(list.substr(start, comma - start));
    start = comma + 1;
  }
  return names;
}

struct BenchArgs {
  std::string model;
  EngineTuning tuning;  // the same for every path
  std::vector<std::string> schedules = default_schedules();
  std::vector<int64_t> batches = {1};
  std::vector<int> threads = {0};
  double time = 10;
  int warmup = 2;
  int64_t min_reps = 3;
  int runs_per_turn = 1;
  uint32_t seed = 1;
  std::vector<std::string> inputs;
  std::string json, plot, trace;
  bool per_layer = false;
  int per_layer_top = 20;
  int profile_reps = 3;
  bool strict = false;
  bool quiet = false;
};

// One entry of --schedule. A schedule listed twice is measured twice (a way to see the noise).
// "depthwise:halo" and "depthwise:rolling" pick Options::tile_reuse, to compare the two;
// "depthwise:tiles" runs every column as tiles, as planned (Options::measure_columns off).
struct PathSpec {
  std::string label;
  Schedule schedule;
  std::optional<TileReuse> tile_reuse;
  bool measure_columns = true;
};

// A --schedule entry as a schedule and an optional ":variant"; throws Error(kInvalidArgument).
PathSpec parse_path(const std::string& name) {
  const std::size_t colon = name.find(':');
  PathSpec spec{name, parse_schedule(name.substr(0, colon)), std::nullopt};
  if (colon == std::string::npos) return spec;
  const std::string variant = name.substr(colon + 1);
  if (spec.schedule != Schedule::kDepthWise ||
      (variant != "halo" && variant != "rolling" && variant != "tiles")) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("unknown path '{}': the variants are depthwise:halo and "
                            "depthwise:rolling (how tiles get their halo rows) and "
                            "depthwise:tiles (every column as tiles, none measured against its "
                            "ops whole)",
                            name));
  }
  if (variant == "tiles") {
    spec.measure_columns = false;
  } else {
    spec.tile_reuse = variant == "halo" ? TileReuse::kHalo : TileReuse::kRolling;
  }
  return spec;
}

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
    specs.push_back(parse_path(*name));
    if (seen > 0) specs.back().label = fmt::format("{}#{}", *name, seen + 1);
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

// The model's inputs, each with its --input file's samples when one was given.
class InputSource {
 public:
  InputSource(const std::vector<TensorInfo>& infos, const std::vector<std::string>& specs,
              uint32_t seed)
      : infos_(infos), seed_(seed), files_(bind_inputs(infos_, specs, /*require_all=*/false)) {
    for (const BoundInput& file : files_) check_input_fits(file);
  }
  // files_ points into infos_.
  InputSource(const InputSource&) = delete;
  InputSource& operator=(const InputSource&) = delete;

  // Every model input at batch size `batch`: the first `batch` samples of its file, or seeded
  // random values. Throws Error when a shape cannot be made.
  NamedTensors feed(int64_t batch) const {
    NamedTensors feed;
    std::mt19937 rng(seed_);
    for (const TensorInfo& info : infos_) {
      const auto file = std::find_if(files_.begin(), files_.end(),
                                     [&](const BoundInput& b) { return b.info == &info; });
      feed.emplace(info.name, file == files_.end() ? random_input(info, batch, rng)
                                                   : file_input(*file, batch));
    }
    return feed;
  }

 private:
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

  static Tensor file_input(const BoundInput& input, int64_t batch) {
    if (input.info->shape_known) check_batch_axis(*input.info, batch);
    if (input.file.samples() < batch) {
      throw Error(
          ErrorCode::kShapeMismatch,
          fmt::format("input '{}' ({}): the file has {} samples, --batch {} needs at "
                      "least {}",
                      input.info->name, input.file.where(), input.file.samples(), batch, batch));
    }
    return input.file.samples_view(0, batch);
  }

  std::vector<TensorInfo> infos_;
  uint32_t seed_;
  std::vector<BoundInput> files_;
};

// ---- agreement ----

// The worst Difference::max_abs_over_max over every output; infinity, with `why` set, when the
// outputs do not even have the same names, dtypes or shapes.
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
    worst = std::max(worst, compare(got, want, 0, 0).max_abs_over_max);
  }
  return worst;
}

// ---- measuring ----

// Profiled runs' events summed per node (over tiles, threads and runs) and divided by the number
// of runs; slowest first.
std::vector<LayerTime> time_per_node(const std::vector<ProfileEvent>& events, int runs) {
  std::vector<LayerTime> layers;
  std::map<std::pair<std::string, std::string>, std::size_t> index;  // (node, op) -> layers[i]
  for (const ProfileEvent& event : events) {
    const auto [it, added] = index.try_emplace({event.name, event.op}, layers.size());
    if (added) layers.push_back({event.name, event.op, 0, 0});
    LayerTime& layer = layers[it->second];
    layer.seconds += static_cast<double>(event.duration_ns) * 1e-9;
    layer.events += 1;
  }
  for (LayerTime& layer : layers) {
    layer.seconds /= runs;
    layer.events /= runs;
  }
  // Stable: nodes that take the same time keep the order they ran in.
  std::stable_sort(layers.begin(), layers.end(),
                   [](const LayerTime& a, const LayerTime& b) { return a.seconds > b.seconds; });
  return layers;
}

std::string describe_exception() {
  try {
    throw;
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return fmt::format("internal error: {}", e.what());
  }
}

// --warmup, or more where a path is still measuring its columns: the timed runs see the
// schedule it settled on.
int warmup_runs(const Engine& engine, int warmup) {
  const Options& options = engine.options();
  const bool measures = options.schedule == Schedule::kDepthWise && options.measure_columns;
  return measures ? std::max(warmup, kColumnMeasuringRuns) : warmup;
}

// Measures every path at one (batch, threads) point and appends one row per path.
void measure_point(std::vector<PathState>& paths, const NamedTensors& feed, int64_t batch,
                   int threads, const BenchArgs& args, std::vector<BenchRow>& rows,
                   TraceRecorder* trace) {
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
      for (int i = 1; i < warmup_runs(*paths[p].engine, args.warmup); ++i) {
        paths[p].session->run(feed);
      }
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

  // Take turns until the budget is spent and every path has its minimum of timed runs. A turn
  // of several runs times all but its first, which refills the caches after the other paths'
  // turns (see --runs-per-turn).
  std::vector<std::vector<double>> seconds(paths.size());
  const auto start = Clock::now();
  while (!live.empty()) {
    for (auto it = live.begin(); it != live.end();) {
      try {
        for (int r = 0; r < args.runs_per_turn; ++r) {
          const auto run_start = Clock::now();
          paths[*it].session->run(feed);
          if (r > 0 || args.runs_per_turn == 1) seconds[*it].push_back(seconds_since(run_start));
        }
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

  // Profiled runs of their own, after the timed ones: reading the clock around every node must
  // not slow the runs the table reports.
  if (!args.per_layer && trace == nullptr) return;
  for (std::size_t p : live) {
    BenchRow& row = rows[first_row + p];
    Session& session = *paths[p].session;
    const int process = trace != nullptr
                            ? trace->add_process(fmt::format(
                                  "{}, batch {}, threads {}", row.path, batch,
                                  threads == 0 ? std::string("auto") : std::to_string(threads)))
                            : 0;
    std::vector<ProfileEvent> events;
    session.set_profiling(true);
    try {
      for (int r = 0; r < args.profile_reps; ++r) {
        const auto run_start = Clock::now();
        session.run(feed);
        events.insert(events.end(), session.profile().begin(), session.profile().end());
        if (trace != nullptr) trace->add_run(process, run_start, session.profile());
      }
    } catch (...) {
      row.error = describe_exception();
    }
    session.set_profiling(false);
    row.profiled_runs = args.profile_reps;
    row.layers = time_per_node(events, args.profile_reps);
  }
}

int bench(const BenchArgs& args) {
  const std::vector<PathSpec> specs = path_specs(args.schedules);
  check_writable_folder(args.json);
  check_writable_folder(args.plot);
  check_writable_folder(args.trace);
  std::optional<TraceRecorder> trace;
  if (!args.trace.empty()) trace.emplace();

  BenchReport report;
  report.model = args.model;
  report.agreement_tolerance = kAgreementTolerance;
  report.time_budget_s = args.time;
  report.warmup = args.warmup;
  report.min_reps = args.min_reps;
  report.runs_per_turn = args.runs_per_turn;
  report.seed = args.seed;
  report.input_files = args.inputs;
  report.machine = describe_machine();
  report.machine.round_trip_ns_before = runtime::core_round_trip_ns(0, 1);

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
        if (spec.tile_reuse) options.tile_reuse = *spec.tile_reuse;
        options.measure_columns = spec.measure_columns;
        options.threads = threads;
        args.tuning.apply_to(options);
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
      measure_point(paths, feeds[b], args.batches[b], threads, args, report.rows,
                    trace ? &*trace : nullptr);
    }
  }
  report.machine.round_trip_ns_after = runtime::core_round_trip_ns(0, 1);
  // Grouped by batch, then threads (measured threads-first so that engines load once per count).
  std::stable_sort(report.rows.begin(), report.rows.end(),
                   [](const BenchRow& a, const BenchRow& b) {
                     return std::pair(a.batch, a.threads) < std::pair(b.batch, b.threads);
                   });

  fmt::print("{}", format_table(report));
  if (args.per_layer) fmt::print("{}", format_per_layer(report, args.per_layer_top));
  if (!args.json.empty()) write_text_file(args.json, format_json(report));
  if (!args.plot.empty()) write_text_file(args.plot, format_svg(report));
  if (trace) {
    trace->write(args.trace);
    if (!args.quiet) {
      fmt::print(stderr, "sparsecol bench: wrote {} ({} events{})\n", args.trace, trace->events(),
                 trace->full() ? ", full: later runs were not traced" : "");
    }
  }

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

CommandAction setup(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  app.add_option("MODEL", args->model, "the .onnx model")->required();
  const auto list = [](CLI::Option* option) {
    return option->delimiter(',')->expected(1)->allow_extra_args(false)->multi_option_policy(
        CLI::MultiOptionPolicy::TakeAll);
  };
  list(app.add_option("-s,--schedule", args->schedules,
                      "comma-separated execution paths to compare (depthwise, layerwise, onednn, "
                      "cuda, cuda-sparse, reference; depthwise:halo, depthwise:rolling, "
                      "depthwise:tiles); the "
                      "first one is the baseline for speedup and agreement; one this build or "
                      "machine lacks gets an error row"))
      ->check(parse_validator([](const std::string& name) { parse_path(name); }, "PATH"))
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
                 fmt::format("untimed runs of each path first; the first one's outputs are "
                             "compared (depthwise: at least {}, the runs over which it measures "
                             "its columns as tiles and whole, unless depthwise:tiles)",
                             kColumnMeasuringRuns))
      ->check(at_least(1))
      ->capture_default_str();
  app.add_option("--min-reps", args->min_reps, "timed runs of each path at least, even past --time")
      ->check(at_least(1))
      ->capture_default_str();
  app.add_option("--runs-per-turn", args->runs_per_turn,
                 "the paths take turns, each this many runs back to back, all but the first of a "
                 "turn timed (the first refills the caches the other paths' turns took: the "
                 "timed runs see what repeated requests to one model see); 1: one timed run "
                 "each, every run after another path's")
      ->check(at_least(1))
      ->capture_default_str();
  app.add_option("--seed", args->seed, "seed of the random inputs")->capture_default_str();
  app.add_option("-i,--input", args->inputs,
                 "input data instead of random values (repeatable): FILE for a model with one "
                 "input, NAME=FILE for input NAME, FILE.npz holding inputs by name; .npy, .npz "
                 "or TensorProto .pb; batches are its first samples (default: random)")
      ->expected(1)
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--json", args->json,
                 "also write the results and machine info as JSON here (default: none)");
  app.add_option("--plot", args->plot,
                 "also write a bar chart of items/s per path and (batch, threads) here, as SVG "
                 "(default: none)");
  app.add_flag("--per-layer", args->per_layer,
               "also profile each path (--profile-reps runs after the timed ones, so the table "
               "is not slowed) and print its time per node, slowest first");
  app.add_option("--per-layer-top", args->per_layer_top,
                 "--per-layer lists this many nodes per path, the rest in one line (0: all)")
      ->check(at_least(0))
      ->capture_default_str();
  app.add_option("--profile-reps", args->profile_reps,
                 "profiled runs of each path for --per-layer and --trace")
      ->check(at_least(1))
      ->capture_default_str();
  app.add_option("--trace", args->trace,
                 "also write the profiled runs as a Chrome/Perfetto trace here (JSON: a process "
                 "per path, a track per thread; default: none)");
  app.add_flag("--strict", args->strict,
               "exit 2 when a path fails or its outputs disagree with the baseline's")
      ->capture_default_str();
  app.add_flag("-q,--quiet", args->quiet, "no progress lines on stderr")->capture_default_str();
  args->tuning.add_to(app);
  return [args] { return bench(*args); };
}

const bool kRegistered = register_command(
    {"bench", "Compare execution paths side by side: latency, items/s, speedup, agreement", 20,
     setup});

}  // namespace
}  // namespace sparsecol::cli
