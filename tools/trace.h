// `--trace FILE` of `run` and `bench`: profiled runs as a Chrome trace, which chrome://tracing and
// ui.perfetto.dev open. The file is the JSON object form of the Trace Event Format: one complete
// event ("ph": "X", microsecond "ts" and "dur") per ProfileEvent, on a track per worker thread,
// and metadata events ("ph": "M") that name the processes and threads. One process per traced
// path (a schedule at a batch size and thread count), so paths lie under one another.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "sparsecol/sparsecol.h"

namespace sparsecol::cli {

class TraceRecorder {
 public:
  using Clock = std::chrono::steady_clock;

  // Keeps at most `max_events` events (a run of a million samples would otherwise make a trace
  // no viewer opens); the time origin is now.
  explicit TraceRecorder(int64_t max_events = kDefaultMaxEvents);

  // Starts a process track named `name` (e.g. "layerwise, batch 16, 2 threads"); returns its id.
  int add_process(const std::string& name);
  // Adds one run's events to process `process`; `run_start` is when the caller started the run
  // (the events' times are relative to the run's start). Returns false, adding nothing, once
  // the trace is full: the caller can stop profiling.
  bool add_run(int process, Clock::time_point run_start, const std::vector<ProfileEvent>& events);

  int64_t events() const { return static_cast<int64_t>(events_.size()); }
  bool full() const { return full_; }

  std::string to_json() const;
  // Writes to_json() atomically (a temporary file renamed into place).
  void write(const std::string& path) const;

  // ~100 bytes of JSON per event: about 100 MB at most.
  static constexpr int64_t kDefaultMaxEvents = 1'000'000;

 private:
  struct Event {
    int process;
    ProfileEvent event;
    int64_t start_ns;  // from the trace's origin
  };
  int64_t max_events_;
  bool full_ = false;
  Clock::time_point origin_ = Clock::now();
  std::vector<std::string> processes_;
  std::vector<Event> events_;
};

}  // namespace sparsecol::cli
