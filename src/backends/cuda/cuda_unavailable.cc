// Built instead of the CUDA backend when the CUDA toolkit was not found (SPARSECOL_CUDA=AUTO)
// or was turned off: the cuda schedules are refused with the reason.
#include "runtime/executor.h"

namespace sparsecol::runtime {

std::unique_ptr<Executor> make_cuda_executor(graph::Graph, const Options&) {
  throw Error(ErrorCode::kUnsupported,
              "the cuda schedules need a build with the CUDA toolkit (this one was configured "
              "without it: SPARSECOL_CUDA=OFF or nvcc not found)");
}

}  // namespace sparsecol::runtime
