// Built instead of the CUDA backend when the CUDA toolkit was not found (SPARSECOL_CUDA=AUTO)
// or was turned off: the cuda schedules are refused with the reason.
#include "backends/cuda/cuda_backend.h"
#include "runtime/executor.h"

namespace sparsecol::runtime {

std::string cuda_unavailable_reason() {
  return "the cuda schedules need a build with the CUDA toolkit (this one was configured "
         "without it: SPARSECOL_CUDA=OFF, or nvcc, the CUDA libraries or cuDNN not found)";
}

std::unique_ptr<Executor> make_cuda_executor(graph::Graph, const Options&) {
  throw Error(ErrorCode::kUnsupported, cuda_unavailable_reason());
}

}  // namespace sparsecol::runtime
