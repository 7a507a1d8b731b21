// cuBLASLt and cuSPARSE, opened with dlopen at the first use of a cuda schedule instead of
// being linked. Linked, the dynamic loader maps and relocates them at the start of every
// process that links sparsecol, used or not: measured on this machine, a trivial program
// starts in 18 ms, 382 ms linked to libcublasLt.so.13 (540 MB) and 971 ms linked to cuBLASLt,
// cuSPARSE, cuDNN and the CUDA runtime together; the CLI and every test executable would pay
// that. The CUDA runtime and cuDNN (which opens its own sub-libraries lazily) stay linked: they
// cost nothing measurable at start.
//
// Each function is called through a pointer of its own declared type (decltype of the header's
// declaration), so a call is checked by the compiler exactly like a direct one.
#pragma once

#include <cublasLt.h>
#include <cusparse.h>

#include <string>

namespace sparsecol::cuda {

// clang-format off
// The functions used, one per line.
#define SPARSECOL_CUBLASLT_FUNCTIONS(X)   \
  X(cublasLtCreate)                       \
  X(cublasLtDestroy)                      \
  X(cublasLtGetStatusString)              \
  X(cublasLtMatmulDescCreate)             \
  X(cublasLtMatmulDescDestroy)            \
  X(cublasLtMatmulDescSetAttribute)       \
  X(cublasLtMatrixLayoutCreate)           \
  X(cublasLtMatrixLayoutDestroy)          \
  X(cublasLtMatrixLayoutSetAttribute)     \
  X(cublasLtMatmulPreferenceCreate)       \
  X(cublasLtMatmulPreferenceDestroy)      \
  X(cublasLtMatmulPreferenceSetAttribute) \
  X(cublasLtMatmulAlgoGetHeuristic)       \
  X(cublasLtMatmul)

#define SPARSECOL_CUSPARSE_FUNCTIONS(X) \
  X(cusparseCreate)                     \
  X(cusparseDestroy)                    \
  X(cusparseSetStream)                  \
  X(cusparseGetErrorString)             \
  X(cusparseCreateCsr)                  \
  X(cusparseDestroySpMat)               \
  X(cusparseCreateDnMat)                \
  X(cusparseDestroyDnMat)               \
  X(cusparseSpMM_bufferSize)            \
  X(cusparseSpMM)
// clang-format on

struct Libraries {
#define SPARSECOL_CUDA_POINTER(name) decltype(&::name) name = nullptr;
  SPARSECOL_CUBLASLT_FUNCTIONS(SPARSECOL_CUDA_POINTER)
  SPARSECOL_CUSPARSE_FUNCTIONS(SPARSECOL_CUDA_POINTER)
#undef SPARSECOL_CUDA_POINTER
};

// Empty when both libraries and every function were found (opening them at the first call);
// otherwise "cannot load <library>: <dlerror>".
const std::string& libraries_problem();
// The loaded functions; throws Error(kUnsupported, libraries_problem()) when they are missing.
const Libraries& libraries();

}  // namespace sparsecol::cuda
