// RNN, GRU and LSTM on the GEMM: the ONNX ops with the shapes, operands and semantics of
// reference/recurrent.h, whose structs this kernel takes.
//
// Why: the reference computes each step's two products one batch entry at a time, in double,
// reading all of W and R for every entry and step. Here a sequence's input projections for all
// of its steps are one product (W x_t for every t: M = the sequence's length, W streamed once),
// each step multiplies the hidden states of a block of batch entries by R at once (M = the
// block), and the gates are float passes over rows with the vectorized sigmoid and tanh
// (f32-eltwise). Products and gates are float, so results differ from the reference's double
// sums by float rounding (carried through the recurrence; the tests bound it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "f32-gemm/gemm.h"
#include "isa.h"
#include "reference/recurrent.h"

namespace sparsecol::kernels {

class PackedRecurrent {
 public:
  // Packs W and R of every direction and folds the biases (b, p: nullptr when absent), for
  // `isa` (Error(kInvalidArgument) if this CPU cannot run it). Every size of `shape` positive.
  PackedRecurrent(reference::RecurrentShape shape, const float* w, const float* r, const float* b,
                  const float* p, Isa isa = active_isa());

  const reference::RecurrentShape& shape() const { return shape_; }
  std::string implementation() const;  // e.g. "recurrent-gemm/avx2"

  // Runs direction d (0 or 1) for batch entries [b0, b1): reads o.x, o.sequence_lens (each in
  // [0, seq_length], checked by the caller) and the initial states, writes those entries' parts
  // of o.y (zeros past each sequence's length), o.y_h and o.y_c (any may be nullptr). o.w, o.r,
  // o.b and o.p are not read: the packed copies are. Runs on the calling thread; calls for
  // different (direction, entries) write disjoint memory and may run concurrently. `buffers`
  // and `gemm_scratch`: the calling thread's own, grown as needed.
  void run(const reference::RecurrentOperands& o, int64_t d, int64_t b0, int64_t b1,
           std::vector<float>& buffers, std::vector<float>& gemm_scratch) const;

 private:
  struct Direction {
    PackedB w;                   // W^T: [input_size, gates * hidden]
    PackedB r;                   // R^T: [hidden, gates * hidden]; GRU: gates z and r only
    std::optional<PackedB> r_h;  // GRU: R_h^T [hidden, hidden], applied to h or to r * h
    // Added to the input projections: Wb + Rb, except GRU's candidate gate, where Rb_h goes
    // with R_h (r_h_bias) because linear_before_reset multiplies it by r.
    std::vector<float> bias;
    std::vector<float> r_h_bias;   // GRU: Rb_h
    std::vector<float> peepholes;  // LSTM: P (i, o, f), or empty
  };

  reference::RecurrentShape shape_;
  Isa isa_;
  std::vector<Direction> directions_;
};

}  // namespace sparsecol::kernels
