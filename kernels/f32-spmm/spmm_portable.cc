// f32_spmm_32x1__portable: the body of spmm_impl.h compiled for this ISA (see spmm.h for the tile).
#include "f32-spmm/spmm_impl.h"

namespace sparsecol::kernels {

static_assert(kTile == 32, "the tile in SPARSECOL_F32_SPMM_UKERNELS must match the vector width");

void f32_spmm_32x1__portable(const SpmmArgs& args) { spmm_region(args); }

}  // namespace sparsecol::kernels
