// Naive reference RNN, GRU and LSTM (ONNX semantics, opsets 7 to 14: layout, both directions,
// sequence_lens, initial states, peepholes, clip, linear_before_reset, input_forget).
//
// Layout (shape.batch_major false, ONNX layout 0): X is [seq_length, batch, input_size], Y is
// [seq_length, directions, batch, hidden], Y_h, Y_c and the initial states [directions, batch,
// hidden]; batch_major (layout 1) puts batch first: X [batch, seq_length, input_size], Y [batch,
// seq_length, directions, hidden], states [batch, directions, hidden]. W is [directions, gates *
// hidden, input_size] and R [directions, gates * hidden, hidden], gates stacked in ONNX's order
// (GRU: z, r, h; LSTM: i, o, f, c); B [directions, 2 * gates * hidden] (W's biases, then R's); P
// [directions, 3 * hidden] (i, o, f). Sums are in double.
#pragma once

#include <cstdint>
#include <vector>

namespace sparsecol::kernels::reference {

enum class RecurrentCell { kRnn, kGru, kLstm };

// Gates per cell (RNN 1, GRU 3, LSTM 4) and activation functions per direction (1, 2, 3).
int64_t gate_count(RecurrentCell cell);
int64_t activation_count(RecurrentCell cell);

// One of the activation functions ONNX's recurrent ops name, with its alpha and beta.
struct RnnActivation {
  enum class Kind {
    kSigmoid,
    kTanh,
    kRelu,
    kAffine,
    kLeakyRelu,
    kThresholdedRelu,
    kScaledTanh,
    kHardSigmoid,
    kElu,
    kSoftsign,
    kSoftplus
  };
  Kind kind = Kind::kTanh;
  float alpha = 0.0f, beta = 0.0f;
  double operator()(double x) const;
};

struct RecurrentShape {
  RecurrentCell cell = RecurrentCell::kRnn;
  int64_t seq_length = 0, batch = 0, input_size = 0, hidden_size = 0;
  int64_t directions = 1;
  bool reverse = false;      // one direction, run from the last step back (direction="reverse")
  bool batch_major = false;  // layout = 1
  bool linear_before_reset = false;  // GRU: apply R_h before the reset gate
  bool input_forget = false;         // LSTM: the forget gate is 1 - the input gate
  float clip = 0.0f;                 // > 0: gate inputs clipped to [-clip, clip]
  // activation_count(cell) per direction, forward's first: RNN f; GRU f, g; LSTM f, g, h.
  std::vector<RnnActivation> activations;
};

// Operands; nullptr for omitted optionals (b, p, initial states: zeros; sequence_lens: every
// sequence is seq_length long, else each 0 <= length <= seq_length, steps past it giving zeros
// in Y and leaving the state as it was) and unused outputs.
struct RecurrentOperands {
  const float *x = nullptr, *w = nullptr, *r = nullptr, *b = nullptr, *p = nullptr;
  const int32_t* sequence_lens = nullptr;
  const float *initial_h = nullptr, *initial_c = nullptr;
  float *y = nullptr, *y_h = nullptr, *y_c = nullptr;
};

void recurrent_reference(const RecurrentShape& shape, const RecurrentOperands& operands);

}  // namespace sparsecol::kernels::reference
