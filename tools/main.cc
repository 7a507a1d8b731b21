// The `sparsecol` command line: parses arguments with CLI11 and runs one subcommand; turns every
// failure into one line on stderr and a documented exit code.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <new>

#include <fmt/format.h>

#include "commands.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol::cli {
namespace {

// A function-local static: registrations run from other files' static initializers, in an
// order the language leaves open.
std::vector<Command>& registry() {
  static std::vector<Command> commands;
  return commands;
}

}  // namespace

bool register_command(Command command) {
  registry().push_back(std::move(command));
  return true;
}

std::vector<Command> registered_commands() {
  std::vector<Command> commands = registry();
  std::sort(commands.begin(), commands.end(),
            [](const Command& a, const Command& b) { return a.order < b.order; });
  return commands;
}

void check_writable_folder(const std::string& path) {
  if (path.empty()) return;
  const std::size_t slash = path.rfind('/');
  const std::string folder = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  if (::access(folder.c_str(), W_OK) != 0) {
    const int error = errno;
    throw Error(
        error == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIoError,
        fmt::format("cannot write '{}': folder '{}': {}", path, folder, std::strerror(error)));
  }
}

CLI::Validator parse_validator(std::function<void(const std::string&)> parse,
                               const std::string& name) {
  return CLI::Validator(
      [parse = std::move(parse)](std::string& value) {
        try {
          parse(value);
          return std::string();
        } catch (const Error& e) {
          return std::string(e.what());
        }
      },
      name);
}

CLI::Validator schedule_validator() {
  return parse_validator([](const std::string& name) { parse_schedule(name); }, "SCHEDULE");
}

void write_text_file(const std::string& path, const std::string& text) {
  const std::string temp = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (out) out << text;
    out.flush();
    if (!out) {
      const int error = errno;
      out.close();
      std::remove(temp.c_str());
      throw Error(error == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIoError,
                  fmt::format("cannot write '{}': {}", path, std::strerror(error)));
    }
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(temp.c_str());
    throw Error(ErrorCode::kIoError,
                fmt::format("cannot write '{}': {}", path, std::strerror(error)));
  }
}

void EngineTuning::add_to(CLI::App& app) {
  app.add_option("--sparse-threshold", sparse_threshold,
                 "Conv, ConvTranspose, Gemm and MatMul weights with at least this fraction of "
                 "exact zeros run "
                 "through the sparse kernels (negative: the default measured for this machine "
                 "class; above 1: never)")
      ->capture_default_str();
  app.add_option("--cache-budget", cache_budget_kib,
                 "depth-wise schedule: the KiB of cache a column's working set must fit, per core "
                 "(0: three quarters of the L2 that hwloc reports, with the shared L3 as a second "
                 "tier; a budget "
                 "given here is the only tier)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
      ->capture_default_str();
  app.add_option("--shared-cache", shared_cache_kib,
                 "depth-wise schedule: the KiB of shared (L3) cache the planner assumes (0: the "
                 "size hwloc reports; in a virtual machine that is the host's whole L3, shared "
                 "with other tenants)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
      ->capture_default_str();
  app.add_option("--tile-rows", tile_rows,
                 "depth-wise schedule: the tile height of every column, in output rows (tokens "
                 "for a transformer's columns) (0: chosen per column from the cache budget)")
      ->check(at_least(0))
      ->capture_default_str();
  app.add_flag("--keep-tiles", keep_tiles,
               fmt::format("depth-wise schedule: run the columns as tiles, as planned (default: a "
                           "session's first {} runs time them as tiles and with their ops whole, "
                           "and keep the faster way)",
                           kColumnMeasuringRuns));
}

void EngineTuning::apply_to(Options& options) const {
  options.sparse_threshold = sparse_threshold;
  options.cache_budget_bytes = cache_budget_kib * 1024;
  options.tile_rows = tile_rows;
  options.shared_cache_bytes = shared_cache_kib * 1024;
  if (keep_tiles) options.measure_columns = false;
}

CLI::Validator at_least(int64_t minimum) {
  return CLI::Validator(
      [minimum](std::string& text) {
        int64_t value = 0;
        if (!CLI::detail::lexical_cast(text, value))
          return fmt::format("'{}' is not an integer", text);
        return value >= minimum ? std::string()
                                : fmt::format("must be at least {}, got {}", minimum, value);
      },
      minimum == 0   ? "NONNEGATIVE"
      : minimum == 1 ? "POSITIVE"
                     : fmt::format(">={}", minimum));
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  if (seconds < 1e-3) return fmt::format("{:.0f} us", seconds * 1e6);
  if (seconds < 1) return fmt::format("{:.1f} ms", seconds * 1e3);
  if (seconds < 60) return fmt::format("{:.2f} s", seconds);
  const int64_t whole = std::llround(seconds);
  if (whole < 3600) return fmt::format("{}m{:02}s", whole / 60, whole % 60);
  return fmt::format("{}h{:02}m", whole / 3600, whole / 60 % 60);
}

LatencyStats latency_stats(std::vector<double> seconds) {
  if (seconds.empty()) return {};
  std::sort(seconds.begin(), seconds.end());
  const auto rank = [&](double p) {
    const auto index = static_cast<std::size_t>(std::ceil(p * static_cast<double>(seconds.size())));
    return seconds[std::clamp<std::size_t>(index, 1, seconds.size()) - 1];
  };
  return {rank(0.50), rank(0.90), rank(0.99)};
}

}  // namespace sparsecol::cli

namespace {

int run_command_line(int argc, char** argv) {
  using namespace sparsecol::cli;
  CLI::App app{"sparsecol: a sparse-aware CPU inference engine for ONNX models", "sparsecol"};
  app.require_subcommand(1);
  app.footer(
      "Run 'sparsecol COMMAND --help' for a command's options.\n"
      "Exit codes: 0 success, 1 usage error, 2 model, input or file error, 3 internal error, "
      "4 check found an output outside its tolerance, 130 interrupted (Ctrl-C: run stops after "
      "the current batch and writes nothing).");

  std::vector<std::pair<CLI::App*, CommandAction>> commands;
  for (const Command& command : registered_commands()) {
    CLI::App* sub = app.add_subcommand(command.name, command.description);
    commands.emplace_back(sub, command.setup(*sub));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Prints the help text (exit 0) or the parse error with a hint to use --help.
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  }
  for (auto& [sub, action] : commands) {
    if (sub->parsed()) return action();
  }
  return kExitUsage;  // unreachable: require_subcommand(1)
}

}  // namespace

int main(int argc, char** argv) {
  using namespace sparsecol::cli;
  try {
    return run_command_line(argc, argv);
  } catch (const sparsecol::Error& e) {
    fmt::print(stderr, "sparsecol: error: {}\n", e.what());
    return kExitFailure;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "sparsecol: error: out of memory\n");
    return kExitFailure;
  } catch (const std::exception& e) {
    fmt::print(stderr, "sparsecol: internal error: {}\n", e.what());
    return kExitInternal;
  } catch (...) {
    fmt::print(stderr, "sparsecol: internal error: unknown exception\n");
    return kExitInternal;
  }
}
