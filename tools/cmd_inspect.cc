// `sparsecol inspect MODEL`: what the engine sees in a model (inputs, outputs, ops, initializers)
// and, per layer, how a schedule runs it: shapes, weight sparsity, the packed format chosen at
// load, its bytes and the kernel. `--plan` adds the depth-wise plan (columns, tiles).
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "commands.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol::cli {
namespace {

struct InspectArgs {
  std::string model;
  EngineTuning tuning;
  std::string schedule = "layerwise";
  int64_t batch = 1;
  bool plan = false;
};

// Every input's shape with its first (sample) axis set to `batch`, when that axis is not fixed
// by the model; other unfixed dimensions are left to Engine::layers (which sets them to 1).
std::map<std::string, std::vector<int64_t>> input_shapes(const Engine& engine, int64_t batch) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const TensorInfo& info : engine.inputs()) {
    if (info.shape.empty()) continue;
    std::vector<int64_t> dims = info.shape;
    if (dims[0] < 0) dims[0] = batch;
    for (int64_t& d : dims) d = d < 0 ? 1 : d;
    shapes[info.name] = std::move(dims);
  }
  return shapes;
}

std::string bytes_string(int64_t bytes) {
  if (bytes < 10 * 1024) return fmt::format("{} B", bytes);
  if (bytes < 10 * 1024 * 1024) return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / 1024);
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1024 * 1024));
}

// Columns sized to their widest cell; the numeric ones right-aligned.
void print_table(const std::vector<std::vector<std::string>>& rows,
                 const std::vector<bool>& right_aligned) {
  std::vector<std::size_t> widths(right_aligned.size(), 0);
  for (const auto& row : rows) {
    for (std::size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      const bool last = c + 1 == row.size();
      line += right_aligned[c] ? fmt::format("{:>{}}", row[c], widths[c])
              : last           ? row[c]
                               : fmt::format("{:<{}}", row[c], widths[c]);
      if (!last) line += "  ";
    }
    fmt::print("{}\n", line);
  }
}

void print_layers(const Engine& engine, const InspectArgs& args) {
  const std::vector<LayerInfo> layers = engine.layers(input_shapes(engine, args.batch));
  std::vector<std::vector<std::string>> rows = {{"node", "op", "output shape", "weight shape",
                                                 "sparsity", "format", "packed", "implementation"}};
  int64_t packed = 0, weights = 0, sparse = 0;
  for (const LayerInfo& layer : layers) {
    const bool has_weight = !layer.weight_shape.empty();
    rows.push_back({layer.node, layer.op, shape_string(layer.output_shape),
                    has_weight ? shape_string(layer.weight_shape) : "-",
                    has_weight ? fmt::format("{:.1f}%", 100.0 * layer.weight_sparsity) : "-",
                    has_weight ? layer.weight_format : "-",
                    has_weight ? bytes_string(layer.packed_bytes) : "-", layer.implementation});
    packed += layer.packed_bytes;
    weights += has_weight ? 1 : 0;
    sparse += has_weight && layer.weight_format != "dense" ? 1 : 0;
  }
  fmt::print("layers ({} schedule, batch {}):\n", args.schedule, args.batch);
  print_table(rows, {false, false, false, false, true, false, true, false});
  fmt::print(
      "total: {} layers, {} with weights ({} in a sparse format), {} of packed weights (generated "
      "code included)\n",
      layers.size(), weights, sparse, bytes_string(packed));
}

CommandAction setup(CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  app.add_option("MODEL", args->model, "the .onnx model")->required();
  app.add_option("--schedule", args->schedule,
                 "the schedule whose layers are shown (its fused ops, formats and kernels)")
      ->check(schedule_validator())
      ->capture_default_str();
  app.add_option("-b,--batch", args->batch, "batch size the layer shapes are computed for")
      ->check(at_least(1))
      ->capture_default_str();
  app.add_flag("--plan", args->plan,
               "also print the depth-wise plan: columns, tile sizes, working sets, halo overhead, "
               "bytes kept in cache")
      ->capture_default_str();
  args->tuning.add_to(app);
  return [args] {
    Options options;
    options.schedule = parse_schedule(args->schedule);
    args->tuning.apply_to(options);
    const Engine engine = Engine::load(args->model, options);
    fmt::print("{}\n", engine.describe());
    print_layers(engine, *args);
    if (args->plan) {
      fmt::print("\ndepth-wise plan (batch {}):\n", args->batch);
      const std::string plan = engine.plan_report(input_shapes(engine, args->batch));
      fmt::print("{}{}", plan, plan.ends_with('\n') ? "" : "\n");
    }
    return kExitOk;
  };
}

const bool kRegistered = register_command(
    {"inspect", "Show a model's inputs, outputs, ops and, per layer, sparsity, format and kernel",
     30, setup});

}  // namespace
}  // namespace sparsecol::cli
