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

// Folds the Transposes around a MatMul of two float32 activations (a transformer's attention
// products: Q and V moved head-major, K to [head, depth, token], the context back token-major)
// into the product: an Einsum whose equation reads the operands in their own layout and writes
// the output Transpose's. The layerwise GEMM reads such operands through strides
// (runtime/layerwise/steps.cc, EinsumOperands), so the activations are not moved once more.
// Only a Transpose read by the MatMul alone folds, and only where both operands' shapes are
// concrete with the same batch dims. Run by the executors whose steps read strided operands
// (layerwise, depthwise); the oneDNN and CUDA paths keep the graph's Transposes.
void fold_matmul_transposes(Graph& graph);

// Folds a Div or Mul by a float32 scalar constant that alone reads a MatMul or Einsum of two
// activations (attention scores scaled by 1 / sqrt(depth)) into the linear layer computing one
// of its operands: a MatMul of a constant weight whose epilogue adds constants only (Q's
// projection and bias), reached through Reshapes and Transposes that each read alone. Its weight
// and those constants are scaled (new constants), and the product writes the Div's output. Exact
// for a power of two (BERT's 8); otherwise within a rounding of each weight.
void fold_product_scale(Graph& graph);

// A copy of `graph` with the given input shapes fixed (every other dimension must then follow)
// and constants folded again, so shape-computing subgraphs disappear. Fails if an input name is
// unknown or a shape contradicts the model's fixed dimensions.
Graph specialize(const Graph& graph, const std::map<std::string, std::vector<int64_t>>& shapes,
                 const Evaluator& evaluate);

// The passes run at load, in order: fold_constants, fold_batchnorm, fuse_layernorm,
// fuse_epilogues, fold_product_scale, remove_dead (specialize runs fold_constants and the last
// three again).
void optimize(Graph& graph, const Evaluator& evaluate);

}  // namespace sparsecol::graph
