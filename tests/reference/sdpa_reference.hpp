// Plain reference of scaled dot-product attention with every option attn's functional API takes
// (PyTorch's SDPA semantics plus valid lengths, windows, ALiBi, soft-capping, sinks, dropout
// multipliers), forward and backward, in double with obvious loops over dense arrays. Shares no
// code with src/: the tests' ground truth, itself checked against finite differences.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

namespace attn::reference {

// One problem, every array dense and row-major: q (N, Hq, L, E), k (N, Hkv, S, E),
// v (N, Hkv, S, Ev), scores-shaped arrays (N, Hq, L, S).
struct SdpaProblem {
  int64_t batch = 1, q_heads = 1, kv_heads = 1, queries = 1, keys = 1, depth = 1, value_depth = 1;
  double scale = 1.0;
  bool causal = false;
  bool bottom_right = false;  // the diagonal key of query i: i (top-left) or i + S − L
  std::optional<int64_t> diagonal_offset;  // when set: i + diagonal_offset, whatever the above
  std::vector<int64_t> batch_offsets;  // when set (B values): i + batch_offsets[b], per sequence
  int64_t window_left = -1, window_right = -1;  // −1: unbounded
  double softcap = 0.0;                         // 0: none
  std::vector<double> alibi;                    // Hq slopes, or empty
  std::vector<double> sinks;                    // Hq logits, or empty
  enum class Mask { kNone, kBool, kFloat } mask_kind = Mask::kNone;
  std::vector<double> mask;      // scores-shaped: 1/0 for kBool, added values for kFloat
  std::vector<int64_t> lengths;  // (N, L) valid lengths, or empty
  std::vector<double> dropout;   // scores-shaped multipliers, or empty

  size_t score_index(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return static_cast<size_t>(((b * q_heads + h) * queries + i) * keys + j);
  }
  int64_t diagonal(int64_t b, int64_t i) const {
    if (!batch_offsets.empty()) return i + batch_offsets[static_cast<size_t>(b)];
    if (diagonal_offset) return i + *diagonal_offset;
    return bottom_right ? i + keys - queries : i;
  }
  // Whether key j is hidden from query i of (b, h) before any score is looked at.
  bool hidden(int64_t b, int64_t h, int64_t i, int64_t j) const {
    const int64_t c = diagonal(b, i);
    if (!lengths.empty() && j >= lengths[static_cast<size_t>(b * queries + i)]) return true;
    if (causal && j > c) return true;
    if (window_left >= 0 && j < c - window_left) return true;
    if (window_right >= 0 && j > c + window_right) return true;
    if (mask_kind == Mask::kBool && mask[score_index(b, h, i, j)] == 0.0) return true;
    return false;
  }
};

// The problem of a kernel test's case: any struct with the sizes (batch, q_heads, kv_heads,
// queries, keys, depth, value_depth) and the options causal, window_left, window_right and softcap;
// causal aligned bottom-right, as the kernels align it by default. The other options stay off.
template <class Case>
SdpaProblem problem_of_case(const Case& c, double scale) {
  SdpaProblem problem;
  problem.batch = c.batch;
  problem.q_heads = c.q_heads;
  problem.kv_heads = c.kv_heads;
  problem.queries = c.queries;
  problem.keys = c.keys;
  problem.depth = c.depth;
  problem.value_depth = c.value_depth;
  problem.scale = scale;
  problem.causal = c.causal;
  problem.bottom_right = true;
  problem.window_left = c.window_left;
  problem.window_right = c.window_right;
  problem.softcap = c.softcap;
  return problem;
}

struct SdpaForward {
  std::vector<double> out;          // (N, Hq, L, Ev)
  std::vector<double> weights;      // (N, Hq, L, S), before dropout
  std::vector<double> raw;          // (N, Hq, L, S): scale·q·k, before soft-capping
  std::vector<double> denominator;  // (N, Hq, L): Σ exp(s − max) + exp(sink − max), with max
  std::vector<double> sink_weight;  // (N, Hq, L): the sink's share of each row
};

inline SdpaForward sdpa_forward(const SdpaProblem& p, const std::vector<double>& q,
                                const std::vector<double>& k, const std::vector<double>& v) {
  const int64_t group = p.q_heads / p.kv_heads;
  SdpaForward f;
  f.out.assign(static_cast<size_t>(p.batch * p.q_heads * p.queries * p.value_depth), 0.0);
  f.weights.assign(static_cast<size_t>(p.batch * p.q_heads * p.queries * p.keys), 0.0);
  f.raw = f.weights;
  f.denominator.assign(static_cast<size_t>(p.batch * p.q_heads * p.queries), 0.0);
  f.sink_weight = f.denominator;
  std::vector<double> scores(static_cast<size_t>(p.keys));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.q_heads; ++h)
      for (int64_t i = 0; i < p.queries; ++i) {
        const int64_t g = h / group;
        const double minus_infinity = -std::numeric_limits<double>::infinity();
        double row_max = p.sinks.empty() ? minus_infinity : p.sinks[static_cast<size_t>(h)];
        for (int64_t j = 0; j < p.keys; ++j) {
          double s = 0;
          for (int64_t t = 0; t < p.depth; ++t)
            s += q[static_cast<size_t>(((b * p.q_heads + h) * p.queries + i) * p.depth + t)] *
                 k[static_cast<size_t>(((b * p.kv_heads + g) * p.keys + j) * p.depth + t)];
          s *= p.scale;
          f.raw[p.score_index(b, h, i, j)] = s;
          if (p.softcap > 0) s = p.softcap * std::tanh(s / p.softcap);
          if (!p.alibi.empty())
            s -= p.alibi[static_cast<size_t>(h)] *
                 std::fabs(static_cast<double>(p.diagonal(b, i) - j));
          if (p.mask_kind == SdpaProblem::Mask::kFloat) s += p.mask[p.score_index(b, h, i, j)];
          if (p.hidden(b, h, i, j)) s = minus_infinity;
          scores[static_cast<size_t>(j)] = s;
          row_max = std::max(row_max, s);
        }
        const size_t row = static_cast<size_t>((b * p.q_heads + h) * p.queries + i);
        if (row_max == minus_infinity) continue;  // sees nothing, no sink: zero output
        double denominator =
            p.sinks.empty() ? 0.0 : std::exp(p.sinks[static_cast<size_t>(h)] - row_max);
        for (const double s : scores) denominator += std::exp(s - row_max);
        f.denominator[row] = denominator;
        f.sink_weight[row] =
            p.sinks.empty() ? 0.0
                            : std::exp(p.sinks[static_cast<size_t>(h)] - row_max) / denominator;
        for (int64_t j = 0; j < p.keys; ++j) {
          const double weight = std::exp(scores[static_cast<size_t>(j)] - row_max) / denominator;
          f.weights[p.score_index(b, h, i, j)] = weight;
          const double kept =
              weight * (p.dropout.empty() ? 1.0 : p.dropout[p.score_index(b, h, i, j)]);
          for (int64_t t = 0; t < p.value_depth; ++t)
            f.out[row * static_cast<size_t>(p.value_depth) + static_cast<size_t>(t)] +=
                kept *
                v[static_cast<size_t>(((b * p.kv_heads + g) * p.keys + j) * p.value_depth + t)];
        }
      }
  return f;
}

struct SdpaGradients {
  std::vector<double> q, k, v;
  std::vector<double> mask;   // scores-shaped: dS (the float mask's gradient before broadcasting)
  std::vector<double> sinks;  // Hq
};

// Gradients of Σ out ⊙ grad_out by the chain rule, with P the weights, Z the dropout multipliers:
// dP_ij = Z_ij dO_i·v_j, D_i = Σ_j P_ij dP_ij, dS_ij = P_ij (dP_ij − D_i), d sink = −Σ_i p_sink,i
// D_i, through the soft cap ds_raw = dS (1 − tanh²(raw/cap)), dq = scale Σ_j ds_raw k_j, dk = scale
// Σ_i ds_raw q_i, dv_j = Σ_i P_ij Z_ij dO_i.
inline SdpaGradients sdpa_backward(const SdpaProblem& p, const std::vector<double>& q,
                                   const std::vector<double>& k, const std::vector<double>& v,
                                   const std::vector<double>& grad_out) {
  const SdpaForward f = sdpa_forward(p, q, k, v);
  const int64_t group = p.q_heads / p.kv_heads;
  SdpaGradients g{std::vector<double>(q.size()), std::vector<double>(k.size()),
                  std::vector<double>(v.size()), std::vector<double>(f.weights.size()),
                  std::vector<double>(static_cast<size_t>(p.q_heads))};
  std::vector<double> grad_weights(static_cast<size_t>(p.keys));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.q_heads; ++h)
      for (int64_t i = 0; i < p.queries; ++i) {
        const int64_t kv = h / group;
        const size_t row = static_cast<size_t>((b * p.q_heads + h) * p.queries + i);
        const auto dO = [&](int64_t t) {
          return grad_out[row * static_cast<size_t>(p.value_depth) + static_cast<size_t>(t)];
        };
        double delta = 0;
        for (int64_t j = 0; j < p.keys; ++j) {
          const double z = p.dropout.empty() ? 1.0 : p.dropout[p.score_index(b, h, i, j)];
          const double weight = f.weights[p.score_index(b, h, i, j)];
          double dp = 0;
          for (int64_t t = 0; t < p.value_depth; ++t) {
            const size_t value_index =
                static_cast<size_t>(((b * p.kv_heads + kv) * p.keys + j) * p.value_depth + t);
            dp += dO(t) * v[value_index];
            g.v[value_index] += weight * z * dO(t);
          }
          grad_weights[static_cast<size_t>(j)] = dp * z;
          delta += weight * grad_weights[static_cast<size_t>(j)];
        }
        if (!p.sinks.empty()) g.sinks[static_cast<size_t>(h)] -= f.sink_weight[row] * delta;
        for (int64_t j = 0; j < p.keys; ++j) {
          const size_t index = p.score_index(b, h, i, j);
          const double ds = f.weights[index] * (grad_weights[static_cast<size_t>(j)] - delta);
          g.mask[index] = ds;
          double ds_raw = ds;
          if (p.softcap > 0) {
            const double t = std::tanh(f.raw[index] / p.softcap);
            ds_raw *= 1 - t * t;
          }
          for (int64_t t = 0; t < p.depth; ++t) {
            const size_t qi =
                static_cast<size_t>(((b * p.q_heads + h) * p.queries + i) * p.depth + t);
            const size_t ki =
                static_cast<size_t>(((b * p.kv_heads + kv) * p.keys + j) * p.depth + t);
            g.q[qi] += p.scale * ds_raw * k[ki];
            g.k[ki] += p.scale * ds_raw * q[qi];
          }
        }
      }
  return g;
}

}  // namespace attn::reference
