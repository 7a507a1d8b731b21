// Running the built `sparsecol` binary from the CLI tests.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include <fmt/format.h>

namespace sparsecol::testing {

struct CliResult {
  int code = -1;  // exit code, -1 if killed by a signal
  std::string out, err;
};

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Runs `sparsecol ARGS` (SPARSECOL_CLI), its stdout and stderr captured through files in `dir`.
inline CliResult run_cli(const std::string& args, const std::string& dir) {
  CliResult result;
  const std::string out = dir + "/stdout.txt", err = dir + "/stderr.txt";
  const int status =
      std::system(fmt::format("{} {} >'{}' 2>'{}'", SPARSECOL_CLI, args, out, err).c_str());
  result.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.out = read_text(out);
  result.err = read_text(err);
  return result;
}

}  // namespace sparsecol::testing
