// What both shape inference (ops_elementwise.cc) and the reference ops
// (runtime/reference/ops_elementwise.cc) derive from a reduction or (de)quantization node,
// computed in one place so that the shape allocated and the elements computed cannot disagree.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/ops.h"

namespace sparsecol::graph {

// The axes a Reduce* node reduces over an input of `rank`: normalized, ascending, without
// repeats; all of them when none are given, none with noop_with_empty_axes. They come from the
// `axes` input (ReduceSum from opset 13, the others from opset 18), which must be constant,
// or else from the `axes` attribute. Fails naming the node on a bad or repeated axis.
std::vector<int64_t> reduce_axes(const InferContext& ctx, int64_t rank);

// QuantizeLinear and DequantizeLinear: how input 1 (the scale, float32) and input 2 (the zero
// point, optional) apply to input 0, seen as [outer, channels, inner]: one value for the whole
// tensor (a scalar or one element: channels 1), or from opset 13 one per index along the `axis`
// attribute (default 1; a 1-D tensor of that axis' length). The zero point has the scale's
// shape. Fails naming the node otherwise.
struct QuantAxis {
  int64_t channels = 1, inner = 1;
};
QuantAxis resolve_quant_axis(const InferContext& ctx);

}  // namespace sparsecol::graph
