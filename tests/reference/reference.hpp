// Plain reference implementations of every attn layer: obvious loops over the book's formulas,
// templated on the scalar so they run in double (the tests' ground truth). Independent of the
// library's kernels on purpose: they share no code with src/.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace attn::reference {

// A dense row-major array with its dimensions; deliberately simpler than attn::Tensor.
template <class T>
struct Array {
  std::vector<int64_t> dims;
  std::vector<T> values;

  Array() = default;
  explicit Array(std::vector<int64_t> dimensions) : dims(std::move(dimensions)) {
    int64_t count = 1;
    for (int64_t dim : dims) count *= dim;
    values.assign(static_cast<size_t>(count), T(0));
  }
  T& at(int64_t i, int64_t j, int64_t k) {
    return values[static_cast<size_t>((i * dims[1] + j) * dims[2] + k)];
  }
  const T& at(int64_t i, int64_t j, int64_t k) const {
    return values[static_cast<size_t>((i * dims[1] + j) * dims[2] + k)];
  }
};

// lengths[b][i]: how many keys query i of batch b sees (already expanded to (B, n)).
using Lengths = std::vector<std::vector<int64_t>>;

// Row i of batch element b over its first `length` ≥ 1 scores: the largest, and Σ_j exp(score −
// that largest), what the softmax and the log-sum-exp below are made of.
template <class T>
struct RowMaxAndSum {
  T max;
  T sum;
};
template <class T>
RowMaxAndSum<T> row_max_and_sum(const Array<T>& scores, int64_t b, int64_t i, int64_t length) {
  T row_max = scores.at(b, i, 0);
  for (int64_t j = 1; j < length; ++j) row_max = std::max(row_max, scores.at(b, i, j));
  T sum = 0;
  for (int64_t j = 0; j < length; ++j) sum += std::exp(scores.at(b, i, j) - row_max);
  return {row_max, sum};
}

// Softmax over the first `length` entries of each row, exact zeros after; zero rows for length 0.
template <class T>
Array<T> masked_softmax(const Array<T>& scores, const Lengths& lengths) {
  Array<T> weights(scores.dims);
  for (int64_t b = 0; b < scores.dims[0]; ++b) {
    for (int64_t i = 0; i < scores.dims[1]; ++i) {
      const int64_t length = lengths[static_cast<size_t>(b)][static_cast<size_t>(i)];
      if (length == 0) continue;
      const RowMaxAndSum<T> row = row_max_and_sum(scores, b, i, length);
      for (int64_t j = 0; j < length; ++j)
        weights.at(b, i, j) = std::exp(scores.at(b, i, j) - row.max) / row.sum;
    }
  }
  return weights;
}

// The log-sum-exp of each row's first `length` scores, log Σ_j exp(scores[b, i, j]), flattened as
// (B, n); −∞ for a row of length 0 (what the kernels report for a query that sees no key).
template <class T>
std::vector<T> masked_log_sum_exp(const Array<T>& scores, const Lengths& lengths) {
  std::vector<T> result;
  result.reserve(static_cast<size_t>(scores.dims[0] * scores.dims[1]));
  for (int64_t b = 0; b < scores.dims[0]; ++b) {
    for (int64_t i = 0; i < scores.dims[1]; ++i) {
      const int64_t length = lengths[static_cast<size_t>(b)][static_cast<size_t>(i)];
      if (length == 0) {
        result.push_back(T(-INFINITY));
        continue;
      }
      const RowMaxAndSum<T> row = row_max_and_sum(scores, b, i, length);
      result.push_back(row.max + std::log(row.sum));
    }
  }
  return result;
}

// out[b, i, :] = Σ_j weights[b, i, j] · dropout[b, i, j] · values[b, j, :], where `dropout` holds
// the dropout multipliers (0 or 1/(1−p)); empty means no dropout.
template <class T>
Array<T> weighted_sum(const Array<T>& weights, const Array<T>& values,
                      const std::vector<T>& dropout = {}) {
  Array<T> out({weights.dims[0], weights.dims[1], values.dims[2]});
  for (int64_t b = 0; b < weights.dims[0]; ++b)
    for (int64_t i = 0; i < weights.dims[1]; ++i)
      for (int64_t j = 0; j < weights.dims[2]; ++j) {
        const size_t index = static_cast<size_t>((b * weights.dims[1] + i) * weights.dims[2] + j);
        const T weight = weights.at(b, i, j) * (dropout.empty() ? T(1) : dropout[index]);
        for (int64_t t = 0; t < values.dims[2]; ++t) out.at(b, i, t) += weight * values.at(b, j, t);
      }
  return out;
}

// x (B, n, in) · Wᵀ (+ bias) with W (out, in) stored row-major.
template <class T>
Array<T> linear(const Array<T>& x, const std::vector<T>& weight, const std::vector<T>& bias,
                int64_t out_features) {
  const int64_t in = x.dims[2];
  Array<T> y({x.dims[0], x.dims[1], out_features});
  for (int64_t b = 0; b < x.dims[0]; ++b)
    for (int64_t i = 0; i < x.dims[1]; ++i)
      for (int64_t o = 0; o < out_features; ++o) {
        T sum = bias.empty() ? T(0) : bias[static_cast<size_t>(o)];
        for (int64_t t = 0; t < in; ++t)
          sum += x.at(b, i, t) * weight[static_cast<size_t>(o * in + t)];
        y.at(b, i, o) = sum;
      }
  return y;
}

struct Result {
  Array<double> output;
  Array<double> weights;
  // Each query row's log Σ_j exp(score) over the keys it sees, (B, n) flattened ((B·heads, n) for
  // multi_head_attention); −∞ where it sees none.
  std::vector<double> log_sum_exp;
};

// The attention that follows a reference's (B, n, m) scores: the masked softmax, its weighted sum
// of v (times the dropout multipliers, empty: none) and each row's log-sum-exp.
inline Result attention_from_scores(const Array<double>& scores, const Lengths& lengths,
                                    const Array<double>& v, const std::vector<double>& dropout) {
  Array<double> weights = masked_softmax(scores, lengths);
  return {weighted_sum(weights, v, dropout), weights, masked_log_sum_exp(scores, lengths)};
}

// Scaled dot-product attention: softmax(Q Kᵀ · scale) V.
inline Result dot_product_attention(const Array<double>& q, const Array<double>& k,
                                    const Array<double>& v, const Lengths& lengths, double scale,
                                    const std::vector<double>& dropout = {}) {
  Array<double> scores({q.dims[0], q.dims[1], k.dims[1]});
  for (int64_t b = 0; b < q.dims[0]; ++b)
    for (int64_t i = 0; i < q.dims[1]; ++i)
      for (int64_t j = 0; j < k.dims[1]; ++j) {
        double sum = 0;
        for (int64_t t = 0; t < q.dims[2]; ++t) sum += q.at(b, i, t) * k.at(b, j, t);
        scores.at(b, i, j) = sum * scale;
      }
  return attention_from_scores(scores, lengths, v, dropout);
}

// Additive attention: score(i, j) = w_v · tanh(W_q q_i + W_k k_j).
inline Result additive_attention(const Array<double>& q, const Array<double>& k,
                                 const Array<double>& v, const Lengths& lengths,
                                 const std::vector<double>& W_q, const std::vector<double>& W_k,
                                 const std::vector<double>& w_v,
                                 const std::vector<double>& dropout = {}) {
  const auto hidden = static_cast<int64_t>(w_v.size());
  const Array<double> qp = linear(q, W_q, {}, hidden);
  const Array<double> kp = linear(k, W_k, {}, hidden);
  Array<double> scores({q.dims[0], q.dims[1], k.dims[1]});
  for (int64_t b = 0; b < q.dims[0]; ++b)
    for (int64_t i = 0; i < q.dims[1]; ++i)
      for (int64_t j = 0; j < k.dims[1]; ++j) {
        double sum = 0;
        for (int64_t t = 0; t < hidden; ++t)
          sum += w_v[static_cast<size_t>(t)] * std::tanh(qp.at(b, i, t) + kp.at(b, j, t));
        scores.at(b, i, j) = sum;
      }
  return attention_from_scores(scores, lengths, v, dropout);
}

// Gaussian-kernel (Nadaraya–Watson) pooling: score(i, j) = −½‖(q_i − k_j)·w‖².
inline Result gaussian_kernel_pooling(const Array<double>& q, const Array<double>& k,
                                      const Array<double>& v, const Lengths& lengths, double width,
                                      const std::vector<double>& dropout = {}) {
  Array<double> scores({q.dims[0], q.dims[1], k.dims[1]});
  for (int64_t b = 0; b < q.dims[0]; ++b)
    for (int64_t i = 0; i < q.dims[1]; ++i)
      for (int64_t j = 0; j < k.dims[1]; ++j) {
        double sum = 0;
        for (int64_t t = 0; t < q.dims[2]; ++t) {
          const double scaled = (q.at(b, i, t) - k.at(b, j, t)) * width;
          sum += scaled * scaled;
        }
        scores.at(b, i, j) = -0.5 * sum;
      }
  return attention_from_scores(scores, lengths, v, dropout);
}

struct MultiHeadParameters {
  std::vector<double> W_q, W_k, W_v, W_o;
  std::vector<double> b_q, b_k, b_v, b_o;  // empty without bias
};

// Multi-head attention written head by head (no transposes): each head h uses columns
// [h·d, (h+1)·d) of the projections; weights are returned as (B·heads, n, m).
inline Result multi_head_attention(const Array<double>& q, const Array<double>& k,
                                   const Array<double>& v, const Lengths& lengths,
                                   const MultiHeadParameters& p, int64_t num_hiddens, int64_t heads,
                                   const std::vector<double>& dropout = {}) {
  const Array<double> qp = linear(q, p.W_q, p.b_q, num_hiddens);
  const Array<double> kp = linear(k, p.W_k, p.b_k, num_hiddens);
  const Array<double> vp = linear(v, p.W_v, p.b_v, num_hiddens);
  const int64_t batch = q.dims[0], n = q.dims[1], m = k.dims[1], d = num_hiddens / heads;
  Array<double> concat({batch, n, num_hiddens});
  Array<double> all_weights({batch * heads, n, m});
  std::vector<double> log_sum_exp(static_cast<size_t>(batch * heads * n), -INFINITY);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < n; ++i) {
        const int64_t length = lengths[static_cast<size_t>(b)][static_cast<size_t>(i)];
        if (length == 0) continue;
        std::vector<double> scores(static_cast<size_t>(length));
        double row_max = -INFINITY;
        for (int64_t j = 0; j < length; ++j) {
          double sum = 0;
          for (int64_t t = 0; t < d; ++t) sum += qp.at(b, i, h * d + t) * kp.at(b, j, h * d + t);
          scores[static_cast<size_t>(j)] = sum / std::sqrt(static_cast<double>(d));
          row_max = std::max(row_max, scores[static_cast<size_t>(j)]);
        }
        double total = 0;
        for (double& s : scores) total += (s = std::exp(s - row_max));
        log_sum_exp[static_cast<size_t>((b * heads + h) * n + i)] = row_max + std::log(total);
        for (int64_t j = 0; j < length; ++j) {
          const double weight = scores[static_cast<size_t>(j)] / total;
          all_weights.at(b * heads + h, i, j) = weight;
          const double kept =
              dropout.empty()
                  ? weight
                  : weight * dropout[static_cast<size_t>(((b * heads + h) * n + i) * m + j)];
          for (int64_t t = 0; t < d; ++t)
            concat.at(b, i, h * d + t) += kept * vp.at(b, j, h * d + t);
        }
      }
  return {linear(concat, p.W_o, p.b_o, num_hiddens), all_weights, std::move(log_sum_exp)};
}

// Gradients of sum(out ⊙ grad_out) for additive attention on projected queries a (B, n, h) and
// projected keys b (B, m, h), straight from the chain rule: with u_ijt = tanh(a_it + b_jt),
// S_ij = Σ_t w_t u_ijt, P = masked softmax(S), Z the dropout multipliers (empty: none) and
// O = (P ⊙ Z) V, dP_ij = Z_ij dO_i·V_j, dS_ij = P_ij (dP_ij − Σ_k P_ik dP_ik), then
// da_i = Σ_j dS_ij w (1 − u_ij²), db_j = Σ_i dS_ij w (1 − u_ij²), dw = Σ_ij dS_ij u_ij,
// dV_j = Σ_i P_ij Z_ij dO_i.
struct AdditiveGradients {
  Array<double> queries, keys, values;
  std::vector<double> w_v;
};

inline AdditiveGradients additive_attention_backward(const Array<double>& a, const Array<double>& b,
                                                     const Array<double>& v, const Lengths& lengths,
                                                     const std::vector<double>& w_v,
                                                     const Array<double>& grad_out,
                                                     const std::vector<double>& dropout = {}) {
  const int64_t batch = a.dims[0], n = a.dims[1], m = b.dims[1], hidden = a.dims[2], dv = v.dims[2];
  Array<double> scores({batch, n, m});
  for (int64_t e = 0; e < batch; ++e)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j)
        for (int64_t t = 0; t < hidden; ++t)
          scores.at(e, i, j) +=
              w_v[static_cast<size_t>(t)] * std::tanh(a.at(e, i, t) + b.at(e, j, t));
  const Array<double> weights = masked_softmax(scores, lengths);
  AdditiveGradients grads{Array<double>(a.dims), Array<double>(b.dims), Array<double>(v.dims),
                          std::vector<double>(static_cast<size_t>(hidden))};
  std::vector<double> grad_weights(static_cast<size_t>(m));
  for (int64_t e = 0; e < batch; ++e)
    for (int64_t i = 0; i < n; ++i) {
      double expected_grad = 0;  // Σ_k P_ik dP_ik
      for (int64_t j = 0; j < m; ++j) {
        const double multiplier =
            dropout.empty() ? 1.0 : dropout[static_cast<size_t>((e * n + i) * m + j)];
        double grad_weight = 0;
        for (int64_t t = 0; t < dv; ++t) {
          grad_weight += grad_out.at(e, i, t) * v.at(e, j, t);
          grads.values.at(e, j, t) += weights.at(e, i, j) * multiplier * grad_out.at(e, i, t);
        }
        grad_weights[static_cast<size_t>(j)] = grad_weight * multiplier;
        expected_grad += weights.at(e, i, j) * grad_weights[static_cast<size_t>(j)];
      }
      for (int64_t j = 0; j < m; ++j) {
        const double grad_score =
            weights.at(e, i, j) * (grad_weights[static_cast<size_t>(j)] - expected_grad);
        for (int64_t t = 0; t < hidden; ++t) {
          const double u = std::tanh(a.at(e, i, t) + b.at(e, j, t));
          const double g = grad_score * w_v[static_cast<size_t>(t)] * (1 - u * u);
          grads.queries.at(e, i, t) += g;
          grads.keys.at(e, j, t) += g;
          grads.w_v[static_cast<size_t>(t)] += grad_score * u;
        }
      }
    }
  return grads;
}

}  // namespace attn::reference
