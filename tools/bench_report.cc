#include "bench_report.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol::cli {
namespace {

std::string base_name(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// "1.23 us", "45.6 ms", "2.5 s": three significant digits, so that sub-millisecond latencies of
// small models still differ in the table.
std::string latency_text(double seconds) {
  if (seconds < 1e-3) return fmt::format("{:.3g} us", seconds * 1e6);
  if (seconds < 1) return fmt::format("{:.3g} ms", seconds * 1e3);
  return fmt::format("{:.3g} s", seconds);
}

std::string threads_text(int threads) { return threads == 0 ? "auto" : std::to_string(threads); }

// "0.53", "12.4", "833", "12.3k", "1.23M": three significant digits at most, short enough to
// sit on a bar.
std::string rate_text(double value) {
  if (value >= 1e6) return fmt::format("{:.3g}M", value / 1e6);
  if (value >= 1e4) return fmt::format("{:.3g}k", value / 1e3);
  if (value >= 100) return fmt::format("{:.0f}", value);
  if (value >= 10) return fmt::format("{:.1f}", value);
  return fmt::format("{:.2f}", value);
}

// An axis tick: "0", "2.5", "40", "15k", "1.2M".
std::string tick_text(double value) {
  if (value >= 1e6) return fmt::format("{:g}M", value / 1e6);
  if (value >= 1e4) return fmt::format("{:g}k", value / 1e3);
  return fmt::format("{:g}", value);
}

bool disagrees(const BenchRow& row, double tolerance) {
  return row.max_rel_diff && !(*row.max_rel_diff <= tolerance);  // NaN disagrees too
}

// The (batch, threads) points in the order the rows first name them.
std::vector<std::pair<int64_t, int>> points_of(const BenchReport& report) {
  std::vector<std::pair<int64_t, int>> points;
  for (const BenchRow& row : report.rows) {
    const std::pair<int64_t, int> point{row.batch, row.threads};
    if (std::find(points.begin(), points.end(), point) == points.end()) points.push_back(point);
  }
  return points;
}

std::vector<std::string> paths_of(const BenchReport& report) {
  std::vector<std::string> paths;
  for (const BenchRow& row : report.rows) {
    if (std::find(paths.begin(), paths.end(), row.path) == paths.end()) paths.push_back(row.path);
  }
  return paths;
}

// The distinct baselines of the rows, in order of appearance.
std::vector<std::string> baselines_of(const BenchReport& report) {
  std::vector<std::string> baselines;
  for (const BenchRow& row : report.rows) {
    if (!row.baseline.empty() &&
        std::find(baselines.begin(), baselines.end(), row.baseline) == baselines.end()) {
      baselines.push_back(row.baseline);
    }
  }
  return baselines;
}

std::string xml_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// A tick step of 1, 2 or 5 times a power of ten that cuts [0, top] into about five intervals.
double nice_step(double top) {
  const double raw = top / 5;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0}) {
    if (raw <= m * power) return m * power;
  }
  return 10 * power;
}

}  // namespace

MachineInfo describe_machine() {
  MachineInfo info;
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  std::set<std::pair<std::string, std::string>> cores;  // (physical id, core id)
  std::string physical_id;
  while (std::getline(cpuinfo, line)) {
    const std::size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "processor") {
      ++info.logical_cpus;
    } else if (key == "model name" && info.cpu.empty()) {
      info.cpu = value;
    } else if (key == "physical id") {
      physical_id = value;
    } else if (key == "core id") {
      cores.emplace(physical_id, value);
    } else if (key == "flags" && !info.avx512f) {
      info.avx512f = (" " + value + " ").find(" avx512f ") != std::string::npos;
    }
  }
  if (info.logical_cpus == 0)
    info.logical_cpus = static_cast<int>(std::thread::hardware_concurrency());
  // Virtual machines may omit core ids; then every logical CPU counts as a core.
  info.physical_cores = cores.empty() ? info.logical_cpus : static_cast<int>(cores.size());
  if (const char* isa = std::getenv("SPARSECOL_MAX_ISA")) info.max_isa = isa;
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &utc);
  info.date = date;
  return info;
}

std::string format_table(const BenchReport& report) {
  const std::vector<std::string> header = {"model",  "path", "batch",   "threads", "reps",
                                           "median", "p90",  "items/s", "speedup", "max rel diff"};
  // Text columns align left, numbers right.
  const std::vector<bool> left = {true,  true,  false, false, false,
                                  false, false, false, false, false};
  const std::string model = base_name(report.model);
  std::vector<std::vector<std::string>> cells;
  for (const BenchRow& row : report.rows) {
    std::vector<std::string> line = {model, row.path, std::to_string(row.batch),
                                     threads_text(row.threads)};
    if (!row.error.empty()) {
      line.push_back("error: " + row.error);
    } else {
      std::string diff = "-";
      if (row.max_rel_diff) {
        diff = fmt::format("{:.1e}", *row.max_rel_diff);
        if (disagrees(row, report.agreement_tolerance)) diff += " MISMATCH";
      }
      line.insert(line.end(), {std::to_string(row.reps), latency_text(row.p50),
                               latency_text(row.p90), rate_text(row.items_per_s),
                               row.speedup ? fmt::format("{:.2f}x", *row.speedup) : "-", diff});
    }
    cells.push_back(std::move(line));
  }
  std::vector<std::size_t> width(header.size());
  for (std::size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& line : cells) {
    // An error message spans the measurement columns, so it sets no width.
    const std::size_t measured = line.size() == header.size() ? line.size() : 4;
    for (std::size_t c = 0; c < measured; ++c) width[c] = std::max(width[c], line[c].size());
  }
  const auto format_line = [&](const std::vector<std::string>& line) {
    std::string text;
    for (std::size_t c = 0; c < line.size(); ++c) {
      if (c > 0) text += "  ";
      const bool spans = c == line.size() - 1 && line.size() < header.size();
      if (spans) {
        text += line[c];
      } else if (left[c]) {
        text += fmt::format("{:<{}}", line[c], width[c]);
      } else {
        text += fmt::format("{:>{}}", line[c], width[c]);
      }
    }
    text.erase(text.find_last_not_of(' ') + 1);
    return text + "\n";
  };
  std::string text = format_line(header);
  for (const auto& line : cells) text += format_line(line);
  const std::vector<std::string> baselines = baselines_of(report);
  if (!baselines.empty()) {
    const std::string base = baselines.size() == 1
                                 ? baselines.front()
                                 : "the first path that ran at each batch and thread count";
    text += fmt::format(
        "speedup: ratio of medians vs {0}; max rel diff: max |output - {0}'s| / max |{0}'s| "
        "(MISMATCH above {1:.0e})\n",
        base, report.agreement_tolerance);
  }
  const MachineInfo& m = report.machine;
  if (m.round_trip_ns_before && m.round_trip_ns_after) {
    text += fmt::format(
        "cores 0-1 round trip: {:.0f} ns before, {:.0f} ns after (hundreds: the cores are far "
        "apart or shared, and multi-thread figures suffer)\n",
        *m.round_trip_ns_before, *m.round_trip_ns_after);
  }
  return text;
}

std::string format_per_layer(const BenchReport& report, int top) {
  std::string text;
  for (const BenchRow& row : report.rows) {
    if (row.profiled_runs == 0) continue;
    text += fmt::format(
        "\nper layer: {}, batch {}, threads {} (mean of {} profiled run{}; a node's time sums its "
        "slices: one per layer run whole, its wall time with every thread inside; one per tile "
        "and thread in a depth-wise column, that thread's time)\n",
        row.path, row.batch, threads_text(row.threads), row.profiled_runs,
        row.profiled_runs == 1 ? "" : "s");
    if (row.layers.empty()) {
      text += "  no per-node times: this path records no profile events\n";
      continue;
    }
    double total = 0;
    std::size_t name_width = 4, op_width = 2;
    const std::size_t shown =
        top > 0 ? std::min<std::size_t>(top, row.layers.size()) : row.layers.size();
    for (std::size_t i = 0; i < row.layers.size(); ++i) {
      total += row.layers[i].seconds;
      if (i < shown) {
        name_width = std::max(name_width, row.layers[i].node.size());
        op_width = std::max(op_width, row.layers[i].op.size());
      }
    }
    const auto share = [&](double seconds) { return total > 0 ? 100 * seconds / total : 0.0; };
    text += fmt::format("  {:<{}}  {:<{}}  {:>9}  {:>6}  {:>6}\n", "node", name_width, "op",
                        op_width, "time", "share", "slices");
    for (std::size_t i = 0; i < shown; ++i) {
      const LayerTime& layer = row.layers[i];
      text += fmt::format("  {:<{}}  {:<{}}  {:>9}  {:>5.1f}%  {:>6.0f}\n", layer.node, name_width,
                          layer.op, op_width, latency_text(layer.seconds), share(layer.seconds),
                          layer.events);
    }
    if (shown < row.layers.size()) {
      double rest = 0;
      for (std::size_t i = shown; i < row.layers.size(); ++i) rest += row.layers[i].seconds;
      text += fmt::format("  {:<{}}  {:>9}  {:>5.1f}%\n",
                          fmt::format("({} more node{})", row.layers.size() - shown,
                                      row.layers.size() - shown == 1 ? "" : "s"),
                          name_width + 2 + op_width, latency_text(rest), share(rest));
    }
    text += fmt::format("  {:<{}}  {:>9}  {:>5.1f}%\n", "total", name_width + 2 + op_width,
                        latency_text(total), 100.0);
  }
  return text;
}

std::string format_json(const BenchReport& report) {
  using Json = nlohmann::ordered_json;
  const auto optional = [](const std::optional<double>& value) {
    return value && std::isfinite(*value) ? Json(*value) : Json(nullptr);
  };
  Json rows = Json::array();
  for (const BenchRow& row : report.rows) {
    Json item = {{"path", row.path},
                 {"batch", row.batch},
                 {"threads", row.threads},
                 {"status", row.error.empty() ? "ok" : "error"},
                 {"baseline", row.baseline.empty() ? Json(nullptr) : Json(row.baseline)}};
    if (!row.error.empty()) {
      item["error"] = row.error;
    } else {
      item.update(Json{{"reps", row.reps},
                       {"median_s", row.p50},
                       {"p90_s", row.p90},
                       {"p99_s", row.p99},
                       {"mean_s", row.mean},
                       {"min_s", row.min},
                       {"items_per_s", row.items_per_s},
                       {"speedup", optional(row.speedup)},
                       {"max_rel_diff", optional(row.max_rel_diff)},
                       {"agrees", !disagrees(row, report.agreement_tolerance)}});
    }
    if (row.profiled_runs > 0) {
      Json layers = Json::array();
      for (const LayerTime& layer : row.layers) {
        layers.push_back({{"node", layer.node},
                          {"op", layer.op},
                          {"seconds", layer.seconds},
                          {"events", layer.events}});
      }
      item["per_layer"] = {{"profiled_runs", row.profiled_runs}, {"layers", std::move(layers)}};
    }
    rows.push_back(std::move(item));
  }
  const MachineInfo& m = report.machine;
  const Json json = {{"model", report.model},
                     {"machine",
                      {{"cpu", m.cpu},
                       {"logical_cpus", m.logical_cpus},
                       {"physical_cores", m.physical_cores},
                       {"avx512f", m.avx512f},
                       {"core_round_trip_ns", m.round_trip_ns_before && m.round_trip_ns_after
                                                  ? Json{{"before", *m.round_trip_ns_before},
                                                         {"after", *m.round_trip_ns_after}}
                                                  : Json(nullptr)},
                       {"sparsecol_max_isa", m.max_isa.empty() ? Json(nullptr) : Json(m.max_isa)}}},
                     {"date", m.date},
                     {"settings",
                      {{"time_budget_s", report.time_budget_s},
                       {"warmup", report.warmup},
                       {"min_reps", report.min_reps},
                       {"runs_per_turn", report.runs_per_turn},
                       {"seed", report.seed},
                       {"agreement_tolerance", report.agreement_tolerance},
                       {"inputs", report.input_files}}},
                     {"results", std::move(rows)}};
  return json.dump(2) + "\n";
}

std::string format_svg(const BenchReport& report) {
  // Okabe-Ito colours: distinguishable with the common colour-vision deficiencies.
  static constexpr const char* kColors[] = {"#0072B2", "#E69F00", "#009E73", "#CC79A7",
                                            "#56B4E9", "#D55E00", "#F0E442", "#000000"};
  // A group's slot is wide enough for its label ("batch 16, auto threads" at 13 px) too.
  constexpr int kBar = 44, kBarGap = 6, kGroupGap = 36, kMinSlot = 180;
  constexpr int kLeft = 90, kTop = 70, kPlotHeight = 320, kLegendWidth = 190, kBottom = 80;
  const std::vector<std::pair<int64_t, int>> points = points_of(report);
  const std::vector<std::string> paths = paths_of(report);
  const int groups = std::max<int>(1, static_cast<int>(points.size()));
  const int per_group = std::max<int>(1, static_cast<int>(paths.size()));
  const int group_width = per_group * kBar + (per_group - 1) * kBarGap;
  const int slot = std::max(kMinSlot, group_width + kGroupGap);
  const int plot_width = std::max(320, groups * slot);
  const std::string title =
      fmt::format("{}: throughput per execution path (higher is better)", base_name(report.model));
  // About 0.6 em per character of the bold 18 px title: wide enough that it is never cut.
  const int width =
      std::max(kLeft + plot_width + kLegendWidth, kLeft + static_cast<int>(title.size()) * 11);
  const int height = kTop + kPlotHeight + kBottom;
  const int base_y = kTop + kPlotHeight;

  double top = 0;
  for (const BenchRow& row : report.rows) {
    if (row.error.empty()) top = std::max(top, row.items_per_s);
  }
  if (!(top > 0)) top = 1;
  const double step = nice_step(top * 1.1);
  const double axis_top = std::ceil(top * 1.1 / step) * step;
  const auto y_of = [&](double value) { return base_y - value / axis_top * kPlotHeight; };

  std::string svg = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
      "<rect width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n",
      width, height);
  svg += fmt::format("<text x=\"{}\" y=\"28\" font-size=\"18\" font-weight=\"bold\">{}</text>\n",
                     kLeft, xml_escape(title));
  svg += fmt::format(
      "<text x=\"{}\" y=\"48\" font-size=\"12\" fill=\"#555\">{}, {} cores, {}</text>\n", kLeft,
      xml_escape(report.machine.cpu), report.machine.physical_cores,
      xml_escape(report.machine.date));

  // Grid lines and y tick labels.
  for (double tick = 0; tick <= axis_top * (1 + 1e-9); tick += step) {
    const double y = y_of(tick);
    svg += fmt::format(
        "<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n"
        "<text x=\"{}\" y=\"{:.1f}\" font-size=\"12\" text-anchor=\"end\">{}</text>\n",
        kLeft, y, kLeft + plot_width, y, kLeft - 8, y + 4, tick_text(tick));
  }
  svg += fmt::format(
      "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>\n"
      "<line x1=\"{0}\" y1=\"{2}\" x2=\"{3}\" y2=\"{2}\" stroke=\"black\"/>\n",
      kLeft, kTop, base_y, kLeft + plot_width);
  svg += fmt::format(
      "<text transform=\"translate(36,{}) rotate(-90)\" font-size=\"14\" "
      "text-anchor=\"middle\">items/s</text>\n",
      kTop + kPlotHeight / 2);
  svg += fmt::format(
      "<text x=\"{}\" y=\"{}\" font-size=\"14\" text-anchor=\"middle\">batch size, "
      "threads</text>\n",
      kLeft + plot_width / 2, height - 16);

  // Groups of bars, centred in the plot.
  const int first_x = kLeft + (plot_width - groups * slot) / 2 + (slot - group_width) / 2;
  for (std::size_t g = 0; g < points.size(); ++g) {
    const int group_x = first_x + static_cast<int>(g) * slot;
    const auto [batch, threads] = points[g];
    svg += fmt::format(
        "<text x=\"{}\" y=\"{}\" font-size=\"13\" text-anchor=\"middle\">batch {}, {} "
        "thread{}</text>\n",
        group_x + group_width / 2, base_y + 22, batch, threads_text(threads),
        threads == 1 ? "" : "s");
    for (const BenchRow& row : report.rows) {
      if (row.batch != batch || row.threads != threads) continue;
      const auto index =
          static_cast<int>(std::find(paths.begin(), paths.end(), row.path) - paths.begin());
      const int x = group_x + index * (kBar + kBarGap);
      const int center = x + kBar / 2;
      if (!row.error.empty()) {
        svg += fmt::format(
            "<text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"#b00\" "
            "text-anchor=\"middle\">failed</text>\n",
            center, base_y - 6);
        continue;
      }
      const double y = y_of(row.items_per_s);
      svg += fmt::format(
          "<rect x=\"{}\" y=\"{:.1f}\" width=\"{}\" height=\"{:.1f}\" fill=\"{}\">"
          "<title>{} batch {} threads {}: {:.4g} items/s</title></rect>\n",
          x, y, kBar, base_y - y, kColors[index % std::size(kColors)], xml_escape(row.path), batch,
          threads_text(threads), row.items_per_s);
      svg += fmt::format(
          "<text x=\"{}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"middle\">{}</text>\n", center,
          y - 5, rate_text(row.items_per_s));
    }
  }

  // Legend, right of the plot.
  const int legend_x = kLeft + plot_width + 20;
  const std::vector<std::string> baselines = baselines_of(report);
  for (std::size_t p = 0; p < paths.size(); ++p) {
    const int y = kTop + 10 + static_cast<int>(p) * 22;
    svg += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"14\" height=\"14\" fill=\"{}\"/>\n"
        "<text x=\"{}\" y=\"{}\" font-size=\"13\">{}{}</text>\n",
        legend_x, y, kColors[p % std::size(kColors)], legend_x + 20, y + 12, xml_escape(paths[p]),
        baselines.size() == 1 && paths[p] == baselines.front() ? " (baseline)" : "");
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace sparsecol::cli
