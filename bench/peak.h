// The measured FMA peak of one core, the denominator of every "fraction of peak" counter.
#pragma once

#include "isa.h"

namespace sparsecol::bench {

// GFLOP/s of one core running independent multiply-adds at `isa`'s widest vector: 16-lane FMA
// for avx512, 4-lane multiply + add for portable (x86-64-v2 has no FMA). Measured once per
// process (best of several runs); 0 when this CPU cannot run `isa`.
double measured_peak_gflops(kernels::Isa isa);

}  // namespace sparsecol::bench
