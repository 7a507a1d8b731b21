// What both shape inference (ops_elementwise.cc) and the reference ops
// (runtime/reference/ops_elementwise.cc) derive from a reduction node, computed in one place so
// that the shape allocated and the axes reduced cannot disagree.
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

}  // namespace sparsecol::graph
