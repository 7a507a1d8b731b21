// `sparsecol prune MODEL OUT --sparsity S`: magnitude pruning (include/sparsecol/prune.h), with
// a per-layer table of what was pruned and what was left dense, and why.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "commands.h"
#include "sparsecol/prune.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol::cli {
namespace {

struct PruneArgs {
  std::string model;
  std::string output;
  PruneOptions options;
};

std::string percent(double fraction) { return fmt::format("{:.1f}%", 100.0 * fraction); }

void print_report(const PruneReport& report) {
  std::size_t node_width = 4;
  for (const PrunedLayer& layer : report.layers) {
    node_width = std::max(node_width, layer.node.empty() ? layer.weight.size() : layer.node.size());
  }
  const std::string row =
      fmt::format("{{:<{}}}  {{:<6}}  {{:<20}}  {{:>10}}  {{:>7}}  {{:>7}}  {{}}", node_width);
  fmt::print("{}\n", fmt::format(fmt::runtime(row), "node", "op", "weight shape", "weights",
                                 "before", "after", "note"));
  int pruned = 0;
  for (const PrunedLayer& layer : report.layers) {
    pruned += layer.skipped.empty() ? 1 : 0;
    // Global pruning can empty a layer whose weights are all small (a classifier initialized
    // with smaller magnitudes than the convolutions, say): its output is then its bias alone.
    const std::string note = !layer.skipped.empty()        ? "kept dense: " + layer.skipped
                             : layer.sparsity_after >= 1.0 ? "every weight is zero"
                                                           : "";
    std::string line =
        fmt::format(fmt::runtime(row), layer.node.empty() ? layer.weight : layer.node, layer.op,
                    shape_string(layer.shape), layer.elements, percent(layer.sparsity_before),
                    percent(layer.sparsity_after), note);
    line.erase(line.find_last_not_of(' ') + 1);
    fmt::print("{}\n", line);
  }
  const auto fraction = [&](int64_t zeros) {
    return report.elements == 0 ? 0.0
                                : static_cast<double>(zeros) / static_cast<double>(report.elements);
  };
  fmt::print("total: {} layers ({} pruned, {} kept dense), {} weights: sparsity {} -> {}\n",
             report.layers.size(), pruned, report.layers.size() - static_cast<std::size_t>(pruned),
             report.elements, percent(fraction(report.zeros_before)),
             percent(fraction(report.zeros_after)));
}

CommandAction setup(CLI::App& app) {
  auto args = std::make_shared<PruneArgs>();
  app.add_option("MODEL", args->model, "the dense .onnx model")->required();
  app.add_option("OUT", args->output, "the pruned .onnx model to write (atomically)")->required();
  app.add_option("-s,--sparsity", args->options.sparsity,
                 "fraction of each weight tensor set to zero, smallest magnitudes first")
      ->required()
      ->check(CLI::Validator(
          [](std::string& text) {
            double value = 0;
            if (!CLI::detail::lexical_cast(text, value)) {
              return fmt::format("'{}' is not a number", text);
            }
            return value >= 0.0 && value < 1.0
                       ? std::string()
                       : fmt::format("must be in [0, 1) (0.9: 90% zeros), got {}", text);
          },
          "[0,1)"));
  app.add_flag("--global", args->options.global,
               "one magnitude threshold over all pruned layers together (default: the same "
               "sparsity in every layer)")
      ->capture_default_str();
  app.add_flag("--prune-first-conv", args->options.prune_first_conv,
               "prune the first convolution too (default: kept dense, it sees the raw input)")
      ->capture_default_str();
  app.add_flag("--prune-depthwise", args->options.prune_depthwise,
               "prune depthwise convolutions too (default: kept dense, 9 weights per channel)")
      ->capture_default_str();
  app.add_option("--exclude", args->options.exclude,
                 "comma-separated node or weight names to keep dense (default: none)")
      ->delimiter(',')
      ->expected(1)
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--min-size", args->options.min_weight_elements,
                 "keep weight tensors with fewer elements than this dense")
      ->check(at_least(0))
      ->capture_default_str();
  return [args] {
    check_writable_folder(args->output);
    print_report(prune_model(args->model, args->output, args->options));
    fmt::print("wrote {}\n", args->output);
    return kExitOk;
  };
}

const bool kRegistered = register_command(
    {"prune", "Magnitude-prune a model's Conv/ConvTranspose/Gemm/MatMul weights to a sparsity", 40,
     setup});

}  // namespace
}  // namespace sparsecol::cli
