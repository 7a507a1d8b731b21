// kernels::PackedRecurrent (RNN, GRU, LSTM on the GEMM) against the double reference
// (kernels/reference/recurrent.h) on randomized problems: every cell, one direction forward or
// reverse or both, both layouts, sequence lengths from 0 to the whole sequence, initial states
// or none, biases or none, peepholes, input_forget, clip, both reset placements of GRU, and the
// activation functions with vectorized (Sigmoid, Tanh, Relu) and scalar (the rest) paths. Sizes
// are odd so that no row is a whole number of vectors or GEMM strips, and batch entries run in
// blocks of random sizes, as a step's tasks cut them. Y starts as NaN, so that an element the
// kernel fails to write (the zeros past a sequence's end included) cannot pass.
//
// Tolerance: 1e-5 * (1 + the largest magnitude of each output): float products of at most ~40
// terms of magnitude <= 0.5 against double ones, through at most 7 steps of contracting gates.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "f32-rnn/recurrent.h"
#include "per_isa_test.h"
#include "reference/recurrent.h"

namespace sparsecol::kernels {
namespace {

using reference::RecurrentCell;
using reference::RnnActivation;

std::vector<float> uniform(std::size_t n, std::mt19937& rng, float bound) {
  std::uniform_real_distribution<float> value(-bound, bound);
  std::vector<float> v(n);
  for (float& x : v) x = value(rng);
  return v;
}

// One random problem: its shape and operands, with the reference's outputs.
struct Problem {
  reference::RecurrentShape shape;
  std::vector<float> x, w, r, b, p, initial_h, initial_c;
  std::vector<int32_t> lens;

  reference::RecurrentOperands operands() const {
    reference::RecurrentOperands o;
    o.x = x.data();
    o.w = w.data();
    o.r = r.data();
    o.b = b.empty() ? nullptr : b.data();
    o.p = p.empty() ? nullptr : p.data();
    o.sequence_lens = lens.empty() ? nullptr : lens.data();
    o.initial_h = initial_h.empty() ? nullptr : initial_h.data();
    o.initial_c = initial_c.empty() ? nullptr : initial_c.data();
    return o;
  }
  int64_t y_size() const {
    return shape.seq_length * shape.directions * shape.batch * shape.hidden_size;
  }
  int64_t state_size() const { return shape.directions * shape.batch * shape.hidden_size; }
};

Problem random_problem(RecurrentCell cell, std::mt19937& rng) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  auto coin = [&] { return pick(0, 1) == 1; };
  Problem pb;
  reference::RecurrentShape& s = pb.shape;
  s.cell = cell;
  s.seq_length = pick(1, 7);
  s.batch = pick(1, 9);
  s.input_size = pick(1, 21);
  s.hidden_size = pick(1, 19);
  const int64_t mode = pick(0, 2);  // forward, reverse, bidirectional
  s.directions = mode == 2 ? 2 : 1;
  s.reverse = mode == 1;
  s.batch_major = coin();
  s.linear_before_reset = cell == RecurrentCell::kGru && coin();
  s.input_forget = cell == RecurrentCell::kLstm && pick(0, 3) == 0;
  s.clip = pick(0, 2) == 0 ? 0.7f : 0.0f;
  // Half the problems run the default functions (vectorized); the rest draw any of them.
  const int64_t per_direction = reference::activation_count(cell);
  const bool defaults = coin();
  using Kind = RnnActivation::Kind;
  for (int64_t d = 0; d < s.directions; ++d) {
    for (int64_t k = 0; k < per_direction; ++k) {
      RnnActivation a;
      if (defaults) {
        a.kind = k == 0 && cell != RecurrentCell::kRnn ? Kind::kSigmoid : Kind::kTanh;
      } else {
        a.kind = static_cast<Kind>(pick(0, static_cast<int64_t>(Kind::kSoftplus)));
        a.alpha = 0.5f;
        a.beta = 0.25f;
      }
      s.activations.push_back(a);
    }
  }
  const auto gh = static_cast<std::size_t>(reference::gate_count(cell) * s.hidden_size);
  const auto dirs = static_cast<std::size_t>(s.directions);
  const auto in = static_cast<std::size_t>(s.input_size);
  const auto hidden = static_cast<std::size_t>(s.hidden_size);
  const auto state = dirs * static_cast<std::size_t>(s.batch) * hidden;
  pb.x = uniform(static_cast<std::size_t>(s.seq_length * s.batch) * in, rng, 1.0f);
  pb.w = uniform(dirs * gh * in, rng, 0.5f);
  pb.r = uniform(dirs * gh * hidden, rng, 0.5f);
  if (coin()) pb.b = uniform(dirs * 2 * gh, rng, 0.5f);
  if (cell == RecurrentCell::kLstm && coin()) pb.p = uniform(dirs * 3 * hidden, rng, 0.5f);
  if (coin()) {
    pb.initial_h = uniform(state, rng, 1.0f);
    if (cell == RecurrentCell::kLstm) pb.initial_c = uniform(state, rng, 1.0f);
  }
  if (coin()) {
    for (int64_t i = 0; i < s.batch; ++i) {
      // The ends (0 and the whole sequence) at least as often as any length between.
      const int64_t draw = pick(-1, s.seq_length + 1);
      pb.lens.push_back(static_cast<int32_t>(std::clamp<int64_t>(draw, 0, s.seq_length)));
    }
  }
  return pb;
}

std::string describe(const reference::RecurrentShape& s) {
  const char* cells[] = {"RNN", "GRU", "LSTM"};
  return std::string(cells[static_cast<int>(s.cell)]) + " steps " + std::to_string(s.seq_length) +
         " batch " + std::to_string(s.batch) + " input " + std::to_string(s.input_size) +
         " hidden " + std::to_string(s.hidden_size) + " directions " +
         std::to_string(s.directions) + (s.reverse ? " reverse" : "") +
         (s.batch_major ? " layout 1" : "") + (s.linear_before_reset ? " lbr" : "") +
         (s.input_forget ? " input_forget" : "") + (s.clip > 0.0f ? " clip" : "") +
         " first activation " + std::to_string(static_cast<int>(s.activations[0].kind));
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  float largest = 0.0f;
  for (float v : want) largest = std::max(largest, std::abs(v));
  const float tolerance = 1e-5f * (1.0f + largest);
  for (std::size_t i = 0; i < want.size(); ++i) {
    ASSERT_LE(std::abs(got[i] - want[i]), tolerance)
        << what << "[" << i << "]: " << got[i] << " against the reference's " << want[i];
  }
}

using RecurrentKernelTest = testing::PerIsaTest;
SPARSECOL_EVERY_ISA(RecurrentKernelTest);

TEST_P(RecurrentKernelTest, MatchesReferenceOnRandomProblems) {
  std::mt19937 rng(20261127);
  for (RecurrentCell cell : {RecurrentCell::kRnn, RecurrentCell::kGru, RecurrentCell::kLstm}) {
    for (int trial = 0; trial < 60; ++trial) {
      const Problem pb = random_problem(cell, rng);
      SCOPED_TRACE(describe(pb.shape));
      const auto y_size = static_cast<std::size_t>(pb.y_size());
      const auto state_size = static_cast<std::size_t>(pb.state_size());
      std::vector<float> y_ref(y_size), h_ref(state_size), c_ref(state_size);
      reference::RecurrentOperands ref = pb.operands();
      ref.y = y_ref.data();
      ref.y_h = h_ref.data();
      ref.y_c = cell == RecurrentCell::kLstm ? c_ref.data() : nullptr;
      reference::recurrent_reference(pb.shape, ref);

      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> y(y_size, nan), h(state_size, nan), c(state_size, nan);
      reference::RecurrentOperands o = pb.operands();
      o.y = y.data();
      o.y_h = h.data();
      o.y_c = cell == RecurrentCell::kLstm ? c.data() : nullptr;
      const PackedRecurrent kernel(pb.shape, pb.w.data(), pb.r.data(),
                                   pb.b.empty() ? nullptr : pb.b.data(),
                                   pb.p.empty() ? nullptr : pb.p.data(), GetParam());
      std::vector<float> buffers, gemm_scratch;
      for (int64_t d = 0; d < pb.shape.directions; ++d) {
        for (int64_t b0 = 0; b0 < pb.shape.batch;) {
          const int64_t b1 = std::uniform_int_distribution<int64_t>(b0 + 1, pb.shape.batch)(rng);
          kernel.run(o, d, b0, b1, buffers, gemm_scratch);
          b0 = b1;
        }
      }
      expect_close(y, y_ref, "Y");
      expect_close(h, h_ref, "Y_h");
      if (cell == RecurrentCell::kLstm) expect_close(c, c_ref, "Y_c");
      if (HasFatalFailure()) return;
    }
  }
}

}  // namespace
}  // namespace sparsecol::kernels
