// The GEMM driver: ISA dispatch, packing of A, and cache blocking around a micro-kernel.
//
// Loop nest (BLIS order): N blocks of NC columns > K blocks of KC > M blocks of MC rows >
// NR-wide strips of B > MR-row panels of A > micro-kernel. The KC x NR strip of B stays in L1
// while every A panel of the M block streams past it; the MC x KC block of A stays in L2 while
// the strips of the N block go by; the KC x NC block of B stays in L2 across the M blocks.
#include "f32-gemm/gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "f32-gemm/ukernels.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol::kernels {
namespace {

constexpr GemmUkernel kUkernels[] = {
#define SPARSECOL_UKERNEL_ENTRY(name, isa, mr, nr) {#name, isa, mr, nr, &name},
    SPARSECOL_F32_GEMM_UKERNELS(SPARSECOL_UKERNEL_ENTRY)
#undef SPARSECOL_UKERNEL_ENTRY
};

// Cache budgets (Zen 5: 48 KiB L1d, 1 MiB L2 per core), in bytes, with room left for C, the
// epilogue operands and the other buffers of the tile.
constexpr int64_t kL1Budget = 32 * 1024;    // one KC x NR strip of B
constexpr int64_t kL2BudgetA = 256 * 1024;  // one MC x KC block of A
constexpr int64_t kL2BudgetB = 512 * 1024;  // one KC x NC block of B

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The epilogue as seen from the tile at (row, col): its pointers moved to the tile's origin.
Epilogue epilogue_at(const Epilogue& e, int64_t row, int64_t col) {
  Epilogue t = e;
  if (t.row_bias != nullptr) t.row_bias += row;
  if (t.col_bias != nullptr) t.col_bias += col;
  if (t.residual != nullptr) t.residual += row * t.residual_ld + col;
  return t;
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

void pack_a_panels(const float* a, int64_t m, int64_t k, int64_t lda, int mr, float* dst) {
  for (int64_t row0 = 0; row0 < m; row0 += mr) {
    const int64_t rows = std::min<int64_t>(mr, m - row0);
    for (int64_t p = 0; p < k; ++p) {
      for (int64_t i = 0; i < rows; ++i) dst[i] = a[(row0 + i) * lda + p];
      for (int64_t i = rows; i < mr; ++i) dst[i] = 0.0f;
      dst += mr;
    }
  }
}

void gemm_packed_with_ukernel(const GemmUkernel& ukernel, const float* packed_a, int64_t m,
                              int64_t k, const float* b, int64_t ldb, float* c, int64_t ldc,
                              int64_t n, const Epilogue& epilogue) {
  if (m <= 0 || n <= 0) return;
  const int64_t mr = ukernel.mr, nr = ukernel.nr;
  // KC: the B strip fits L1; split K evenly so that no block is a sliver.
  const int64_t kc_max = std::max<int64_t>(64, kL1Budget / (nr * 4));
  const int64_t k_blocks = std::max<int64_t>(1, ceil_div(k, kc_max));
  const int64_t kc = ceil_div(k, k_blocks);
  const int64_t mc = std::max<int64_t>(mr, kL2BudgetA / (kc * 4 + 1) / mr * mr);
  const int64_t nc = std::max<int64_t>(nr, kL2BudgetB / (kc * 4 + 1) / nr * nr);

  GemmUkernelArgs args;
  args.ldb = ldb;
  args.ldc = ldc;
  for (int64_t n0 = 0; n0 < n; n0 += nc) {
    const int64_t n1 = std::min(n, n0 + nc);
    for (int64_t kb = 0; kb < k_blocks; ++kb) {
      const int64_t k0 = std::min(k, kb * kc);
      const int64_t k1 = std::min(k, k0 + kc);
      const bool last = kb + 1 == k_blocks;
      args.k = k1 - k0;
      args.accumulate = kb > 0;
      for (int64_t m0 = 0; m0 < m; m0 += mc) {
        const int64_t m1 = std::min(m, m0 + mc);
        for (int64_t j = n0; j < n1; j += nr) {
          args.n = std::min(nr, n1 - j);
          args.b = b + k0 * ldb + j;
          for (int64_t i = m0; i < m1; i += mr) {
            args.m = std::min(mr, m1 - i);
            args.a = packed_a + i * k + k0 * mr;  // panel i / mr starts at (i / mr) * mr * k
            args.c = c + i * ldc + j;
            Epilogue tile_epilogue;
            if (last) tile_epilogue = epilogue_at(epilogue, i, j);
            args.epilogue = last ? &tile_epilogue : nullptr;
            ukernel.fn(args);
          }
        }
      }
    }
  }
}

void gemm_with_ukernel(const GemmUkernel& ukernel, const GemmShape& shape, const float* a,
                       int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                       const Epilogue& epilogue, std::vector<float>& scratch) {
  require_available(ukernel.isa);
  if (shape.m <= 0 || shape.n <= 0) return;
  const int64_t size = packed_a_size(shape.m, shape.k, ukernel.mr);
  if (static_cast<int64_t>(scratch.size()) < size) scratch.resize(size);
  pack_a_panels(a, shape.m, shape.k, lda, ukernel.mr, scratch.data());
  gemm_packed_with_ukernel(ukernel, scratch.data(), shape.m, shape.k, b, ldb, c, ldc, shape.n,
                           epilogue);
}

PackedA::PackedA(const float* a, int64_t m, int64_t k, int64_t lda)
    : PackedA(a, m, k, lda, active_isa()) {}

PackedA::PackedA(const float* a, int64_t m, int64_t k, int64_t lda, Isa isa)
    : m_(m), k_(k), isa_(isa) {
  require_available(isa);
  const GemmUkernel& ukernel = default_gemm_ukernel(isa);
  const int64_t size = std::max<int64_t>(1, packed_a_size(m, k, ukernel.mr));
  data_ = std::shared_ptr<float[]>(new float[size]());
  pack_a_panels(a, m, k, lda, ukernel.mr, data_.get());
}

void gemm_packed(const PackedA& a, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t n,
                 const Epilogue& epilogue) {
  gemm_packed_with_ukernel(default_gemm_ukernel(a.isa()), a.data(), a.rows(), a.depth(), b, ldb, c,
                           ldc, n, epilogue);
}

void gemm(const GemmShape& shape, const float* a, int64_t lda, const float* b, int64_t ldb,
          float* c, int64_t ldc, const Epilogue& epilogue, std::vector<float>& scratch) {
  gemm_with_ukernel(default_gemm_ukernel(active_isa()), shape, a, lda, b, ldb, c, ldc, epilogue,
                    scratch);
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
