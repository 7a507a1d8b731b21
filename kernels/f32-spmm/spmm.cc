// Packing of sparse weights, kernel selection, the reference kernel and the linear-layer driver.
// See spmm.h.
#include "f32-spmm/spmm.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "f32-eltwise/eltwise.h"
#include "f32-gemm/gemm.h"
#include "scratch.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol::kernels {
namespace {

constexpr SpmmUkernel kUkernels[] = {
#define SPARSECOL_SPMM_ENTRY(name, isa, tile) {#name, isa, tile, &name},
    SPARSECOL_F32_SPMM_UKERNELS(SPARSECOL_SPMM_ENTRY)
#undef SPARSECOL_SPMM_ENTRY
};

[[noreturn]] void invalid(const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, message);
}

int32_t checked_offset(int64_t offset) {
  if (offset < 0 || offset > std::numeric_limits<int32_t>::max()) {
    invalid(
        fmt::format("SparseMatrix: B offset {} does not fit the kernels' 32-bit offsets", offset));
  }
  return static_cast<int32_t>(offset);
}

}  // namespace

SparseMatrix::SparseMatrix(const float* a, int64_t rows, int64_t depth, int64_t row_stride,
                           int64_t col_stride, int64_t groups,
                           std::span<const int64_t> b_row_offsets, int64_t lanes)
    : rows_(rows), depth_(depth), groups_(groups) {
  if (rows < 0 || depth < 0 || groups <= 0 || rows % groups != 0 || lanes <= 0 ||
      static_cast<int64_t>(b_row_offsets.size()) != groups * depth) {
    invalid(fmt::format(
        "SparseMatrix: {} rows x {} columns in {} groups with {} B row offsets, lanes {}", rows,
        depth, groups, b_row_offsets.size(), lanes));
  }
  if (rows * depth > std::numeric_limits<int32_t>::max()) {
    invalid(fmt::format("SparseMatrix: {} x {} elements exceed 32-bit positions", rows, depth));
  }
  for (const int64_t offset : b_row_offsets) {
    shifts_ = std::max(shifts_, checked_offset(offset) % lanes + 1);
  }
  if (shifts_ > kMaxSpmmShifts) {
    invalid(fmt::format("SparseMatrix: a B row offset {} lanes past a vector (at most {})",
                        shifts_ - 1, kMaxSpmmShifts - 1));
  }
  const int64_t rows_per_group = rows / std::max<int64_t>(groups, 1);
  row_ptr_.reserve(static_cast<std::size_t>(rows * shifts_ + 1));
  row_ptr_.push_back(0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t group = r / rows_per_group;
    for (int64_t shift = 0; shift < shifts_; ++shift) {
      for (int64_t k = 0; k < depth; ++k) {
        const float w = a[r * row_stride + k * col_stride];
        if (w == 0.0f) continue;  // -0.0f too: an exact zero contributes nothing
        const int64_t b_row = group * depth + k;
        const int64_t offset = b_row_offsets[static_cast<std::size_t>(b_row)];
        if (offset % lanes != shift) continue;
        values_.push_back(w);
        b_rows_.push_back(static_cast<int32_t>(b_row));
        offsets_.push_back(checked_offset(offset - shift));
      }
      row_ptr_.push_back(static_cast<int32_t>(values_.size()));
    }
  }
}

double SparseMatrix::sparsity() const {
  const int64_t total = rows_ * depth_;
  return total == 0 ? 1.0 : 1.0 - static_cast<double>(nnz()) / static_cast<double>(total);
}

int64_t SparseMatrix::packed_bytes() const {
  return static_cast<int64_t>(values_.size() * sizeof(float) + offsets_.size() * sizeof(int32_t) +
                              row_ptr_.size() * sizeof(int32_t));
}

void SparseMatrix::offsets_for(std::span<const int64_t> b_row_offsets,
                               std::vector<int32_t>& out) const {
  if (shifts_ > 1) invalid("SparseMatrix::offsets_for: the matrix is packed shifted");
  if (static_cast<int64_t>(b_row_offsets.size()) != groups_ * depth_) {
    invalid(fmt::format("SparseMatrix::offsets_for: {} B row offsets for {} B rows",
                        b_row_offsets.size(), groups_ * depth_));
  }
  out.resize(b_rows_.size());
  for (std::size_t i = 0; i < b_rows_.size(); ++i) {
    out[i] = checked_offset(b_row_offsets[static_cast<std::size_t>(b_rows_[i])]);
  }
}

double zero_fraction(const float* w, int64_t count) {
  if (count <= 0) return 1.0;
  int64_t zeros = 0;
  for (int64_t i = 0; i < count; ++i) zeros += w[i] == 0.0f ? 1 : 0;
  return static_cast<double>(zeros) / static_cast<double>(count);
}

double resolve_sparse_threshold(double option, SparseLayerKind kind) {
  if (option >= 0.0) return option;
  return kind == SparseLayerKind::kConv ? kConvSparseThreshold : kLinearSparseThreshold;
}

std::span<const SpmmUkernel> spmm_ukernels() { return kUkernels; }

const SpmmUkernel& default_spmm_ukernel(Isa isa) {
  for (const SpmmUkernel& u : kUkernels) {
    if (u.isa == isa) return u;
  }
  return default_spmm_ukernel(Isa::kPortable);  // the list always has a portable kernel
}

void require_spmm_isa(Isa isa) {
  if (!isa_available(isa)) {
    invalid(fmt::format("spmm: ISA {} requested but not available here ({})", to_string(isa),
                        isa_reason()));
  }
}

void f32_spmm__reference(const SpmmArgs& args) {
  const Epilogue* e = args.epilogue;
  for (int64_t row = 0; row < args.rows; ++row) {
    for (int64_t col = 0; col < args.n; ++col) {
      double sum = args.accumulate ? static_cast<double>(args.dst[row * args.ldd + col]) : 0.0;
      const int32_t* groups = args.row_ptr + row * args.shifts;
      for (int64_t shift = 0; shift < args.shifts; ++shift) {
        for (int32_t j = groups[shift]; j < groups[shift + 1]; ++j) {
          sum +=
              static_cast<double>(args.values[j]) *
              static_cast<double>(args.src[(args.offsets[j] >> args.offset_shift) + shift + col]);
        }
      }
      float x = static_cast<float>(sum);
      if (e != nullptr) {
        if (e->row_bias != nullptr) x += e->row_bias[row];
        if (e->col_bias != nullptr) x += e->col_bias[col];
        x = apply_activation(e->pre_residual, x, e->clip_min, e->clip_max);
        if (e->residual != nullptr) x += e->residual[row * e->residual_ld + col];
        x = apply_activation(e->post_residual, x, e->clip_min, e->clip_max);
      }
      args.dst[row * args.ldd + col] = x;
    }
  }
}

namespace {

// The arguments of a product over rows [row_begin, row_end) (see spmm).
SpmmArgs spmm_args(const SparseMatrix& a, const int32_t* offsets, int64_t row_begin,
                   int64_t row_end, const float* src, int64_t n, float* dst, int64_t ldd,
                   const Epilogue& epilogue, bool accumulate) {
  if (row_begin < 0 || row_end > a.rows() || row_begin > row_end) {
    invalid(fmt::format("spmm: rows [{}, {}) of a {}-row matrix", row_begin, row_end, a.rows()));
  }
  SpmmArgs args;
  args.rows = row_end - row_begin;
  args.n = n;
  args.row_ptr = a.row_ptr() + row_begin * a.shifts();
  args.shifts = a.shifts();
  args.values = a.values();
  args.offsets = offsets;
  args.src = src;
  args.dst = dst;
  args.ldd = ldd;
  args.epilogue = &epilogue;
  args.accumulate = accumulate;
  return args;
}

}  // namespace

void spmm(const SparseMatrix& a, const int32_t* offsets, int64_t row_begin, int64_t row_end,
          const float* src, int64_t n, float* dst, int64_t ldd, const Epilogue& epilogue, Isa isa,
          bool accumulate) {
  const SpmmArgs args =
      spmm_args(a, offsets, row_begin, row_end, src, n, dst, ldd, epilogue, accumulate);
  if (args.rows == 0 || n <= 0) return;
  default_spmm_ukernel(std::min(isa, active_isa())).fn(args);
}

// ---- Linear layers ----

namespace {

std::vector<int64_t> token_block_offsets(int64_t k) {
  std::vector<int64_t> offsets(static_cast<std::size_t>(std::max<int64_t>(k, 0)));
  for (int64_t i = 0; i < k; ++i) offsets[static_cast<std::size_t>(i)] = i * kSpmmTokenBlock;
  return offsets;
}

}  // namespace

SparseLinear::SparseLinear(const float* w, int64_t k, int64_t n, int64_t k_stride, int64_t n_stride,
                           int64_t depth_block)
    : depth_(k), features_(n) {
  if (k < 0 || n < 0 || depth_block <= 0) {
    invalid(fmt::format("SparseLinear: K {} x N {} in blocks of {}", k, n, depth_block));
  }
  const int64_t blocks = std::max<int64_t>(1, (k + depth_block - 1) / depth_block);
  block_depth_ = std::max<int64_t>(1, (k + blocks - 1) / blocks);
  for (int64_t k0 = 0; k0 < k || (k == 0 && blocks_.empty()); k0 += block_depth_) {
    const int64_t depth = std::min(block_depth_, k - k0);
    blocks_.emplace_back(w + k0 * k_stride, n, depth, n_stride, k_stride, 1,
                         token_block_offsets(depth));
  }
}

int64_t SparseLinear::nnz() const {
  int64_t total = 0;
  for (const SparseMatrix& b : blocks_) total += b.nnz();
  return total;
}

int64_t SparseLinear::packed_bytes() const {
  int64_t total = 0;
  for (const SparseMatrix& b : blocks_) total += b.packed_bytes();
  return total;
}

// Y^T is computed kFeatureChunk features at a time, so that the chunk (64 KiB) is still in L2
// when it is transposed out: a whole block of BERT's 3072-feature layer (768 KiB) was not.
constexpr int64_t kFeatureChunk = 256;

std::string describe(LinearLayouts layouts) {
  const bool x = layouts.x == TokenLayout::kFeatureBlocks;
  const bool y = layouts.y == TokenLayout::kFeatureBlocks;
  if (!x && !y) return "";
  return fmt::format(" ({} in feature blocks)", x && y ? "input and output"
                                                : x    ? "input"
                                                       : "output");
}

int64_t sparse_linear_scratch_floats(int64_t depth) {
  return (depth + kFeatureChunk) * kSpmmTokenBlock;
}

void sparse_linear(const SparseLinear& w, const float* x, int64_t ldx, int64_t tokens,
                   int64_t feature_begin, int64_t feature_end, float* y, int64_t ldy,
                   const Epilogue& epilogue, std::vector<float>& scratch, Isa isa,
                   LinearLayouts layouts, bool one_token_tensor) {
  if (epilogue.row_bias != nullptr) invalid("sparse_linear: the epilogue has a row bias");
  if (feature_begin < 0 || feature_end > w.features() || feature_begin > feature_end) {
    invalid(fmt::format("sparse_linear: features [{}, {}) of {}", feature_begin, feature_end,
                        w.features()));
  }
  const bool x_blocks = layouts.x == TokenLayout::kFeatureBlocks;
  const bool y_blocks = layouts.y == TokenLayout::kFeatureBlocks;
  if (y_blocks && (epilogue.residual != nullptr || epilogue.post_residual != Activation::kNone)) {
    invalid("sparse_linear: a residual or an activation after it on an output in feature blocks");
  }
  const int64_t features = feature_end - feature_begin, k = w.depth();
  if (tokens <= 0 || features == 0) return;
  const std::size_t xt_size = static_cast<std::size_t>(k * kSpmmTokenBlock);
  // X^T's rows are kSpmmTokenBlock floats, whole cache lines, so from an aligned start no vector
  // load of B straddles two lines: BERT-base's linear layers at 90% and 95% ran 1.0-1.5x faster
  // than from malloc's 16-byte alignment (bench/spmm_bench.cc, one thread, Zen 5).
  float* xt = aligned_scratch(scratch, sparse_linear_scratch_floats(k));
  float* yt = xt + xt_size;
  // The kernel applies the feature bias (a row bias of Y^T) and the activation before the
  // residual, with the last K block; the residual and the activation after it are applied after
  // transposing back, where the residual is read in its own (token-major) layout.
  const Epilogue none;
  Epilogue inner;
  inner.pre_residual = epilogue.pre_residual;
  inner.clip_min = epilogue.clip_min;
  inner.clip_max = epilogue.clip_max;
  const std::vector<SparseMatrix>& blocks = w.blocks();
  const SpmmUkernel& ukernel = default_spmm_ukernel(std::min(isa, active_isa()));
  for (int64_t t0 = 0; t0 < tokens; t0 += kSpmmTokenBlock) {
    const int64_t block = std::min(kSpmmTokenBlock, tokens - t0);
    // In feature blocks X^T and Y^T are copied whole, not read and written in place: the kernel
    // visits a block's rows in the order of the non-zeros, and from the 12 MiB tensor (BERT's
    // FFN at batch 8) that ran 0.93x of the transposing version (2 threads, Zen 3), against
    // 1.04x with the copies (10 interleaved pairs, docs/BENCHMARKS.md).
    const float* xb = x + token_feature_offset(layouts.x, t0, 0, ldx);
    // A tensor of one token (a CNN's classifier at batch 1), token-major: each output sums its
    // non-zeros in a vector of partial sums, gathering their inputs straight from the token's row
    // (SpmmArgs::reassociate, offset_shift), instead of a chain of FMAs on vectors of which one
    // lane counts, each waiting on the last. Its bits then depend on the K blocks, and differ
    // from what a call on more tokens gives that token: hence only where the whole tensor is
    // one token (a depth-wise tile of one token of a sequence must give layer by layer's bits).
    // MobileNetV2's classifier (1280 -> 1000) at 80/90/95%: 196 -> 119, 98.5 -> 76.6, 59.7 ->
    // 53.7 us; ResNet-50's (2048 -> 1000) 1.68x, 1.36x, 1.11x (bench/spmm_bench.cc, one thread,
    // Zen 4, two rounds).
    const bool one_token = one_token_tensor && tokens == 1 && !x_blocks;
    if (x_blocks) {
      std::memcpy(xt, xb, static_cast<std::size_t>(k * kSpmmTokenBlock) * sizeof(float));
    } else if (!one_token) {
      transpose_2d(xb, ldx, block, k, xt, kSpmmTokenBlock);
    }
    for (int64_t f0 = 0; f0 < features; f0 += kFeatureChunk) {
      const int64_t chunk = std::min(kFeatureChunk, features - f0);
      inner.row_bias = epilogue.col_bias != nullptr ? epilogue.col_bias + f0 : nullptr;
      float* out = y + token_feature_offset(layouts.y, t0, f0, ldy);
      for (std::size_t b = 0; b < blocks.size(); ++b) {
        const SparseMatrix& wt = blocks[b];
        const bool last = b + 1 == blocks.size();
        const int64_t k0 = static_cast<int64_t>(b) * w.block_depth();
        SpmmArgs args = spmm_args(wt, wt.offsets(), feature_begin + f0, feature_begin + f0 + chunk,
                                  one_token ? xb + k0 : xt + k0 * kSpmmTokenBlock, block, yt,
                                  kSpmmTokenBlock, last ? inner : none, /*accumulate=*/b > 0);
        static_assert(std::has_single_bit(static_cast<uint64_t>(kSpmmTokenBlock)));
        args.reassociate = one_token;
        args.offset_shift =
            one_token ? std::countr_zero(static_cast<uint64_t>(kSpmmTokenBlock)) : 0;
        ukernel.fn(args);
      }
      if (y_blocks) {
        std::memcpy(out, yt, static_cast<std::size_t>(chunk * kSpmmTokenBlock) * sizeof(float));
        continue;
      }
      transpose_2d(yt, kSpmmTokenBlock, chunk, block, out, ldy);
      if (epilogue.residual == nullptr && epilogue.post_residual == Activation::kNone) continue;
      // The add and the activation in separate passes, so that the add vectorizes (a call to
      // apply_activation per element was most of this loop's cost).
      for (int64_t t = 0; t < block; ++t) {
        float* row = out + t * ldy;
        if (epilogue.residual != nullptr) {
          const float* res = epilogue.residual + (t0 + t) * epilogue.residual_ld + f0;
          for (int64_t f = 0; f < chunk; ++f) row[f] += res[f];
        }
        if (epilogue.post_residual == Activation::kNone) continue;
        for (int64_t f = 0; f < chunk; ++f) {
          row[f] = apply_activation(epilogue.post_residual, row[f], epilogue.clip_min,
                                    epilogue.clip_max);
        }
      }
    }
  }
}

}  // namespace sparsecol::kernels
