// `sparsecol COMMAND --help` for every subcommand: every option that takes a value shows its
// default (CLI11 prints "=VALUE" after the type) or says in words what happens without it, unless
// it is required. Subcommands are read from `sparsecol --help`, so a new one is checked too.
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cli_util.h"

namespace sparsecol {
namespace {

namespace fs = std::filesystem;

using testing::CliResult;
using testing::contains;

// One option of a help text: its first line up to the description ("-b,--batch INT=16") and
// its description, continuation lines included.
struct HelpOption {
  std::string head;
  std::string description;
};

// CLI11 pads an option's head to a fixed column (where "Print this help message" starts) and
// puts the description after it, or on the next line, at that column, when the head is longer.
std::vector<HelpOption> help_options(const std::string& help) {
  std::vector<std::string> lines;
  std::istringstream in(help.substr(help.find("Options:")));
  for (std::string line; std::getline(in, line) && !(line.empty() && !lines.empty());) {
    lines.push_back(line);
  }
  const std::size_t column =
      help.find("Print this help") - help.rfind('\n', help.find("Print this help")) - 1;
  const std::string indent(column, ' ');
  std::vector<HelpOption> options;
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    if (!line.starts_with("  -")) {
      if (!options.empty()) options.back().description += line.substr(column);  // wrapped
      continue;
    }
    const bool wrapped = i + 1 < lines.size() && lines[i + 1].starts_with(indent);
    std::string head =
        wrapped || line.size() <= column ? line.substr(2) : line.substr(2, column - 2);
    head.erase(head.find_last_not_of(' ') + 1);
    options.push_back({head, wrapped || line.size() <= column ? "" : line.substr(column)});
  }
  return options;
}

std::vector<std::string> subcommands(const std::string& main_help) {
  std::vector<std::string> names;
  std::istringstream lines(main_help.substr(main_help.find("Subcommands:")));
  std::string line;
  std::getline(lines, line);
  while (std::getline(lines, line) && line.starts_with("  ")) {
    names.push_back(line.substr(2, line.find(' ', 2) - 2));
  }
  return names;
}

class HelpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A directory per test: ctest runs the tests in parallel and run_cli's files are per dir.
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = (fs::path(SPARSECOL_TEST_TMPDIR) / "help_test" / info->name()).string();
    fs::create_directories(dir_);
  }
  CliResult cli(const std::string& args) const { return testing::run_cli(args, dir_); }
  std::string dir_;
};

TEST_F(HelpTest, EveryValueOptionOfEverySubcommandStatesItsDefault) {
  const CliResult main_help = cli("--help");
  ASSERT_EQ(main_help.code, 0) << main_help.err;
  const std::vector<std::string> names = subcommands(main_help.out);
  ASSERT_GE(names.size(), 4u) << main_help.out;
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const CliResult help = cli(name + " --help");
    ASSERT_EQ(help.code, 0) << help.err;
    const std::vector<HelpOption> options = help_options(help.out);
    EXPECT_GE(options.size(), 1u) << help.out;
    for (const HelpOption& option : options) {
      SCOPED_TRACE(option.head);
      EXPECT_FALSE(option.description.empty()) << "no description";
      const bool takes_value = option.head.find(' ') != std::string::npos;
      const bool required = contains(option.head, "REQUIRED");
      if (!takes_value || required) continue;  // a flag is off unless given
      EXPECT_TRUE(contains(option.head, "=") || contains(option.description, "default"))
          << "neither '=DEFAULT' nor a stated default in\n"
          << help.out;
    }
  }
}

TEST_F(HelpTest, CheckListsEveryOptionWithItsDefault) {
  const CliResult help = cli("check --help");
  ASSERT_EQ(help.code, 0) << help.err;
  for (const char* expected :
       {"Usage: sparsecol check", "MODEL", "DIR", "--atol", "=1e-05", "--rtol", "=0.001",
        "--schedule", "--threads", "=0", "Exit code 0", "4 when"}) {
    EXPECT_TRUE(contains(help.out, expected)) << expected << " missing from\n" << help.out;
  }
}

}  // namespace
}  // namespace sparsecol
