// AdditiveAttention: project queries and keys once, then score every (query, key) pair without
// building the book's (B, n, m, h) feature tensor.
#include "attn/nn/additive_attention.hpp"

#include <cmath>

#include "attn/kernels/additive_attention.hpp"
#include "attn/kernels/masked_softmax.hpp"

namespace attn {

AdditiveAttention::AdditiveAttention(int64_t key_size, int64_t query_size, int64_t num_hiddens,
                                     float dropout, uint64_t seed)
    : AttentionLayer(dropout, seed ^ 0x5eed'd50'9017ULL),
      init_rng_(seed),
      W_k_(require_positive_size("key_size", key_size),
           require_positive_size("num_hiddens", num_hiddens), false, init_rng_),
      W_q_(require_positive_size("query_size", query_size), num_hiddens, false, init_rng_),
      w_v_(num_hiddens, 1, false, init_rng_) {}

Tensor AdditiveAttention::forward(ConstTensorView queries, ConstTensorView keys,
                                  ConstTensorView values, const ValidLengths& valid_lens) {
  check_attention_inputs(queries, keys, values);
  valid_lens.check("valid_lens", queries.dim(0), queries.dim(1), keys.dim(1));
  projected_queries_ = W_q_.forward(queries, "queries");
  projected_keys_ = W_k_.forward(keys, "keys");
  queries_ = Tensor::from(queries);
  keys_ = Tensor::from(keys);
  valid_lens_ = valid_lens;
  values_ = Tensor();
  output_ = Tensor();
  log_sum_exp_.clear();
  const float applied_dropout = is_training() ? dropout() : 0.0F;
  if (path_ == AttentionPath::kFused && applied_dropout < 1.0F) {
    // The fused kernel never holds the scores, so it cannot report a NaN one as masked_softmax
    // does; tanh keeps finite inputs' scores bounded by Σ|w_v|, so checking the inputs suffices.
    require_finite("queries (projected)", projected_queries_);
    require_finite("keys (projected)", projected_keys_);
    require_finite("values", values);
    require_finite("w_v.weight", w_v_.weight());
    FlashAttentionOptions options;
    options.dropout = applied_dropout;
    options.seed = applied_dropout > 0.0F ? next_dropout_seed() : 0;
    fused_options_ = options;
    Tensor output(Shape{queries.dim(0), queries.dim(1), values.dim(2)});
    log_sum_exp_.resize(static_cast<size_t>(queries.dim(0) * queries.dim(1)));
    additive_attention_forward(single_head(projected_queries_, "queries"),
                               single_head(projected_keys_, "keys"), w_v_.weight().span(),
                               single_head(values, "values"), valid_lens, options,
                               single_head(output.view(), "out"), log_sum_exp_.data());
    defer_weights(values, applied_dropout > 0.0F);
    values_ = Tensor::from(values);
    output_ = output;
    return output;
  }
  return pool(compute_scores(), valid_lens, values);
}

// The book's scores, one (query, key) pair at a time: (B, n, m), without the (B, n, m, h) tensor.
Tensor AdditiveAttention::compute_scores() const {
  const int64_t batch = projected_queries_.dim(0), n = projected_queries_.dim(1),
                m = projected_keys_.dim(1);
  const int64_t hidden = num_hiddens();
  const float* w_v = w_v_.weight().data();
  Tensor scores(Shape{batch, n, m});
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      const float* q = &projected_queries_(b, i, 0);
      for (int64_t j = 0; j < m; ++j) {
        const float* k = &projected_keys_(b, j, 0);
        float score = 0.0F;
        for (int64_t t = 0; t < hidden; ++t) score += w_v[t] * std::tanh(q[t] + k[t]);
        scores(b, i, j) = score;
      }
    }
  }
  return scores;
}

Tensor AdditiveAttention::compute_weights() const {
  return masked_softmax(compute_scores(), valid_lens_);
}

Tensor AdditiveAttention::compute_dropout_mask() const {
  return flash_attention_dropout_mask(fused_options_, projected_queries_.dim(0),
                                      projected_queries_.dim(1), projected_keys_.dim(1));
}

// With a = W_q q_i, b = W_k k_j and u_t = tanh(a_t + b_t), the score is S_ij = Σ_t w_t u_t, so
//   dw_t += dS_ij u_t,   da_it += dS_ij w_t (1 − u_t²),   db_jt += dS_ij w_t (1 − u_t²),
// and the projections' backward passes take da and db to dq, dk and the gradients of W_q, W_k.
AttentionGradients AdditiveAttention::backward(ConstTensorView grad_output) {
  if (output_.rank() == 3) {
    // The last pass was fused: the fused kernel recomputes the probabilities and tanh tile by tile.
    check_grad_output(grad_output, output_.shape());
    Tensor grad_projected_queries(projected_queries_.shape());
    Tensor grad_projected_keys(projected_keys_.shape());
    Tensor grad_values(values_.shape());
    Tensor grad_w_v(Shape{1, num_hiddens()});
    additive_attention_backward(
        single_head(projected_queries_, "queries"), single_head(projected_keys_, "keys"),
        w_v_.weight().span(), single_head(values_, "values"), single_head(output_, "out"),
        single_head(grad_output, "grad_output"), log_sum_exp_.data(), valid_lens_, fused_options_,
        single_head(grad_projected_queries, "grad_queries"),
        single_head(grad_projected_keys, "grad_keys"), grad_w_v.span(),
        single_head(grad_values, "grad_values"));
    w_v_.accumulate_weight_grad(grad_w_v);
    return {W_q_.backward(queries_, grad_projected_queries),
            W_k_.backward(keys_, grad_projected_keys), std::move(grad_values)};
  }
  PoolGradients pooled = pool_backward(grad_output, "AdditiveAttention");
  const int64_t batch = queries_.dim(0), n = queries_.dim(1), m = keys_.dim(1),
                hidden = num_hiddens();
  Tensor grad_projected_queries(projected_queries_.shape());
  Tensor grad_projected_keys(projected_keys_.shape());
  Tensor grad_w_v(Shape{1, hidden});
  const float* w_v = w_v_.weight().data();
  float* dw = grad_w_v.data();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      const float* q = &projected_queries_(b, i, 0);
      float* dq = &grad_projected_queries(b, i, 0);
      for (int64_t j = 0; j < m; ++j) {
        const float ds = pooled.scores(b, i, j);
        if (ds == 0.0F) continue;  // masked keys and zero gradients contribute nothing
        const float* k = &projected_keys_(b, j, 0);
        float* dk = &grad_projected_keys(b, j, 0);
        for (int64_t t = 0; t < hidden; ++t) {
          const float u = std::tanh(q[t] + k[t]);
          dw[t] += ds * u;
          const float d_pre = ds * w_v[t] * (1.0F - u * u);
          dq[t] += d_pre;
          dk[t] += d_pre;
        }
      }
    }
  }
  // w_v is a Linear(h → 1) applied to u; its backward with input u would recompute u, so its
  // weight gradient is accumulated here through a one-row product instead.
  w_v_.accumulate_weight_grad(grad_w_v);
  return {W_q_.backward(queries_, grad_projected_queries),
          W_k_.backward(keys_, grad_projected_keys), std::move(pooled.values)};
}

std::vector<NamedParameter> AdditiveAttention::parameters() {
  std::vector<NamedParameter> parameters;
  W_k_.append_parameters("W_k", parameters);
  W_q_.append_parameters("W_q", parameters);
  w_v_.append_parameters("w_v", parameters);
  return parameters;
}

StateDict AdditiveAttention::state_dict() const {
  // parameters() hands out mutable pointers, but collecting only copies through them.
  return collect_state_dict(const_cast<AdditiveAttention*>(this)->parameters());
}

void AdditiveAttention::load_state_dict(const StateDict& state) {
  attn::load_state_dict(state, parameters(), "AdditiveAttention");
}

}  // namespace attn
