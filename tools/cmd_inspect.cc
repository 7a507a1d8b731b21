// `sparsecol inspect MODEL`: what the engine sees in a model.
#include <memory>

#include <fmt/format.h>

#include "commands.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol::cli {
namespace {

CommandAction setup(CLI::App& app) {
  auto model = std::make_shared<std::string>();
  app.add_option("MODEL", *model, "the .onnx model")->required();
  return [model] {
    const Engine engine = Engine::load(*model);
    fmt::print("{}", engine.describe());
    return kExitOk;
  };
}

const bool kRegistered = register_command(
    {"inspect", "Show a model's inputs, outputs, ops and per-initializer sparsity", 30, setup});

}  // namespace
}  // namespace sparsecol::cli
