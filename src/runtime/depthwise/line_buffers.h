// Rolling line buffers: what a thread that runs tile t+1 of an image right after tile t keeps
// of each op's tile buffer instead of recomputing it (the overlap of the two tiles' halos).
#pragma once

#include <algorithm>

#include "plan/tile_plan.h"

namespace sparsecol::runtime::depthwise {

// The rows of an op's output that one tile computed (`previous`) and the next one (`current`)
// needs again: a prefix of `current`, when `current` starts inside `previous` and ends at or
// after it (the tile algebra is monotone in the tile, so it does whenever both are non-empty);
// empty otherwise, and the next tile computes all its rows.
inline plan::RowRange kept_rows(plan::RowRange previous, plan::RowRange current) {
  if (previous.empty() || current.empty() || current.begin < previous.begin ||
      current.end < previous.end) {
    return {};
  }
  return {current.begin, std::min(previous.end, current.end)};
}

}  // namespace sparsecol::runtime::depthwise
