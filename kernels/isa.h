// Which instruction-set path the kernels may use, decided once per process.
//
// Three tiers, best first: AVX-512 (CPUID: AVX512F, BW, VL, DQ; XGETBV: opmask and zmm state
// enabled in XCR0), AVX2 + FMA (CPUID: AVX2, FMA; XGETBV: ymm state), and the portable x86-64-v2
// baseline. Both the CPU and the OS must agree, as ONNX Runtime checks.
// SPARSECOL_MAX_ISA=portable|avx2|avx512 caps the choice so every lower path is testable on a
// machine that has a higher one. Ordered: a higher value may run every lower one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sparsecol::kernels {

enum class Isa { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };

const char* to_string(Isa isa);
// The best ISA this CPU and OS support, capped by SPARSECOL_MAX_ISA (read once).
Isa active_isa();
// Why the active ISA is what it is, e.g. "avx512: CPU has AVX512F/BW/VL/DQ, OS saves zmm state".
std::string isa_reason();
// Whether this process may run `isa`: it is the active ISA or a lower one.
bool isa_available(Isa isa);
// The ISA a kernel family runs when a caller asks for `requested`: the best one that is no
// higher than `requested` and that this process may run (the lower of the two, the tiers being
// ordered).
Isa effective_isa(Isa requested);
// Every ISA this process may run, best first (tests and benchmarks sweep them).
std::vector<Isa> runnable_isas();
// Floats per vector register on `isa`'s path (zmm, ymm, and the portable path's xmm).
constexpr int64_t vector_floats(Isa isa) {
  return isa == Isa::kAvx512 ? 16 : isa == Isa::kAvx2 ? 8 : 4;
}

// One core's data caches in bytes as the OS reports them (glibc reads CPUID), read once: Zen 3
// has 32 KiB L1d and 512 KiB L2, Zen 5 48 KiB and 1 MiB. Where the OS says nothing, Zen 3's.
// The kernels size their blocks from these; the depth-wise planner reads hwloc instead.
struct CoreCaches {
  int64_t l1d = 32 * 1024;
  int64_t l2 = 512 * 1024;
};
const CoreCaches& core_caches();

}  // namespace sparsecol::kernels
