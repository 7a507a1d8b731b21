#include "reference/tensor.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

namespace sparsecol::kernels::reference {

namespace {

int64_t product(std::span<const int64_t> dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

// Copies rows along the innermost axis, advancing the outer axes like an odometer. kSize is
// the element size when known at compile time (so the per-element memcpy becomes one move),
// 0 when it is only known at run time.
template <std::size_t kSize>
void copy_strided_rows(const char* src, std::span<const int64_t> src_strides, char* dst,
                       std::span<const int64_t> dst_strides, std::span<const int64_t> shape,
                       std::size_t runtime_size) {
  const int64_t es = static_cast<int64_t>(kSize != 0 ? kSize : runtime_size);
  const std::size_t rank = shape.size();
  const std::size_t last = rank - 1;
  const int64_t row_length = shape[last];
  const int64_t src_step = src_strides[last] * es;
  const int64_t dst_step = dst_strides[last] * es;
  const bool contiguous_row = src_step == es && dst_step == es;
  const int64_t rows = product(shape.first(last));
  std::vector<int64_t> index(last, 0);
  int64_t src_offset = 0;
  int64_t dst_offset = 0;
  for (int64_t row = 0; row < rows; ++row) {
    if (contiguous_row) {
      std::memcpy(dst + dst_offset, src + src_offset, static_cast<std::size_t>(row_length * es));
    } else {
      const char* s = src + src_offset;
      char* d = dst + dst_offset;
      for (int64_t j = 0; j < row_length; ++j, s += src_step, d += dst_step) {
        std::memcpy(d, s, static_cast<std::size_t>(es));
      }
    }
    for (std::size_t axis = last; axis-- > 0;) {
      src_offset += src_strides[axis] * es;
      dst_offset += dst_strides[axis] * es;
      if (++index[axis] < shape[axis]) break;
      src_offset -= shape[axis] * src_strides[axis] * es;
      dst_offset -= shape[axis] * dst_strides[axis] * es;
      index[axis] = 0;
    }
  }
}

// Walks every index of `shape` in C order, calling visit(index) with the current multi-index.
template <typename Visit>
void for_each_index(std::span<const int64_t> shape, Visit&& visit) {
  const int64_t count = product(shape);
  std::vector<int64_t> index(shape.size(), 0);
  for (int64_t n = 0; n < count; ++n) {
    visit(std::span<const int64_t>(index));
    for (std::size_t axis = shape.size(); axis-- > 0;) {
      if (++index[axis] < shape[axis]) break;
      index[axis] = 0;
    }
  }
}

// Where output coordinate c (already shifted by the leading pad) reads along an axis of n
// elements, or -1 for the constant value.
int64_t pad_source(int64_t c, int64_t n, PadMode mode) {
  if (c >= 0 && c < n) return c;
  if (mode == PadMode::kConstant || n == 0) return -1;
  const auto positive_mod = [](int64_t a, int64_t m) { return ((a % m) + m) % m; };
  switch (mode) {
    case PadMode::kEdge:
      return c < 0 ? 0 : n - 1;
    case PadMode::kWrap:
      return positive_mod(c, n);
    case PadMode::kReflect: {
      // Mirror without repeating the border: the pattern 0 1 .. n-1 n-2 .. 1 has period 2(n-1).
      if (n == 1) return 0;
      const int64_t period = 2 * (n - 1);
      const int64_t m = positive_mod(c, period);
      return m < n ? m : period - m;
    }
    case PadMode::kConstant:
      break;
  }
  return -1;
}

}  // namespace

std::vector<int64_t> contiguous_strides(std::span<const int64_t> shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t stride = 1;
  for (std::size_t axis = shape.size(); axis-- > 0;) {
    strides[axis] = stride;
    stride *= shape[axis];
  }
  return strides;
}

void copy_strided(const void* src, std::span<const int64_t> src_strides, void* dst,
                  std::span<const int64_t> dst_strides, std::span<const int64_t> shape,
                  std::size_t element_size) {
  const auto* s = static_cast<const char*>(src);
  auto* d = static_cast<char*>(dst);
  if (shape.empty()) {
    std::memcpy(d, s, element_size);
    return;
  }
  if (product(shape) == 0) return;
  switch (element_size) {
    case 1:
      return copy_strided_rows<1>(s, src_strides, d, dst_strides, shape, 1);
    case 2:
      return copy_strided_rows<2>(s, src_strides, d, dst_strides, shape, 2);
    case 4:
      return copy_strided_rows<4>(s, src_strides, d, dst_strides, shape, 4);
    case 8:
      return copy_strided_rows<8>(s, src_strides, d, dst_strides, shape, 8);
    default:
      return copy_strided_rows<0>(s, src_strides, d, dst_strides, shape, element_size);
  }
}

void transpose(const void* src, std::span<const int64_t> src_shape, std::span<const int64_t> perm,
               void* dst, std::size_t element_size) {
  const std::vector<int64_t> src_strides = contiguous_strides(src_shape);
  std::vector<int64_t> dst_shape(perm.size());
  std::vector<int64_t> read_strides(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i) {
    const auto from = static_cast<std::size_t>(perm[i]);
    dst_shape[i] = src_shape[from];
    read_strides[i] = src_strides[from];
  }
  copy_strided(src, read_strides, dst, contiguous_strides(dst_shape), dst_shape, element_size);
}

void slice(const void* src, std::span<const int64_t> src_shape, std::span<const int64_t> starts,
           std::span<const int64_t> steps, std::span<const int64_t> dst_shape, void* dst,
           std::size_t element_size) {
  if (product(dst_shape) == 0 && !dst_shape.empty()) return;
  const std::vector<int64_t> src_strides = contiguous_strides(src_shape);
  std::vector<int64_t> read_strides(src_shape.size());
  int64_t first = 0;
  for (std::size_t axis = 0; axis < src_shape.size(); ++axis) {
    first += starts[axis] * src_strides[axis];
    read_strides[axis] = steps[axis] * src_strides[axis];
  }
  copy_strided(static_cast<const char*>(src) + first * static_cast<int64_t>(element_size),
               read_strides, dst, contiguous_strides(dst_shape), dst_shape, element_size);
}

void broadcast(const void* src, std::span<const int64_t> src_shape,
               std::span<const int64_t> dst_shape, void* dst, std::size_t element_size) {
  const std::vector<int64_t> src_strides = contiguous_strides(src_shape);
  const std::size_t lead = dst_shape.size() - src_shape.size();
  std::vector<int64_t> read_strides(dst_shape.size(), 0);
  for (std::size_t axis = 0; axis < src_shape.size(); ++axis) {
    // A dimension of 1 stretched to dst's size reads its one element again: stride 0.
    if (src_shape[axis] == dst_shape[lead + axis]) read_strides[lead + axis] = src_strides[axis];
  }
  copy_strided(src, read_strides, dst, contiguous_strides(dst_shape), dst_shape, element_size);
}

void tile(const void* src, std::span<const int64_t> src_shape, std::span<const int64_t> repeats,
          void* dst, std::size_t element_size) {
  // dst of shape [r0*s0, r1*s1, ...] is, in memory, the shape [r0, s0, r1, s1, ...]; reading it
  // from src with stride 0 on the repeat axes is a broadcast.
  const std::vector<int64_t> src_strides = contiguous_strides(src_shape);
  std::vector<int64_t> split_shape;
  std::vector<int64_t> read_strides;
  for (std::size_t axis = 0; axis < src_shape.size(); ++axis) {
    split_shape.insert(split_shape.end(), {repeats[axis], src_shape[axis]});
    read_strides.insert(read_strides.end(), {0, src_strides[axis]});
  }
  copy_strided(src, read_strides, dst, contiguous_strides(split_shape), split_shape, element_size);
}

void concat(std::span<const void* const> srcs, std::span<const int64_t> axis_dims, int64_t outer,
            int64_t inner, void* dst, std::size_t element_size) {
  auto* d = static_cast<char*>(dst);
  const auto row_bytes = [&](std::size_t k) {
    return static_cast<std::size_t>(axis_dims[k] * inner) * element_size;
  };
  for (int64_t o = 0; o < outer; ++o) {
    for (std::size_t k = 0; k < srcs.size(); ++k) {
      const std::size_t bytes = row_bytes(k);
      if (bytes == 0) continue;
      std::memcpy(d, static_cast<const char*>(srcs[k]) + static_cast<std::size_t>(o) * bytes,
                  bytes);
      d += bytes;
    }
  }
}

void split(const void* src, int64_t outer, std::span<const int64_t> axis_dims, int64_t inner,
           std::span<void* const> dsts, std::size_t element_size) {
  const auto* s = static_cast<const char*>(src);
  for (int64_t o = 0; o < outer; ++o) {
    for (std::size_t k = 0; k < dsts.size(); ++k) {
      const auto bytes = static_cast<std::size_t>(axis_dims[k] * inner) * element_size;
      if (bytes == 0) continue;
      std::memcpy(static_cast<char*>(dsts[k]) + static_cast<std::size_t>(o) * bytes, s, bytes);
      s += bytes;
    }
  }
}

void gather(const void* src, int64_t outer, int64_t axis_dim, int64_t inner,
            std::span<const int64_t> indices, void* dst, std::size_t element_size) {
  const auto chunk = static_cast<std::size_t>(inner) * element_size;
  if (chunk == 0) return;
  const auto* s = static_cast<const char*>(src);
  auto* d = static_cast<char*>(dst);
  for (int64_t o = 0; o < outer; ++o) {
    const char* block = s + static_cast<std::size_t>(o * axis_dim) * chunk;
    for (int64_t index : indices) {
      std::memcpy(d, block + static_cast<std::size_t>(index) * chunk, chunk);
      d += chunk;
    }
  }
}

void gather_elements(const void* src, std::span<const int64_t> src_shape,
                     std::span<const int64_t> indices, std::span<const int64_t> index_shape,
                     std::size_t axis, void* dst, std::size_t element_size) {
  const std::vector<int64_t> src_strides = contiguous_strides(src_shape);
  const auto* s = static_cast<const char*>(src);
  auto* d = static_cast<char*>(dst);
  std::size_t n = 0;
  for_each_index(index_shape, [&](std::span<const int64_t> index) {
    int64_t offset = indices[n] * src_strides[axis];
    for (std::size_t a = 0; a < index.size(); ++a) {
      if (a != axis) offset += index[a] * src_strides[a];
    }
    std::memcpy(d + n * element_size, s + static_cast<std::size_t>(offset) * element_size,
                element_size);
    ++n;
  });
}

void scatter_nd(void* dst, std::span<const int64_t> offsets, int64_t slice, const void* updates,
                std::size_t element_size) {
  const std::size_t chunk = static_cast<std::size_t>(slice) * element_size;
  auto* d = static_cast<char*>(dst);
  const auto* u = static_cast<const char*>(updates);
  for (int64_t offset : offsets) {
    std::memcpy(d + static_cast<std::size_t>(offset) * element_size, u, chunk);
    u += chunk;
  }
}

void pad(const void* src, std::span<const int64_t> src_shape, std::span<const int64_t> pads_begin,
         std::span<const int64_t> dst_shape, PadMode mode, const void* value, void* dst,
         std::size_t element_size) {
  // Per axis, the source coordinate of every output coordinate (-1: the constant), so that the
  // element loop only adds up table entries.
  const std::vector<int64_t> src_strides = contiguous_strides(src_shape);
  std::vector<std::vector<int64_t>> sources(dst_shape.size());
  for (std::size_t axis = 0; axis < dst_shape.size(); ++axis) {
    sources[axis].resize(static_cast<std::size_t>(dst_shape[axis]));
    for (int64_t i = 0; i < dst_shape[axis]; ++i) {
      sources[axis][static_cast<std::size_t>(i)] =
          pad_source(i - pads_begin[axis], src_shape[axis], mode);
    }
  }
  const auto* s = static_cast<const char*>(src);
  auto* d = static_cast<char*>(dst);
  for_each_index(dst_shape, [&](std::span<const int64_t> index) {
    int64_t offset = 0;
    for (std::size_t axis = 0; axis < index.size() && offset >= 0; ++axis) {
      const int64_t from = sources[axis][static_cast<std::size_t>(index[axis])];
      offset = from < 0 ? -1 : offset + from * src_strides[axis];
    }
    std::memcpy(d, offset < 0 ? value : s + static_cast<std::size_t>(offset) * element_size,
                element_size);
    d += element_size;
  });
}

void fill(void* dst, int64_t count, const void* value, std::size_t element_size) {
  auto* d = static_cast<char*>(dst);
  for (int64_t i = 0; i < count; ++i, d += element_size) std::memcpy(d, value, element_size);
}

void eye(int64_t rows, int64_t cols, int64_t k, const void* one, void* dst,
         std::size_t element_size) {
  auto* d = static_cast<char*>(dst);
  std::memset(d, 0, static_cast<std::size_t>(rows * cols) * element_size);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t j = i + k;
    if (j >= 0 && j < cols) {
      std::memcpy(d + static_cast<std::size_t>(i * cols + j) * element_size, one, element_size);
    }
  }
}

void trilu(const void* src, int64_t batch, int64_t rows, int64_t cols, int64_t k, bool upper,
           void* dst, std::size_t element_size) {
  const auto* s = static_cast<const char*>(src);
  auto* d = static_cast<char*>(dst);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j, s += element_size, d += element_size) {
        const bool keep = upper ? j - i >= k : j - i <= k;
        if (keep) {
          std::memcpy(d, s, element_size);
        } else {
          std::memset(d, 0, element_size);
        }
      }
    }
  }
}

void one_hot(std::span<const int64_t> indices, int64_t outer, int64_t depth, int64_t inner,
             const void* off, const void* on, void* dst, std::size_t element_size) {
  auto* d = static_cast<char*>(dst);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t c = 0; c < depth; ++c) {
      for (int64_t i = 0; i < inner; ++i, d += element_size) {
        const bool hot = indices[static_cast<std::size_t>(o * inner + i)] == c;
        std::memcpy(d, hot ? on : off, element_size);
      }
    }
  }
}

namespace {

// a + b, wrapping for integers (through the unsigned type, where overflow is defined).
template <typename T>
T add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

}  // namespace

template <typename T>
void cumsum(const T* src, int64_t outer, int64_t dim, int64_t inner, bool exclusive, bool reverse,
            T* dst) {
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      T sum = T(0);
      for (int64_t step = 0; step < dim; ++step) {
        const int64_t j = reverse ? dim - 1 - step : step;
        const int64_t at = (o * dim + j) * inner + i;
        const T x = src[at];
        if (exclusive) {
          dst[at] = sum;
          sum = add(sum, x);
        } else {
          sum = add(sum, x);
          dst[at] = sum;
        }
      }
    }
  }
}

// a * b, wrapping for integers like add().
template <typename T>
T multiply(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

template <typename T>
void scatter_nd_reduce(T* dst, std::span<const int64_t> offsets, int64_t slice, const T* updates,
                       ScatterReduction reduction) {
  for (int64_t offset : offsets) {
    T* d = dst + offset;
    for (int64_t j = 0; j < slice; ++j, ++updates) {
      switch (reduction) {
        case ScatterReduction::kNone:
          d[j] = *updates;
          break;
        case ScatterReduction::kAdd:
          d[j] = add(d[j], *updates);
          break;
        case ScatterReduction::kMul:
          d[j] = multiply(d[j], *updates);
          break;
        case ScatterReduction::kMax:
          d[j] = std::max(d[j], *updates);
          break;
        case ScatterReduction::kMin:
          d[j] = std::min(d[j], *updates);
          break;
      }
    }
  }
}

template <typename T>
void range(T start, T delta, int64_t count, T* dst) {
  for (int64_t i = 0; i < count; ++i) {
    if constexpr (std::is_integral_v<T>) {
      // Every value lies between start and limit, but i * delta alone may not fit T.
      dst[i] = static_cast<T>(static_cast<uint64_t>(start) +
                              static_cast<uint64_t>(i) * static_cast<uint64_t>(delta));
    } else {
      dst[i] = static_cast<T>(static_cast<double>(start) +
                              static_cast<double>(i) * static_cast<double>(delta));
    }
  }
}

template void cumsum<float>(const float*, int64_t, int64_t, int64_t, bool, bool, float*);
template void cumsum<double>(const double*, int64_t, int64_t, int64_t, bool, bool, double*);
template void cumsum<int32_t>(const int32_t*, int64_t, int64_t, int64_t, bool, bool, int32_t*);
template void cumsum<int64_t>(const int64_t*, int64_t, int64_t, int64_t, bool, bool, int64_t*);
template void scatter_nd_reduce<float>(float*, std::span<const int64_t>, int64_t, const float*,
                                       ScatterReduction);
template void scatter_nd_reduce<double>(double*, std::span<const int64_t>, int64_t, const double*,
                                        ScatterReduction);
template void scatter_nd_reduce<int32_t>(int32_t*, std::span<const int64_t>, int64_t,
                                         const int32_t*, ScatterReduction);
template void scatter_nd_reduce<int64_t>(int64_t*, std::span<const int64_t>, int64_t,
                                         const int64_t*, ScatterReduction);
template <typename T>
void top_k(const T* src, int64_t outer, int64_t dim, int64_t inner, int64_t k, bool largest,
           T* values, int64_t* indices) {
  // a above b in the order: the larger (or smaller) first, a NaN the largest of all.
  const auto above = [largest](T a, T b) {
    const bool a_nan = a != a, b_nan = b != b;  // NOLINT(misc-redundant-expression): NaN test
    if (a_nan || b_nan) return largest ? a_nan && !b_nan : b_nan && !a_nan;
    return largest ? a > b : a < b;
  };
  std::vector<int64_t> order(static_cast<std::size_t>(dim));
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      const T* line = src + o * dim * inner + i;
      std::iota(order.begin(), order.end(), int64_t{0});
      // Stable, so equal elements keep their index order.
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return above(line[a * inner], line[b * inner]);
      });
      for (int64_t j = 0; j < k; ++j) {
        const int64_t at = (o * k + j) * inner + i;
        indices[at] = order[static_cast<std::size_t>(j)];
        values[at] = line[order[static_cast<std::size_t>(j)] * inner];
      }
    }
  }
}

template void range<float>(float, float, int64_t, float*);
template void range<double>(double, double, int64_t, double*);
template void range<int32_t>(int32_t, int32_t, int64_t, int32_t*);
template void range<int64_t>(int64_t, int64_t, int64_t, int64_t*);

template void top_k<float>(const float*, int64_t, int64_t, int64_t, int64_t, bool, float*,
                           int64_t*);
template void top_k<double>(const double*, int64_t, int64_t, int64_t, int64_t, bool, double*,
                            int64_t*);
template void top_k<int32_t>(const int32_t*, int64_t, int64_t, int64_t, int64_t, bool, int32_t*,
                             int64_t*);
template void top_k<int64_t>(const int64_t*, int64_t, int64_t, int64_t, int64_t, bool, int64_t*,
                             int64_t*);

template <typename T>
void einsum(std::span<const int64_t> sizes, std::span<const T* const> inputs,
            const std::vector<std::vector<int64_t>>& input_strides,
            std::span<const int64_t> output_strides, int64_t output_numel, T* out) {
  using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
  std::vector<Acc> acc(static_cast<std::size_t>(output_numel), Acc{0});
  const std::size_t labels = sizes.size(), operands = inputs.size();
  // An odometer over the labels, the last fastest, moving every operand's offset with it (no
  // combinations at all where a label has size 0).
  std::vector<int64_t> at(labels, 0), offset(operands, 0);
  int64_t out_offset = 0;
  bool done = std::find(sizes.begin(), sizes.end(), int64_t{0}) != sizes.end();
  while (!done) {
    Acc product{1};
    for (std::size_t i = 0; i < operands; ++i) product *= static_cast<Acc>(inputs[i][offset[i]]);
    acc[static_cast<std::size_t>(out_offset)] += product;
    std::size_t l = labels;
    for (; l-- > 0;) {
      const bool wraps = ++at[l] == sizes[l];
      const int64_t step = wraps ? 1 - sizes[l] : 1;
      for (std::size_t i = 0; i < operands; ++i) offset[i] += step * input_strides[i][l];
      out_offset += step * output_strides[l];
      if (!wraps) break;
      at[l] = 0;
    }
    done = l == static_cast<std::size_t>(-1);  // every label wrapped
  }
  for (int64_t o = 0; o < output_numel; ++o)
    out[o] = static_cast<T>(acc[static_cast<std::size_t>(o)]);
}

template void einsum<float>(std::span<const int64_t>, std::span<const float* const>,
                            const std::vector<std::vector<int64_t>>&, std::span<const int64_t>,
                            int64_t, float*);
template void einsum<double>(std::span<const int64_t>, std::span<const double* const>,
                             const std::vector<std::vector<int64_t>>&, std::span<const int64_t>,
                             int64_t, double*);
template void einsum<int32_t>(std::span<const int64_t>, std::span<const int32_t* const>,
                              const std::vector<std::vector<int64_t>>&, std::span<const int64_t>,
                              int64_t, int32_t*);
template void einsum<int64_t>(std::span<const int64_t>, std::span<const int64_t* const>,
                              const std::vector<std::vector<int64_t>>&, std::span<const int64_t>,
                              int64_t, int64_t*);

}  // namespace sparsecol::kernels::reference
