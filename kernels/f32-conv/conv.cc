// The convolution front end: picks an implementation per geometry and weight sparsity at packing
// time and lowers a range of output rows onto the GEMM (f32-gemm/gemm.h), the sparse kernels
// (f32-spmm/spmm.h) or the depthwise kernel (f32-dwconv/dwconv.h). See conv.h.
#include "f32-conv/conv.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <span>

#include <fmt/format.h>

#include "f32-dwconv/dwconv.h"
#include "f32-eltwise/eltwise.h"
#include "f32-gemm/ukernels.h"
#include "f32-spmm/spmm.h"
#include "f32-spmm/spmm_jit.h"
#include "scratch.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol::kernels {

struct PackedConv::Impl {
  enum class Kind {
    kGemm1x1,
    kGemmGathered1x1,
    kIm2colGemm,
    kImplicitGemm,
    kDepthwise,
    kSpmm1x1,
    kSpmmGathered1x1,
    kSpmmPhases,
    kPhaseGemm
  };
  Kind kind = Kind::kIm2colGemm;
  std::vector<PackedA> groups;  // GEMM kinds: group g's weights [OC/g x IC/g*KH*KW]
  // kImplicitGemm (one group): the weights' depth runs in blocks of this many input channels, tap
  // by tap within a block (order_for_taps); each tap's plane and shifts (gemm.h, ConvTap). A
  // strided layer reads the stride phases its taps use, a * stride_w + b for phase (a, b), copied
  // per call (fill_tap_phases; ConvTap::phase indexes this list); a stride-1 layer its input.
  int64_t tap_block_channels = 0;
  std::vector<ConvTap> taps;
  std::vector<int64_t> tap_phases;
  // kPhaseGemm (see pack_phase_gemm): B row (c, ky, kx) of group 0's channels as an offset into
  // the phase planes of a chunk (chunk_rows, phase_w and b_plane below); group g's rows lie
  // g * IC/g planes further on.
  std::vector<int64_t> row_offsets;
  std::vector<float> weight;  // depthwise: [C x KH*KW]
  std::vector<float> bias;    // out_c values, zeros when the layer has none
  double sparsity = 0.0;      // fraction of exact zeros of the weight
  // Sparse kinds: all groups in one matrix [OC x IC/g*KH*KW], its offsets laid out for the
  // whole input tensor (1x1) or for the phase planes of a chunk (the others), split by input
  // channels into K-blocks where its rows are long enough (see pack_sparse; grouped: one).
  std::vector<SparseMatrix> sparse;
  Isa sparse_isa = Isa::kPortable;
  // Sparse kinds on AVX-512: code generated for the weight, which is then one block packed
  // unshifted (see pack_sparse); null where none was made.
  std::shared_ptr<const SpmmJit> jit;
  // kSpmmPhases (see pack_sparse) and kPhaseGemm: output rows per chunk and the length of a
  // phase row.
  int64_t chunk_rows = 0;
  int64_t phase_w = 0;
  // kSpmmPhases: the `lanes` of its SparseMatrix blocks, which phase_w is a multiple of: the
  // sparse ISA's vector width or half of it for the shifted packing, else 1 (see
  // sparse_phase_pitch).
  int64_t sparse_lanes = 1;
  // Sparse kinds and kPhaseGemm: the floats from one B plane to the next that the packed offsets
  // assume, a whole number of cache lines: the phase planes of a chunk buffer (kSpmmPhases,
  // kPhaseGemm), the input planes (1x1 kinds; the input's own when its planes are that far
  // apart, else a copy's).
  int64_t b_plane = 0;
  // 1x1 sparse kinds, where the kernels run: the K-blocks' offsets for B planes `plane_stride`
  // floats apart, the first such layout other than b_plane that a product reads (a depth-wise tile
  // buffer, whose planes stay that far apart from tile to tile), made once by that product and
  // kept. Re-mapping costs a pass over the non-zeros: on a 7-row tile of a 14x14 layer about
  // what the product itself costs.
  // Where the weight has generated code, code for that layout too (null where none was made).
  struct TileLayout {
    std::once_flag made;
    int64_t plane_stride = 0;
    std::vector<std::vector<int32_t>> offsets;
    std::shared_ptr<const SpmmJit> jit;
  };
  mutable TileLayout tile_layout;
  // A layer summed by halves of its input channels (kInputHalvesMaxPixels, conv.h): each half
  // packed as a layer of its own, without the bias (added once, with the sums); `sparse` is
  // empty then.
  std::vector<PackedConv> input_halves;
  int64_t input_split = 0;

  bool is_sparse() const { return !sparse.empty() || !input_halves.empty(); }
  bool is_gemm() const {
    return kind == Kind::kGemm1x1 || kind == Kind::kGemmGathered1x1 || kind == Kind::kIm2colGemm ||
           kind == Kind::kImplicitGemm || kind == Kind::kPhaseGemm;
  }
};

namespace {

// im2col chunks (kIm2colBudgetFloats, conv.h) never hold fewer than kMinChunkPixels output
// pixels, because a GEMM this narrow spends its time on edges (ResNet-50's last 3x3 layer, 4608
// deep and 7 wide, ran 3x slower in chunks of 2 rows than in one chunk of all 7).
constexpr int64_t kMinChunkPixels = 64;
// The sparse phase path copies the chunk's input rows, zero-padded, into a buffer the kernel
// reads once per non-zero of every output channel: at most this many floats (128 KiB), so that
// it and the chunk's output stay in the 512 KiB L2 of a Zen 3 core.
constexpr int64_t kPaddedBudget = 32 * 1024;
// The fewest non-zeros per output row a K-block holds on average (see pack_sparse).
constexpr double kMinBlockNonZeros = 24.0;
// The floats of B one pixel tile of a K-block reads (see pack_sparse): L1 less 16 KiB, which
// leaves room for the non-zeros and the output rows streaming past. On Zen 3 (32 KiB) that was
// half of L1, the best of the sizes tried; on Zen 5 (48 KiB) ResNet-50's 3x3 layers at 90% and
// 95% ran 1.03-1.24x faster with 32 KiB than with 16 KiB, within 3% of 24 and 40 KiB
// (bench/spmm_bench.cc, one thread, two runs of each).
int64_t sparse_l1_budget_floats() {
  const int64_t l1 = core_caches().l1d;
  return std::max(l1 / 2, l1 - 16 * 1024) / static_cast<int64_t>(sizeof(float));
}

void check_geometry(const ConvGeometry& g) {
  const bool positive = g.in_c > 0 && g.in_h > 0 && g.in_w > 0 && g.out_c > 0 && g.out_h > 0 &&
                        g.out_w > 0 && g.kernel_h > 0 && g.kernel_w > 0 && g.stride_h > 0 &&
                        g.stride_w > 0 && g.dilation_h > 0 && g.dilation_w > 0 && g.groups > 0 &&
                        g.pad_top >= 0 && g.pad_left >= 0;
  if (!positive || g.in_c % g.groups != 0 || g.out_c % g.groups != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("PackedConv: invalid geometry in {}x{}x{} -> out {}x{}x{}, kernel "
                            "{}x{}, stride {}x{}, dilation {}x{}, pad {},{}, groups {}",
                            g.in_c, g.in_h, g.in_w, g.out_c, g.out_h, g.out_w, g.kernel_h,
                            g.kernel_w, g.stride_h, g.stride_w, g.dilation_h, g.dilation_w,
                            g.pad_top, g.pad_left, g.groups));
  }
}

// Columns [first, last) of output positions x whose input column x * stride + offset lies in
// [0, size).
void valid_range(int64_t out_size, int64_t stride, int64_t offset, int64_t size, int64_t* first,
                 int64_t* last) {
  const int64_t begin = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  const int64_t last_in = size - 1 - offset;
  const int64_t end = last_in < 0 ? 0 : std::min(out_size, last_in / stride + 1);
  *first = std::min(begin, end);
  *last = end;
}

// Phase planes (space-to-depth, see pack_sparse and fill_phases): channel c's padded input row
// i * sh + a, column j * sw + b, counted from a chunk's first padded row, is plane (c, a, b) row
// i column j, planes `plane` floats apart and rows `phase_w` apart. Tap (ky, kx) of output pixel
// (i, j) of the chunk then reads that plane's element at the returned offset from i * phase_w + j.
// The taps' reach in phase rows and columns: a chunk of r output rows reads r + halo rows of each
// plane, and a phase row is out_w + reach columns long.
int64_t phase_halo_rows(const ConvGeometry& g) {
  return (g.kernel_h - 1) * g.dilation_h / g.stride_h;
}
int64_t phase_reach_columns(const ConvGeometry& g) {
  return (g.kernel_w - 1) * g.dilation_w / g.stride_w;
}
int64_t phase_row_width(const ConvGeometry& g) { return g.out_w + phase_reach_columns(g); }

int64_t phase_tap_offset(const ConvGeometry& g, int64_t c, int64_t ky, int64_t kx, int64_t phase_w,
                         int64_t plane) {
  const int64_t y = ky * g.dilation_h, x = kx * g.dilation_w;
  const int64_t index = (c * g.stride_h + y % g.stride_h) * g.stride_w + x % g.stride_w;
  return index * plane + y / g.stride_h * phase_w + x / g.stride_w;
}

// The column matrix of input channels [c0, c0 + channels) for output rows [oh_begin, oh_end):
// row (c, ky, kx) at cols + row * ldb, column (oh - oh_begin) * out_w + ox, zeros where the tap
// is in padding.
void im2col(const ConvGeometry& g, const PlaneView& src, int64_t c0, int64_t channels,
            int64_t oh_begin, int64_t oh_end, float* cols, int64_t ldb) {
  const int64_t n = ldb;
  for (int64_t c = 0; c < channels; ++c) {
    const float* plane = src.data + (c0 + c) * src.plane_stride;
    for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
      // Output rows [o0, o1) read an input row inside the image; the others are all padding.
      const int64_t off_h = ky * g.dilation_h - g.pad_top;
      int64_t o0 = 0, o1 = 0;
      valid_range(oh_end, g.stride_h, off_h, g.in_h, &o0, &o1);
      o0 = std::max(o0, oh_begin);
      o1 = std::max(o1, o0);
      for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
        float* row = cols + ((c * g.kernel_h + ky) * g.kernel_w + kx) * n;
        const int64_t off_w = kx * g.dilation_w - g.pad_left;
        int64_t x0 = 0, x1 = 0;
        valid_range(g.out_w, g.stride_w, off_w, g.in_w, &x0, &x1);
        std::fill(row, row + (o0 - oh_begin) * g.out_w, 0.0f);
        if (o1 > o0) {
          gather_rows(
              plane + (o0 * g.stride_h + off_h - src.row0) * g.in_w + off_w + x0 * g.stride_w,
              g.stride_h * g.in_w, g.stride_w, o1 - o0, x0, x1, g.out_w,
              row + (o0 - oh_begin) * g.out_w, g.out_w);
        }
        std::fill(row + (o1 - oh_begin) * g.out_w, row + (oh_end - oh_begin) * g.out_w, 0.0f);
      }
    }
  }
}

}  // namespace

void conv_input_rows(const ConvGeometry& g, int64_t oh_begin, int64_t oh_end, int64_t* first,
                     int64_t* last) {
  if (oh_begin >= oh_end) {
    *first = *last = 0;
    return;
  }
  const int64_t lo = oh_begin * g.stride_h - g.pad_top;
  const int64_t hi = (oh_end - 1) * g.stride_h - g.pad_top + (g.kernel_h - 1) * g.dilation_h + 1;
  *first = std::clamp(lo, int64_t{0}, g.in_h);
  *last = std::clamp(hi, *first, g.in_h);
}

// Candidates run from the fewest rows allowed to twice the budget's, and one wins over the
// budget's own choice only by filling at least 2% more of the computed columns, because the GEMM
// computes the last strip of every chunk whole: on ResNet-50's 3x3 layer at 28x28 (K = 1152),
// chunks of 3 rows (84 pixels: 5 strips and 4 columns) ran at 66 GFLOP/s, chunks of 4 rows (112
// pixels, 7 strips) at 83 (the GEMM alone, one thread, Zen 3); at 14x14 (K = 2304) the budget's
// 70 pixels and 112: 61-64 and 62-79 GFLOP/s (two runs). A larger chunk's strips may outgrow
// L2; the GEMM streams them one block of K at a time, which does fit.
int64_t im2col_chunk_rows(const ConvGeometry& g, Isa isa) {
  const int64_t depth = g.in_c / g.groups * g.kernel_h * g.kernel_w;
  const int64_t nr = default_gemm_ukernel(isa).nr;
  const int64_t least = std::min(g.out_h, (kMinChunkPixels + g.out_w - 1) / g.out_w);
  const int64_t budget_rows =
      std::clamp(kIm2colBudgetFloats / std::max<int64_t>(1, depth * g.out_w), least, g.out_h);
  // The fraction of the columns computed over a whole image's chunks that are real pixels.
  auto filled = [&](int64_t rows) {
    const int64_t chunks = (g.out_h + rows - 1) / rows;
    const int64_t last = g.out_h - (chunks - 1) * rows;
    const int64_t strips =
        (chunks - 1) * ((rows * g.out_w + nr - 1) / nr) + (last * g.out_w + nr - 1) / nr;
    return static_cast<double>(g.out_h * g.out_w) / static_cast<double>(strips * nr);
  };
  int64_t best = budget_rows;
  for (int64_t rows = least; rows <= std::min(g.out_h, 2 * budget_rows); ++rows) {
    if (filled(rows) > filled(best) + 0.02) best = rows;
  }
  return best;
}

namespace {

// Output rows per chunk of a sparse lowering through scratch, whose layout the packed offsets fix:
// `floats_per_row` scratch floats per output row plus `fixed` whatever the chunk, within
// `budget`; never fewer than kMinChunkPixels output pixels (see above), never more than out_h.
int64_t chunk_rows(const ConvGeometry& g, int64_t floats_per_row, int64_t fixed, int64_t budget) {
  const int64_t fit = (budget - fixed) / std::max<int64_t>(floats_per_row, 1);
  const int64_t least = (kMinChunkPixels + g.out_w - 1) / g.out_w;
  return std::clamp<int64_t>(std::max(fit, least), 1, g.out_h);
}

// Columns a phase row may share with the next: rows laid out closer together than their width
// overlap in these, which are zeros in both (one row's right padding, the next one's left).
// Stride 1 only, where a row is the padding, the input row and the padding.
int64_t phase_row_overlap(const ConvGeometry& g) {
  if (g.stride_w != 1) return 0;
  return std::max<int64_t>(0, std::min(g.pad_left, phase_row_width(g) - g.pad_left - g.in_w));
}

// How far apart a sparse layer's phase rows lie, and the `lanes` of its packing (see
// SparseMatrix): rows a multiple of the widest vector-load granule that pads them by at most an
// eighth, so that every plane row and every tap's aligned base starts on one and the kernel
// reads B in whole aligned loads (the shifted packing: a tap's column offset, at most
// kMaxSpmmShifts - 1, becomes a lane shift of its group's sums); else rows as close as they go,
// packed unshifted.
// The granule is the vector (ResNet-50's 56-, 28- and 14-wide planes: rows of 57, 29 and 15
// floats padded to 64, 32 and 16) or half of it (its 7x7 planes: 8 floats, with the overlap).
// Measured on ResNet-50's 3x3 layers at 90% (bench/spmm_bench.cc, one thread, Zen 5): each
// shifted tap's vector loads straddled two cache lines, and with every load aligned (offsets
// rounded down, a timing-only experiment) the stride-1 layers ran 1.3-1.45x faster, stride 2
// 1.16-1.2x. A half-vector granule: on Zen 4, which splits a 512-bit load in two, a load from a
// 32-byte boundary cost what an aligned one does and one from elsewhere 1.58x (a standalone loop
// of 4 FMAs per broadcast, B in L1, the thirty-third session); on a core that loads 512 bits at
// once half of such loads straddle two lines, against 15 of 16 unaligned.
// AVX2 pads the rows the same way but packs unshifted (lanes 1; sparse_phases_shifted in
// conv.h).
struct PhasePitch {
  int64_t pitch, lanes;
};
PhasePitch sparse_phase_pitch(const ConvGeometry& g, Isa isa) {
  const int64_t closest = phase_row_width(g) - phase_row_overlap(g);
  const int64_t lanes = vector_floats(isa);
  if (phase_reach_columns(g) < kMaxSpmmShifts) {
    for (const int64_t granule : {lanes, lanes / 2}) {
      const int64_t padded = (closest + granule - 1) / granule * granule;
      if (granule > 1 && 8 * padded <= 9 * closest) {
        return {padded, sparse_phases_shifted(isa) ? granule : 1};
      }
    }
  }
  return {closest, 1};
}

// The chunking of a layer on phase planes (see pack_sparse): impl.phase_w = `pitch` (at least
// the width of a row less phase_row_overlap(), rows as far apart as they are wide when 0),
// impl.chunk_rows (a chunk's planes plus `out_rows` phase_w-wide output rows per output row
// within `budget` floats) and impl.b_plane; returns B row (c, ky, kx) of input channels
// [0, channels), in that order, as an offset into a chunk's planes.
std::vector<int64_t> plan_phase_planes(const ConvGeometry& g, int64_t out_rows, int64_t budget,
                                       int64_t channels, PackedConv::Impl& impl,
                                       int64_t pitch = 0) {
  const int64_t width = phase_row_width(g);
  impl.phase_w = pitch > 0 ? pitch : width;
  const int64_t halo = phase_halo_rows(g);
  const int64_t planes = g.in_c * g.stride_h * g.stride_w;
  impl.chunk_rows =
      chunk_rows(g, (planes + out_rows) * impl.phase_w, planes * halo * impl.phase_w, budget);
  impl.b_plane =
      round_up_to_line((impl.chunk_rows + halo - 1) * impl.phase_w + std::max(impl.phase_w, width));
  std::vector<int64_t> offsets;
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
      for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
        offsets.push_back(phase_tap_offset(g, c, ky, kx, impl.phase_w, impl.b_plane));
      }
    }
  }
  return offsets;
}

// Packs the weight [OC x IC/g*KH*KW] for the sparse lowering the geometry takes.
void pack_sparse(const ConvGeometry& g, const float* weight, PackedConv::Impl& impl) {
  using Kind = PackedConv::Impl::Kind;
  const int64_t taps = g.kernel_h * g.kernel_w;
  const int64_t depth = g.in_c / g.groups * taps;
  // B row (c, ky, kx) for input channel c of any group: group g's column k is B row g*depth + k.
  std::vector<int64_t> offsets(static_cast<std::size_t>(g.in_c * taps));
  auto b_row = [&](int64_t c, int64_t ky, int64_t kx) -> int64_t& {
    return offsets[static_cast<std::size_t>((c * g.kernel_h + ky) * g.kernel_w + kx)];
  };
  const bool strided_pointwise = impl.kind == Kind::kGemmGathered1x1;
  if (impl.kind == Kind::kGemm1x1 || strided_pointwise) {
    // B row c is input plane c, planes b_plane apart (see sparse_conv_rows): the input tensor's
    // own when its planes are whole cache lines apart, else the region's pixels copied (gathered,
    // if strided) to the start of planes that are.
    impl.kind = strided_pointwise ? Kind::kSpmmGathered1x1 : Kind::kSpmm1x1;
    impl.b_plane = round_up_to_line(g.out_h * g.out_w);
    for (int64_t c = 0; c < g.in_c; ++c) b_row(c, 0, 0) = c * impl.b_plane;
  } else {
    // Any other convolution reads a zero-padded copy of the chunk's input rows, split by stride
    // phase (space-to-depth): channel c's input (row i * sh + a, column j * sw + b), counted from
    // the chunk's first padded row and column, goes to plane (c, a, b) at row i, column j. Tap
    // (ky, kx) with ky * dh = qy * sh + a and kx * dw = qx * sw + b then reads plane (c, a, b)
    // qy rows and qx columns on from where output pixel (oh, ox) sits, the flat position
    // (oh - r0) * phase_w + ox: every tap is a contiguous run of outputs, with no im2col. With
    // stride 1 there is one phase and this is a plain padded copy. The kernel computes
    // phase_w-wide rows, of which the last phase_w - out_w columns are discarded.
    impl.kind = Kind::kSpmmPhases;
    const PhasePitch pitch = sparse_phase_pitch(g, impl.sparse_isa);
    impl.sparse_lanes = pitch.lanes;
    offsets = plan_phase_planes(g, 0, kPaddedBudget, g.in_c, impl, pitch.pitch);
  }
  // K-blocks: a pixel tile of the kernel reads, per input channel, its tile of every phase plane
  // plus the taps' reach (halo rows and columns). A 3x3 layer's channels overflow L1 at 64
  // pixels (ResNet-50's 3x3 64 at 56x56: 46 KiB), so every non-zero's B row came from L2; the
  // phase path instead runs the product over blocks of input channels whose tiles fit
  // sparse_l1_budget_floats(), adding each block to the partial sums (SpmmArgs::accumulate).
  // Grouped convolutions keep one block (a group's channels are already few). With this and the
  // whole epilogue in the kernel (finish_row), ResNet-50's stride-1 3x3 layers ran 1.0-1.7x
  // faster at 90% and 95% (bench/spmm_bench.cc, ratios to the dense kernel of the same run, two
  // runs, Zen 3), but its stride-2 one, whose 4 phase planes per channel left 9 blocks of 15
  // channels (~6-13 non-zeros per row and block), ran 0.8x at 95%; with the floor on non-zeros
  // below, its stride-2 3x3 layers ran 1.05-1.2x faster with blocks than without (Zen 5, three
  // alternated runs).
  // 1x1 layers read one tile per channel (the tile no wider than the image).
  // Every block keeps at least kMinBlockNonZeros non-zeros per output row on average: a row's
  // fixed costs (loading and storing its partial sums, the loop exit) are paid once per block.
  // On Zen 5 at 90% and 95% (one thread, two runs), blocks of at least 3 non-zeros a row made
  // ResNet-50's 1x1 layers up to 1.7x slower than one block (2048->512 at 7x7, 95%), of at least
  // 6-12 still up to 1.3x, of at least 24 ran within 5% of one block or faster (1024->256 at
  // 14x14 1.05-1.1x), and 32 or 48 were no better; the 3x3 layers' blocks (15-30 non-zeros a row
  // at 95%) are unaffected.
  int64_t block_c = g.in_c;
  const bool phases = impl.kind == Kind::kSpmmPhases;
  if (g.groups == 1) {
    const int64_t tile = default_spmm_ukernel(impl.sparse_isa).tile;
    const int64_t reach = phases ? phase_halo_rows(g) * impl.phase_w + phase_reach_columns(g) : 0;
    // A tile of each phase plane, or of the (gathered) input plane, no wider than a chunk of
    // the first or the image of the second. Blocks sized for a whole tile of 128 columns were
    // half as wide as they could be on ResNet-50's 7x7 planes (55 columns a chunk): sized for
    // its 64, that 3x3 layer ran 1.09x faster at 90% (one thread, Zen 4, 6 alternated runs).
    const int64_t columns =
        phases ? (impl.chunk_rows - 1) * impl.phase_w + g.out_w : g.out_h * g.out_w;
    const int64_t width =
        (phases ? g.stride_h * g.stride_w : 1) * std::min(tile, round_up_to_line(columns));
    const int64_t budget = sparse_l1_budget_floats();
    const double nnz_per_channel = (1.0 - impl.sparsity) * static_cast<double>(taps);
    const int64_t least_c = static_cast<int64_t>(std::ceil(
        kMinBlockNonZeros / std::max(nnz_per_channel, 1.0 / static_cast<double>(g.in_c))));
    const int64_t fit_c = std::max<int64_t>(1, budget / (width + reach));
    const int64_t most_c = std::max(least_c, fit_c);
    int64_t blocks = (g.in_c + most_c - 1) / most_c;
    // A 1x1 layer whose blocks the non-zero floor makes wider than L1 anyway (least_c > fit_c),
    // and whose whole tile of B sits in a quarter of L2, gains nothing from blocks: they only
    // add a pass over the partial sums each, and keep the output off its residual's buffer
    // (may_overwrite_residual). ResNet-50 90% at batch 16, layer by layer, 2 threads (Zen 4,
    // `--per-layer`, two alternated pairs): its 256 -> 1024 layers at 14x14, whose residual the
    // output now overwrites, 20.5 and 19.6 -> 15.7 and 15.7 ms for the six; the other layers
    // this touches (256 and 512 input channels) within noise, alone and in the model
    // (bench/spmm_bench.cc, one thread, three alternated runs). 1024 input channels (512 KiB of
    // B per tile) keep their blocks: on Zen 5 they ran 1.05-1.1x faster with them.
    if (!phases && least_c > fit_c &&
        g.in_c * width * static_cast<int64_t>(sizeof(float)) <= core_caches().l2 / 4) {
      blocks = 1;
    }
    block_c = (g.in_c + blocks - 1) / blocks;
  }
  // A layer whose code can be generated runs in one block, packed unshifted (spmm_jit.h).
  if (g.groups == 1 && impl.sparse_isa == Isa::kAvx512) {
    SparseMatrix whole(weight, g.out_c, depth, depth, 1, 1, offsets);
    impl.jit = SpmmJit::generate(whole);
    if (impl.jit != nullptr) {
      impl.sparse.push_back(std::move(whole));
      return;
    }
  }
  for (int64_t c0 = 0; c0 < g.in_c; c0 += block_c) {
    const int64_t c1 = std::min(g.in_c, c0 + block_c);
    if (g.groups != 1) {
      impl.sparse.emplace_back(weight, g.out_c, depth, depth, 1, g.groups, offsets,
                               impl.sparse_lanes);
      break;
    }
    impl.sparse.emplace_back(
        weight + c0 * taps, g.out_c, (c1 - c0) * taps, depth, 1, 1,
        std::span<const int64_t>(offsets).subspan(static_cast<std::size_t>(c0 * taps),
                                                  static_cast<std::size_t>((c1 - c0) * taps)),
        impl.sparse_lanes);
  }
}

// A dense convolution that runs as an implicit GEMM (gemm_packed_taps) instead of through im2col:
// one group, and planes whose rows are as wide as the output's, so that every tap is one shift of
// the output's pixel index (taps falling off the image's edges are masked off): stride 1 with
// rows as wide in as out reads the input in place, a strided layer a copy of the stride phases
// its taps use (each input pixel copied at most once, against im2col's once per tap), as long
// as no phase row is wider than an output row. No column matrix to write and read back, and no
// chunking of the image to keep one in L2, whose narrow chunks left the GEMM's last strip of
// each mostly empty (14x14 images: chunks of 5 rows, 3 strips of 32 for 70 pixels).
// The micro-kernel runs each tap's channels as one loop between mask and pointer changes, so
// a layer with few input channels runs on phase planes instead (runs_on_phase_planes): ResNet-50's
// 7x7 stem (3 channels, 49 taps) and MobileNetV2's 3x3 stem ran 2.9x and 3.5x slower as implicit
// GEMMs (one thread, Zen 5).
constexpr int64_t kMinTapChannels = 16;

bool is_depthwise(const ConvGeometry& g) { return g.groups == g.in_c && g.groups == g.out_c; }

// A 1x1 stride-1 convolution without padding: a GEMM over the input's planes.
bool is_pointwise(const ConvGeometry& g) {
  return g.kernel_h == 1 && g.kernel_w == 1 && g.stride_h == 1 && g.stride_w == 1 &&
         g.pad_top == 0 && g.pad_left == 0 && g.in_h == g.out_h && g.in_w == g.out_w;
}

// Whether a sparse layer of this geometry sums its input channels in halves (conv.h,
// kInputHalvesMaxPixels): 1x1, more input than output channels, at least 32 of them.
bool sums_input_halves(const ConvGeometry& g) {
  const int64_t pixels = g.out_h * g.out_w;
  return is_pointwise(g) && g.groups == 1 && g.in_c > g.out_c && g.in_c >= 32 &&
         pixels > kStackedPlanePixels && pixels <= kInputHalvesMaxPixels;
}

bool reads_taps_in_place(const ConvGeometry& g) {
  return g.groups == 1 && g.in_c >= kMinTapChannels && g.stride_h == 1 && g.stride_w == 1 &&
         g.in_w == g.out_w && g.kernel_h * g.kernel_w > 1;
}
bool reads_tap_phases(const ConvGeometry& g) {
  return g.groups == 1 && g.in_c >= kMinTapChannels && (g.stride_h > 1 || g.stride_w > 1) &&
         (g.in_w + g.stride_w - 1) / g.stride_w <= g.out_w;
}

// A's columns [c][t] (ONNX order) reordered block by block of `block` channels, tap by tap within
// a block: the order in which gemm_packed_taps runs a block's taps over the same input lines.
std::vector<float> order_for_taps(const float* weight, int64_t rows, int64_t channels, int64_t taps,
                                  int64_t block) {
  std::vector<float> ordered(static_cast<std::size_t>(rows * channels * taps));
  for (int64_t o = 0; o < rows; ++o) {
    const float* w = weight + o * channels * taps;
    float* out = ordered.data() + o * channels * taps;
    for (int64_t c0 = 0; c0 < channels; c0 += block) {
      const int64_t count = std::min(block, channels - c0);
      for (int64_t t = 0; t < taps; ++t) {
        for (int64_t c = 0; c < count; ++c) out[c0 * taps + t * count + c] = w[(c0 + c) * taps + t];
      }
    }
  }
  return ordered;
}

int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// Tap (i, j) reads input row y * stride_h - pad_top + i * dilation_h of output row y: with
// i * dilation_h - pad_top = q * stride_h + a (0 <= a < stride_h), that is row y + q of phase a.
// Channels per block: a strip of the micro-kernel's NR output pixels reads, per channel and
// phase, the plane's lines from its first pixel's top-left tap to its last pixel's bottom-right
// one (at most one run of NR + the taps' width per distinct row shift, on a wide image); blocks
// of channels whose lines fill half of L1 stay there while every panel of A passes the strip.
void pack_implicit_gemm(const ConvGeometry& g, const float* weight, Isa isa,
                        PackedConv::Impl& impl) {
  impl.kind = PackedConv::Impl::Kind::kImplicitGemm;
  const bool strided = g.stride_h > 1 || g.stride_w > 1;
  int64_t row_lo = 0, row_hi = 0, col_lo = 0, col_hi = 0;
  std::vector<int64_t> row_shifts;
  for (int64_t i = 0; i < g.kernel_h; ++i) {
    for (int64_t j = 0; j < g.kernel_w; ++j) {
      const int64_t y = i * g.dilation_h - g.pad_top, x = j * g.dilation_w - g.pad_left;
      ConvTap tap;
      tap.row_shift = floor_div(y, g.stride_h);
      tap.col_shift = floor_div(x, g.stride_w);
      const int64_t a = y - tap.row_shift * g.stride_h, b = x - tap.col_shift * g.stride_w;
      tap.rows = (g.in_h - a + g.stride_h - 1) / g.stride_h;
      tap.columns = (g.in_w - b + g.stride_w - 1) / g.stride_w;
      if (strided) {
        const int64_t phase = a * g.stride_w + b;
        const auto it = std::find(impl.tap_phases.begin(), impl.tap_phases.end(), phase);
        tap.phase = it - impl.tap_phases.begin();
        if (it == impl.tap_phases.end()) impl.tap_phases.push_back(phase);
      }
      impl.taps.push_back(tap);
      row_lo = std::min(row_lo, tap.row_shift);
      row_hi = std::max(row_hi, tap.row_shift);
      col_lo = std::min(col_lo, tap.col_shift);
      col_hi = std::max(col_hi, tap.col_shift);
      if (std::find(row_shifts.begin(), row_shifts.end(), tap.row_shift) == row_shifts.end()) {
        row_shifts.push_back(tap.row_shift);
      }
    }
  }
  const int64_t taps = g.kernel_h * g.kernel_w;
  const int64_t nr = default_gemm_ukernel(isa).nr;
  const int64_t span_w = col_hi - col_lo + nr;
  const int64_t reach = (row_hi - row_lo) * g.out_w + span_w;
  const int64_t phases = std::max<int64_t>(1, static_cast<int64_t>(impl.tap_phases.size()));
  const int64_t lines =
      phases * std::min(reach / kLineFloats + 2,
                        static_cast<int64_t>(row_shifts.size()) * (span_w / kLineFloats + 2));
  const int64_t fit = std::max<int64_t>(1, core_caches().l1d / 2 / (lines * 64));
  const int64_t blocks = (g.in_c + fit - 1) / fit;
  impl.tap_block_channels = (g.in_c + blocks - 1) / blocks;
  const std::vector<float> ordered =
      order_for_taps(weight, g.out_c, g.in_c, taps, impl.tap_block_channels);
  impl.groups.emplace_back(ordered.data(), g.out_c, g.in_c * taps, g.in_c * taps, isa);
}

// A dense layer on phase planes (runs_on_phase_planes): each chunk of output rows copies its
// input rows, zero-padded and split by stride phase, into planes (fill_phases, as the sparse
// phase path does: pack_sparse), where every tap of every output row is a contiguous run; the
// GEMM reads B row (c, ky, kx) there at its offset (gemm_packed_row_offsets) and computes
// phase_w-wide rows. A chunk's planes and its output rows together stay near
// kIm2colBudgetFloats. Against im2col into packed strips (bench/conv_bench.cc, one thread, Zen
// 5, 3 alternated runs of both binaries): ResNet-50's 7x7 stride-2 stem 1.11-1.14x (1247 ->
// 1105 us), MobileNetV2's 3x3 stride-2 stem 1.08-1.13x, small_cnn's 3x3 3 -> 16 1.46-1.56x.
// The stems' B loads straddle cache lines (a tap's offset is any column), and the 12 planes of
// a ResNet-50 chunk (55 KiB) outgrow L1: the stem runs at 0.82 of the FMA peak, against 0.95
// for the GEMM alone on packed strips.
void pack_phase_gemm(const ConvGeometry& g, PackedConv::Impl& impl) {
  impl.kind = PackedConv::Impl::Kind::kPhaseGemm;
  impl.row_offsets = plan_phase_planes(g, 0, kIm2colBudgetFloats, g.in_c / g.groups, impl);
}

}  // namespace

PackedConv::PackedConv(const ConvGeometry& geometry, const float* weight, const float* bias,
                       double sparse_threshold, Isa isa)
    : PackedConv(geometry, weight, bias, sparse_threshold, isa, Halves::kAllowed) {}

PackedConv::PackedConv(const ConvGeometry& geometry, const float* weight, const float* bias,
                       double sparse_threshold, Isa isa, Halves halves)
    : geometry_(geometry) {
  check_geometry(geometry);
  const ConvGeometry& g = geometry_;
  auto impl = std::make_shared<Impl>();
  impl->bias.assign(static_cast<std::size_t>(g.out_c), 0.0f);
  if (bias != nullptr) std::copy(bias, bias + g.out_c, impl->bias.begin());

  const int64_t taps = g.kernel_h * g.kernel_w;
  const int64_t depth = g.in_c / g.groups * taps;  // ONNX weight rows are already [oc][ic][ky][kx]
  impl->sparsity = zero_fraction(weight, g.out_c * depth);
  if (is_depthwise(g)) {
    impl->kind = Impl::Kind::kDepthwise;
    impl->weight.assign(weight, weight + g.out_c * taps);
  } else {
    impl->kind = is_pointwise(g)                ? Impl::Kind::kGemm1x1
                 : gathers_strided_pointwise(g) ? Impl::Kind::kGemmGathered1x1
                                                : Impl::Kind::kIm2colGemm;
    if (impl->sparsity >= resolve_sparse_threshold(sparse_threshold, SparseLayerKind::kConv)) {
      impl->sparse_isa = std::min(isa, active_isa());
      if (halves == Halves::kAllowed && sums_input_halves(g)) {
        // The first half ends on a multiple of 16 channels near the middle: where the layer
        // before splits its output channels between two threads (blocks of whole granules).
        impl->kind = Impl::Kind::kSpmm1x1;
        impl->input_split = std::min(g.in_c - 1, (g.in_c / 2 + 15) / 16 * 16);
        for (int half = 0; half < 2; ++half) {
          const int64_t c0 = half == 0 ? 0 : impl->input_split;
          const int64_t c1 = half == 0 ? impl->input_split : g.in_c;
          ConvGeometry part = g;
          part.in_c = c1 - c0;
          std::vector<float> w(static_cast<std::size_t>(g.out_c * part.in_c));
          for (int64_t oc = 0; oc < g.out_c; ++oc) {
            std::copy(weight + oc * g.in_c + c0, weight + oc * g.in_c + c1,
                      w.begin() + oc * part.in_c);
          }
          // A threshold of 0: the half packs sparse whatever its own sparsity.
          impl->input_halves.push_back(
              PackedConv(part, w.data(), nullptr, 0.0, impl->sparse_isa, Halves::kNever));
        }
      } else {
        pack_sparse(g, weight, *impl);
      }
    } else if (impl->kind == Impl::Kind::kIm2colGemm &&
               (reads_taps_in_place(g) || reads_tap_phases(g))) {
      pack_implicit_gemm(g, weight, std::min(isa, active_isa()), *impl);
    } else {
      const int64_t oc_per_group = g.out_c / g.groups;
      for (int64_t group = 0; group < g.groups; ++group) {
        impl->groups.emplace_back(weight + group * oc_per_group * depth, oc_per_group, depth, depth,
                                  std::min(isa, active_isa()));
      }
      if (runs_on_phase_planes(g)) pack_phase_gemm(g, *impl);
    }
  }
  impl_ = std::move(impl);
}

double PackedConv::weight_sparsity() const { return impl_->sparsity; }

const char* PackedConv::weight_format() const {
  return impl_->is_sparse() ? "sparse-csr" : "dense";
}

int64_t PackedConv::packed_bytes() const {
  int64_t bytes = static_cast<int64_t>(impl_->bias.size() * sizeof(float));
  for (const PackedConv& half : impl_->input_halves) {
    bytes += half.packed_bytes() - static_cast<int64_t>(half.impl_->bias.size() * sizeof(float));
  }
  for (const SparseMatrix& block : impl_->sparse) bytes += block.packed_bytes();
  if (impl_->jit != nullptr) bytes += impl_->jit->bytes();
  if (impl_->is_sparse()) return bytes;
  if (impl_->kind == Impl::Kind::kDepthwise) {
    return bytes + static_cast<int64_t>(impl_->weight.size() * sizeof(float));
  }
  for (const PackedA& a : impl_->groups) {
    bytes += packed_a_size(a.rows(), a.depth(), default_gemm_ukernel(a.isa()).mr) *
             static_cast<int64_t>(sizeof(float));
  }
  return bytes;
}

std::string PackedConv::implementation() const {
  switch (impl_->kind) {
    case Impl::Kind::kGemm1x1:
    case Impl::Kind::kGemmGathered1x1:
      return fmt::format("gemm-1x1{}/{}",
                         impl_->kind == Impl::Kind::kGemmGathered1x1 ? "-gathered" : "",
                         to_string(impl_->groups.front().isa()));
    case Impl::Kind::kIm2colGemm:
      return fmt::format("im2col-gemm-{}x{}/{}", geometry_.kernel_h, geometry_.kernel_w,
                         to_string(impl_->groups.front().isa()));
    case Impl::Kind::kImplicitGemm:
      return fmt::format("implicit-gemm-{}x{}/{}", geometry_.kernel_h, geometry_.kernel_w,
                         to_string(impl_->groups.front().isa()));
    case Impl::Kind::kPhaseGemm:
      return fmt::format("phase-gemm-{}x{}/{}", geometry_.kernel_h, geometry_.kernel_w,
                         to_string(impl_->groups.front().isa()));
    case Impl::Kind::kDepthwise:
      return fmt::format("depthwise-{}x{}/{}", geometry_.kernel_h, geometry_.kernel_w,
                         to_string(active_isa()));
    case Impl::Kind::kSpmm1x1:
    case Impl::Kind::kSpmmGathered1x1:
      if (!impl_->input_halves.empty()) {
        return impl_->input_halves.front().implementation() + " in input halves";
      }
      return fmt::format("spmm-1x1{}{}/{}",
                         impl_->kind == Impl::Kind::kSpmmGathered1x1 ? "-gathered" : "",
                         impl_->jit != nullptr ? "-jit" : "", to_string(impl_->sparse_isa));
    case Impl::Kind::kSpmmPhases:
      return fmt::format("spmm-{}x{}{}{}{}/{}", geometry_.kernel_h, geometry_.kernel_w,
                         geometry_.stride_h == 1 && geometry_.stride_w == 1 ? "" : "-strided",
                         impl_->sparse.front().shifts() > 1 ? "-shifted" : "",
                         impl_->jit != nullptr ? "-jit" : "", to_string(impl_->sparse_isa));
  }
  return "unknown";
}

bool runs_on_phase_planes(const ConvGeometry& g) {
  return !is_depthwise(g) && !is_pointwise(g) && !gathers_strided_pointwise(g) &&
         g.in_c < kMinTapChannels;
}

bool sparse_phases_shifted(Isa isa) { return isa != Isa::kAvx2; }

bool gathers_strided_pointwise(const ConvGeometry& g) {
  return g.kernel_h == 1 && g.kernel_w == 1 && (g.stride_h > 1 || g.stride_w > 1) &&
         g.pad_top == 0 && g.pad_left == 0 && (g.out_h - 1) * g.stride_h < g.in_h &&
         (g.out_w - 1) * g.stride_w < g.in_w;
}

namespace {

// Fills the phase planes (see pack_sparse) for output rows [r0, r1): `rows` phase rows per
// plane, zeros wherever the input position is padding or beyond the rows those outputs read
// (a tile buffer holds no more). Rows lie phase_w apart; where that is less than a row's width
// (phase_row_overlap), each row is written whole after the one before, whose last columns it
// overwrites with the same zeros.
void fill_phases(const ConvGeometry& g, const PlaneView& src, int64_t r0, int64_t r1, int64_t rows,
                 int64_t phase_w, int64_t plane_size, float* planes) {
  const int64_t width = std::max(phase_w, phase_row_width(g));
  const int64_t last_row =
      std::min(g.in_h, (r1 - 1) * g.stride_h - g.pad_top + (g.kernel_h - 1) * g.dilation_h + 1);
  for (int64_t c = 0; c < g.in_c; ++c) {
    for (int64_t a = 0; a < g.stride_h; ++a) {
      // Phase rows [i0, i1) hold input rows in [0, last_row); the others are zeros.
      const int64_t offset = r0 * g.stride_h - g.pad_top + a;
      int64_t i0 = 0, i1 = 0;
      valid_range(rows, g.stride_h, offset, last_row, &i0, &i1);
      float* first_plane = planes + (c * g.stride_h + a) * g.stride_w * plane_size;
      for (int64_t b = 0; b < g.stride_w; ++b) {
        float* plane = first_plane + b * plane_size;
        std::fill_n(plane, i0 * phase_w, 0.0f);
        std::fill(plane + i1 * phase_w, plane + (rows - 1) * phase_w + width, 0.0f);
      }
      if (i1 <= i0) continue;
      const float* row =
          src.data + c * src.plane_stride + (offset + i0 * g.stride_h - src.row0) * g.in_w;
      if (g.stride_w == 2) {  // both column phases from one read of each row
        split_column_phases(row, g.stride_h * g.in_w, g.in_w, g.pad_left, i1 - i0, width,
                            first_plane + i0 * phase_w, first_plane + plane_size + i0 * phase_w,
                            phase_w);
        continue;
      }
      for (int64_t b = 0; b < g.stride_w; ++b) {
        // Phase columns j whose input column j * sw + b - pad_left lies in [0, in_w).
        const int64_t first =
            std::min(width, std::max<int64_t>(0, g.pad_left - b + g.stride_w - 1) / g.stride_w);
        const int64_t end = std::clamp<int64_t>(
            (g.in_w + g.pad_left - b + g.stride_w - 1) / g.stride_w, first, width);
        gather_rows(row + first * g.stride_w + b - g.pad_left, g.stride_h * g.in_w, g.stride_w,
                    i1 - i0, first, end, width, first_plane + b * plane_size + i0 * phase_w,
                    phase_w);
      }
    }
  }
}

// dst = post(residual + acc) for one output row whose bias and pre-residual activation the
// kernel already applied; without a residual the kernel applied the whole epilogue and this is
// a copy (it was one out-of-line apply_activation call per element). The activation is a
// separate pass so that the add vectorizes.
void finish_row(const float* acc, const float* residual, int64_t n, const Epilogue& e, float* dst) {
  if (residual == nullptr) {
    std::memcpy(dst, acc, static_cast<std::size_t>(n) * sizeof(float));
    return;
  }
  for (int64_t x = 0; x < n; ++x) dst[x] = acc[x] + residual[x];
  if (e.post_residual == Activation::kNone) return;
  for (int64_t x = 0; x < n; ++x) {
    dst[x] = apply_activation(e.post_residual, dst[x], e.clip_min, e.clip_max);
  }
}

// The pixels that output rows [oh_begin, oh_end) of a 1x1 layer read, channel by channel, into
// planes `plane` floats apart: the rows' run copied at stride 1, gathered at a larger stride.
void copy_pointwise_pixels(const ConvGeometry& g, const PlaneView& src, int64_t oh_begin,
                           int64_t oh_end, float* planes, int64_t plane) {
  const float* in = src.data + (oh_begin * g.stride_h - src.row0) * g.in_w;
  const int64_t rows = oh_end - oh_begin;
  for (int64_t c = 0; c < g.in_c; ++c) {
    const float* from = in + c * src.plane_stride;
    float* to = planes + c * plane;
    if (g.stride_h == 1 && g.stride_w == 1) {
      std::memcpy(to, from, static_cast<std::size_t>(rows * g.out_w) * sizeof(float));
    } else {
      gather_rows(from, g.stride_h * g.in_w, g.stride_w, rows, 0, g.out_w, g.out_w, to, g.out_w);
    }
  }
}

// The sparse lowerings (see pack_sparse): the kernel computes every output channel of a run of
// output pixels.
void sparse_conv_rows(const ConvGeometry& g, const PackedConv::Impl& impl, const PlaneView& src,
                      const PlaneView& dst, int64_t oh_begin, int64_t oh_end, int64_t oc_begin,
                      int64_t oc_end, const Epilogue& epilogue, const PlaneView* residual,
                      std::vector<float>& scratch) {
  using Kind = PackedConv::Impl::Kind;
  // A weight with generated code (impl.jit) is one block and runs through it, except in a 1x1
  // layer's call on at most kKernelPixels pixels (a 7x7 image): there each block's code would
  // serve at most 4 vectors of columns, and the layer's code, fetched cold once per call, costs
  // more than the kernel's stream of non-zeros. MobileNetV2 80% at batch 1 (one thread, Zen 4,
  // three alternated rounds): depth-wise 4.24-4.34 ms with this, 4.37-4.49 without; at batch 16,
  // where its columns run one image at a time and keep their code warm, 51.7-53.0 against
  // 49.8-50.5 ms, and layer by layer (whose 7x7 layers stack their images) the same. A phase
  // layer's chunks all run the same code in one call.
  constexpr int64_t kKernelPixels = 64;
  const bool jit = impl.jit != nullptr && (impl.kind == Kind::kSpmmPhases ||
                                           (oh_end - oh_begin) * g.out_w > kKernelPixels);
  // The code for B's layout: the weight's own, or where B is not in the layout the weight was
  // packed for (a tile buffer's planes), the code made for that one (TileLayout), or none.
  const SpmmJit* code = jit ? impl.jit.get() : nullptr;
  // The product over the K-blocks in order into `out` (ldo apart), each adding to the partial
  // sums, `last` with the last block; B at `b`, block i's offsets for its layout offsets_of(i).
  auto product = [&](const float* b, int64_t n, float* out, int64_t ldo, const Epilogue& last,
                     auto offsets_of) {
    if (code != nullptr) {
      code->run(impl.sparse.front(), offsets_of(0), oc_begin, oc_end, b, n, out, ldo, last);
      return;
    }
    for (std::size_t i = 0; i < impl.sparse.size(); ++i) {
      spmm(impl.sparse[i], offsets_of(i), oc_begin, oc_end, b, n, out, ldo,
           i + 1 == impl.sparse.size() ? last : Epilogue{}, impl.sparse_isa, i > 0);
    }
  };
  auto packed = [&](std::size_t i) { return impl.sparse[i].offsets(); };

  if (impl.kind == Kind::kSpmm1x1 || impl.kind == Kind::kSpmmGathered1x1) {
    // Output rows [oh_begin, oh_end) straight into dst (contiguous out_w-wide rows of each
    // plane) with the whole epilogue.
    const int64_t n = (oh_end - oh_begin) * g.out_w;
    float* out = dst.data + oc_begin * dst.plane_stride + (oh_begin - dst.row0) * g.out_w;
    Epilogue e = epilogue;
    e.row_bias = impl.bias.data() + oc_begin;
    e.col_bias = nullptr;
    e.residual = nullptr;
    if (residual != nullptr) {
      e.residual = residual->data + oc_begin * residual->plane_stride +
                   (oh_begin - residual->row0) * g.out_w;
      e.residual_ld = residual->plane_stride;
    }
    const float* in = src.data + (oh_begin * g.stride_h - src.row0) * g.in_w;
    if (impl.kind == Kind::kSpmm1x1 && src.plane_stride % kLineFloats == 0) {
      // Planes whole lines apart: the region's first pixel sits at the same place in a line in
      // every plane. Where that is not a line's start (a tile's rows from the middle of
      // the plane: the depth-wise schedule's halo rows shift them by one), the columns up to the
      // next line boundary run on their own and the rest from aligned loads, instead of copying
      // the region: ResNet-50 90% at batch 1 copied a 0.8 MiB region in 3 of 4 tiles of its
      // 56x56 columns' first 1x1 layer. The kernels sum every column the same way however the
      // columns are split, so the bits do not change.
      const auto misaligned =
          static_cast<int64_t>(reinterpret_cast<uintptr_t>(in) % 64 / sizeof(float));
      const int64_t peel = std::min(n, (kLineFloats - misaligned) % kLineFloats);
      auto run = [&](auto offsets_of) {
        if (peel > 0) product(in, peel, out, dst.plane_stride, e, offsets_of);
        if (peel == n) return;
        Epilogue rest = e;
        if (rest.residual != nullptr) rest.residual += peel;
        product(in + peel, n - peel, out + peel, dst.plane_stride, rest, offsets_of);
      };
      if (src.plane_stride == impl.b_plane) {
        run(packed);
        return;
      }
      // A tile buffer (the depth-wise schedule) with other aligned planes: the kernels' offsets
      // re-mapped, and code generated, once for the first such layout (Impl::tile_layout).
      thread_local std::vector<int64_t> b_rows;
      auto remap = [&](std::vector<std::vector<int32_t>>& offsets) {
        offsets.resize(std::max(offsets.size(), impl.sparse.size()));
        for (std::size_t i = 0, c0 = 0; i < impl.sparse.size(); ++i) {
          const SparseMatrix& block = impl.sparse[i];
          b_rows.resize(static_cast<std::size_t>(block.depth()));
          for (int64_t& offset : b_rows) offset = static_cast<int64_t>(c0++) * src.plane_stride;
          block.offsets_for(b_rows, offsets[i]);
        }
      };
      PackedConv::Impl::TileLayout& kept = impl.tile_layout;
      std::call_once(kept.made, [&] {
        remap(kept.offsets);
        kept.plane_stride = src.plane_stride;
        // A weight with code is one block: b_rows holds its layout.
        if (impl.jit != nullptr) kept.jit = SpmmJit::generate(impl.sparse.front(), b_rows);
      });
      if (kept.plane_stride == src.plane_stride) {
        code = jit ? kept.jit.get() : nullptr;
        run([&](std::size_t i) { return kept.offsets[i].data(); });
        return;
      }
      code = nullptr;
      thread_local std::vector<std::vector<int32_t>> offsets;
      remap(offsets);
      run([&](std::size_t i) { return offsets[i].data(); });
      return;
    }
    // The pixels the output rows read, from the start of planes b_plane apart: gathered with
    // the stride for a strided layer, else a plain copy, made where the input's planes or this
    // region's first pixel are not on a cache line. Read in place, every vector load of B would
    // straddle two lines: ResNet-50's 1x1 layers on 14x14 and 7x7 planes (196 and 49 floats
    // apart) ran 1.2-1.4x faster with the copy and K-blocks than in place in one block (aligned
    // tensors, bench/spmm_bench.cc, one thread, Zen 5, three alternated runs; most of it the
    // alignment: 1.1x of it the blocks, on 1024->256).
    float* planes = aligned_scratch(scratch, g.in_c * impl.b_plane);
    copy_pointwise_pixels(g, src, oh_begin, oh_end, planes, impl.b_plane);
    product(planes, n, out, dst.plane_stride, e, packed);
    return;
  }

  // Phases: the kernel computes phase_w-wide rows into scratch, with the whole epilogue unless
  // there is a residual: that one and the activation after it are applied on the copy out,
  // where the output's own row length applies. Each channel's rows start on a cache line, so
  // that the K-blocks' partial sums are whole lines.
  const int64_t pw = impl.phase_w, halo = phase_halo_rows(g);
  const int64_t in_floats = g.in_c * g.stride_h * g.stride_w * impl.b_plane;
  const int64_t ldo = round_up_to_line(impl.chunk_rows * pw);
  // The output rows follow the planes, and at least two vectors more: the slack a shifted
  // product reads past its last column (SpmmArgs::shifts).
  float* planes =
      aligned_scratch(scratch, in_floats + (oc_end - oc_begin) * ldo + 2 * kSpmmMaxLanes);
  float* out = planes + in_floats;
  Epilogue inner;
  inner.row_bias = impl.bias.data() + oc_begin;
  inner.pre_residual = epilogue.pre_residual;
  inner.clip_min = epilogue.clip_min;
  inner.clip_max = epilogue.clip_max;
  if (residual == nullptr) inner.post_residual = epilogue.post_residual;
  for (int64_t r0 = oh_begin; r0 < oh_end; r0 += impl.chunk_rows) {
    const int64_t rows = std::min(oh_end - r0, impl.chunk_rows);
    fill_phases(g, src, r0, r0 + rows, rows + halo, pw, impl.b_plane, planes);
    const int64_t n = (rows - 1) * pw + g.out_w;
    product(planes, n, out, ldo, inner, packed);
    for (int64_t oc = oc_begin; oc < oc_end; ++oc) {
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t oh = r0 + r;
        const float* res = residual == nullptr ? nullptr
                                               : residual->data + oc * residual->plane_stride +
                                                     (oh - residual->row0) * g.out_w;
        finish_row(out + (oc - oc_begin) * ldo + r * pw, res, g.out_w, epilogue,
                   dst.data + oc * dst.plane_stride + (oh - dst.row0) * g.out_w);
      }
    }
  }
}

}  // namespace

int64_t PackedConv::channel_granule() const {
  if (impl_->is_sparse()) return 1;
  if (impl_->is_gemm() && geometry_.groups == 1) return impl_->groups.front().panel_rows();
  if (impl_->kind == Impl::Kind::kDepthwise) return std::min<int64_t>(geometry_.out_c, 16);
  return geometry_.out_c;
}

namespace {

// The phase planes an implicit GEMM's taps read for output rows [oh_begin, oh_end) (see
// pack_implicit_gemm), in `scratch`: per input channel, one plane per phase of impl.tap_phases,
// each out_w floats a row, from the phase row the highest tap of output row oh_begin reads to the
// one the lowest tap of row oh_end - 1 reads. Only in-image pixels that those output rows read
// are written; the masks keep the kernel off the rest. Returns the address of phase row
// oh_begin of channel 0's first plane (which may lie before the buffer) and its plane size.
const float* fill_tap_phases(const ConvGeometry& g, const PackedConv::Impl& impl,
                             const PlaneView& src, int64_t oh_begin, int64_t oh_end,
                             std::vector<float>& scratch, int64_t* plane_floats) {
  int64_t row_lo = 0, row_hi = 0;
  for (const ConvTap& tap : impl.taps) {
    row_lo = std::min(row_lo, tap.row_shift);
    row_hi = std::max(row_hi, tap.row_shift);
  }
  const int64_t rows = oh_end - oh_begin + row_hi - row_lo;
  const int64_t phases = static_cast<int64_t>(impl.tap_phases.size());
  *plane_floats = round_up_to_line(rows * g.out_w);
  float* planes = aligned_scratch(scratch, g.in_c * phases * *plane_floats);
  int64_t first = 0, last = 0;  // the input rows src holds
  conv_input_rows(g, oh_begin, oh_end, &first, &last);
  for (int64_t c = 0; c < g.in_c; ++c) {
    for (int64_t s = 0; s < phases; ++s) {
      const int64_t a = impl.tap_phases[s] / g.stride_w, b = impl.tap_phases[s] % g.stride_w;
      const int64_t columns = (g.in_w - b + g.stride_w - 1) / g.stride_w;
      float* plane = planes + (c * phases + s) * *plane_floats;
      // Rows [i0, i1) lie inside the image and are read by some tap.
      const int64_t offset = (oh_begin + row_lo) * g.stride_h + a - first;
      int64_t i0 = 0, i1 = 0;
      valid_range(rows, g.stride_h, offset, last - first, &i0, &i1);
      if (i1 > i0) {
        gather_rows(src.data + c * src.plane_stride +
                        (offset + first + i0 * g.stride_h - src.row0) * g.in_w + b,
                    g.stride_h * g.in_w, g.stride_w, i1 - i0, 0, columns, columns,
                    plane + i0 * g.out_w, g.out_w);
      }
    }
  }
  return planes - row_lo * g.out_w;
}

// Output rows [oh_begin, oh_end) x channels [oc_begin, oc_end) of a GEMM lowering (one group, or
// all channels of every group).
// `image_rows` > 0: src is images of that many rows stacked (conv2d_images; the implicit GEMM
// masks its taps per image, ConvTaps::image_rows).
void dense_conv_rows(const ConvGeometry& g, const PackedConv::Impl& impl, const PlaneView& src,
                     const PlaneView& dst, int64_t oh_begin, int64_t oh_end, int64_t oc_begin,
                     int64_t oc_end, const Epilogue& epilogue, const PlaneView* residual,
                     std::vector<float>& scratch, int64_t image_rows = 0) {
  const int64_t ic_per_group = g.in_c / g.groups;
  const int64_t oc_per_group = g.out_c / g.groups;
  // The rows of each group's weights this call computes: all of them with several groups.
  const int64_t part_begin = g.groups == 1 ? oc_begin : 0;
  const int64_t part_end = g.groups == 1 ? oc_end : oc_per_group;
  // Output rows from r0 of group `group`: its part of the weights, the epilogue and C of that
  // region, for `product` to pass to the GEMM.
  auto gemm_rows = [&](int64_t group, int64_t r0, auto product) {
    const int64_t oc0 = group * oc_per_group + part_begin;
    Epilogue e = epilogue;
    e.row_bias = impl.bias.data() + oc0;
    e.col_bias = nullptr;
    e.residual = nullptr;
    if (residual != nullptr) {
      e.residual = residual->data + oc0 * residual->plane_stride + (r0 - residual->row0) * g.out_w;
      e.residual_ld = residual->plane_stride;
    }
    product(impl.groups[static_cast<std::size_t>(group)].row_range(part_begin, part_end), e,
            dst.data + oc0 * dst.plane_stride + (r0 - dst.row0) * g.out_w);
  };

  if (impl.kind == PackedConv::Impl::Kind::kImplicitGemm) {
    ConvTaps taps;
    taps.channels = g.in_c;
    taps.block_channels = impl.tap_block_channels;
    taps.width = g.out_w;
    taps.first_row = oh_begin;
    taps.image_rows = image_rows;
    taps.taps = impl.taps;
    if (impl.tap_phases.empty()) {
      taps.data = src.data + (oh_begin - src.row0) * g.in_w;
      taps.channel_stride = src.plane_stride;
    } else {
      taps.data = fill_tap_phases(g, impl, src, oh_begin, oh_end, scratch, &taps.phase_stride);
      taps.channel_stride = taps.phase_stride * static_cast<int64_t>(impl.tap_phases.size());
    }
    gemm_rows(0, oh_begin, [&](const PackedA& a, const Epilogue& e, float* c) {
      gemm_packed_taps(a, taps, c, dst.plane_stride, (oh_end - oh_begin) * g.out_w, e);
    });
    return;
  }
  if (impl.kind == PackedConv::Impl::Kind::kGemm1x1 ||
      impl.kind == PackedConv::Impl::Kind::kGemmGathered1x1) {
    // A strided layer's B: the pixels it reads gathered into planes of their own, so that it runs
    // the stride-1 product. The implicit GEMM over its one stride phase (the same copy, then one
    // tap per block of channels through C) ran ResNet-50's downsample layers 1.5-1.7x slower
    // (bench/spmm_bench.cc, dense, one thread, Zen 3).
    const int64_t n = (oh_end - oh_begin) * g.out_w;
    const float* in = src.data + (oh_begin - src.row0) * g.in_w;
    int64_t plane = src.plane_stride;
    if (impl.kind == PackedConv::Impl::Kind::kGemmGathered1x1) {
      plane = round_up_to_line(n);
      float* planes = aligned_scratch(scratch, g.in_c * plane);
      copy_pointwise_pixels(g, src, oh_begin, oh_end, planes, plane);
      in = planes;
    }
    for (int64_t group = 0; group < g.groups; ++group) {
      gemm_rows(group, oh_begin, [&](const PackedA& a, const Epilogue& e, float* c) {
        gemm_packed(a, in + group * ic_per_group * plane, plane, c, dst.plane_stride, n, e);
      });
    }
    return;
  }

  if (impl.kind == PackedConv::Impl::Kind::kPhaseGemm) {
    // One GEMM per output row, straight into dst with the whole epilogue: a chunk's phase rows
    // are phase_w = out_w + reach apart, so one GEMM over the chunk computed phase_w-wide rows
    // into scratch, and copying out_w of each into dst was a quarter of MobileNetV2's stem
    // (perf, one thread, 16 images); the micro-kernel's early C prefetch hides dst's misses,
    // the copy could not. Against the chunk-wide GEMM and copy (bench/conv_bench.cc, one
    // thread, Zen 5, 16 images, two runs each): MobileNetV2's stem 1.22-1.33x, ResNet-50's 1.14x,
    // small_cnn's 1.08x.
    const int64_t pw = impl.phase_w, halo = phase_halo_rows(g);
    const int64_t planes = g.in_c * g.stride_h * g.stride_w;
    float* phases = aligned_scratch(scratch, planes * impl.b_plane);
    for (int64_t r0 = oh_begin; r0 < oh_end; r0 += impl.chunk_rows) {
      const int64_t rows = std::min(oh_end - r0, impl.chunk_rows);
      fill_phases(g, src, r0, r0 + rows, rows + halo, pw, impl.b_plane, phases);
      for (int64_t group = 0; group < g.groups; ++group) {
        gemm_rows(group, r0, [&](const PackedA& a, const Epilogue& e, float* c) {
          const float* b = phases + group * (planes / g.groups) * impl.b_plane;
          Epilogue row_e = e;
          for (int64_t r = 0; r < rows; ++r) {
            if (e.residual != nullptr) row_e.residual = e.residual + r * g.out_w;
            gemm_packed_row_offsets(a, b + r * pw, impl.row_offsets, c + r * g.out_w,
                                    dst.plane_stride, g.out_w, row_e);
          }
        });
      }
    }
    return;
  }

  // im2col writes the column matrix straight into the GEMM's packed strips (gemm.h,
  // pack_b_strip_rows), a few of its rows at a time through a small block that stays in L1,
  // instead of as a plain matrix the GEMM would copy into strips again: on ResNet-50's 3x3
  // layer at 56x56 that copy and im2col's own were a quarter of the time (perf, one thread).
  const Isa isa = impl.groups.front().isa();
  const int64_t taps = g.kernel_h * g.kernel_w;
  const int64_t depth = ic_per_group * taps;
  const int64_t chunk = im2col_chunk_rows(g, isa);
  const int64_t nr = gemm_strip_width(isa);
  // Channels per block: at least 16 rows of the column matrix per packing call.
  const int64_t block_c = std::min(ic_per_group, (16 + taps - 1) / taps);
  const int64_t max_n = std::min(chunk, oh_end - oh_begin) * g.out_w;
  const int64_t strip_floats = depth * ((max_n + nr - 1) / nr) * nr;
  float* strips = aligned_scratch(scratch, strip_floats + block_c * taps * max_n);
  float* block = strips + strip_floats;
  for (int64_t r0 = oh_begin; r0 < oh_end; r0 += chunk) {
    const int64_t r1 = std::min(oh_end, r0 + chunk);
    const int64_t n = (r1 - r0) * g.out_w;
    for (int64_t group = 0; group < g.groups; ++group) {
      for (int64_t c0 = 0; c0 < ic_per_group; c0 += block_c) {
        const int64_t channels = std::min(block_c, ic_per_group - c0);
        im2col(g, src, group * ic_per_group + c0, channels, r0, r1, block, n);
        pack_b_strip_rows(block, n, channels * taps, n, c0 * taps, depth, strips, isa);
      }
      gemm_rows(group, r0, [&](const PackedA& a, const Epilogue& e, float* c) {
        gemm_packed_strips(a, strips, c, dst.plane_stride, n, e);
      });
    }
  }
}

// conv2d_images: the floats of stacked output per chunk of output channels (1 MiB; the
// residual's stack as much again). Every chunk streams the input's stack again, so chunks are
// few: ResNet-50's 2048-deep 7x7 layer ran 0.8x in chunks of 128 KiB.
constexpr int64_t kStackChunkFloats = 256 * 1024;

void check_channel_range(const char* caller, const PackedConv& conv, int64_t oc_begin,
                         int64_t oc_end) {
  kernels::check_channel_range(caller, oc_begin, oc_end, conv.geometry().out_c,
                               conv.channel_granule(), conv.implementation());
}

}  // namespace

void check_channel_range(const char* caller, int64_t oc_begin, int64_t oc_end, int64_t out_c,
                         int64_t granule, const std::string& implementation) {
  if (oc_begin < 0 || oc_end > out_c || oc_begin > oc_end || oc_begin % granule != 0 ||
      (oc_end % granule != 0 && oc_end != out_c)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: output channels [{}, {}) of {} with {}, which takes ranges in "
                            "steps of {}",
                            caller, oc_begin, oc_end, out_c, implementation, granule));
  }
}

void conv2d_region(const PackedConv& conv, const PlaneView& src, const PlaneView& dst,
                   int64_t oh_begin, int64_t oh_end, int64_t oc_begin, int64_t oc_end,
                   const Epilogue& epilogue, const PlaneView* residual,
                   std::vector<float>& scratch) {
  const ConvGeometry& g = conv.geometry();
  const PackedConv::Impl& impl = *conv.impl();
  check_channel_range("conv2d_region", conv, oc_begin, oc_end);
  if (oh_begin >= oh_end || oc_begin >= oc_end) return;
  if (!impl.input_halves.empty()) {
    // The halves' sums in a buffer of their own (the halves' products use `scratch`), planes of
    // the region's pixels.
    thread_local std::vector<float> sums;
    const int64_t n = (oh_end - oh_begin) * g.out_w;
    sums.resize(static_cast<std::size_t>(2 * g.out_c * n));
    const PlaneView sums0{sums.data(), oh_begin, n}, sums1{sums.data() + g.out_c * n, oh_begin, n};
    conv2d_input_half(conv, 0, src, sums0, oh_begin, oh_end, oc_begin, oc_end, scratch);
    conv2d_input_half(conv, 1, src, sums1, oh_begin, oh_end, oc_begin, oc_end, scratch);
    add_input_halves(conv, sums0, sums1, dst, oh_begin, oh_end, oc_begin, oc_end, epilogue,
                     residual);
    return;
  }
  if (impl.is_sparse()) {
    sparse_conv_rows(g, impl, src, dst, oh_begin, oh_end, oc_begin, oc_end, epilogue, residual,
                     scratch);
  } else if (impl.kind == PackedConv::Impl::Kind::kDepthwise) {
    // Channels are independent: the range is a depthwise convolution of its own on shifted views.
    ConvGeometry part = g;
    part.in_c = part.out_c = part.groups = oc_end - oc_begin;
    const PlaneView part_residual =
        residual != nullptr ? from_channel(*residual, oc_begin) : PlaneView{};
    dwconv2d_rows(part, impl.weight.data() + oc_begin * g.kernel_h * g.kernel_w,
                  impl.bias.data() + oc_begin, from_channel(src, oc_begin),
                  from_channel(dst, oc_begin), oh_begin, oh_end, epilogue,
                  residual != nullptr ? &part_residual : nullptr, scratch);
  } else {
    dense_conv_rows(g, impl, src, dst, oh_begin, oh_end, oc_begin, oc_end, epilogue, residual,
                    scratch);
  }
}

bool stacks_images(const ConvGeometry& g, bool sparse) {
  // Input rows exactly stride_h per output row: image i's rows start at row i * out_h of the
  // output's stack and of every stride phase of the input's, so that each tap is one shift of
  // the stacked pixel index.
  if (g.groups != 1 || is_depthwise(g) || g.in_h != g.out_h * g.stride_h ||
      g.out_h * g.out_w > kStackedPlanePixels) {
    return false;
  }
  if (sparse) return is_pointwise(g);  // kSpmm1x1
  return is_pointwise(g) || gathers_strided_pointwise(g) || reads_taps_in_place(g) ||
         reads_tap_phases(g);
}

bool PackedConv::may_overwrite_residual() const {
  switch (impl_->kind) {
    case Impl::Kind::kSpmm1x1:
    case Impl::Kind::kSpmmGathered1x1:
      // The product and its epilogue in one pass into dst; by halves, the sums into scratch and
      // then one pass (add_input_halves).
      return impl_->sparse.size() == 1 || !impl_->input_halves.empty();
    case Impl::Kind::kSpmmPhases:
      return true;  // products into scratch, then finish_row adds the residual element-wise
    case Impl::Kind::kGemm1x1:
    case Impl::Kind::kGemmGathered1x1:
      return gemm_packed_writes_c_once(geometry_.in_c / geometry_.groups,
                                       impl_->groups.front().isa());
    default:  // tap blocks, im2col chunks and depthwise rows: not established, so not claimed
      return false;
  }
}

bool PackedConv::stacks_images() const {
  return kernels::stacks_images(geometry_, impl_->is_sparse());
}

int64_t PackedConv::input_split() const { return impl_->input_split; }

void conv2d_input_half(const PackedConv& conv, int half, const PlaneView& src,
                       const PlaneView& sums, int64_t oh_begin, int64_t oh_end, int64_t oc_begin,
                       int64_t oc_end, std::vector<float>& scratch) {
  const PackedConv::Impl& impl = *conv.impl();
  if (impl.input_halves.empty() || half < 0 || half > 1) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("conv2d_input_half: half {} of {}, which {}", half, conv.implementation(),
                    impl.input_halves.empty() ? "sums its input in one piece" : "has two"));
  }
  conv2d_region(impl.input_halves[static_cast<std::size_t>(half)],
                half == 0 ? src : from_channel(src, impl.input_split), sums, oh_begin, oh_end,
                oc_begin, oc_end, Epilogue{}, nullptr, scratch);
}

namespace {

// The bounds that make an activation one clamp (Relu, Clip; none: no bounds), or nullopt (Gelu).
std::optional<std::pair<float, float>> clamp_bounds(Activation act, const Epilogue& e) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  switch (act) {
    case Activation::kNone:
      return std::pair{-kInf, kInf};
    case Activation::kRelu:
      return std::pair{0.0f, kInf};
    case Activation::kClip:
      return std::pair{e.clip_min, e.clip_max};
    default:
      return std::nullopt;
  }
}

}  // namespace

void add_input_halves(const PackedConv& conv, const PlaneView& sums0, const PlaneView& sums1,
                      const PlaneView& dst, int64_t oh_begin, int64_t oh_end, int64_t oc_begin,
                      int64_t oc_end, const Epilogue& epilogue, const PlaneView* residual) {
  const ConvGeometry& g = conv.geometry();
  const PackedConv::Impl& impl = *conv.impl();
  if (impl.input_halves.empty()) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("add_input_halves: {} sums its input in one piece", conv.implementation()));
  }
  check_channel_range("add_input_halves", conv, oc_begin, oc_end);
  const auto pre = clamp_bounds(epilogue.pre_residual, epilogue);
  const auto post = clamp_bounds(epilogue.post_residual, epilogue);
  const int64_t n = (oh_end - oh_begin) * g.out_w;  // the region's run of pixels in each plane
  auto at = [&](const PlaneView& v, int64_t c) {
    return v.data + c * v.plane_stride + (oh_begin - v.row0) * g.out_w;
  };
  for (int64_t c = oc_begin; c < oc_end; ++c) {
    const float* a = at(sums0, c);
    const float* b = at(sums1, c);
    const float* res = residual != nullptr ? at(*residual, c) : nullptr;
    float* out = at(dst, c);
    const float bias = impl.bias[static_cast<std::size_t>(c)];
    if (pre && post) {
      // Relu and Clip as one clamp (max, then min), in loops that vectorize (a call per element
      // to apply_activation would cost more than the sums); each residual element is read
      // before its output is written (dst may be the residual).
      const float lo = pre->first, hi = pre->second, lo2 = post->first, hi2 = post->second;
      if (res != nullptr) {
        for (int64_t i = 0; i < n; ++i) {
          const float v = std::min(std::max(a[i] + b[i] + bias, lo), hi) + res[i];
          out[i] = std::min(std::max(v, lo2), hi2);
        }
      } else {
        for (int64_t i = 0; i < n; ++i) {
          out[i] = std::min(std::max(std::min(std::max(a[i] + b[i] + bias, lo), hi), lo2), hi2);
        }
      }
      continue;
    }
    for (int64_t i = 0; i < n; ++i) {
      float v = apply_activation(epilogue.pre_residual, a[i] + b[i] + bias, epilogue.clip_min,
                                 epilogue.clip_max);
      if (res != nullptr) v += res[i];
      out[i] = apply_activation(epilogue.post_residual, v, epilogue.clip_min, epilogue.clip_max);
    }
  }
}

void conv2d_images(const PackedConv& conv, const float* src, float* dst, int64_t images,
                   int64_t oc_begin, int64_t oc_end, const Epilogue& epilogue,
                   const float* residual, std::vector<float>& scratch) {
  const ConvGeometry& g = conv.geometry();
  const int64_t in_plane = g.in_h * g.in_w, out_plane = g.out_h * g.out_w;
  const int64_t in_image = g.in_c * in_plane, out_image = g.out_c * out_plane;
  check_channel_range("conv2d_images", conv, oc_begin, oc_end);
  if (images <= 0 || oc_begin >= oc_end) return;
  if (!conv.stacks_images() || images == 1) {
    for (int64_t i = 0; i < images; ++i) {
      const PlaneView res{
          residual != nullptr ? const_cast<float*>(residual) + i * out_image : nullptr, 0,
          out_plane};
      conv2d_region(conv, {const_cast<float*>(src) + i * in_image, 0, in_plane},
                    {dst + i * out_image, 0, out_plane}, 0, g.out_h, oc_begin, oc_end, epilogue,
                    residual != nullptr ? &res : nullptr, scratch);
    }
    return;
  }
  // The stack lives beside the kernel's own scratch, its planes on cache lines (the sparse 1x1
  // kernel reads aligned planes in place).
  thread_local std::vector<float> stack;
  float* in = aligned_scratch(stack, g.in_c * stacked_plane_floats(g, images));
  stack_channels(g, src, images, 0, g.in_c, in);
  conv2d_stacked(conv, in, dst, images, oc_begin, oc_end, epilogue, residual, scratch);
}

namespace {

// Planes [c0, c1) of `images` images (image_floats apart, planes `plane` floats) one after another
// per plane, the planes of the result `stride` floats apart from plane c0 on.
void stack_planes(const float* from, int64_t image_floats, int64_t plane, int64_t images,
                  int64_t c0, int64_t c1, float* to, int64_t stride) {
  for (int64_t c = c0; c < c1; ++c) {
    for (int64_t i = 0; i < images; ++i) {
      std::memcpy(to + (c - c0) * stride + i * plane, from + i * image_floats + c * plane,
                  static_cast<std::size_t>(plane) * sizeof(float));
    }
  }
}

}  // namespace

int64_t stacked_plane_floats(const ConvGeometry& g, int64_t images) {
  return round_up_to_line(images * g.in_h * g.in_w);
}

void stack_channels(const ConvGeometry& g, const float* src, int64_t images, int64_t c_begin,
                    int64_t c_end, float* stack) {
  const int64_t stride = stacked_plane_floats(g, images);
  stack_planes(src, g.in_c * g.in_h * g.in_w, g.in_h * g.in_w, images, c_begin, c_end,
               stack + c_begin * stride, stride);
}

void conv2d_stacked(const PackedConv& conv, const float* stack, float* dst, int64_t images,
                    int64_t oc_begin, int64_t oc_end, const Epilogue& epilogue,
                    const float* residual, std::vector<float>& scratch) {
  const ConvGeometry& g = conv.geometry();
  check_channel_range("conv2d_stacked", conv, oc_begin, oc_end);
  if (!conv.stacks_images()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("conv2d_stacked: {} does not stack images", conv.implementation()));
  }
  if (images <= 0 || oc_begin >= oc_end) return;
  const int64_t out_plane = g.out_h * g.out_w, out_image = g.out_c * out_plane;
  const int64_t in_stride = stacked_plane_floats(g, images);
  // Output channels run in chunks of kStackChunkFloats of stacked output (and as much of stacked
  // residual), copied out after each.
  const int64_t out_stride = round_up_to_line(images * out_plane);
  const int64_t granule = conv.channel_granule();
  const int64_t chunk = std::max(granule, kStackChunkFloats / out_stride / granule * granule);
  const int64_t chunk_floats = std::min(chunk, oc_end - oc_begin) * out_stride;
  thread_local std::vector<float> chunks;
  float* out = aligned_scratch(chunks, 2 * chunk_floats);
  float* res = out + chunk_floats;
  ConvGeometry tall = g;
  tall.in_h = images * g.in_h;
  tall.out_h = images * g.out_h;
  const PackedConv::Impl& impl = *conv.impl();
  for (int64_t c0 = oc_begin; c0 < oc_end; c0 += chunk) {
    const int64_t c1 = std::min(oc_end, c0 + chunk);
    // Views whose channel c0 is the chunk's first plane.
    const PlaneView stacked_dst{out - c0 * out_stride, 0, out_stride};
    const PlaneView stacked_res{res - c0 * out_stride, 0, out_stride};
    if (residual != nullptr) {
      stack_planes(residual, out_image, out_plane, images, c0, c1, res, out_stride);
    }
    const PlaneView* r = residual != nullptr ? &stacked_res : nullptr;
    const PlaneView in{const_cast<float*>(stack), 0, in_stride};
    if (impl.is_sparse()) {
      sparse_conv_rows(tall, impl, in, stacked_dst, 0, tall.out_h, c0, c1, epilogue, r, scratch);
    } else {
      dense_conv_rows(tall, impl, in, stacked_dst, 0, tall.out_h, c0, c1, epilogue, r, scratch,
                      g.out_h);
    }
    for (int64_t oc = c0; oc < c1; ++oc) {
      for (int64_t i = 0; i < images; ++i) {
        std::memcpy(dst + i * out_image + oc * out_plane,
                    out + (oc - c0) * out_stride + i * out_plane,
                    static_cast<std::size_t>(out_plane) * sizeof(float));
      }
    }
  }
}

void conv2d_rows(const PackedConv& conv, const PlaneView& src, const PlaneView& dst,
                 int64_t oh_begin, int64_t oh_end, const Epilogue& epilogue,
                 const PlaneView* residual, std::vector<float>& scratch) {
  conv2d_region(conv, src, dst, oh_begin, oh_end, 0, conv.geometry().out_c, epilogue, residual,
                scratch);
}

}  // namespace sparsecol::kernels
