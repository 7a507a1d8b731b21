// The code generator of spmm_jit.h: a few AVX-512 and x86-64 instructions encoded by hand (the
// Intel SDM's EVEX, VEX and REX forms), one function per block of kSpmmJitRows output rows.
#include "f32-spmm/spmm_jit.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "isa.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol::kernels {
namespace {

// What a block's function reads, through its one argument (rdi); the offsets are baked into
// the code.
struct JitCall {
  const float* src;     // column 0 of this tile in B row 0's frame
  const float* values;  // the non-zeros in the order the code reads them
  float* dst;           // the block's first row, this tile's column 0
  int64_t ldd_bytes;
  const float* bias;  // the block's first row's bias, or null
  const float* residual;
  int64_t residual_ld_bytes;
  float clip_min, clip_max;
  uint16_t mask;  // the tile's columns: loads and stores touch only these
  // For B rows read out of an aligned pair of vectors (see emit_block), shifted by `low` to
  // `high` lanes: the lanes of the pair's first vector that they read (low_masks[low][high], one
  // run of lanes, so that no lane lies outside the rows' own), and of its second
  // (high_masks[high]).
  uint16_t low_masks[kMaxPairShift + 1][kMaxPairShift + 1];
  uint16_t high_masks[kMaxPairShift + 1];
  uint8_t pre, post;  // Activation before and after the residual
};

// General-purpose registers by encoding.
constexpr int kRdx = 2, kRsi = 6, kRdi = 7, kR8 = 8, kR10 = 10, kR11 = 11;
// Vector registers: accumulators 0 .. kSpmmJitRows - 1, then the epilogue's constants and the
// B row; while the products run (before the epilogue needs its constants), the first two hold an
// aligned pair of B vectors.
constexpr int kZero = 28, kClipMin = 29, kClipMax = 30, kBRow = 31;
constexpr int kPairLow = kZero, kPairHigh = kClipMin;
static_assert(kSpmmJitRows <= kZero);
constexpr int kColumnMask = 1;  // k1
// The mask registers of a pair's vectors: k2 the first vector's (loaded per pair where it
// changes), k3-k5 the second's for rows shifted by up to 1, 2 or 3 lanes.
constexpr int kPairLowMask = 2;
int high_mask_register(int64_t high) { return static_cast<int>(kPairLowMask + high); }

struct Mem {
  int base;
  int index = -1;  // scale 1
  int32_t disp = 0;
  // > 0: the displacement is encoded in 8 bits, divided by this (EVEX's compressed disp8*N, or
  // 1 for a legacy instruction); it must fit.
  int disp8_scale = 0;
};

int32_t field(std::size_t offset) { return static_cast<int32_t>(offset); }

int bit(int value, int which) { return (value >> which) & 1; }

class Assembler {
 public:
  std::vector<uint8_t> code;

  std::size_t size() const { return code.size(); }

  // ---- AVX-512, 512-bit, W0 ----
  void vpxord(int d) { evex_rr(1, 1, 0xEF, d, d, d); }
  void vmovups_load(int d, const Mem& m, int mask, bool zeroing) {
    evex_rm(1, 0, 0x10, d, 0, m, mask, zeroing, false);
  }
  void vmovups_store(const Mem& m, int s, int mask) {
    evex_rm(1, 0, 0x11, s, 0, m, mask, false, false);
  }
  // acc += b * broadcast(m)
  void vfmadd231ps_bcast(int acc, int b, const Mem& m) {
    evex_rm(2, 1, 0xB8, acc, b, m, 0, false, true);
  }
  void vaddps_bcast(int d, int s, const Mem& m) { evex_rm(1, 0, 0x58, d, s, m, 0, false, true); }
  void vaddps_masked(int d, int s, const Mem& m, int mask) {
    evex_rm(1, 0, 0x58, d, s, m, mask, true, false);
  }
  // d = s > r ? s : r (and vminps: s < r ? s : r), as vmax and vmin of simd.h.
  void vmaxps(int d, int s, int r) { evex_rr(1, 0, 0x5F, d, s, r); }
  void vminps(int d, int s, int r) { evex_rr(1, 0, 0x5D, d, s, r); }
  void vbroadcastss(int d, const Mem& m) { evex_rm(2, 1, 0x18, d, 0, m, 0, false, false); }
  // d = lanes [shift, shift + 16) of high:low (EVEX.512.66.0F3A.W0 03 /r ib).
  void valignd(int d, int high, int low, int shift) {
    evex_rr(3, 1, 0x03, d, high, low);
    u8(shift);
  }

  // ---- x86-64 ----
  void mov_load(int reg, const Mem& m) { rex_op(1, reg, m, 0x8B); }
  void add_load(int reg, const Mem& m) { rex_op(1, reg, m, 0x03); }
  void add_imm(int reg, int32_t value) {  // REX.W 81 /0 id
    u8(0x48 | bit(reg, 3));
    u8(0x81);
    u8(0xC0 | (reg & 7));
    u32(value);
  }
  void cmp_qword_zero(const Mem& m) {
    rex_op(1, 7, m, 0x83);
    u8(0);
  }
  void cmp_byte(const Mem& m, uint8_t value) {
    rex_op(0, 7, m, 0x80);
    u8(value);
  }
  void kmovw_load(int k, const Mem& m) {  // VEX.L0.0F.W0 90 /r, base and index below r8
    u8(0xC5);
    u8(0xF8);
    u8(0x90);
    modrm_mem(k, m);
  }
  // A jump whose target is set later with bind(); returns its place.
  std::size_t jump(bool equal, bool conditional) {
    if (conditional) {
      u8(0x0F);
      u8(equal ? 0x84 : 0x85);
    } else {
      u8(0xE9);
    }
    u32(0);
    return code.size() - 4;
  }
  void bind(std::size_t jump_at) {
    const auto rel = static_cast<int32_t>(code.size() - (jump_at + 4));
    std::memcpy(code.data() + jump_at, &rel, 4);
  }
  void vzeroupper_ret() {
    u8(0xC5);
    u8(0xF8);
    u8(0x77);
    u8(0xC3);
  }

 private:
  void u8(int b) { code.push_back(static_cast<uint8_t>(b)); }
  void u32(int32_t v) {
    uint8_t b[4];
    std::memcpy(b, &v, 4);
    code.insert(code.end(), b, b + 4);
  }
  // ModRM, SIB and displacement for `reg` and m: none for 0, 8 bits where m asks for them
  // (divided by disp8_scale), else 32 bits. Bases rsp/r12 (which need a SIB of their own) and
  // rbp/r13 (whose mod 0 means something else) are not used.
  void modrm_mem(int reg, const Mem& m) {
    const int mod = m.disp == 0 ? 0 : m.disp8_scale > 0 ? 1 : 2;
    if (m.index >= 0) {
      u8((mod << 6) | ((reg & 7) << 3) | 4);
      u8(((m.index & 7) << 3) | (m.base & 7));
    } else {
      u8((mod << 6) | ((reg & 7) << 3) | (m.base & 7));
    }
    if (mod == 1) u8(static_cast<int8_t>(m.disp / m.disp8_scale));
    if (mod == 2) u32(m.disp);
  }
  void rex_op(int w, int reg, const Mem& m, int opcode) {
    const int rex = (w << 3) | (bit(reg, 3) << 2) | ((m.index >= 0 ? bit(m.index, 3) : 0) << 1) |
                    bit(m.base, 3);
    if (rex != 0) u8(0x40 | rex);
    u8(opcode);
    modrm_mem(reg, m);
  }
  // EVEX: 62, then R X B R' 0 0 m m (R, X, B, R' inverted), W vvvv 1 p p (vvvv inverted),
  // z L'L b V' a a a (V' inverted). An unused vvvv is 0 (encoded 1111, V' 1).
  void evex(int map, int pp, int opcode, int reg, int vvvv, int rm_b, int rm_x, int mask,
            bool zeroing, bool broadcast) {
    u8(0x62);
    u8(((1 - bit(reg, 3)) << 7) | ((1 - rm_x) << 6) | ((1 - rm_b) << 5) | ((1 - bit(reg, 4)) << 4) |
       map);
    u8(((~vvvv & 15) << 3) | 4 | pp);
    u8((int{zeroing} << 7) | (2 << 5) | (int{broadcast} << 4) | ((1 - bit(vvvv, 4)) << 3) | mask);
    u8(opcode);
  }
  void evex_rr(int map, int pp, int opcode, int reg, int vvvv, int rm) {
    evex(map, pp, opcode, reg, vvvv, bit(rm, 3), bit(rm, 4), 0, false, false);
    u8(0xC0 | ((reg & 7) << 3) | (rm & 7));
  }
  void evex_rm(int map, int pp, int opcode, int reg, int vvvv, const Mem& m, int mask, bool zeroing,
               bool broadcast) {
    evex(map, pp, opcode, reg, vvvv, bit(m.base, 3), m.index >= 0 ? bit(m.index, 3) : 0, mask,
         zeroing, broadcast);
    modrm_mem(reg, m);
  }
};

// The activation at JitCall field `kind` on accumulators [0, rows).
void emit_activation(Assembler& as, std::size_t kind, int rows) {
  as.cmp_byte({kRdi, -1, field(kind)}, static_cast<uint8_t>(Activation::kRelu));
  const std::size_t not_relu = as.jump(false, true);
  for (int r = 0; r < rows; ++r) as.vmaxps(r, r, kZero);
  const std::size_t relu_done = as.jump(false, false);
  as.bind(not_relu);
  as.cmp_byte({kRdi, -1, field(kind)}, static_cast<uint8_t>(Activation::kClip));
  const std::size_t not_clip = as.jump(false, true);
  for (int r = 0; r < rows; ++r) {
    as.vmaxps(r, r, kClipMin);
    as.vminps(r, r, kClipMax);
  }
  as.bind(not_clip);
  as.bind(relu_done);
}

// The vector `bytes` after src (rsi): an 8-bit displacement where it is a whole number of vectors
// within reach (EVEX's disp8*64), else 32 bits (generate checks that every offset fits).
Mem b_address(int64_t bytes) {
  const bool short_form = bytes % 64 == 0 && bytes / 64 >= -128 && bytes / 64 <= 127;
  return {kRsi, -1, static_cast<int32_t>(bytes), short_form ? 64 : 0};
}

// Rows [row0, row0 + rows) of `a`: zero the accumulators, one FMA per non-zero in order of B
// row (each row's own non-zeros stay in increasing column order), then the epilogue and the
// stores, the order of store_row_tile in spmm_impl.h. The non-zeros' values are appended to
// `values` in the order the code reads them; `reads_pairs` is set where the code reads B rows
// out of an aligned pair of vectors. B row k lies `b_row_offsets[k]` floats after src.
void emit_block(Assembler& as, const SparseMatrix& a, std::span<const int64_t> b_row_offsets,
                int64_t row0, int rows, std::vector<float>& values, bool& reads_pairs) {
  as.mov_load(kRsi, {kRdi, -1, field(offsetof(JitCall, src))});
  as.mov_load(kRdx, {kRdi, -1, field(offsetof(JitCall, values))});
  as.mov_load(kR8, {kRdi, -1, field(offsetof(JitCall, dst))});
  as.mov_load(kR10, {kRdi, -1, field(offsetof(JitCall, bias))});
  as.mov_load(kR11, {kRdi, -1, field(offsetof(JitCall, residual))});
  as.kmovw_load(kColumnMask, {kRdi, -1, field(offsetof(JitCall, mask))});
  for (int high = 1; high <= kMaxPairShift; ++high) {
    as.kmovw_load(high_mask_register(high),
                  {kRdi, -1, field(offsetof(JitCall, high_masks) + 2 * high)});
  }
  int64_t low_mask_holds = -1;  // the low_masks entry in kPairLowMask, -1: none yet
  for (int r = 0; r < rows; ++r) as.vpxord(r);

  std::vector<std::tuple<int32_t, int, int32_t>> nonzeros;  // (B row, accumulator, index)
  for (int r = 0; r < rows; ++r) {
    for (int32_t j = a.row_ptr()[row0 + r]; j < a.row_ptr()[row0 + r + 1]; ++j) {
      nonzeros.emplace_back(a.b_rows()[j], r, j);
    }
  }
  std::sort(nonzeros.begin(), nonzeros.end());
  // A B row's non-zeros: [begin, end) of `nonzeros`, and the row's element offset.
  struct BRow {
    int32_t k;
    int64_t offset;
    std::size_t begin, end;
  };
  std::vector<BRow> b_rows;
  for (std::size_t i = 0; i < nonzeros.size(); ++i) {
    const auto [k, r, j] = nonzeros[i];
    if (b_rows.empty() || b_rows.back().k != k) {
      b_rows.push_back({k, b_row_offsets[static_cast<std::size_t>(k)], i, i});
    }
    b_rows.back().end = i + 1;
  }
  // rdx steps through the values, so that every value is an 8-bit displacement from it: an FMA
  // takes 7 bytes instead of 10 (the code streams from L2 once it outgrows the op cache).
  int64_t value_at = 0;  // the value rdx points at
  auto products = [&](const BRow& row, int b_register) {
    for (std::size_t i = row.begin; i < row.end; ++i) {
      const auto [k, r, j] = nonzeros[i];
      const auto v = static_cast<int64_t>(values.size());
      values.push_back(a.values()[j]);
      if (v - value_at > 127) {
        as.add_imm(kRdx, static_cast<int32_t>(4 * (v + 127 - value_at)));
        value_at = v + 127;
      }
      as.vfmadd231ps_bcast(r, b_register, {kRdx, -1, static_cast<int32_t>(4 * (v - value_at)), 4});
    }
  };
  // B rows read on their own: loaded into kBRow, which the pairs' shifted rows also use.
  auto alone = [&](const BRow& row) {
    as.vmovups_load(kBRow, b_address(4 * row.offset), kColumnMask, true);
    products(row, kBRow);
  };
  for (std::size_t g = 0; g < b_rows.size();) {
    // The pair's members among B rows g .. h - 1 lie in one aligned pair of vectors, shifted by
    // up to kMaxPairShift lanes (a 3x3 layer's column taps of one input row: offsets base,
    // base + 1, base + 2). Loading each on its own, the shifted ones straddle two cache lines, so
    // the pair is loaded once and each member shifted out of it (see SpmmJit). A row between two
    // members that is not one (a stride-2 layer's tap kx = 1, in the other phase plane than
    // kx = 0 and 2) is read alone, and the pair stays in its registers.
    const int64_t base = b_rows[g].offset - b_rows[g].offset % kSpmmMaxLanes;
    auto member = [&](std::size_t i) {
      const int64_t shift = b_rows[i].offset - base;
      return shift >= 0 && shift <= kMaxPairShift;
    };
    std::size_t h = g;
    int64_t low = kSpmmMaxLanes, high = 0;
    for (; h < b_rows.size(); ++h) {
      if (!member(h)) {
        if (h + 1 < b_rows.size() && member(h + 1)) continue;
        break;
      }
      low = std::min(low, b_rows[h].offset - base);
      high = std::max(high, b_rows[h].offset - base);
    }
    if (high == 0) {  // no shifted member: the row alone, as it is
      alone(b_rows[g++]);
      continue;
    }
    const int64_t low_mask = low * (kMaxPairShift + 1) + high;
    if (low_mask != low_mask_holds) {
      as.kmovw_load(kPairLowMask, {kRdi, -1, field(offsetof(JitCall, low_masks) + 2 * low_mask)});
      low_mask_holds = low_mask;
    }
    as.vmovups_load(kPairLow, b_address(4 * base), kPairLowMask, true);
    as.vmovups_load(kPairHigh, b_address(4 * base + 64), high_mask_register(static_cast<int>(high)),
                    true);
    for (; g < h; ++g) {
      if (!member(g)) {
        alone(b_rows[g]);
        continue;
      }
      const auto shift = static_cast<int>(b_rows[g].offset - base);
      if (shift > 0) as.valignd(kBRow, kPairHigh, kPairLow, shift);
      products(b_rows[g], shift > 0 ? kBRow : kPairLow);
    }
    reads_pairs = true;
  }
  as.vpxord(kZero);
  as.vbroadcastss(kClipMin, {kRdi, -1, field(offsetof(JitCall, clip_min))});
  as.vbroadcastss(kClipMax, {kRdi, -1, field(offsetof(JitCall, clip_max))});

  as.cmp_qword_zero({kRdi, -1, field(offsetof(JitCall, bias))});
  const std::size_t no_bias = as.jump(true, true);
  for (int r = 0; r < rows; ++r) as.vaddps_bcast(r, r, {kR10, -1, 4 * r});
  as.bind(no_bias);
  emit_activation(as, offsetof(JitCall, pre), rows);
  as.cmp_qword_zero({kRdi, -1, field(offsetof(JitCall, residual))});
  const std::size_t no_residual = as.jump(true, true);
  for (int r = 0; r < rows; ++r) {
    as.vaddps_masked(r, r, {kR11}, kColumnMask);
    as.add_load(kR11, {kRdi, -1, field(offsetof(JitCall, residual_ld_bytes))});
  }
  as.bind(no_residual);
  emit_activation(as, offsetof(JitCall, post), rows);
  for (int r = 0; r < rows; ++r) {
    as.vmovups_store({kR8}, r, kColumnMask);
    as.add_load(kR8, {kRdi, -1, field(offsetof(JitCall, ldd_bytes))});
  }
  as.vzeroupper_ret();
}

// The element offset of each B row in the layout the matrix was packed for (rows without a
// non-zero: 0, never read).
std::vector<int64_t> packed_b_row_offsets(const SparseMatrix& a) {
  std::vector<int64_t> offsets(static_cast<std::size_t>(a.groups() * a.depth()), 0);
  for (int64_t j = 0; j < a.nnz(); ++j) {
    offsets[static_cast<std::size_t>(a.b_rows()[j])] = a.offsets()[j];
  }
  return offsets;
}

// The masks of a tile `width` columns wide (JitCall::mask, low_masks, high_masks), unless
// `call` holds them already.
void set_column_masks(int64_t width, JitCall& call) {
  const uint32_t mask = (uint32_t{1} << width) - 1;
  if (call.mask == mask) return;
  call.mask = static_cast<uint16_t>(mask);
  for (int64_t high = 0; high <= kMaxPairShift; ++high) {
    const uint32_t through = (uint32_t{1} << std::min<int64_t>(16, high + width)) - 1;
    for (int64_t low = 0; low <= high; ++low) {
      call.low_masks[low][high] = static_cast<uint16_t>(through & ~((uint32_t{1} << low) - 1));
    }
    call.high_masks[high] = static_cast<uint16_t>(mask >> (16 - high));
  }
}

// Columns per chunk: each block's code runs over a chunk's tiles one after another, so that it
// is fetched once per chunk, not once per tile, and each row's stores run 1 KiB on. Against
// tiles outside blocks (ResNet-50's layers, bench/spmm_bench.cc, one thread, Zen 4): the 1x1
// layers 1.0-1.4x faster (those with the most code the most), 64 -> 256 at 95% (3.2 non-zeros a
// row, bound by its stores) 1.1x, the 3x3 256 at 90% 365-377 against 394-438 us; chunks sized
// to keep their B within a quarter of L2 (48 columns for that layer) ran 426-471 us.
constexpr int64_t kChunkColumns = 256;

}  // namespace

std::shared_ptr<const SpmmJit> SpmmJit::generate(const SparseMatrix& a,
                                                 std::span<const int64_t> b_row_offsets) {
  if (active_isa() != Isa::kAvx512 || a.shifts() != 1 || a.groups() != 1) return nullptr;
  if (!b_row_offsets.empty() && static_cast<int64_t>(b_row_offsets.size()) != a.depth()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("SpmmJit::generate: {} B row offsets for {} B rows",
                            b_row_offsets.size(), a.depth()));
  }
  // A block loads each B row it needs once; below ~2 non-zeros per load (sparser than ~93% at 28
  // rows) those loads, and each row's epilogue and store per vector of columns, outweigh what
  // the code saves. ResNet-50's layers against the spmm kernels (bench/spmm_bench.cc, one
  // thread, Zen 4, two alternated rounds): at 70-90% 1.1-2.1x faster, at 95% the 3x3 layers
  // 1.0-1.14x slower (the 1x1 ones 0.9-1.2x).
  const double per_load = static_cast<double>(a.nnz()) /
                          static_cast<double>(std::max<int64_t>(1, a.rows() * a.depth())) *
                          static_cast<double>(std::min(a.rows(), kSpmmJitRows));
  if (per_load < kMinNonZerosPerLoad) return nullptr;
  // At least 7 bytes per non-zero: stop before building code that could not fit.
  if (7 * a.nnz() > core_caches().l2) return nullptr;
  const std::vector<int64_t> packed =
      b_row_offsets.empty() ? packed_b_row_offsets(a) : std::vector<int64_t>{};
  const std::span<const int64_t> layout = b_row_offsets.empty() ? packed : b_row_offsets;
  // Each B row's address is a displacement in the code: it and the vector after it must fit in
  // 32 bits.
  for (const int64_t offset : layout) {
    if (offset < 0 || offset > (int64_t{INT32_MAX} - 128) / 4) return nullptr;
  }
  Assembler as;
  std::shared_ptr<SpmmJit> jit(new SpmmJit);
  jit->rows_ = a.rows();
  for (int64_t row0 = 0; row0 < a.rows(); row0 += kSpmmJitRows) {
    jit->block_entry_.push_back(as.size());
    emit_block(as, a, layout, row0, static_cast<int>(std::min(kSpmmJitRows, a.rows() - row0)),
               jit->values_, jit->reads_pairs_);
  }
  // Code that outgrows the core's L2 streams from L3 for every chunk of columns, slower than the
  // spmm kernels read their non-zeros (8 bytes each, against 10-14 here): ResNet-50 90%'s 7x7
  // layers (1.2-2.5 MiB of code each) ran 1.3-1.5x slower with it at batch 16 (depth-wise, 2
  // threads, Zen 4), its layer 3 (0.3-0.65 MiB) up to 1.4x faster.
  if (static_cast<int64_t>(as.size()) > core_caches().l2) return nullptr;
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t size = std::max<std::size_t>(page, (as.size() + page - 1) / page * page);
  void* code = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (code == MAP_FAILED) return nullptr;
  std::memcpy(code, as.code.data(), as.size());
  if (mprotect(code, size, PROT_READ | PROT_EXEC) != 0) {
    munmap(code, size);
    return nullptr;
  }
  jit->code_ = code;
  jit->size_ = size;
  jit->code_bytes_ = as.size();
  return jit;
}

SpmmJit::~SpmmJit() {
  if (code_ != nullptr) munmap(code_, size_);
}

bool SpmmJit::handles(const Epilogue& e) {
  return e.col_bias == nullptr && e.pre_residual != Activation::kGelu &&
         e.post_residual != Activation::kGelu;
}

void SpmmJit::run(const SparseMatrix& a, const int32_t* offsets, int64_t row_begin, int64_t row_end,
                  const float* src, int64_t n, float* dst, int64_t ldd,
                  const Epilogue& epilogue) const {
  if (n <= 0 || row_begin >= row_end) return;
  const auto blocks = static_cast<int64_t>(block_entry_.size());
  const int64_t first = (row_begin + kSpmmJitRows - 1) / kSpmmJitRows;
  const int64_t last = row_end == rows_ ? blocks : row_end / kSpmmJitRows;
  if (!handles(epilogue) || first >= last) {
    spmm(a, offsets, row_begin, row_end, src, n, dst, ldd, epilogue);
    return;
  }
  const int64_t jit_begin = first * kSpmmJitRows, jit_end = std::min(last * kSpmmJitRows, rows_);
  if (row_begin < jit_begin) {
    spmm(a, offsets, row_begin, jit_begin, src, n, dst, ldd, epilogue);
  }
  if (jit_end < row_end) {
    const int64_t skip = jit_end - row_begin;
    Epilogue later = epilogue;
    move_epilogue_to(epilogue, skip, 0, later);
    spmm(a, offsets, jit_end, row_end, src, n, dst + skip * ldd, ldd, later);
  }

  JitCall call{};
  call.values = values_.data();
  call.ldd_bytes = ldd * static_cast<int64_t>(sizeof(float));
  call.residual_ld_bytes = epilogue.residual_ld * static_cast<int64_t>(sizeof(float));
  call.clip_min = epilogue.clip_min;
  call.clip_max = epilogue.clip_max;
  call.pre = static_cast<uint8_t>(epilogue.pre_residual);
  call.post = static_cast<uint8_t>(epilogue.post_residual);
  constexpr int64_t kLanes = 16;
  for (int64_t c0 = 0; c0 < n; c0 += kChunkColumns) {
    const int64_t c1 = std::min(n, c0 + kChunkColumns);
    for (int64_t b = first; b < last; ++b) {
      const int64_t skip = b * kSpmmJitRows - row_begin;
      call.bias = epilogue.row_bias != nullptr ? epilogue.row_bias + skip : nullptr;
      const auto fn = reinterpret_cast<void (*)(const JitCall*)>(
          static_cast<char*>(code_) + block_entry_[static_cast<std::size_t>(b)]);
      for (int64_t col = c0; col < c1; col += kLanes) {
        set_column_masks(std::min(kLanes, n - col), call);
        call.src = src + col;
        call.dst = dst + skip * ldd + col;
        call.residual = epilogue.residual != nullptr
                            ? epilogue.residual + skip * epilogue.residual_ld + col
                            : nullptr;
        fn(&call);
      }
    }
  }
}

}  // namespace sparsecol::kernels
