// What `sparsecol bench` measured, and the three ways it shows it: a text table (stdout), JSON
// (for scripts and for docs/BENCHMARKS.md) and an SVG bar chart (written as text, no plotting
// dependency). Kept apart from the measuring code in cmd_bench.cc so that each side stays small.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sparsecol::cli {

// One node's time in the profiled runs of a path (`bench --per-layer`).
struct LayerTime {
  std::string node;
  std::string op;
  double seconds = 0;  // per run, summed over the node's tiles and threads
  double events = 0;   // per run: 1 layer by layer, the number of tiles depth-wise
};

// One execution path at one (batch, threads) point.
struct BenchRow {
  std::string path;  // the schedule's name; "reference#2" when a schedule is listed twice
  int64_t batch = 0;
  int threads = 0;  // as asked: 0 is one thread per physical core
  // Empty when the path ran; otherwise why it could not (the Error's message), and the
  // measurements below are meaningless.
  std::string error;
  // The path that speedup and max_rel_diff compare with: the first listed path that ran at this
  // (batch, threads) point; empty when none ran.
  std::string baseline;
  int64_t reps = 0;
  double p50 = 0, p90 = 0, p99 = 0, mean = 0, min = 0;  // seconds per run
  double items_per_s = 0;                               // batch / p50
  std::optional<double> speedup;                        // baseline p50 / this p50
  std::optional<double> max_rel_diff;  // vs the baseline's outputs; none for the baseline itself
  // --per-layer: runs profiled after the timed ones (0: none), and their time per node, slowest
  // first (empty when the path records no profile).
  int profiled_runs = 0;
  std::vector<LayerTime> layers;
};

// The machine the numbers come from, so that a saved result says where it was taken.
struct MachineInfo {
  std::string cpu;  // "model name" from /proc/cpuinfo
  int logical_cpus = 0;
  int physical_cores = 0;
  bool avx512f = false;
  std::string max_isa;  // $SPARSECOL_MAX_ISA, empty when unset
  std::string date;     // UTC, ISO 8601
  // Cores 0 and 1's cache-line round trip (runtime::core_round_trip_ns) just before and just
  // after measuring; nullopt on one core. A shared virtual machine's figures with several
  // threads are only comparable between runs whose round trips agree.
  std::optional<double> round_trip_ns_before, round_trip_ns_after;
};

MachineInfo describe_machine();

struct BenchReport {
  std::string model;  // the path given on the command line
  double agreement_tolerance = 0;
  double time_budget_s = 0;  // per (batch, threads) point, all paths together
  int warmup = 0;
  int64_t min_reps = 0;
  int runs_per_turn = 1;
  uint32_t seed = 0;
  std::vector<std::string> input_files;  // empty: seeded random inputs
  MachineInfo machine;
  std::vector<BenchRow> rows;  // grouped by (batch, threads), paths in command-line order
};

// The table for stdout, one line per row under a header line.
std::string format_table(const BenchReport& report);
// Each profiled row's time per node, slowest first, with its share of the row's total: the
// `top` slowest nodes (0: all) and one line for the rest.
std::string format_per_layer(const BenchReport& report, int top);
// The whole report as pretty-printed JSON.
std::string format_json(const BenchReport& report);
// A grouped bar chart of items/s: one group per (batch, threads), one bar and colour per path.
std::string format_svg(const BenchReport& report);

}  // namespace sparsecol::cli
