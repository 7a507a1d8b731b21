// The GEMM driver: ISA dispatch, packing of A and B, and cache blocking around a micro-kernel.
//
// Loop nest: N blocks of NC columns > K blocks of KC > (where B is packed: pack the KC x NC block
// of B into NR-wide strips) > M blocks of MC rows > MR-row panels of A > NR-wide strips of B >
// micro-kernel. The MR x KC panel of A (6 KiB for 6x16 at KC = 256) stays in L1 while the strips
// of the B block stream past it from L2; the B block stays in L2 across the panels and M blocks.
// When B is packed and when it is read in place: below.
//
// Why panels outside strips (the other BLIS order keeps a B strip in L1 across panels): it
// writes C row by row, MR rows at a time, instead of 64 bytes of each of MC rows, which matters
// when K is small and the layer is bound by writing C (MobileNetV2's 16 -> 96 pointwise layer,
// K = 16, N = 12544: measured ~2x faster than the other order), and costs only L2 bandwidth: a
// 6x16 step reads 64 bytes of B per 12 FMAs (6 cycles), well within the 32 bytes per cycle L2
// delivers.
//
// Tried on Zen 3 against this driver (medians of interleaved runs, thread CPU time, noisy shared
// machine) and not kept: the BLIS order inside an M block (strips outer, panels inner) 0.63-1.08x
// (0.63 on K = 16, 0.89-0.95 on the 3x3 and BERT shapes); KC = 384 or 512 instead of 256,
// within noise (0.85-1.13x, no consistent sign); packing B row by row instead of strip by strip
// 0.80-1.17x; aligning the packed B strips to 64 bytes, within noise (0.94-1.11x).
//
// When B is packed (the micro-kernel reads it at whatever stride it is given): in place, a strip
// is KC rows ldb floats apart, and a row stride that is a multiple of 2 KiB maps every row onto
// one or two cache sets (L1 is 64 sets of 64 bytes, a 4 KiB period, on Zen 3 and Zen 5 alike), so
// that the strip's rows evict each other: BERT's N = 3072 (12 KiB) ran at 63 GFLOP/s packed and
// 39 in place (Zen 3), and N = 3072 and 1024 at 0.72-0.8x in place on Zen 5. Every other stride
// is read in place: packing copies all of B once per call, and with the rows spread over the
// sets the strips stream from L2 as fast as packed ones. In place against packed, one thread,
// Zen 5 (bench/gemm_bench.cc, conv_bench.cc, two alternated runs): MobileNetV2's pointwise
// layers with few output channels 1.27-1.46x (M16 x K32 at 112x112, M24 x K144 at 56x56, even at
// 12544-float rows that fall into only four sets), ResNet-50's 64- and 128-row 1x1 layers
// 1.09-1.15x, BERT's 768-wide products 1.05-1.1x, the rest (many rows, short planes) equal. A B
// that is itself computed (a convolution's im2col) is written straight into full-depth strips by
// its producer (pack_b_strip_rows) and read in place (gemm_packed_strips), as is a linear
// layer's weight packed at load (PackedB).
#include "f32-gemm/gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <xmmintrin.h>
#include <vector>

#include <fmt/format.h>

#include "f32-eltwise/eltwise.h"
#include "f32-gemm/ukernels.h"
#include "scratch.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol::kernels {
namespace {

struct Blocking {
  int64_t kc, mc, nc;
};

// KC: a KC x NR strip of B is half of L1, so that the strip a micro-kernel call streams and the
// A panel it keeps (MR x KC) fit L1 together (Zen 3, 6x16: a 16 KiB strip at KC = 256 and 6 KiB
// of A in 32 KiB). K is split evenly so that no block is a sliver. NC: the packed KC x NC block
// of B is half of L2 (Zen 3: NC = 256 at KC = 256), read from L2 by every panel; a block as large
// as L2 measured slower (it evicts itself and A). MC: the MC x KC block of A is the other half
// of L2 (Zen 3: MC = 256 rows at KC = 256), so that it is still there for the next N block.
Blocking choose_blocking(const GemmUkernel& ukernel, int64_t k) {
  const int64_t l1 = core_caches().l1d, l2 = core_caches().l2;
  const int64_t mr = ukernel.mr, nr = ukernel.nr;
  const int64_t kc_max = std::max<int64_t>(64, l1 / 2 / (nr * 4));
  const int64_t k_blocks = std::max<int64_t>(1, (k + kc_max - 1) / kc_max);
  Blocking blocking;
  blocking.kc = std::max<int64_t>(1, (k + k_blocks - 1) / k_blocks);
  blocking.mc = std::max<int64_t>(mr, l2 / 2 / (blocking.kc * 4) / mr * mr);
  blocking.nc = std::max<int64_t>(nr, l2 / 2 / (blocking.kc * 4) / nr * nr);
  return blocking;
}

// Columns [0, n) of rows [0, k) of B (ldb apart) as ceil(n / kNr) strips of k x kNr floats,
// each row of a strip contiguous; the last strip's columns past n are left unwritten (the
// micro-kernel's masked loads never read them). Strip by strip, so that the writes are
// sequential; kNr is a compile-time constant so that a row is a few plain vector moves, not a
// memcpy call.
//
// Each row is prefetched kPackAheadFloats ahead: a strip reads one line of each of k rows, k
// streams (16-256 here) that the hardware prefetchers cannot all follow, so where B comes from
// memory (a 1x1 convolution's input planes at batch 16) every line was a full miss. Measured on
// the 1x1 layer shapes with B and C out of cache (16 images in turn, one thread, Zen 3, medians
// of 5 rounds): MobileNetV2 32->16 @112 1.33x, 144->24 @56 1.78x, 16->96 1.06x; ResNet-50
// 64->256 @56 1.11x, 256->64 1.28x, 512->128 @28 1.08x. Prefetching two to eight lines ahead
// all gained; packing row by row (sequential reads) gained less (0.96-1.48x).
inline constexpr int64_t kPackAheadFloats = 64;  // 4 cache lines

template <int kNr>
void pack_b_strips(const float* b, int64_t ldb, int64_t k, int64_t n, float* dst,
                   int64_t strip_stride) {
  int64_t j = 0;
  for (; j + kNr <= n; j += kNr, dst += strip_stride) {
    const float* column = b + j;
    for (int64_t p = 0; p < k; ++p, column += ldb) {
      __builtin_prefetch(column + kPackAheadFloats);  // never faults, even past B
      std::memcpy(dst + p * kNr, column, kNr * sizeof(float));
    }
  }
  if (j == n) return;
  for (int64_t p = 0; p < k; ++p) {
    std::memcpy(dst + p * kNr, b + p * ldb + j, static_cast<std::size_t>(n - j) * sizeof(float));
  }
}

// Columns [0, n) of B given transposed (B[p][j] = bt[j * ldbt + p]: an attention product's K^T
// read from K) as pack_b_strips lays them out: each strip is kNr rows of bt transposed, by the
// tiled 2-D transpose (16 x 16 tiles of whole cache lines). Gathering a strip column by column
// (as A's panels are packed, kNr rows read in step) made BERT's 128 x 64 x 128 scores product
// 1.3x slower than on a K^T transposed beforehand (bench/gemm_bench.cc, bert_attention_scores).
template <int kNr>
void pack_b_transposed_strips(const float* bt, int64_t ldbt, int64_t k, int64_t n, float* dst,
                              int64_t strip_stride) {
  for (int64_t j = 0; j < n; j += kNr, dst += strip_stride) {
    transpose_2d(bt + j * ldbt, ldbt, std::min<int64_t>(kNr, n - j), k, dst, kNr);
  }
}

constexpr GemmUkernel kUkernels[] = {
#define SPARSECOL_UKERNEL_ENTRY(name, isa, mr, nr, lanes, extra) \
  {#name, isa, mr, nr, lanes, extra, &name, &pack_b_strips<nr>, &pack_b_transposed_strips<nr>},
    SPARSECOL_F32_GEMM_UKERNELS(SPARSECOL_UKERNEL_ENTRY)
#undef SPARSECOL_UKERNEL_ENTRY
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Asks for lines [first, end) from `p` in L2. A weight's panels come from memory at batch 1 (a
// model's weights outgrow L3) and each is a short sequential run, 32 KiB or more from the last,
// so the hardware prefetchers restart on every panel; the drivers ask for the next panel while
// the current one computes. ResNet-50 at batch 1 ran 1.05-1.06x faster (one thread, two runs).
void prefetch_lines(const float* p, int64_t first, int64_t end) {
  for (int64_t line = first; line < end; ++line) {
    _mm_prefetch(reinterpret_cast<const char*>(p + line * 16), _MM_HINT_T1);
  }
}

void require_available(Isa isa) {
  if (!isa_available(isa)) {
    throw Error(ErrorCode::kInvalidArgument, std::string("gemm: ISA ") + to_string(isa) +
                                                 " requested but not available here (" +
                                                 isa_reason() + ")");
  }
}

}  // namespace

std::span<const GemmUkernel> gemm_ukernels() { return kUkernels; }

const GemmUkernel& default_gemm_ukernel(Isa isa) {
  for (const GemmUkernel& u : kUkernels) {
    if (u.isa == isa) return u;
  }
  return default_gemm_ukernel(Isa::kPortable);  // the list always has a portable kernel
}

int64_t packed_a_size(int64_t m, int64_t k, int mr) { return ceil_div(m, mr) * mr * k; }

namespace {

// One panel of kMr rows, MR known at compile time so that the loop over rows unrolls into kMr
// plain moves per column, reading the kMr rows in step. (The loop with MR a runtime value ran
// ~5 cycles per float: on the attention products of BERT, M x K x N = 128 x 64 x 128 and
// 128 x 128 x 64, where A is packed per call, packing took a third and a half of the time.)
// `rows` < kMr: the panel's last kMr - rows rows are zeros.
template <int kMr>
void pack_a_panel(const float* a, int64_t rows, int64_t k, int64_t lda, float* dst) {
  if (rows == kMr) {
    for (int64_t p = 0; p < k; ++p, dst += kMr) {
#pragma GCC unroll 16
      for (int i = 0; i < kMr; ++i) dst[i] = a[i * lda + p];
    }
    return;
  }
  for (int64_t p = 0; p < k; ++p, dst += kMr) {
    for (int i = 0; i < kMr; ++i) dst[i] = i < rows ? a[i * lda + p] : 0.0f;
  }
}

template <int kMr>
void pack_a_panels_of(const float* a, int64_t m, int64_t k, int64_t lda, float* dst) {
  for (int64_t row0 = 0; row0 < m; row0 += kMr, dst += kMr * k) {
    pack_a_panel<kMr>(a + row0 * lda, std::min<int64_t>(kMr, m - row0), k, lda, dst);
  }
}

}  // namespace

void pack_a_panels(const float* a, int64_t m, int64_t k, int64_t lda, int mr, float* dst) {
  switch (mr) {
    case 4:
      return pack_a_panels_of<4>(a, m, k, lda, dst);
    case 6:
      return pack_a_panels_of<6>(a, m, k, lda, dst);
    case 8:
      return pack_a_panels_of<8>(a, m, k, lda, dst);
    default:
      throw Error(ErrorCode::kInternal,
                  "pack_a_panels: no panel packing for MR " + std::to_string(mr));
  }
}

namespace {

// The B operand of the blocked driver: row-major, ldb apart (read in place, or packed per call
// into strips where its rows would share cache sets: "When B is packed" above), or already in
// full-depth strips of NR columns (PackedB): the strip of column j at data + j / NR * k * NR.
struct BOperand {
  const float* data = nullptr;
  int64_t ldb = 0;
  bool strips = false;
  const int64_t* row_offsets = nullptr;  // an indirect B: row p at data + row_offsets[p]
  bool from_memory = false;  // strips only: a weight that comes from memory (see BlockPrefetch)
  bool transposed = false;   // B[p][j] at data + j * ldb + p: always packed per call
};

// Asks for the lines of the next block of a B in strips, a few per micro-kernel call of the
// current block, so that a weight streamed from memory is in L2 when its block starts. Why: a
// linear layer's weight (PackedB) comes from memory at small batches (BERT's weights are ten
// times the L3), and the first A panel of each block otherwise waits for every line of it: at 128
// tokens a 192 x 672 block is 504 KiB, some 25 us from memory against 8 us of FMAs for that
// panel. Dense BERT at batch 1 ran 1.04-1.07x faster (0.89-0.92x -> 0.95-0.96x of oneDNN, 3
// alternated pairs twice, Zen 5, 2 threads); batch 8 within noise. Not for a B packed per call or
// by its producer: that one is in cache already.
class BlockPrefetch {
 public:
  // `pieces` runs of `piece_lines` lines, `piece_stride` floats apart from `first`, spread over
  // `calls` calls of step().
  void start(const float* first, int64_t pieces, int64_t piece_lines, int64_t piece_stride,
             int64_t calls) {
    p_ = first;
    pieces_left_ = pieces;
    piece_lines_ = piece_lines;
    piece_stride_ = piece_stride;
    line_ = 0;
    per_call_ = ceil_div(pieces * piece_lines, std::max<int64_t>(1, calls));
  }
  // The next few lines (a counter, not a division per line: this runs between micro-kernel
  // calls).
  void step() {
    for (int64_t n = 0; n < per_call_ && pieces_left_ > 0; ++n) {
      _mm_prefetch(reinterpret_cast<const char*>(p_ + line_ * 16), _MM_HINT_T1);
      if (++line_ == piece_lines_) {
        line_ = 0;
        --pieces_left_;
        p_ += piece_stride_;
      }
    }
  }

 private:
  const float* p_ = nullptr;
  int64_t pieces_left_ = 0, piece_lines_ = 0, piece_stride_ = 0, line_ = 0, per_call_ = 0;
};

// What the micro-kernel computes of the strip of columns from j, in a block of columns ending at
// n1: `vectors` columns as vectors and `extra` columns past them by broadcasts
// (GemmUkernelArgs::extra); the next strip starts at `next`. A block's last few columns (up to
// ukernel.extra_columns past a whole number of vectors) are extra columns of its last vectors'
// strip. Measured (bench/gemm_bench.cc, one thread, Zen 5): with M = 256 and K = 2304, N = 192
// took 893 us, N = 196 1015 us (its 4-column strip cost 0.7 of a full one); with extra columns
// the 196-pixel GEMMs of ResNet-50's 14x14 layers ran 1.03-1.09x faster, the 49-pixel ones of
// its 7x7 layers 1.02-1.04x, and conv_bench's one-image 7x7 3x3 layer 1.14x.
struct StripColumns {
  int64_t vectors = 0, extra = 0, next = 0;
};

StripColumns strip_columns(const GemmUkernel& ukernel, int64_t j, int64_t n1,
                           bool extra_allowed = true) {
  const int64_t columns = std::min<int64_t>(ukernel.nr, n1 - j);
  if (!extra_allowed) return {columns, 0, j + columns};
  const int64_t beyond = n1 - j - columns;       // columns of the strips after this one
  const int64_t tail = columns % ukernel.lanes;  // columns of this strip's last, partial vector
  if (beyond > 0 && beyond <= ukernel.extra_columns) return {columns, beyond, n1};
  if (beyond == 0 && columns > ukernel.lanes && tail <= ukernel.extra_columns && tail > 0) {
    return {columns - tail, tail, n1};
  }
  return {columns, 0, j + columns};
}

void gemm_driver(const GemmUkernel& ukernel, const float* packed_a, int64_t m, int64_t k,
                 BOperand b, float* c, int64_t ldc, int64_t n, const Epilogue& epilogue) {
  if (m <= 0 || n <= 0) return;
  const int64_t mr = ukernel.mr, nr = ukernel.nr;
  const Blocking blocking = choose_blocking(ukernel, k);
  const int64_t kc = blocking.kc, mc = blocking.mc, nc = blocking.nc;
  const int64_t k_blocks = std::max<int64_t>(1, ceil_div(k, kc));
  constexpr int64_t kAliasingRowBytes = 2048;  // see "When B is packed" above
  const bool pack_b =
      !b.strips && b.row_offsets == nullptr && k > 0 &&
      (b.transposed ||
       (m > mr && b.ldb * static_cast<int64_t>(sizeof(float)) % kAliasingRowBytes == 0));
  // One buffer per thread: callers run this on several threads at once, one region each.
  thread_local std::vector<float> packed_b_scratch;
  float* packed_b =
      pack_b ? aligned_scratch(packed_b_scratch, kc * ceil_div(std::min(n, nc), nr) * nr) : nullptr;

  // Extra columns are read from the rows of the vectors' B (GemmUkernelArgs::extra): not from
  // strips, where the last few columns are the next strip's.
  const bool b_in_place = !b.strips && !pack_b && b.row_offsets == nullptr;

  GemmUkernelArgs args;
  args.ldc = ldc;
  Epilogue tile_epilogue = epilogue;  // its pointers move from tile to tile
  BlockPrefetch next_b;
  const bool prefetch_b = b.strips && b.from_memory;
  for (int64_t n0 = 0; n0 < n; n0 += nc) {
    const int64_t n1 = std::min(n, n0 + nc);
    for (int64_t kb = 0; kb < k_blocks; ++kb) {
      const int64_t k0 = std::min(k, kb * kc);
      const int64_t k1 = std::min(k, k0 + kc);
      const bool last = kb + 1 == k_blocks;
      if (prefetch_b) {  // the block after this one: the next K block, or the next N block's first
        const int64_t next_n0 = last ? n0 + nc : n0, next_k0 = last ? 0 : k1;
        const int64_t next_k1 = std::min(k, next_k0 + kc);
        const int64_t pieces = next_n0 < n ? ceil_div(std::min(n, next_n0 + nc) - next_n0, nr) : 0;
        next_b.start(pieces > 0 ? b.data + next_n0 / nr * k * nr + next_k0 * nr : nullptr, pieces,
                     ceil_div((next_k1 - next_k0) * nr, 16), k * nr,
                     ceil_div(m, mr) * ceil_div(n1 - n0, nr));
      }
      args.k = k1 - k0;
      args.accumulate = kb > 0;
      if (pack_b && b.transposed) {
        ukernel.pack_b_transposed(b.data + n0 * b.ldb + k0, b.ldb, k1 - k0, n1 - n0, packed_b,
                                  (k1 - k0) * nr);
      } else if (pack_b) {
        ukernel.pack_b(b.data + k0 * b.ldb + n0, b.ldb, k1 - k0, n1 - n0, packed_b, (k1 - k0) * nr);
      }
      args.ldb = pack_b || b.strips ? nr : b.ldb;
      args.b_row_offsets = b.row_offsets != nullptr ? b.row_offsets + k0 : nullptr;
      for (int64_t m0 = 0; m0 < m; m0 += mc) {
        const int64_t m1 = std::min(m, m0 + mc);
        auto tile = [&](int64_t i, int64_t j, const StripColumns& columns) {
          args.n = columns.vectors;
          args.extra = columns.extra;
          args.b = b.strips ? b.data + j / nr * k * nr + k0 * nr
                   : pack_b ? packed_b + (j - n0) * (k1 - k0)
                            : b.data + k0 * b.ldb + j;
          args.m = std::min(mr, m1 - i);
          args.a = packed_a + i * k + k0 * mr;  // panel i / mr starts at (i / mr) * mr * k
          args.c = c + i * ldc + j;
          if (last) move_epilogue_to(epilogue, i, j, tile_epilogue);
          args.epilogue = last ? &tile_epilogue : nullptr;
          ukernel.fn(args);
        };
        const int64_t strips = ceil_div(n1 - n0, nr);
        const int64_t panel_lines = ceil_div((k1 - k0) * mr, 16);
        const int64_t per_strip = ceil_div(panel_lines, strips);
        for (int64_t i = m0; i < m1; i += mr) {
          const float* next = i + mr < m1 ? packed_a + (i + mr) * k + k0 * mr : nullptr;
          for (int64_t j = n0, line = 0; j < n1; line += per_strip) {
            if (next != nullptr)
              prefetch_lines(next, line, std::min(panel_lines, line + per_strip));
            if (prefetch_b) next_b.step();
            const StripColumns columns = strip_columns(ukernel, j, n1, b_in_place);
            tile(i, j, columns);
            j = columns.next;
          }
        }
      }
    }
  }
}

// A packed into `scratch` for the micro-kernel, then the driver.
void gemm_packing_a(const GemmUkernel& ukernel, const GemmShape& shape, const float* a, int64_t lda,
                    BOperand b, float* c, int64_t ldc, const Epilogue& epilogue,
                    std::vector<float>& scratch) {
  if (shape.m <= 0 || shape.n <= 0) return;
  const int64_t size = packed_a_size(shape.m, shape.k, ukernel.mr);
  if (static_cast<int64_t>(scratch.size()) < size) scratch.resize(size);
  pack_a_panels(a, shape.m, shape.k, lda, ukernel.mr, scratch.data());
  gemm_driver(ukernel, scratch.data(), shape.m, shape.k, b, c, ldc, shape.n, epilogue);
}

}  // namespace

void gemm_packed_with_ukernel(const GemmUkernel& ukernel, const float* packed_a, int64_t m,
                              int64_t k, const float* b, int64_t ldb, float* c, int64_t ldc,
                              int64_t n, const Epilogue& epilogue) {
  gemm_driver(ukernel, packed_a, m, k, BOperand{b, ldb, false}, c, ldc, n, epilogue);
}

void gemm_with_ukernel(const GemmUkernel& ukernel, const GemmShape& shape, const float* a,
                       int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                       const Epilogue& epilogue, std::vector<float>& scratch) {
  require_available(ukernel.isa);
  gemm_packing_a(ukernel, shape, a, lda, BOperand{b, ldb, false}, c, ldc, epilogue, scratch);
}

void gemm_transposed_b_with_ukernel(const GemmUkernel& ukernel, const GemmShape& shape,
                                    const float* a, int64_t lda, const float* bt, int64_t ldbt,
                                    float* c, int64_t ldc, const Epilogue& epilogue,
                                    std::vector<float>& scratch) {
  require_available(ukernel.isa);
  BOperand b{bt, ldbt};
  b.transposed = true;
  gemm_packing_a(ukernel, shape, a, lda, b, c, ldc, epilogue, scratch);
}

PackedA::PackedA(const float* a, int64_t m, int64_t k, int64_t lda)
    : PackedA(a, m, k, lda, active_isa()) {}

namespace {

// The buffer of a packed operand: zero-filled (the padding of the last panel or strip), one
// float at least.
std::shared_ptr<float[]> packed_buffer(int64_t floats) {
  return std::shared_ptr<float[]>(
      new float[static_cast<std::size_t>(std::max<int64_t>(1, floats))]());
}

}  // namespace

PackedA::PackedA(const float* a, int64_t m, int64_t k, int64_t lda, Isa isa)
    : m_(m), k_(k), isa_(isa) {
  require_available(isa);
  const int mr = default_gemm_ukernel(isa).mr;
  data_ = packed_buffer(packed_a_size(m, k, mr));
  pack_a_panels(a, m, k, lda, mr, data_.get());
}

int64_t PackedA::panel_rows() const { return default_gemm_ukernel(isa_).mr; }

PackedA PackedA::row_range(int64_t begin, int64_t end) const {
  if (begin < 0 || begin > end || end > m_ || (begin % panel_rows() != 0 && begin != m_)) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("PackedA: rows [{}, {}) of {} in panels of {}", begin, end, m_, panel_rows()));
  }
  PackedA part = *this;
  part.m_ = end - begin;
  part.data_ = std::shared_ptr<float[]>(data_, data_.get() + begin * k_);  // panel begin / MR
  return part;
}

void gemm_packed(const PackedA& a, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t n,
                 const Epilogue& epilogue) {
  gemm_packed_with_ukernel(default_gemm_ukernel(a.isa()), a.data(), a.rows(), a.depth(), b, ldb, c,
                           ldc, n, epilogue);
}

bool gemm_packed_writes_c_once(int64_t k, Isa isa) {
  return k <= choose_blocking(default_gemm_ukernel(isa), k).kc;
}

PackedB::PackedB(const float* b, int64_t k, int64_t n, int64_t ldb)
    : PackedB(b, k, n, ldb, active_isa()) {}

PackedB::PackedB(const float* b, int64_t k, int64_t n, int64_t ldb, Isa isa)
    : k_(k), n_(n), isa_(isa) {
  require_available(isa);
  nr_ = gemm_strip_width(isa);
  data_ = packed_buffer(packed_bytes() / static_cast<int64_t>(sizeof(float)));
  pack_b_strip_rows(b, ldb, k, n, 0, k, data_.get(), isa);
}

int64_t PackedB::packed_bytes() const {
  return ceil_div(n_, nr_) * nr_ * k_ * static_cast<int64_t>(sizeof(float));
}

const float* PackedB::strip(int64_t column) const { return data_.get() + column / nr_ * k_ * nr_; }

void gemm_packed_b(const GemmShape& shape, const float* a, int64_t lda, const PackedB& b,
                   int64_t col_begin, float* c, int64_t ldc, const Epilogue& epilogue,
                   std::vector<float>& scratch) {
  if (shape.k != b.depth() || col_begin < 0 || col_begin % b.strip_width() != 0 ||
      col_begin + shape.n > b.columns()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("gemm_packed_b: K {} columns [{}, {}) of a packed B of K {} x N {} "
                            "(strips of {})",
                            shape.k, col_begin, col_begin + shape.n, b.depth(), b.columns(),
                            b.strip_width()));
  }
  gemm_packing_a(default_gemm_ukernel(b.isa()), shape, a, lda,
                 BOperand{b.strip(col_begin), 0, true, nullptr, true}, c, ldc, epilogue, scratch);
}

int64_t gemm_strip_width(Isa isa) { return default_gemm_ukernel(isa).nr; }

void pack_b_strip_rows(const float* b, int64_t ldb, int64_t rows, int64_t n, int64_t row0,
                       int64_t k, float* strips, Isa isa) {
  const GemmUkernel& ukernel = default_gemm_ukernel(isa);
  ukernel.pack_b(b, ldb, rows, n, strips + row0 * ukernel.nr, k * ukernel.nr);
}

void gemm_packed_strips(const PackedA& a, const float* strips, float* c, int64_t ldc, int64_t n,
                        const Epilogue& epilogue) {
  gemm_driver(default_gemm_ukernel(a.isa()), a.data(), a.rows(), a.depth(),
              BOperand{strips, 0, true}, c, ldc, n, epilogue);
}

void gemm_packed_row_offsets(const PackedA& a, const float* b, std::span<const int64_t> row_offsets,
                             float* c, int64_t ldc, int64_t n, const Epilogue& epilogue) {
  if (static_cast<int64_t>(row_offsets.size()) != a.depth()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("gemm_packed_row_offsets: {} row offsets for A of depth {}",
                            row_offsets.size(), a.depth()));
  }
  gemm_driver(default_gemm_ukernel(a.isa()), a.data(), a.rows(), a.depth(),
              BOperand{b, 0, false, row_offsets.data()}, c, ldc, n, epilogue);
}

// Loop nest: M blocks whose A block (MC rows of one block of channels, all its taps) is half of
// L2 > blocks of channels > NR-wide strips of columns > MR-row panels > micro-kernel. A strip
// reads, per channel of its block, the input lines its taps shift over (3 rows of 3 lines for a
// 3x3 layer on a wide image); conv.cc sizes the channel blocks so that those stay in L1 while the
// panels of the M block stream past them, each panel once per strip from L2.
void gemm_packed_taps(const PackedA& a, const ConvTaps& b, float* c, int64_t ldc, int64_t n,
                      const Epilogue& epilogue) {
  const GemmUkernel& ukernel = default_gemm_ukernel(a.isa());
  const int64_t taps = static_cast<int64_t>(b.taps.size());
  if (taps == 0 || b.block_channels <= 0 || a.depth() != b.channels * taps || ukernel.nr > 64) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("gemm_packed_taps: {} taps, blocks of {} of {} channels, for A of "
                            "depth {} (strips of {})",
                            taps, b.block_channels, b.channels, a.depth(), ukernel.nr));
  }
  const int64_t m = a.rows();
  if (m <= 0 || n <= 0) return;
  const int64_t mr = ukernel.mr, nr = ukernel.nr;
  // Per strip and tap, the columns whose input lies in the tap's plane (and before n).
  const int64_t strips = ceil_div(n, nr);
  thread_local std::vector<uint64_t> masks;
  thread_local std::vector<int64_t> offsets;
  masks.assign(static_cast<std::size_t>(strips * taps), 0);
  offsets.resize(static_cast<std::size_t>(taps));
  // A tap reads a rectangle of the output: per output row in its plane, one run of columns,
  // set run by run. Three divisions per pixel and tap cost more than the product on layers of
  // few channels (bench/conv_bench.cc, one thread, Zen 5: small_cnn's 16-channel 3x3 on 32x32
  // 54 -> 20 us; ResNet-50's 3x3 64 on 56x56 961 -> 888 us).
  for (int64_t t = 0; t < taps; ++t) {
    const ConvTap& tap = b.taps[static_cast<std::size_t>(t)];
    offsets[t] = tap.phase * b.phase_stride + tap.row_shift * b.width + tap.col_shift;
    const int64_t x_begin = std::clamp<int64_t>(-tap.col_shift, 0, b.width);
    const int64_t x_end = std::clamp<int64_t>(tap.columns - tap.col_shift, x_begin, b.width);
    if (x_begin == x_end) continue;
    int64_t image_row = b.image_rows > 0 ? b.first_row % b.image_rows : b.first_row;
    for (int64_t p0 = 0; p0 < n; p0 += b.width) {
      const int64_t row = image_row + tap.row_shift;
      if (++image_row == b.image_rows) image_row = 0;
      if (row < 0 || row >= tap.rows) continue;
      for (int64_t p = p0 + x_begin, end = std::min(n, p0 + x_end); p < end;) {
        const int64_t lane = p % nr, count = std::min(end - p, nr - lane);
        const uint64_t bits = count == 64 ? ~uint64_t{0} : ((uint64_t{1} << count) - 1);
        masks[(p / nr) * taps + t] |= bits << lane;
        p += count;
      }
    }
  }
  const int64_t block_depth = std::min(b.channels, b.block_channels) * taps;
  const int64_t mc = std::max<int64_t>(mr, core_caches().l2 / 2 / (block_depth * 4) / mr * mr);
  GemmUkernelArgs args;
  args.ldc = ldc;
  args.ldb = b.channel_stride;
  args.taps = taps;
  args.tap_offset = offsets.data();
  Epilogue tile_epilogue = epilogue;
  for (int64_t m0 = 0; m0 < m; m0 += mc) {
    const int64_t m1 = std::min(m, m0 + mc);
    for (int64_t c0 = 0; c0 < b.channels; c0 += b.block_channels) {
      const int64_t c1 = std::min(b.channels, c0 + b.block_channels);
      const bool last = c1 == b.channels;
      args.k = (c1 - c0) * taps;
      args.accumulate = c0 > 0;
      for (int64_t j = 0; j < n;) {
        const StripColumns columns = strip_columns(ukernel, j, n);
        args.n = columns.vectors;
        args.extra = columns.extra;
        args.b = b.data + c0 * b.channel_stride + j;
        args.tap_masks = masks.data() + j / nr * taps;
        for (int64_t i = m0; i < m1; i += mr) {
          if (j == 0 && i + mr < m1) {  // the first strip brings each panel from memory
            prefetch_lines(a.data() + (i + mr) * a.depth() + c0 * taps * mr, 0,
                           ceil_div(args.k * mr, 16));
          }
          args.m = std::min(mr, m1 - i);
          args.a = a.data() + i * a.depth() + c0 * taps * mr;
          args.c = c + i * ldc + j;
          if (last) move_epilogue_to(epilogue, i, j, tile_epilogue);
          args.epilogue = last ? &tile_epilogue : nullptr;
          ukernel.fn(args);
        }
        j = columns.next;
      }
    }
  }
}

void gemm(const GemmShape& shape, const float* a, int64_t lda, const float* b, int64_t ldb,
          float* c, int64_t ldc, const Epilogue& epilogue, std::vector<float>& scratch) {
  gemm_with_ukernel(default_gemm_ukernel(active_isa()), shape, a, lda, b, ldb, c, ldc, epilogue,
                    scratch);
}

void gemm_transposed_b(const GemmShape& shape, const float* a, int64_t lda, const float* bt,
                       int64_t ldbt, float* c, int64_t ldc, const Epilogue& epilogue,
                       std::vector<float>& scratch) {
  gemm_transposed_b_with_ukernel(default_gemm_ukernel(active_isa()), shape, a, lda, bt, ldbt, c,
                                 ldc, epilogue, scratch);
}

float apply_activation(Activation act, float x, float clip_min, float clip_max) {
  switch (act) {
    case Activation::kNone:
      return x;
    case Activation::kRelu:
      return x > 0.0f ? x : 0.0f;
    case Activation::kClip:
      return std::min(std::max(x, clip_min), clip_max);
    case Activation::kGelu:
      return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
  }
  return x;
}

}  // namespace sparsecol::kernels
