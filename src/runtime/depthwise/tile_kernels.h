// The ops of a column bound to the kernels' region interface (kernels/f32-*): each computes a
// range of output rows of one image from PlaneViews, which point either into memory (whole
// images, row0 = 0) or into a thread's tile buffers (only the rows the tile holds).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "f32-conv/conv.h"
#include "f32-spmm/spmm.h"
#include "graph/graph.h"
#include "plan/tile_plan.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol::runtime::depthwise {

struct TileArgs {
  // One per node input (own inputs, then epilogue operands); empty views for constants and
  // absent inputs, which the kernel reads from the graph.
  std::vector<kernels::PlaneView> inputs;
  kernels::PlaneView output;
  plan::RowRange rows;          // output rows to compute
  std::vector<float>* scratch;  // the thread's kernel scratch, grown as needed
};

class TileKernel {
 public:
  virtual ~TileKernel() = default;
  // Single-threaded: the column's tiles are the unit of parallelism.
  virtual void run(const TileArgs& args) const = 0;
  virtual std::string implementation() const = 0;
  // The kernel's part of the op's LayerInfo: a packed weight's format and bytes, where it has one
  // (describe_node() fills in the rest, as for the layer-by-layer steps).
  virtual void describe(LayerInfo& /*info*/) const {}
  // Whether the output may be written over the fused residual's own rows (the residual's view
  // passed as the output): every residual element read before its output element is written,
  // and each output element written once (plan::share_residual_buffers).
  virtual bool may_overwrite_residual() const { return false; }
};

// The kernel of a tile op (plan::make_tile_op accepted it), with the user's options (a Conv's
// weight is packed for the sparse kernels at options.sparse_threshold, as layer by layer), and
// for a sparse MatMul the layouts of its input and output tile buffers
// (plan::Column::feature_blocks). Throws Error(kInternal) if the node is not one the planner tiles.
std::unique_ptr<TileKernel> make_tile_kernel(const graph::Graph& graph, const plan::TileOp& op,
                                             const Options& options,
                                             kernels::LinearLayouts layouts = {});

}  // namespace sparsecol::runtime::depthwise
