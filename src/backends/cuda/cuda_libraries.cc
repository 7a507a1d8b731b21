// Opens cuBLASLt and cuSPARSE once per process (see cuda_libraries.h for why not link them).
#include "backends/cuda/cuda_libraries.h"

#include <dlfcn.h>

#include <fmt/format.h>

#include "sparsecol/sparsecol.h"

namespace sparsecol::cuda {

namespace {

struct Loaded {
  Libraries functions;
  std::string problem;
};

// The soname of the major version the headers describe (libcublasLt.so.13 for CUDA 13), found
// the way the dynamic loader finds a linked library: LD_LIBRARY_PATH, the executable's
// RUNPATH (the toolkit's lib folder in a build tree), the system's cache.
void* open_library(const std::string& soname, std::string& problem) {
  if (!problem.empty()) return nullptr;
  // RTLD_LOCAL: their symbols stay out of the global scope; the handles are never closed.
  void* handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) problem = fmt::format("cannot load {}: {}", soname, dlerror());
  return handle;
}

template <typename Pointer>
void find(void* handle, const char* name, Pointer& pointer, std::string& problem) {
  if (handle == nullptr || !problem.empty()) return;
  pointer = reinterpret_cast<Pointer>(dlsym(handle, name));
  if (pointer == nullptr) problem = fmt::format("cannot load {}: {}", name, dlerror());
}

Loaded load() {
  Loaded loaded;
  Libraries& f = loaded.functions;
  std::string& problem = loaded.problem;
  void* lt = open_library(fmt::format("libcublasLt.so.{}", CUBLAS_VER_MAJOR), problem);
#define SPARSECOL_CUDA_FIND(name) find(lt, #name, f.name, problem);
  SPARSECOL_CUBLASLT_FUNCTIONS(SPARSECOL_CUDA_FIND)
#undef SPARSECOL_CUDA_FIND
  void* sparse = open_library(fmt::format("libcusparse.so.{}", CUSPARSE_VER_MAJOR), problem);
#define SPARSECOL_CUDA_FIND(name) find(sparse, #name, f.name, problem);
  SPARSECOL_CUSPARSE_FUNCTIONS(SPARSECOL_CUDA_FIND)
#undef SPARSECOL_CUDA_FIND
  return loaded;
}

const Loaded& loaded() {
  static const Loaded instance = load();  // thread-safe initialization (C++11 magic statics)
  return instance;
}

}  // namespace

const std::string& libraries_problem() { return loaded().problem; }

const Libraries& libraries() {
  const Loaded& l = loaded();
  if (!l.problem.empty()) throw Error(ErrorCode::kUnsupported, l.problem);
  return l.functions;
}

}  // namespace sparsecol::cuda
