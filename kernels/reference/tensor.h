// Naive reference kernels of the data-movement ops (Transpose, Slice, Concat, Gather, Pad, ...).
//
// They move elements as opaque bytes of `element_size` bytes, so one kernel serves every dtype.
// Tensors are dense and C-ordered; shapes and strides are counted in elements. Callers (the
// reference ops in src/runtime/reference) validate every argument: the kernels assume indices
// in range and shapes that agree, and never allocate more than small index tables.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace sparsecol::kernels::reference {

// Strides of a dense C-ordered tensor of `shape`, in elements.
std::vector<int64_t> contiguous_strides(std::span<const int64_t> shape);

// The workhorse: for every index i of `shape`, copies the element at src + sum(i_d *
// src_strides[d]) to dst + sum(i_d * dst_strides[d]). Strides may be zero (broadcast) or
// negative (reversed slices). Transpose, Slice, Expand, Tile and DepthToSpace are all one call.
void copy_strided(const void* src, std::span<const int64_t> src_strides, void* dst,
                  std::span<const int64_t> dst_strides, std::span<const int64_t> shape,
                  std::size_t element_size);

// dst has shape src_shape[perm[0]], src_shape[perm[1]], ...
void transpose(const void* src, std::span<const int64_t> src_shape, std::span<const int64_t> perm,
               void* dst, std::size_t element_size);

// dst[i] = src[starts + i * steps] per axis; starts must be in range on every axis where
// dst_shape is non-zero.
void slice(const void* src, std::span<const int64_t> src_shape, std::span<const int64_t> starts,
           std::span<const int64_t> steps, std::span<const int64_t> dst_shape, void* dst,
           std::size_t element_size);

// Numpy broadcast of src to dst_shape (src_shape aligned to the right; its dims are 1 or equal).
void broadcast(const void* src, std::span<const int64_t> src_shape,
               std::span<const int64_t> dst_shape, void* dst, std::size_t element_size);

// dst has shape src_shape[d] * repeats[d]; dst[i] = src[i mod src_shape].
void tile(const void* src, std::span<const int64_t> src_shape, std::span<const int64_t> repeats,
          void* dst, std::size_t element_size);

// Tensors viewed as [outer, axis_dims[k], inner]: dst's axis is the concatenation of the srcs'.
void concat(std::span<const void* const> srcs, std::span<const int64_t> axis_dims, int64_t outer,
            int64_t inner, void* dst, std::size_t element_size);
// The inverse of concat.
void split(const void* src, int64_t outer, std::span<const int64_t> axis_dims, int64_t inner,
           std::span<void* const> dsts, std::size_t element_size);

// src viewed as [outer, axis_dim, inner], dst as [outer, indices.size(), inner]:
// dst[o, j, i] = src[o, indices[j], i]. Indices must be in [0, axis_dim).
void gather(const void* src, int64_t outer, int64_t axis_dim, int64_t inner,
            std::span<const int64_t> indices, void* dst, std::size_t element_size);

// dst has index_shape (same rank as src_shape, no larger on any axis but `axis`):
// dst[i] = src[i with i_axis replaced by indices[i]]. Indices must be in [0, src_shape[axis]).
void gather_elements(const void* src, std::span<const int64_t> src_shape,
                     std::span<const int64_t> indices, std::span<const int64_t> index_shape,
                     std::size_t axis, void* dst, std::size_t element_size);

enum class PadMode { kConstant, kReflect, kEdge, kWrap };

// dst[i] = src[i - pads_begin] where that is inside src; outside, per mode: `value` (constant),
// the mirror image without repeating the border (reflect), the nearest border element (edge),
// or the periodic repetition (wrap). Negative pads crop. Modes other than constant need every
// src axis that dst reads beyond to be non-empty.
void pad(const void* src, std::span<const int64_t> src_shape, std::span<const int64_t> pads_begin,
         std::span<const int64_t> dst_shape, PadMode mode, const void* value, void* dst,
         std::size_t element_size);

// Writes `count` copies of the element at `value`.
void fill(void* dst, int64_t count, const void* value, std::size_t element_size);

// A rows x cols matrix of zeros with `one` on the diagonal j - i == k.
void eye(int64_t rows, int64_t cols, int64_t k, const void* one, void* dst,
         std::size_t element_size);

// batch matrices of rows x cols: keeps the elements with j - i >= k (upper) or j - i <= k
// (lower) and zeroes the others (all-zero bytes are the zero of every dtype we hold).
void trilu(const void* src, int64_t batch, int64_t rows, int64_t cols, int64_t k, bool upper,
           void* dst, std::size_t element_size);

// indices viewed as [outer, inner], dst as [outer, depth, inner]: dst[o, d, i] is `on` where
// indices[o, i] == d, else `off`. An index outside [0, depth) gives a row of `off`.
void one_hot(std::span<const int64_t> indices, int64_t outer, int64_t depth, int64_t inner,
             const void* off, const void* on, void* dst, std::size_t element_size);

// ScatterND with its index tuples already turned into element offsets of dst, each starting a
// slice of `slice` elements (graph::resolve_nd_slices): dst[offsets[i] + j] = updates[i * slice
// + j] for every tuple i in order (the last of repeated tuples wins) and j < slice.
void scatter_nd(void* dst, std::span<const int64_t> offsets, int64_t slice, const void* updates,
                std::size_t element_size);

enum class ScatterReduction { kNone, kAdd, kMul, kMax, kMin };

// Arithmetic kernels, instantiated for float, double, int32_t and int64_t. Integer sums wrap
// instead of overflowing (signed overflow would be undefined behaviour).
//
// src and dst viewed as [outer, dim, inner]: running sums along dim, optionally excluding the
// current element and/or running from the end.
template <typename T>
void cumsum(const T* src, int64_t outer, int64_t dim, int64_t inner, bool exclusive, bool reverse,
            T* dst);
// ScatterND with a reduction: dst[offsets[i] + j] = reduce(dst[offsets[i] + j],
// updates[i * slice + j]), tuples in order, so repeated tuples all count (kNone: as scatter_nd).
template <typename T>
void scatter_nd_reduce(T* dst, std::span<const int64_t> offsets, int64_t slice, const T* updates,
                       ScatterReduction reduction);
// dst[i] = start + i * delta for i < count.
template <typename T>
void range(T start, T delta, int64_t count, T* dst);
// src viewed as [outer, dim, inner]: the k largest (or smallest) elements of each line along dim,
// in order (largest first, or smallest first), with their indices; equal elements in index order,
// a NaN above every number (as numpy sorts). values and indices are [outer, k, inner].
template <typename T>
void top_k(const T* src, int64_t outer, int64_t dim, int64_t inner, int64_t k, bool largest,
           T* values, int64_t* indices);

// Einsum as one loop per label: for every combination of label values (sizes[l] each),
// out[sum of value * output_strides] += the product over the inputs of
// inputs[i][sum of value * input_strides[i]]. A stride is 0 where the operand lacks the label
// (or broadcasts it), the sum of its axes' strides where the label repeats in one term (a
// diagonal). Sums in double (int64 for integer T). T: float, double, int32_t, int64_t.
template <typename T>
void einsum(std::span<const int64_t> sizes, std::span<const T* const> inputs,
            const std::vector<std::vector<int64_t>>& input_strides,
            std::span<const int64_t> output_strides, int64_t output_numel, T* out);

}  // namespace sparsecol::kernels::reference
