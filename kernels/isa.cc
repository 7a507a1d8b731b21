// ISA selection: CPUID says what the CPU implements, XGETBV says what the OS saves on a context
// switch. Both are needed for AVX-512 (ONNX Runtime checks the same way): a CPU with AVX512F under
// an OS that does not save the opmask and zmm registers would corrupt them.
#include "isa.h"

#include <cpuid.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace sparsecol::kernels {
namespace {

struct IsaChoice {
  Isa isa = Isa::kPortable;
  std::string reason;
};

// XCR0 bits the OS sets when it saves the state: 1 SSE, 2 AVX (ymm upper halves), 5 opmask,
// 6 upper halves of zmm0-15, 7 zmm16-31 (Intel SDM vol. 1, 13.3).
constexpr uint64_t kXcr0AvxState = (1u << 1) | (1u << 2);
constexpr uint64_t kXcr0Avx512State = kXcr0AvxState | (1u << 5) | (1u << 6) | (1u << 7);

uint64_t read_xcr0() {
  uint32_t eax = 0, edx = 0;
  // XGETBV with ECX = 0 reads XCR0; written as asm so this file needs no -mxsave.
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

// Why AVX-512 can or cannot be used; `ok` says which.
std::string probe_avx512(bool* ok) {
  *ok = false;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return "CPUID leaf 1 unavailable";
  if (!(ecx & bit_OSXSAVE)) return "OS does not enable XSAVE (CPUID.1:ECX.OSXSAVE = 0)";
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return "CPUID leaf 7 unavailable";
  std::string missing;
  if (!(ebx & bit_AVX512F)) missing += " AVX512F";
  if (!(ebx & bit_AVX512BW)) missing += " AVX512BW";
  if (!(ebx & bit_AVX512VL)) missing += " AVX512VL";
  if (!(ebx & bit_AVX512DQ)) missing += " AVX512DQ";
  if (!missing.empty()) return "CPU lacks" + missing;
  const uint64_t xcr0 = read_xcr0();
  if ((xcr0 & kXcr0Avx512State) != kXcr0Avx512State) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "OS does not save zmm/opmask state (XCR0 = 0x%llx)",
                  static_cast<unsigned long long>(xcr0));
    return buf;
  }
  *ok = true;
  return "CPU has AVX512F/BW/VL/DQ, OS saves zmm state";
}

// Why AVX2 + FMA can or cannot be used; `ok` says which.
std::string probe_avx2(bool* ok) {
  *ok = false;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return "CPUID leaf 1 unavailable";
  if (!(ecx & bit_OSXSAVE)) return "OS does not enable XSAVE (CPUID.1:ECX.OSXSAVE = 0)";
  const bool fma = (ecx & bit_FMA) != 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return "CPUID leaf 7 unavailable";
  std::string missing;
  if (!(ebx & bit_AVX2)) missing += " AVX2";
  if (!fma) missing += " FMA";
  if (!missing.empty()) return "CPU lacks" + missing;
  if ((read_xcr0() & kXcr0AvxState) != kXcr0AvxState) return "OS does not save ymm state";
  *ok = true;
  return "CPU has AVX2/FMA, OS saves ymm state";
}

// SPARSECOL_MAX_ISA as an ISA; `known` false for an unset or unrecognized value.
Isa isa_cap(const char* cap, bool* known) {
  *known = true;
  if (cap != nullptr && std::strcmp(cap, "portable") == 0) return Isa::kPortable;
  if (cap != nullptr && std::strcmp(cap, "avx2") == 0) return Isa::kAvx2;
  if (cap != nullptr && std::strcmp(cap, "avx512") == 0) return Isa::kAvx512;
  *known = false;
  return Isa::kAvx512;
}

IsaChoice choose_isa() {
  IsaChoice choice;
  bool avx512 = false, avx2 = false;
  const std::string probe512 = probe_avx512(&avx512);
  const std::string probe2 = probe_avx2(&avx2);
  const char* cap_text = std::getenv("SPARSECOL_MAX_ISA");
  bool cap_known = false;
  const Isa cap = isa_cap(cap_text, &cap_known);
  if (avx512 && cap >= Isa::kAvx512) {
    choice.isa = Isa::kAvx512;
    choice.reason = "avx512: " + probe512;
  } else if (avx2 && cap >= Isa::kAvx2) {
    choice.isa = Isa::kAvx2;
    choice.reason =
        "avx2: " + probe2 +
        (avx512 ? "; avx512 capped by SPARSECOL_MAX_ISA" : "; avx512 unavailable: " + probe512);
  } else {
    choice.reason = std::string("portable: ") +
                    (avx2 ? "avx2 capped by SPARSECOL_MAX_ISA" : "avx2 unavailable: " + probe2) +
                    (avx512 ? "" : "; avx512 unavailable: " + probe512);
  }
  if (cap_text != nullptr && !cap_known) {
    choice.reason += std::string("; SPARSECOL_MAX_ISA='") + cap_text +
                     "' ignored (expected portable, avx2 or avx512)";
  }
  const char* verbose = std::getenv("SPARSECOL_VERBOSE");
  if (verbose != nullptr && std::strcmp(verbose, "0") != 0 && verbose[0] != '\0') {
    std::fprintf(stderr, "sparsecol: isa %s\n", choice.reason.c_str());
  }
  return choice;
}

const IsaChoice& isa_choice() {
  static const IsaChoice choice = choose_isa();  // thread-safe, once per process
  return choice;
}

}  // namespace

const char* to_string(Isa isa) {
  switch (isa) {
    case Isa::kPortable:
      return "portable";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

bool isa_available(Isa isa) { return static_cast<int>(isa) <= static_cast<int>(active_isa()); }

Isa effective_isa(Isa requested) { return isa_available(requested) ? requested : active_isa(); }

std::vector<Isa> runnable_isas() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2, Isa::kPortable}) {
    if (isa_available(isa)) isas.push_back(isa);
  }
  return isas;
}

Isa active_isa() { return isa_choice().isa; }

std::string isa_reason() { return isa_choice().reason; }

const CoreCaches& core_caches() {
  static const CoreCaches caches = [] {
    CoreCaches c;
    if (const long l1d = sysconf(_SC_LEVEL1_DCACHE_SIZE); l1d > 0) c.l1d = l1d;
    if (const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE); l2 > 0) c.l2 = l2;
    return c;
  }();
  return caches;
}

}  // namespace sparsecol::kernels
