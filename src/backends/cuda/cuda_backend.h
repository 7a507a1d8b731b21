// What the rest of the project may ask the CUDA backend besides make_cuda_executor()
// (runtime/executor.h). No CUDA header: this is included by tests and by builds without CUDA.
#pragma once

#include <string>

namespace sparsecol::runtime {

// Empty when the cuda schedules can run here; otherwise why not, exactly as the Error that
// make_cuda_executor() throws says it: "no CUDA device: <CUDA's error string>" on a machine
// without a usable GPU, or that the build has no CUDA backend.
std::string cuda_unavailable_reason();

}  // namespace sparsecol::runtime
