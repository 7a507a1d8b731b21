// Parameters of the tensor (data movement) ops that both shape inference (ops_tensor.cc) and
// the reference ops (runtime/reference/ops_tensor.cc) derive from a node and its inputs.
// One implementation for both, so the shape that is allocated and the bytes that are moved
// cannot disagree. Every function validates what it reads and fails naming node and op.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "graph/ops.h"

namespace sparsecol::graph {

// The contents of an int32 or int64 tensor of rank 0 or 1, as int64.
std::vector<int64_t> int_values(const InferContext& ctx, const Tensor& tensor, const char* what);

// Transpose's perm (default: the axes reversed), checked to be a permutation of 0..rank-1.
std::vector<int64_t> resolve_perm(const InferContext& ctx, int64_t rank);

// Gather-style indices (int32 or int64, any rank) checked against an axis of `dim` elements
// and made non-negative (ONNX allows [-dim, dim)). Fails with `code` naming the first bad one:
// kInvalidModel for indices stored in the model, kInvalidArgument for indices computed from
// the caller's inputs (token ids beyond a vocabulary, say).
std::vector<int64_t> resolve_indices(const InferContext& ctx, const Tensor& indices, int64_t dim,
                                     ErrorCode code);

// ScatterND and GatherND: where each index tuple's slice of data lies. The first `batch_dims`
// axes of indices and data are a batch (equal lengths; GatherND's batch_dims, ScatterND has
// none): the tuples of batch entry b address data[b]. indices (rank > batch_dims, last axis k
// <= rank of data - batch_dims) addresses slices of data[batch_dims + k:] (`slice` elements
// each); nd_slices_shape is indices[:-1] + data[batch_dims + k:], the shape of ScatterND's
// updates and of GatherND's output. With the index values (`index_values`, int64, may be null
// while they are not known) each tuple's components are checked against their axes ([-dim,
// dim), negative ones counting from the end; `code` as for resolve_indices) and turned into
// element offsets.
std::vector<int64_t> nd_slices_shape(const InferContext& ctx, const std::vector<int64_t>& data,
                                     const std::vector<int64_t>& indices, int64_t batch_dims = 0);
// TopK: the normalized axis and K (input 1, a constant of one int64 in [0, length of the axis]).
struct TopKSpec {
  std::size_t axis = 0;
  int64_t k = 0;
};
TopKSpec resolve_top_k(const InferContext& ctx, const std::vector<int64_t>& x, const Tensor& k);

// Einsum: the equation (numpy's notation: terms of letters and at most one "..." each, comma
// separated, then optionally "->" and the output's term; without it the output is the
// ellipsis' dimensions then the letters used once, in alphabetical order) resolved against the
// input shapes into one loop per label (a letter, or a dimension of the ellipsis, which
// broadcasts numpy's way), with each operand's element stride along it (see
// kernels/reference/tensor.h, einsum). A letter must have one size wherever it appears.
struct EinsumSpec {
  std::vector<int64_t> sizes;                       // per label
  std::vector<std::vector<int64_t>> input_strides;  // per input, per label
  std::vector<int64_t> output_strides;              // per label; 0 for a summed label
  std::vector<int64_t> output_shape;
};
EinsumSpec resolve_einsum(const InferContext& ctx, const std::string& equation,
                          const std::vector<std::vector<int64_t>>& shapes);

// How an Einsum of one or two operands runs as a batched GEMM (the layerwise schedule's
// kernels, the onednn schedule's matmul): which role each label of a resolved Einsum plays in
// C[batch][M][N] = A[batch][M][K] * B[batch][K][N], and each operand's strides along the labels
// in that order. A label that the output keeps is a batch label where both operands vary along
// it, else an M (A's) or N (B's) label; every summed label is a K label, including one that only
// one operand has (the other's stride 0 repeats it along K, so the product sums that operand over
// it). A single operand is A, with B a virtual 1.0 of stride 0 everywhere.
struct EinsumProduct {
  std::vector<int64_t> a_shape, a_strides;  // [batch..., M..., K...]
  std::vector<int64_t> b_shape, b_strides;  // [batch..., K..., N...]
  std::vector<int64_t> c_shape, c_strides;  // [batch..., M..., N...], into the output
  int64_t batch = 1, m = 1, n = 1, k = 1;
  std::size_t batch_labels = 0, m_labels = 0, n_labels = 0, k_labels = 0;  // each group's length
};
EinsumProduct einsum_product(const EinsumSpec& spec);

// ScatterElements: the element offset into data of every element of indices, its
// own position with the coordinate along `axis` replaced by its value ([-dim, dim), negative
// counting from the end; `code` as for resolve_indices). indices has data's rank and is no longer
// than data on any other axis (kShapeMismatch otherwise).
std::vector<int64_t> resolve_element_offsets(const InferContext& ctx,
                                             const std::vector<int64_t>& data,
                                             const std::vector<int64_t>& indices,
                                             const Tensor* index_values, std::size_t axis,
                                             ErrorCode code);

// ScatterND's updates must have nd_slices_shape (kShapeMismatch naming all three otherwise).
void check_nd_updates(const InferContext& ctx, const std::vector<int64_t>& data,
                      const std::vector<int64_t>& indices, const std::vector<int64_t>& updates);
struct NdSlices {
  std::vector<int64_t> offsets;  // one per index tuple; empty without index_values
  int64_t slice = 0;
};
NdSlices resolve_nd_slices(const InferContext& ctx, const std::vector<int64_t>& data,
                           const std::vector<int64_t>& indices, const Tensor* index_values,
                           ErrorCode code, int64_t batch_dims = 0);

// Resize: the output shape and what the interpolation needs, from the input shape, the
// attributes and the optional inputs (null where omitted; an empty tensor counts as omitted):
// exactly one of scales (float32, one per axis, > 0: output length floor(input * scale)) and
// sizes (int64, one per axis). roi (float32 or float64, starts then ends) is read only for
// coordinate_transformation_mode tf_crop_and_resize, which requires it.
struct ResizeSpec {
  std::vector<int64_t> out;
  std::vector<double> scales;  // per axis: the scale given, or output length / input length
  std::vector<double> roi;     // empty unless tf_crop_and_resize
};
ResizeSpec resolve_resize(const InferContext& ctx, const std::vector<int64_t>& in,
                          const Tensor* roi, const Tensor* scales, const Tensor* sizes);

// One axis of a Slice: the first element read, the step, and how many elements are read.
// When count <= 1 the step is 1, so that start + step * (count - 1) never overflows.
struct SliceAxis {
  int64_t start = 0;
  int64_t step = 1;
  int64_t count = 0;
};
// ONNX Slice (opset 10+) over every axis of data_shape: negative starts/ends count from the
// end, then are clamped to the axis ([0, dim] for positive steps, [-1, dim - 1] for negative).
std::vector<SliceAxis> resolve_slice(const InferContext& ctx,
                                     const std::vector<int64_t>& data_shape, const Tensor& starts,
                                     const Tensor& ends, const Tensor* axes, const Tensor* steps);

// ONNX Pad's pads for every axis of a tensor of `rank`: [begin_0 .. begin_{r-1}, end_0 ..
// end_{r-1}], from the `pads` attribute before opset 11 and from the inputs after (`axes`,
// opset 18, may be null). Negative pads crop.
std::vector<int64_t> resolve_pads(const InferContext& ctx, int64_t rank, const Tensor* pads,
                                  const Tensor* axes);

// ONNX Shape's [start, end) (opset 15 attributes; the whole shape before), clamped to rank.
std::pair<int64_t, int64_t> resolve_shape_range(const InferContext& ctx, int64_t rank);

// The tensor a Constant node holds: its `value` attribute, or one built from value_float(s) /
// value_int(s). Sparse and string constants are kUnsupported.
Tensor constant_value(const InferContext& ctx);

// Calls visit(T{}) with the C++ type of dtype (bool for kBool).
template <typename Visit>
decltype(auto) visit_dtype(DType dtype, Visit&& visit) {
  switch (dtype) {
    case DType::kFloat64:
      return visit(double{});
    case DType::kInt64:
      return visit(int64_t{});
    case DType::kInt32:
      return visit(int32_t{});
    case DType::kInt8:
      return visit(int8_t{});
    case DType::kUInt8:
      return visit(uint8_t{});
    case DType::kBool:
      return visit(bool{});
    case DType::kFloat32:
      break;
  }
  return visit(float{});
}

}  // namespace sparsecol::graph
