// Graph-to-graph passes. Each takes a linked Graph and leaves a linked Graph.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace sparsecol::graph {

// Computes a node's outputs from constant inputs. Injected by the runtime so that the graph
// layer does not depend on kernels.
using Evaluator = std::function<std::vector<Tensor>(const Graph&, const Node&,
                                                    const std::vector<const Tensor*>&)>;

// Infers concrete dtypes and shapes node by node (graph/ops.h) wherever the inputs' shapes are
// concrete, and replaces by constants every node whose inputs are all constant, plus every
// Shape node whose input shape is concrete. Fails on an unsupported op naming node and op.
void fold_constants(Graph& graph, const Evaluator& evaluate);

// Folds BatchNormalization (inference form) into the preceding Conv's weights and bias when
// the Conv output feeds only that BatchNormalization and all parameters are constant.
void fold_batchnorm(Graph& graph);

// Marks element-wise successors as fusable epilogues of their producer and removes them:
// bias Add after MatMul, residual Add after Conv/Gemm/MatMul, Relu, Clip with constant bounds,
// and the erf form of GELU (x * 0.5 * (1 + erf(x / sqrt(2)))) as exported by PyTorch.
void fuse_epilogues(Graph& graph);

// Replaces the decomposed layer normalization PyTorch exports below opset 17
// (ReduceMean, Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div, Mul gamma, Add beta over the last
// axis) by one LayerNormalization node.
void fuse_layernorm(Graph& graph);

// A copy of `graph` with the given input shapes fixed (every other dimension must then follow)
// and constants folded again, so shape-computing subgraphs disappear. Fails if an input name is
// unknown or a shape contradicts the model's fixed dimensions.
Graph specialize(const Graph& graph, const std::map<std::string, std::vector<int64_t>>& shapes,
                 const Evaluator& evaluate);

// The passes run at load, in order: fold_constants, fold_batchnorm, fuse_layernorm,
// fuse_epilogues, remove_dead.
void optimize(Graph& graph, const Evaluator& evaluate);

}  // namespace sparsecol::graph
