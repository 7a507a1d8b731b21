#include "trace.h"

#include <set>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"

namespace sparsecol::cli {

TraceRecorder::TraceRecorder(int64_t max_events) : max_events_(max_events) {}

int TraceRecorder::add_process(const std::string& name) {
  processes_.push_back(name);
  return static_cast<int>(processes_.size());  // pid 0 is avoided: some viewers hide it
}

bool TraceRecorder::add_run(int process, Clock::time_point run_start,
                            const std::vector<ProfileEvent>& events) {
  if (full_ || static_cast<int64_t>(events_.size() + events.size()) > max_events_) {
    full_ = true;
    return false;
  }
  const int64_t offset_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(run_start - origin_).count();
  for (const ProfileEvent& event : events) {
    events_.push_back({process, event, offset_ns + event.start_ns});
  }
  return true;
}

std::string TraceRecorder::to_json() const {
  using Json = nlohmann::ordered_json;
  Json trace_events = Json::array();
  for (std::size_t p = 0; p < processes_.size(); ++p) {
    const int pid = static_cast<int>(p) + 1;
    trace_events.push_back(
        {{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", processes_[p]}}}});
    trace_events.push_back({{"name", "process_sort_index"},
                            {"ph", "M"},
                            {"pid", pid},
                            {"args", {{"sort_index", pid}}}});
  }
  std::set<std::pair<int, int>> threads;  // (pid, tid) seen
  for (const Event& e : events_) {
    if (threads.emplace(e.process, e.event.thread).second) {
      trace_events.push_back({{"name", "thread_name"},
                              {"ph", "M"},
                              {"pid", e.process},
                              {"tid", e.event.thread},
                              {"args", {{"name", fmt::format("worker {}", e.event.thread)}}}});
    }
    Json args = {{"op", e.event.op}};
    if (e.event.tile >= 0) args["tile"] = e.event.tile;
    // Microseconds with nanosecond digits: the format's unit, without rounding short ops to 0.
    trace_events.push_back({{"name", e.event.name},
                            {"cat", e.event.op},
                            {"ph", "X"},
                            {"ts", static_cast<double>(e.start_ns) / 1e3},
                            {"dur", static_cast<double>(e.event.duration_ns) / 1e3},
                            {"pid", e.process},
                            {"tid", e.event.thread},
                            {"args", std::move(args)}});
  }
  const Json json = {{"traceEvents", std::move(trace_events)},
                     {"displayTimeUnit", "ns"},
                     {"otherData",
                      {{"generator", "sparsecol"},
                       {"events", events_.size()},
                       {"truncated", full_},
                       {"max_events", max_events_}}}};
  return json.dump() + "\n";
}

void TraceRecorder::write(const std::string& path) const { write_text_file(path, to_json()); }

}  // namespace sparsecol::cli
