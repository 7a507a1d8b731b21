// Which instruction-set path the kernels may use, decided once per process.
//
// AVX-512 needs both the CPU (CPUID: AVX512F, BW, VL, DQ) and the OS (XGETBV: the opmask and
// zmm state enabled in XCR0), as ONNX Runtime checks. SPARSECOL_MAX_ISA=portable forces the
// portable path so every path is testable on an AVX-512 machine.
#pragma once

#include <string>

namespace sparsecol::kernels {

enum class Isa { kPortable = 0, kAvx512 = 1 };

const char* to_string(Isa isa);
// The best ISA this CPU and OS support, capped by SPARSECOL_MAX_ISA (read once).
Isa active_isa();
// Why the active ISA is what it is, e.g. "avx512: CPU has AVX512F/BW/VL/DQ, OS saves zmm state".
std::string isa_reason();

}  // namespace sparsecol::kernels
