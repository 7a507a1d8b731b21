// ISA selection: CPUID says what the CPU implements, XGETBV says what the OS saves on a context
// switch. Both are needed for AVX-512 (ONNX Runtime checks the same way): a CPU with AVX512F under
// an OS that does not save the opmask and zmm registers would corrupt them.
#include "isa.h"

#include <cpuid.h>

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
constexpr uint64_t kXcr0Avx512State = (1u << 1) | (1u << 2) | (1u << 5) | (1u << 6) | (1u << 7);

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

IsaChoice choose_isa() {
  IsaChoice choice;
  bool avx512 = false;
  const std::string probe = probe_avx512(&avx512);
  const char* cap = std::getenv("SPARSECOL_MAX_ISA");
  if (cap != nullptr && std::strcmp(cap, "portable") == 0) {
    choice.reason = std::string("portable: SPARSECOL_MAX_ISA=portable (avx512 ") +
                    (avx512 ? "available: " : "unavailable: ") + probe + ")";
  } else if (avx512) {
    choice.isa = Isa::kAvx512;
    choice.reason = "avx512: " + probe;
  } else {
    choice.reason = "portable: " + probe;
  }
  if (cap != nullptr && std::strcmp(cap, "portable") != 0 && std::strcmp(cap, "avx512") != 0) {
    choice.reason +=
        std::string("; SPARSECOL_MAX_ISA='") + cap + "' ignored (expected portable or avx512)";
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
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

Isa active_isa() { return isa_choice().isa; }

std::string isa_reason() { return isa_choice().reason; }

}  // namespace sparsecol::kernels
