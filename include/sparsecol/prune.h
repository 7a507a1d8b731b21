// Magnitude pruning of an ONNX model's weights: what `sparsecol prune` does, for users who have
// a dense model and want to see what the sparse kernels make of it. Standard library only, like
// sparsecol.h.
//
//   sparsecol::PruneOptions options;
//   options.sparsity = 0.9;
//   sparsecol::PruneReport report = sparsecol::prune_model("resnet50.onnx", "resnet50_s90.onnx",
//                                                          options);  // throws sparsecol::Error
//
// Unstructured and one-shot: the smallest-magnitude weights are set to exactly zero, nothing is
// fine-tuned, so a real model loses accuracy; the point is a model with the sparsity pattern and
// the shapes of a pruned one. Everything else in the file (graph, other initializers, metadata)
// is written back unchanged, and the result passes ONNX's checker, so it loads in any ONNX tool.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sparsecol/sparsecol.h"

namespace sparsecol {

struct PruneOptions {
  // Fraction of each pruned weight tensor (or, with global, of all of them together) set to
  // zero, in [0, 1). Weights already zero count towards it; a tensor already sparser is kept.
  double sparsity = 0.9;
  // false: each weight tensor gets exactly `sparsity` zeros. true: one magnitude threshold over
  // all pruned weights together, so layers with many small weights end up sparser than others
  // (exactly `sparsity` over all of them).
  bool global = false;
  // The first convolution sees the raw input (3 channels): it holds few weights, costs little,
  // and pruning it hurts accuracy most, so it stays dense unless asked.
  bool prune_first_conv = false;
  // Depthwise convolutions (group == input channels) hold 9 weights per channel: little to gain,
  // and the engine runs them dense anyway (DESIGN.md), so they stay dense unless asked.
  bool prune_depthwise = false;
  // Node names or weight initializer names to leave dense; each must exist in the model.
  std::vector<std::string> exclude;
  // Weight tensors with fewer elements than this stay dense.
  int64_t min_weight_elements = 0;
};

// One Conv, ConvTranspose, Gemm or MatMul whose weight is a float initializer.
struct PrunedLayer {
  std::string node;    // the node's name ("" when the model leaves it unnamed)
  std::string op;      // "Conv", "ConvTranspose", "Gemm" or "MatMul"
  std::string weight;  // the initializer's name
  std::vector<int64_t> shape;
  int64_t elements = 0;
  double sparsity_before = 0.0;  // fraction of exact zeros
  double sparsity_after = 0.0;
  // Why the layer was left as it was ("first convolution", "excluded", "depthwise",
  // "fewer than N weights"); empty when it was pruned.
  std::string skipped;
};

struct PruneReport {
  std::vector<PrunedLayer> layers;  // in graph order
  int64_t elements = 0;             // over every listed layer, pruned or skipped
  int64_t zeros_before = 0;
  int64_t zeros_after = 0;
};

// Reads the model at `input_path`, prunes it as `options` say, and writes it to `output_path`
// atomically (a temporary file in the same folder, renamed when complete; `output_path` may be
// `input_path`). Throws Error: kNotFound for a missing model, kInvalidModel for a file that is
// not a valid ONNX model (or whose result fails ONNX's checker), kInvalidArgument for a sparsity
// outside [0, 1), an excluded name that is neither a node nor an initializer, or a model with
// nothing to prune, kUnsupported for weights stored as external data, kIoError when the output
// cannot be written.
PruneReport prune_model(const std::string& input_path, const std::string& output_path,
                        const PruneOptions& options);

}  // namespace sparsecol
