#include "reference/recurrent.h"

#include <algorithm>
#include <cmath>

namespace sparsecol::kernels::reference {

int64_t gate_count(RecurrentCell cell) {
  switch (cell) {
    case RecurrentCell::kRnn:
      return 1;
    case RecurrentCell::kGru:
      return 3;
    case RecurrentCell::kLstm:
      return 4;
  }
  return 0;
}

int64_t activation_count(RecurrentCell cell) {
  return cell == RecurrentCell::kRnn ? 1 : cell == RecurrentCell::kGru ? 2 : 3;
}

double RnnActivation::operator()(double x) const {
  switch (kind) {
    case Kind::kSigmoid:
      return 1.0 / (1.0 + std::exp(-x));
    case Kind::kTanh:
      return std::tanh(x);
    case Kind::kRelu:
      return std::max(x, 0.0);
    case Kind::kAffine:
      return alpha * x + beta;
    case Kind::kLeakyRelu:
      return x < 0.0 ? alpha * x : x;
    case Kind::kThresholdedRelu:
      return x > alpha ? x : 0.0;
    case Kind::kScaledTanh:
      return alpha * std::tanh(beta * x);
    case Kind::kHardSigmoid:
      return std::clamp(alpha * x + beta, 0.0, 1.0);
    case Kind::kElu:
      return x < 0.0 ? alpha * (std::exp(x) - 1.0) : x;
    case Kind::kSoftsign:
      return x / (1.0 + std::abs(x));
    case Kind::kSoftplus:
      return std::log1p(std::exp(x));
  }
  return x;
}

namespace {

// One direction's weights, in the order of RecurrentOperands.
struct DirectionWeights {
  const float *w, *r, *wb, *rb, *p;
};

// dst[u] = bias[u] + sum_k v[k] * m[u][k] for the n rows of m (k columns); bias may be nullptr.
void affine(const float* m, const float* bias, const float* v, int64_t n, int64_t k, double* dst) {
  for (int64_t u = 0; u < n; ++u) {
    double sum = bias != nullptr ? bias[u] : 0.0;
    for (int64_t i = 0; i < k; ++i) sum += static_cast<double>(m[u * k + i]) * v[i];
    dst[u] = sum;
  }
}

}  // namespace

void recurrent_reference(const RecurrentShape& s, const RecurrentOperands& o) {
  const int64_t hidden = s.hidden_size, gates = gate_count(s.cell), in = s.input_size;
  const int64_t steps = s.seq_length, batch = s.batch, dirs = s.directions;
  const int64_t gh = gates * hidden;
  auto x_at = [&](int64_t t, int64_t b) {
    return o.x + (s.batch_major ? b * steps + t : t * batch + b) * in;
  };
  auto y_at = [&](int64_t t, int64_t d, int64_t b) {
    return o.y + (s.batch_major ? (b * steps + t) * dirs + d : (t * dirs + d) * batch + b) * hidden;
  };
  auto state_offset = [&](int64_t d, int64_t b) {
    return (s.batch_major ? b * dirs + d : d * batch + b) * hidden;
  };
  auto clip = [&](double v) { return s.clip > 0.0f ? std::clamp<double>(v, -s.clip, s.clip) : v; };
  if (o.y != nullptr) std::fill_n(o.y, steps * dirs * batch * hidden, 0.0f);

  // Per step: xw = W x + Wb and hr = R h + Rb, each [gates * hidden].
  std::vector<double> xw(static_cast<std::size_t>(gh)), hr(static_cast<std::size_t>(gh));
  std::vector<float> h(static_cast<std::size_t>(hidden)), c(h.size()), reset_h(h.size());
  std::vector<double> z(h.size()), r(h.size());  // GRU's update and reset gates
  for (int64_t d = 0; d < dirs; ++d) {
    const DirectionWeights dw{o.w + d * gh * in, o.r + d * gh * hidden,
                              o.b != nullptr ? o.b + d * 2 * gh : nullptr,
                              o.b != nullptr ? o.b + d * 2 * gh + gh : nullptr,
                              o.p != nullptr ? o.p + d * 3 * hidden : nullptr};
    const RnnActivation* act =
        s.activations.data() + d * activation_count(s.cell);  // f, then g, then h
    const bool backwards = s.reverse || d == 1;
    // GRU's candidate applies R_h to r * h unless linear_before_reset: that product is taken
    // below, once r is known, so R h stops at the first two gates.
    const int64_t recurrent_rows =
        s.cell == RecurrentCell::kGru && !s.linear_before_reset ? 2 * hidden : gh;
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t state = state_offset(d, b);
      for (int64_t u = 0; u < hidden; ++u) {
        h[u] = o.initial_h != nullptr ? o.initial_h[state + u] : 0.0f;
        c[u] = o.initial_c != nullptr ? o.initial_c[state + u] : 0.0f;
      }
      const int64_t length = o.sequence_lens != nullptr ? o.sequence_lens[b] : steps;
      for (int64_t step = 0; step < length; ++step) {
        const int64_t t = backwards ? length - 1 - step : step;
        affine(dw.w, dw.wb, x_at(t, b), gh, in, xw.data());
        affine(dw.r, dw.rb, h.data(), recurrent_rows, hidden, hr.data());
        switch (s.cell) {
          case RecurrentCell::kRnn:
            for (int64_t u = 0; u < hidden; ++u)
              h[u] = static_cast<float>(act[0](clip(xw[u] + hr[u])));
            break;
          case RecurrentCell::kGru: {
            // Gates z (update), r (reset), then the candidate h.
            for (int64_t u = 0; u < hidden; ++u) {
              z[u] = act[0](clip(xw[u] + hr[u]));
              r[u] = act[0](clip(xw[hidden + u] + hr[hidden + u]));
            }
            if (!s.linear_before_reset) {  // R_h (r * h)
              for (int64_t u = 0; u < hidden; ++u) reset_h[u] = static_cast<float>(r[u] * h[u]);
              affine(dw.r + 2 * hidden * hidden, dw.rb != nullptr ? dw.rb + 2 * hidden : nullptr,
                     reset_h.data(), hidden, hidden, hr.data() + 2 * hidden);
            }
            for (int64_t u = 0; u < hidden; ++u) {
              const double candidate =
                  s.linear_before_reset
                      ? act[1](clip(xw[2 * hidden + u] + r[u] * hr[2 * hidden + u]))
                      : act[1](clip(xw[2 * hidden + u] + hr[2 * hidden + u]));
              h[u] = static_cast<float>((1.0 - z[u]) * candidate + z[u] * h[u]);
            }
            break;
          }
          case RecurrentCell::kLstm:
            // Gates i, o, f, c; peepholes i, o, f.
            for (int64_t u = 0; u < hidden; ++u) {
              auto pre = [&](int64_t gate) {
                return xw[gate * hidden + u] + hr[gate * hidden + u];
              };
              auto peep = [&](int64_t k, double cell) {
                return dw.p != nullptr ? dw.p[k * hidden + u] * cell : 0.0;
              };
              const double i = act[0](clip(pre(0) + peep(0, c[u])));
              const double f = s.input_forget ? 1.0 - i : act[0](clip(pre(2) + peep(2, c[u])));
              const double cell = f * c[u] + i * act[1](clip(pre(3)));
              const double out = act[0](clip(pre(1) + peep(1, cell)));
              c[u] = static_cast<float>(cell);
              h[u] = static_cast<float>(out * act[2](cell));
            }
            break;
        }
        if (o.y != nullptr) std::copy(h.begin(), h.end(), y_at(t, d, b));
      }
      if (o.y_h != nullptr) std::copy(h.begin(), h.end(), o.y_h + state);
      if (o.y_c != nullptr) std::copy(c.begin(), c.end(), o.y_c + state);
    }
  }
}

}  // namespace sparsecol::kernels::reference
