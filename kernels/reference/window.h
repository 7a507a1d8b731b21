// Geometry of a sliding window over the spatial dimensions of an NC[D][H]W tensor, shared by
// the convolution and pooling reference kernels.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

namespace sparsecol::kernels::reference {

// Up to three spatial dimensions (Conv3D, MaxPool3D); the kernels treat fewer as leading
// dimensions of size 1, so one loop nest serves 1-D, 2-D and 3-D.
inline constexpr int kMaxSpatialRank = 3;

struct Window {
  int rank = 2;  // number of spatial dimensions in use, 1..kMaxSpatialRank
  // Only the first `rank` entries are meaningful.
  std::array<int64_t, kMaxSpatialRank> in_size{};
  std::array<int64_t, kMaxSpatialRank> out_size{};
  std::array<int64_t, kMaxSpatialRank> kernel{};
  std::array<int64_t, kMaxSpatialRank> stride{};
  std::array<int64_t, kMaxSpatialRank> dilation{};
  std::array<int64_t, kMaxSpatialRank> pad_begin{};
  std::array<int64_t, kMaxSpatialRank> pad_end{};

  // The same window with exactly kMaxSpatialRank dimensions: missing leading dimensions get
  // size 1, kernel 1, stride 1, dilation 1 and no padding.
  Window expanded() const {
    Window full;
    full.rank = kMaxSpatialRank;
    const int shift = kMaxSpatialRank - rank;
    for (int d = 0; d < kMaxSpatialRank; ++d) {
      const bool used = d >= shift;
      const int s = d - shift;
      full.in_size[d] = used ? in_size[s] : 1;
      full.out_size[d] = used ? out_size[s] : 1;
      full.kernel[d] = used ? kernel[s] : 1;
      full.stride[d] = used ? stride[s] : 1;
      full.dilation[d] = used ? dilation[s] : 1;
      full.pad_begin[d] = used ? pad_begin[s] : 0;
      full.pad_end[d] = used ? pad_end[s] : 0;
    }
    return full;
  }
};

struct IndexRange {
  int64_t begin = 0;
  int64_t end = 0;
};

// The output positions o in [0, out_size) whose input position o * stride + offset lies in
// [0, in_size). Lets the loops run over valid positions only instead of testing every tap.
inline IndexRange valid_outputs(int64_t out_size, int64_t stride, int64_t offset, int64_t in_size) {
  const int64_t begin = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  const int64_t last_in = in_size - 1 - offset;  // largest allowed o * stride
  const int64_t end = last_in < 0 ? 0 : std::min(out_size, last_in / stride + 1);
  return {std::min(begin, end), end};
}

}  // namespace sparsecol::kernels::reference
