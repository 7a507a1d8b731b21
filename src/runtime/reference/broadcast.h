// Numpy-style broadcasting of two Tensors into a third: the Tensor-level face of the one
// broadcast iterator (kernels/reference/elementwise.h), for the reference ops and for the
// executors' epilogues (a bias or residual Add broadcast over an op's output).
#pragma once

#include <array>
#include <cstdint>

#include "reference/elementwise.h"
#include "sparsecol/sparsecol.h"

namespace sparsecol::runtime {

// out[i] = f(a[ia], b[ib]) for every element i of `out`, where ia and ib are the elements of
// a and b that numpy broadcasting pairs with i. `out` must already have the broadcast shape;
// it may be `a` itself when a has that shape (in-place, e.g. `out += bias`), since each
// element is read before it is written and by no other element.
// Throws Error(kShapeMismatch) if a or b does not broadcast to out's shape, and
// Error(kDtypeMismatch) if a tensor's element type is not A, B or Out respectively.
//
//   broadcast_binary<float>(out, bias, out, [](float x, float b) { return x + b; });
template <typename A, typename B = A, typename Out = A, typename Fn>
void broadcast_binary(const Tensor& a, const Tensor& b, Tensor& out, Fn&& f) {
  const A* a_data = a.data<A>();
  const B* b_data = b.data<B>();
  Out* out_data = out.data<Out>();
  kernels::reference::for_each_broadcast<2>(
      out.shape(), {kernels::reference::Dims(a.shape()), kernels::reference::Dims(b.shape())},
      [&](int64_t i, const std::array<int64_t, 2>& at) {
        out_data[i] = f(a_data[at[0]], b_data[at[1]]);
      });
}

}  // namespace sparsecol::runtime
