// A graph node bound to the kernels' arguments (kernels/f32-*): the one translation that both
// executors use, the layer-by-layer steps (layerwise/steps.cc) and the tile kernels of the
// depth-wise schedule (depthwise/tile_kernels.cc). Each caller validates the node its own way
// (the planner's refusals, a step's why_not) and binds run-time pointers itself.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "epilogue.h"
#include "f32-conv/conv.h"
#include "f32-eltwise/eltwise.h"
#include "f32-pool/pool.h"
#include "graph/graph.h"
#include "graph/op_params.h"
#include "reference/recurrent.h"

namespace sparsecol::runtime {

// The geometry of a 2-D convolution (params.window of rank 2).
kernels::ConvGeometry conv_geometry(const graph::ConvParams& params);

// The geometry of a 2-D MaxPool / AveragePool (params.window of rank 2).
kernels::PoolGeometry pool_geometry(const graph::PoolParams& params);
kernels::PoolKind pool_kind(const graph::Node& node);          // MaxPool: kMax, else kAverage
std::string pool_rows_implementation(kernels::PoolKind kind);  // e.g. "max-pool-rows/avx2"

// The row kernels' kind of an element-wise op type ("Add", "Relu", ...), nullopt for others.
std::optional<kernels::BinaryKind> binary_kind(std::string_view op_type);
std::optional<kernels::UnaryKind> unary_kind(std::string_view op_type);

// A Clip node's bounds: its attributes (opset 6) or its constant scalar inputs (opset 11+),
// +-infinity where absent; nullopt when an input bound is not a float32 constant scalar.
struct ClipBounds {
  float lo, hi;
};
std::optional<ClipBounds> clip_bounds(const graph::Graph& graph, const graph::Node& node);

// Softmax over the last axis, or LayerNormalization over the last axis with constant scale and
// bias of its length (each caller checked the node), bound to the row kernels (kernels/f32-norm):
// the layer-by-layer step runs blocks of rows, a token tile its tokens.
class RowNormalization {
 public:
  // `n`: the last axis's length, the floats of one row.
  RowNormalization(const graph::Graph& graph, const graph::Node& node, int64_t n);
  // `rows` rows of n floats each, n apart, from src to dst.
  void run(const float* src, float* dst, int64_t rows) const;
  std::string implementation() const;  // e.g. "layer-norm-rows/avx2"

 private:
  int64_t n_;
  std::vector<float> gamma_, beta_;  // empty gamma_: softmax
  float epsilon_ = 0.0f;
};

// The kernels' activation of an epilogue op (kNone for kAdd).
kernels::Activation to_activation(graph::EpilogueOp::Kind kind);

// A node's epilogue in the kernels' fused form out = post(residual + pre(acc + col_bias)):
// [Add of a bias] [activation] [Add of a residual] [activation], one Clip range at most.
struct FusedEpilogue {
  kernels::Epilogue kernel;  // col_bias set when a bias was taken; the residual is bound per run
  int residual_input = -1;   // index into node.inputs of the residual operand, or -1
};

// What the operand of an epilogue Add (index into node.inputs) may serve as; the caller judges
// (a constant vector along the output's last axis, a same-shape tensor in memory or on a tile).
struct AddOperandUse {
  const float* bias = nullptr;  // the bias values, where the operand may be the column bias
  bool residual = false;
};
using AddOperandJudge = std::function<AddOperandUse(int input)>;

// The fused form of node.epilogue, or nullopt when it does not fit. An Add takes the bias slot
// when its operand may be a bias and nothing precedes it, else the residual slot when its
// operand may be a residual and no residual or post activation precedes it.
std::optional<FusedEpilogue> fuse_epilogue(const graph::Node& node, const AddOperandJudge& judge);

// An RNN, GRU or LSTM node's sizes, attributes and activation functions (ONNX's defaults where
// absent; a list for one direction serves both), from the shapes of its inputs (nullopt for
// omitted ones); Error naming the node where they do not fit.
struct RecurrentBinding {
  graph::RecurrentParams params;  // with the output shapes
  kernels::reference::RecurrentShape shape;
};
RecurrentBinding bind_recurrent(const graph::Graph& graph, const graph::Node& node,
                                const std::vector<std::optional<std::vector<int64_t>>>& shapes);

// Error(kInvalidArgument) naming the node and the entry where a sequence length falls outside
// [0, shape.seq_length]: values a caller hands in at run time.
void check_sequence_lens(const graph::Graph& graph, const graph::Node& node, const int32_t* lens,
                         const kernels::reference::RecurrentShape& shape);

}  // namespace sparsecol::runtime
