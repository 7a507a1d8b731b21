#include "f32-rnn/recurrent.h"

#include <algorithm>
#include <utility>

#include "f32-eltwise/eltwise.h"
#include "scratch.h"

namespace sparsecol::kernels {

using reference::RecurrentCell;
using reference::RnnActivation;

namespace {

// m^T of the `rows` x `cols` block at m (rows ld apart), packed as a GEMM B operand.
PackedB pack_transposed(const float* m, int64_t rows, int64_t cols, int64_t ld, Isa isa) {
  std::vector<float> t(static_cast<std::size_t>(rows * cols));
  transpose_2d(m, ld, rows, cols, t.data(), rows);
  return PackedB(t.data(), cols, rows, rows, isa);
}

// v[0, n) = a(v[0, n)): the vectorized kernels for the default functions, the reference's
// scalar ones (in double, rounded) for the rest.
void activate(const RnnActivation& a, float* v, int64_t n, Isa isa) {
  switch (a.kind) {
    case RnnActivation::Kind::kSigmoid:
      return unary_rows(UnaryKind::kSigmoid, v, n, v, n, 1, n, 0.0f, 0.0f, isa);
    case RnnActivation::Kind::kTanh:
      return unary_rows(UnaryKind::kTanh, v, n, v, n, 1, n, 0.0f, 0.0f, isa);
    case RnnActivation::Kind::kRelu:
      return unary_rows(UnaryKind::kRelu, v, n, v, n, 1, n, 0.0f, 0.0f, isa);
    default:
      for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(a(v[i]));
  }
}

// v[0, n) clipped to [-clip, clip] where clip > 0 (ONNX's clip on the gates' inputs).
void clip_to(float* v, int64_t n, float clip) {
  if (clip <= 0.0f) return;
  for (int64_t i = 0; i < n; ++i) v[i] = std::clamp(v[i], -clip, clip);
}

// acc[0, n) += add[0, n), then clipped.
void add_and_clip(float* acc, const float* add, int64_t n, float clip) {
  for (int64_t i = 0; i < n; ++i) acc[i] += add[i];
  clip_to(acc, n, clip);
}

}  // namespace

PackedRecurrent::PackedRecurrent(reference::RecurrentShape shape, const float* w, const float* r,
                                 const float* b, const float* p, Isa isa)
    : shape_(std::move(shape)), isa_(isa) {
  const int64_t hidden = shape_.hidden_size, in = shape_.input_size;
  const int64_t gh = reference::gate_count(shape_.cell) * hidden;
  const bool gru = shape_.cell == RecurrentCell::kGru;
  const int64_t recurrent_cols = gru ? 2 * hidden : gh;
  for (int64_t d = 0; d < shape_.directions; ++d) {
    const float* wd = w + d * gh * in;
    const float* rd = r + d * gh * hidden;
    Direction dir{pack_transposed(wd, gh, in, in, isa),
                  pack_transposed(rd, recurrent_cols, hidden, hidden, isa),
                  std::nullopt,
                  std::vector<float>(static_cast<std::size_t>(gh), 0.0f),
                  {},
                  {}};
    if (gru) dir.r_h = pack_transposed(rd + 2 * hidden * hidden, hidden, hidden, hidden, isa);
    if (b != nullptr) {
      const float* wb = b + d * 2 * gh;
      const float* rb = wb + gh;
      for (int64_t g = 0; g < gh; ++g) {
        dir.bias[static_cast<std::size_t>(g)] = wb[g] + (g < recurrent_cols ? rb[g] : 0.0f);
      }
      if (gru) dir.r_h_bias.assign(rb + 2 * hidden, rb + 3 * hidden);
    }
    if (p != nullptr) dir.peepholes.assign(p + d * 3 * hidden, p + (d + 1) * 3 * hidden);
    directions_.push_back(std::move(dir));
  }
}

std::string PackedRecurrent::implementation() const {
  return std::string("recurrent-gemm/") + to_string(isa_);
}

void PackedRecurrent::run(const reference::RecurrentOperands& o, int64_t d, int64_t b0, int64_t b1,
                          std::vector<float>& buffers, std::vector<float>& gemm_scratch) const {
  const reference::RecurrentShape& s = shape_;
  const Direction& dir = directions_[static_cast<std::size_t>(d)];
  const int64_t hidden = s.hidden_size, in = s.input_size, steps = s.seq_length;
  const int64_t batch = s.batch, dirs = s.directions, rows = b1 - b0;
  const int64_t gh = reference::gate_count(s.cell) * hidden;
  const bool gru = s.cell == RecurrentCell::kGru;
  const int64_t recurrent_cols = gru ? 2 * hidden : gh;
  const RnnActivation* act = s.activations.data() + d * reference::activation_count(s.cell);
  const bool backwards = s.reverse || d == 1;
  if (rows <= 0) return;

  // Per entry: its projections x_t W^T + bias for t < its length ([steps][gh]); per row of the
  // block: the step's recurrent products ([gh]), h, c and GRU's r * h ([hidden] each).
  const int64_t xw_floats = round_up_to_line(steps * gh);
  const int64_t gate_ld = round_up_to_line(gh), state_ld = round_up_to_line(hidden);
  float* xw = aligned_scratch(buffers, rows * (xw_floats + gate_ld + 3 * state_ld));
  float* gates = xw + rows * xw_floats;
  float* h = gates + rows * gate_ld;
  float* c = h + rows * state_ld;
  float* reset_h = c + rows * state_ld;

  const int64_t x_step = s.batch_major ? in : batch * in;  // floats from x_t to x_t+1
  auto x_at = [&](int64_t t, int64_t b) {
    return o.x + (s.batch_major ? b * steps + t : t * batch + b) * in;
  };
  auto y_at = [&](int64_t t, int64_t b) {
    return o.y + (s.batch_major ? (b * steps + t) * dirs + d : (t * dirs + d) * batch + b) * hidden;
  };
  auto state_at = [&](int64_t b) {
    return (s.batch_major ? b * dirs + d : d * batch + b) * hidden;
  };
  auto length = [&](int64_t j) {
    return o.sequence_lens != nullptr ? int64_t{o.sequence_lens[b0 + j]} : steps;
  };

  int64_t longest = 0;
  for (int64_t j = 0; j < rows; ++j) {
    const int64_t b = b0 + j, len = length(j);
    longest = std::max(longest, len);
    Epilogue bias;
    bias.col_bias = dir.bias.data();
    if (len > 0) {
      gemm_packed_b(GemmShape{len, gh, in}, x_at(0, b), x_step, dir.w, 0, xw + j * xw_floats, gh,
                    bias, gemm_scratch);
    }
    for (int64_t u = 0; u < hidden; ++u) {
      h[j * state_ld + u] = o.initial_h != nullptr ? o.initial_h[state_at(b) + u] : 0.0f;
      c[j * state_ld + u] = o.initial_c != nullptr ? o.initial_c[state_at(b) + u] : 0.0f;
    }
    if (o.y != nullptr) {
      for (int64_t t = len; t < steps; ++t) std::fill_n(y_at(t, b), hidden, 0.0f);
    }
  }

  Epilogue r_h_bias;
  r_h_bias.col_bias = dir.r_h_bias.empty() ? nullptr : dir.r_h_bias.data();
  for (int64_t step = 0; step < longest; ++step) {
    // Rows whose sequence has ended keep their state: their products are computed (one block
    // product is cheaper than gathering the live rows) and not used.
    auto time_of = [&](int64_t j) {
      const int64_t len = length(j);
      return step >= len ? int64_t{-1} : backwards ? len - 1 - step : step;
    };
    gemm_packed_b(GemmShape{rows, recurrent_cols, hidden}, h, state_ld, dir.r, 0, gates, gate_ld,
                  Epilogue{}, gemm_scratch);
    if (gru && s.linear_before_reset) {  // R_h h + Rb_h, multiplied by r below
      gemm_packed_b(GemmShape{rows, hidden, hidden}, h, state_ld, *dir.r_h, 0, gates + 2 * hidden,
                    gate_ld, r_h_bias, gemm_scratch);
    }
    for (int64_t j = 0; j < rows; ++j) {
      const int64_t t = time_of(j);
      float* g = gates + j * gate_ld;
      float* hj = h + j * state_ld;
      float* cj = c + j * state_ld;
      if (t < 0) {
        std::copy_n(hj, hidden, reset_h + j * state_ld);  // any finite values: not used
        continue;
      }
      const float* x = xw + j * xw_floats + t * gh;
      switch (s.cell) {
        case RecurrentCell::kRnn:
          add_and_clip(g, x, hidden, s.clip);
          activate(act[0], g, hidden, isa_);
          std::copy_n(g, hidden, hj);
          break;
        case RecurrentCell::kGru:  // gates z, r now; the candidate after R_h (r * h)
          add_and_clip(g, x, 2 * hidden, s.clip);
          activate(act[0], g, 2 * hidden, isa_);
          for (int64_t u = 0; u < hidden; ++u) reset_h[j * state_ld + u] = g[hidden + u] * hj[u];
          break;
        case RecurrentCell::kLstm: {  // gates i, o, f, c
          float *gi = g, *go = g + hidden, *gf = g + 2 * hidden, *gc = g + 3 * hidden;
          for (int64_t u = 0; u < gh; ++u) g[u] += x[u];
          if (!dir.peepholes.empty()) {
            const float *pi = dir.peepholes.data(), *pf = pi + 2 * hidden;
            for (int64_t u = 0; u < hidden; ++u) {
              gi[u] += pi[u] * cj[u];
              gf[u] += pf[u] * cj[u];
            }
          }
          for (float* gate : {gi, gf, gc}) clip_to(gate, hidden, s.clip);
          activate(act[0], gi, hidden, isa_);
          if (!s.input_forget) activate(act[0], gf, hidden, isa_);
          activate(act[1], gc, hidden, isa_);
          for (int64_t u = 0; u < hidden; ++u) {
            const float f = s.input_forget ? 1.0f - gi[u] : gf[u];
            cj[u] = f * cj[u] + gi[u] * gc[u];
          }
          if (!dir.peepholes.empty()) {
            const float* po = dir.peepholes.data() + hidden;
            for (int64_t u = 0; u < hidden; ++u) go[u] += po[u] * cj[u];
          }
          clip_to(go, hidden, s.clip);
          activate(act[0], go, hidden, isa_);
          std::copy_n(cj, hidden, gf);  // h = o * act_h(c), act_h taken in gf's place
          activate(act[2], gf, hidden, isa_);
          for (int64_t u = 0; u < hidden; ++u) hj[u] = go[u] * gf[u];
          break;
        }
      }
    }
    if (gru) {
      if (!s.linear_before_reset) {  // R_h (r * h) + Rb_h
        gemm_packed_b(GemmShape{rows, hidden, hidden}, reset_h, state_ld, *dir.r_h, 0,
                      gates + 2 * hidden, gate_ld, r_h_bias, gemm_scratch);
      }
      for (int64_t j = 0; j < rows; ++j) {
        const int64_t t = time_of(j);
        if (t < 0) continue;
        float* g = gates + j * gate_ld;
        float* hj = h + j * state_ld;
        const float* x = xw + j * xw_floats + t * gh + 2 * hidden;
        float *z = g, *r = g + hidden, *candidate = g + 2 * hidden;
        if (s.linear_before_reset) {
          for (int64_t u = 0; u < hidden; ++u) candidate[u] *= r[u];
        }
        add_and_clip(candidate, x, hidden, s.clip);
        activate(act[1], candidate, hidden, isa_);
        for (int64_t u = 0; u < hidden; ++u) {
          hj[u] = (1.0f - z[u]) * candidate[u] + z[u] * hj[u];
        }
      }
    }
    if (o.y != nullptr) {
      for (int64_t j = 0; j < rows; ++j) {
        const int64_t t = time_of(j);
        if (t >= 0) std::copy_n(h + j * state_ld, hidden, y_at(t, b0 + j));
      }
    }
  }
  for (int64_t j = 0; j < rows; ++j) {
    if (o.y_h != nullptr) std::copy_n(h + j * state_ld, hidden, o.y_h + state_at(b0 + j));
    if (o.y_c != nullptr) std::copy_n(c + j * state_ld, hidden, o.y_c + state_at(b0 + j));
  }
}

}  // namespace sparsecol::kernels
