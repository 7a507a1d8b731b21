// Applies a node's fused epilogue (graph::EpilogueOp) to its output. The reference path applies
// it after the whole op; fast kernels apply the same operations per tile, in registers.
#pragma once

#include <cmath>
#include <vector>

#include "graph/graph.h"

namespace sparsecol::runtime {

// `inputs` are all of the node's inputs (own and epilogue operands), `output` its first output.
void apply_epilogue(const graph::Graph& graph, const graph::Node& node,
                    const std::vector<const Tensor*>& inputs, Tensor& output);

// GELU, erf form: 0.5 x (1 + erf(x / sqrt 2)), as PyTorch's nn.GELU() computes it.
inline float gelu_erf(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }

}  // namespace sparsecol::runtime
