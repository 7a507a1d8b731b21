// The `sparsecol` subcommands and what they share.
//
// A subcommand lives in one file, tools/cmd_<name>.cc, which registers itself:
//
//   namespace {
//   CommandAction setup(CLI::App& app) {
//     auto args = std::make_shared<Args>();
//     app.add_option("MODEL", args->model, "the .onnx model")->required();
//     return [args] { ...; return kExitOk; };
//   }
//   const bool kRegistered = register_command({"name", "one-line description", 30, setup});
//   }  // namespace
//
// Static registration works here because tools/*.cc are linked into the executable directly,
// not through a static library whose unreferenced objects the linker would drop.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "sparsecol/sparsecol.h"

namespace sparsecol::cli {

// Exit codes, documented in `sparsecol --help`.
inline constexpr int kExitOk = 0;
inline constexpr int kExitUsage = 1;          // the command line does not parse
inline constexpr int kExitFailure = 2;        // a model, input or file error (sparsecol::Error)
inline constexpr int kExitInternal = 3;       // anything else: a bug
inline constexpr int kExitMismatch = 4;       // `check`: the model ran but an output is off
inline constexpr int kExitInterrupted = 130;  // 128 + SIGINT, as a shell reports Ctrl-C

// The schedule `run` and `check` use, and the paths `bench` compares, when none is given: the
// depth-wise schedule (the engine's fastest CPU path; it runs every model, falling back to
// layer-by-layer steps for ops that cannot be tiled), compared against the layer-by-layer
// baseline and oneDNN.
inline constexpr const char* kDefaultSchedule = "depthwise";
inline constexpr const char* kDefaultBenchSchedules = "depthwise,layerwise,onednn";

// What a subcommand does once its command line has parsed; throws sparsecol::Error on failure.
using CommandAction = std::function<int()>;

struct Command {
  const char* name;
  const char* description;
  int order;  // position in `sparsecol --help`
  // Adds the subcommand's options to `app`, bound to state that the returned action reads.
  std::function<CommandAction(CLI::App& app)> setup;
};

// Returns true so that a file can register from a static initializer.
bool register_command(Command command);
// Sorted by Command::order.
std::vector<Command> registered_commands();

// A CLI11 check that an integer option is at least `minimum`, with a plain message.
CLI::Validator at_least(int64_t minimum);

// A CLI11 check that passes a value when `parse` accepts it, and otherwise fails with the
// message of the sparsecol::Error that `parse` threw. `name` is the value's placeholder in --help.
CLI::Validator parse_validator(std::function<void(const std::string&)> parse,
                               const std::string& name);

// A CLI11 check that a --schedule value is one that sparsecol::parse_schedule accepts; its
// message lists them. (Whether the schedule is built and usable here is the Engine's to say.)
CLI::Validator schedule_validator();

// The engine settings `run`, `bench`, `check` and `inspect` let a user override (the fields of
// sparsecol::Options they map to); the defaults leave the engine's own choices.
struct EngineTuning {
  double sparse_threshold = -1.0;  // Options::sparse_threshold; negative: the measured default
  int64_t cache_budget_kib = 0;    // Options::cache_budget_bytes / 1024; 0: 3/4 of the machine's L2
  int tile_rows = 0;               // Options::tile_rows; 0: chosen per column
  int64_t shared_cache_kib = 0;    // Options::shared_cache_bytes / 1024; 0: hwloc's L3
  bool keep_tiles = false;         // Options::measure_columns off

  void add_to(CLI::App& app);
  void apply_to(Options& options) const;
};

// "850 us", "12.5 ms", "3.25 s", "4m05s", "1h02m".
std::string format_duration(double seconds);

// Latency percentiles over a set of timings (seconds), nearest-rank.
struct LatencyStats {
  double p50 = 0, p90 = 0, p99 = 0;
};
LatencyStats latency_stats(std::vector<double> seconds);

// Seconds since `start`.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Fails (Error naming the path and the folder) when the folder `path` would be written in is
// not writable: checked before long work rather than after it. An empty path passes.
void check_writable_folder(const std::string& path);

// Writes `text` to `path` through a temporary file renamed into place, so that a reader never
// sees half a file. Throws Error(kIoError / kNotFound) naming the file.
void write_text_file(const std::string& path, const std::string& text);

}  // namespace sparsecol::cli
