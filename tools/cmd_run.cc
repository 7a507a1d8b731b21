// `sparsecol run MODEL --input x.npy --output y.npy`: batch scoring of a large input.
//
// A .npy input is memory-mapped and fed in batches along axis 0 (the sample axis), so memory
// holds one batch of inputs plus the outputs (.npz and .pb inputs are read whole, see
// input_files.h); outputs are gathered into one preallocated tensor per output and written
// atomically at the end, so a failed or interrupted run leaves no partial file.
//
// Ctrl-C (SIGINT) stops scoring cleanly after the batch in progress, says how far it got and
// writes nothing (exit code 130, the shell's 128 + SIGINT); a second Ctrl-C kills at once.
// SIGKILL, or a crash, leaves at most the temporary file of an unfinished write, never a file
// at the output path.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "commands.h"
#include "input_files.h"
#include "sparsecol/io.h"
#include "sparsecol/sparsecol.h"
#include "trace.h"

namespace sparsecol::cli {
namespace {

using Clock = std::chrono::steady_clock;

// Set by the SIGINT handler, read between batches. A signal handler may only touch a
// volatile std::sig_atomic_t (or a lock-free atomic) safely.
volatile std::sig_atomic_t g_interrupted = 0;

void on_interrupt(int /*signal*/) { g_interrupted = 1; }

// Catches SIGINT for the lifetime of the scoring loop. SA_RESETHAND restores the default action
// as the handler runs, so that a second Ctrl-C terminates a batch that takes too long.
class InterruptHandler {
 public:
  InterruptHandler() {
    g_interrupted = 0;
    struct sigaction action {};
    action.sa_handler = on_interrupt;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESETHAND;
    installed_ = ::sigaction(SIGINT, &action, &previous_) == 0;
  }
  ~InterruptHandler() {
    if (installed_) ::sigaction(SIGINT, &previous_, nullptr);
  }
  InterruptHandler(const InterruptHandler&) = delete;
  InterruptHandler& operator=(const InterruptHandler&) = delete;

  bool interrupted() const { return g_interrupted != 0; }

 private:
  struct sigaction previous_ {};
  bool installed_ = false;
};

struct RunArgs {
  std::string model;
  EngineTuning tuning;
  std::vector<std::string> inputs;
  std::string output;
  std::vector<std::string> outputs;
  int64_t batch = 16;
  int threads = 0;
  std::string schedule = kDefaultSchedule;
  std::string trace;
  bool quiet = false;
};

// Checks what can be checked before scoring starts, so that a mistake costs no time: dtypes,
// per-sample shapes, sample counts and fixed batch sizes. Returns the number of samples.
int64_t check_inputs(const std::vector<BoundInput>& inputs, int64_t batch) {
  const BoundInput& first = inputs.front();
  const int64_t samples = first.file.samples();
  for (const BoundInput& input : inputs) {
    check_input_fits(input);
    const TensorInfo& info = *input.info;
    if (input.file.samples() != samples) {
      throw Error(ErrorCode::kShapeMismatch,
                  fmt::format("inputs differ in sample count: '{}' ({}) has {}, '{}' ({}) has {}",
                              first.info->name, first.file.where(), samples, info.name,
                              input.file.where(), input.file.samples()));
    }
    const int64_t fixed = info.shape_known ? info.shape.front() : -1;
    if (fixed >= 0 && (fixed != batch || samples % fixed != 0)) {
      throw Error(
          ErrorCode::kShapeMismatch,
          fmt::format("input '{}' ({}): the model fixes the batch size to {} (shape {}); "
                      "run with --batch {} and a sample count that is a multiple of it "
                      "(the file has {})",
                      info.name, input.file.where(), fixed, shape_string(info), fixed, samples));
    }
  }
  if (samples == 0) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("input '{}' ({}) has no samples",
                                                         first.info->name, first.file.where()));
  }
  return samples;
}

// The model outputs to write, in order: --outputs, or all of them.
std::vector<std::string> select_outputs(const Engine& engine, const RunArgs& args) {
  const std::vector<TensorInfo>& model_outputs = engine.outputs();
  std::vector<std::string> names = args.outputs;
  if (names.empty()) {
    for (const TensorInfo& info : model_outputs) names.push_back(info.name);
  }
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (find_tensor(model_outputs, names[i]) == nullptr) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("--outputs: the model has no output named '{}' (outputs: {})",
                              names[i], list_tensors(model_outputs)));
    }
    if (std::find(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(i), names[i]) !=
        names.begin() + static_cast<std::ptrdiff_t>(i)) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("--outputs: '{}' is named twice", names[i]));
    }
  }
  if (args.output.ends_with(".npy") && names.size() != 1) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: a .npy file holds one tensor but the model has {} outputs ({}); "
                            "choose one with --outputs NAME or write a .npz",
                            args.output, names.size(), list_tensors(model_outputs)));
  }
  return names;
}

// The outputs of all samples, filled batch by batch.
class OutputGather {
 public:
  OutputGather(std::vector<std::string> names, int64_t samples)
      : names_(std::move(names)), samples_(samples) {}

  void add(const NamedTensors& batch_outputs, int64_t begin, int64_t count) {
    for (const std::string& name : names_) {
      const auto found = batch_outputs.find(name);
      if (found == batch_outputs.end()) {
        throw Error(ErrorCode::kInternal, fmt::format("the session returned no output '{}'", name));
      }
      const Tensor& part = found->second;
      auto [it, first] = gathered_.try_emplace(name);
      if (part.rank() == 0 || part.dim(0) != count) {
        throw Error(ErrorCode::kShapeMismatch,
                    fmt::format("output '{}' has shape {} for a batch of {} samples; sparsecol run "
                                "needs outputs whose axis 0 is the batch",
                                name, shape_string(part.shape()), count));
      }
      std::vector<int64_t> full = part.shape();
      full[0] = samples_;
      // The first batch tells the per-sample shape; every later batch must agree.
      if (first) it->second = Tensor::zeros(part.dtype(), full);
      Tensor& all = it->second;
      if (all.dtype() != part.dtype() || all.shape() != full) {
        throw Error(ErrorCode::kShapeMismatch,
                    fmt::format("output '{}' changed from {} {} per batch to {} {} at sample {}",
                                name, to_string(all.dtype()), shape_string(all.shape()),
                                to_string(part.dtype()), shape_string(part.shape()), begin));
      }
      const std::size_t sample_bytes = all.nbytes() / static_cast<std::size_t>(samples_);
      std::memcpy(
          static_cast<char*>(all.raw_data()) + static_cast<std::size_t>(begin) * sample_bytes,
          part.raw_data(), part.nbytes());
    }
  }

  const NamedTensors& tensors() const { return gathered_; }

 private:
  std::vector<std::string> names_;
  int64_t samples_;
  NamedTensors gathered_;
};

// Progress on stderr: a bar redrawn in place on a terminal, a plain line every ~2 s otherwise
// (logs and CI capture stderr, where carriage returns make a mess).
class Progress {
 public:
  Progress(int64_t total, bool enabled)
      : total_(total), enabled_(enabled), tty_(::isatty(STDERR_FILENO) == 1) {}

  void update(int64_t done) {
    if (!enabled_) return;
    const auto now = Clock::now();
    const double since_print = std::chrono::duration<double>(now - last_print_).count();
    // Nothing at the end: the summary follows at once.
    if (since_print < (tty_ ? 0.1 : 2.0) || done >= total_) return;
    last_print_ = now;
    const double elapsed = seconds_since(start_);
    const double rate = elapsed > 0 ? static_cast<double>(done) / elapsed : 0;
    const double eta = rate > 0 ? static_cast<double>(total_ - done) / rate : -1;
    const double fraction = static_cast<double>(done) / static_cast<double>(total_);
    if (tty_) {
      constexpr int kWidth = 30;
      const int filled = static_cast<int>(fraction * kWidth);
      fmt::print(stderr, "\r[{:=<{}}{:<{}}] {}/{} samples  {:.0f} samples/s  ETA {}\x1b[K", "",
                 filled, "", kWidth - filled, done, total_, rate, format_duration(eta));
      drawn_ = true;
    } else {
      fmt::print(stderr, "sparsecol: {}/{} samples ({:.0f}%), {:.0f} samples/s, ETA {}\n", done,
                 total_, 100 * fraction, rate, format_duration(eta));
    }
    std::fflush(stderr);
  }

  // Erases the bar so that the summary, or an error, takes its place.
  void finish() {
    if (drawn_) fmt::print(stderr, "\r\x1b[K");
    drawn_ = false;
  }
  ~Progress() { finish(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

 private:
  int64_t total_;
  bool enabled_;
  bool tty_;
  bool drawn_ = false;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_print_ = start_;
};

int run(const RunArgs& args) {
  // From the start: Ctrl-C while the model loads also ends the run cleanly at the first check.
  const InterruptHandler interrupt;
  Options options;
  options.schedule = parse_schedule(args.schedule);
  options.threads = args.threads;
  args.tuning.apply_to(options);
  const Engine engine = Engine::load(args.model, options);
  const std::vector<BoundInput> inputs =
      bind_inputs(engine.inputs(), args.inputs, /*require_all=*/true);
  const int64_t samples = check_inputs(inputs, args.batch);
  const std::vector<std::string> output_names = select_outputs(engine, args);
  check_writable_folder(args.output);
  check_writable_folder(args.trace);

  Session session = engine.session();
  std::optional<TraceRecorder> trace;
  int trace_process = 0;
  if (!args.trace.empty()) {
    trace.emplace();
    trace_process = trace->add_process(
        fmt::format("run {}: {}, batch {}, {} threads", args.model, args.schedule, args.batch,
                    args.threads == 0 ? "auto" : std::to_string(args.threads)));
    session.set_profiling(true);
  }
  OutputGather gather(output_names, samples);
  Progress progress(samples, !args.quiet);
  std::vector<double> latencies;
  const auto start = Clock::now();
  for (int64_t begin = 0; begin < samples; begin += args.batch) {
    if (interrupt.interrupted()) {
      progress.finish();
      fmt::print(stderr,
                 "sparsecol: interrupted after {} of {} samples ({} batches of {}); nothing "
                 "written to {}\n",
                 begin, samples, latencies.size(), args.batch, args.output);
      return kExitInterrupted;
    }
    const int64_t count = std::min(args.batch, samples - begin);
    NamedTensors feed;
    for (const BoundInput& input : inputs) {
      feed.emplace(input.info->name, input.file.samples_view(begin, count));
    }
    const auto batch_start = Clock::now();
    const NamedTensors outputs = session.run(feed);
    latencies.push_back(seconds_since(batch_start));
    // A full trace stops profiling: the rest of the run goes at full speed.
    if (trace && !trace->add_run(trace_process, batch_start, session.profile())) {
      session.set_profiling(false);
    }
    gather.add(outputs, begin, count);
    // Read pages of the inputs would otherwise stay resident: memory would grow with the file.
    for (const BoundInput& input : inputs) input.file.release_before(begin + count);
    progress.update(begin + count);
  }
  const double wall = seconds_since(start);
  progress.finish();

  if (args.output.ends_with(".npz")) {
    write_npz(args.output, gather.tensors());
  } else {
    write_npy(args.output, gather.tensors().begin()->second);
  }
  if (trace) trace->write(args.trace);

  if (!args.quiet) {
    const LatencyStats stats = latency_stats(latencies);
    fmt::print(stderr,
               "sparsecol: {} samples in {} ({:.{}f} samples/s), {} batches of {}; batch latency "
               "p50 {}, p90 {}, p99 {}\n",
               samples, format_duration(wall), static_cast<double>(samples) / wall,
               static_cast<double>(samples) / wall < 100 ? 1 : 0, latencies.size(), args.batch,
               format_duration(stats.p50), format_duration(stats.p90), format_duration(stats.p99));
    std::vector<std::string> written;
    for (const auto& [name, tensor] : gather.tensors()) {
      written.push_back(
          fmt::format("{} {} {}", name, to_string(tensor.dtype()), shape_string(tensor.shape())));
    }
    fmt::print(stderr, "sparsecol: wrote {} ({})\n", args.output, fmt::join(written, ", "));
    if (trace) {
      fmt::print(stderr, "sparsecol: wrote {} ({} events{})\n", args.trace, trace->events(),
                 trace->full() ? ", full: later batches were not traced" : "");
    }
  }
  return kExitOk;
}

CommandAction setup(CLI::App& app) {
  auto args = std::make_shared<RunArgs>();
  app.add_option("MODEL", args->model, "the .onnx model")->required();
  // One value per --input, so that a positional MODEL after it is not taken as a second file.
  app.add_option("-i,--input", args->inputs,
                 "input file (repeatable): FILE for a model with one input, NAME=FILE for input "
                 "NAME, FILE.npz holding every input by name; axis 0 is the sample axis. A .npy "
                 "is memory-mapped and streamed (memory stays flat); a .npz or an ONNX "
                 "TensorProto .pb is read whole")
      ->required()
      ->expected(1)
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("-o,--output", args->output,
                 "output file, written atomically: .npy (one output) or .npz (any number)")
      ->required()
      ->check(CLI::Validator(
          [](std::string& path) {
            return path.ends_with(".npy") || path.ends_with(".npz")
                       ? std::string()
                       : "the output file must end in .npy or .npz";
          },
          "FILE.npy|FILE.npz"));
  app.add_option("--outputs", args->outputs,
                 "comma-separated model outputs to write (default: all of them)")
      ->delimiter(',')
      ->expected(1)
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->capture_default_str();
  app.add_option("-b,--batch", args->batch, "samples per batch (the last batch may be smaller)")
      ->check(at_least(1))
      ->capture_default_str();
  app.add_option("-t,--threads", args->threads, "threads (0: one per physical core)")
      ->check(at_least(0))
      ->capture_default_str();
  app.add_option("--schedule", args->schedule,
                 "execution schedule: depthwise, layerwise, onednn, cuda, cuda-sparse or "
                 "reference (one that this build or machine lacks is refused with the reason)")
      ->check(schedule_validator())
      ->capture_default_str();
  app.add_option("--trace", args->trace,
                 "also write a Chrome/Perfetto trace of the run here (JSON: one track per "
                 "thread, one slice per node or tile; profiling slows the run a little; at most "
                 "1M events, later batches untraced; default: none)")
      ->capture_default_str();
  app.add_flag("-q,--quiet", args->quiet, "no progress and no summary on stderr")
      ->capture_default_str();
  args->tuning.add_to(app);
  return [args] { return run(*args); };
}

const bool kRegistered = register_command(
    {"run", "Score a model over a large input in batches and write the outputs", 10, setup});

}  // namespace
}  // namespace sparsecol::cli
