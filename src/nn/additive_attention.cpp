// AdditiveAttention: project queries and keys once, then score every (query, key) pair without
// building the book's (B, n, m, h) feature tensor.
#include "attn/nn/additive_attention.hpp"

#include <cmath>

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
  require_dim("queries", queries.shape(), -1, query_size(), "the layer's input size");
  require_dim("keys", keys.shape(), -1, key_size(), "the layer's input size");
  const float applied_dropout = is_training() ? dropout() : 0.0F;
  queries_ = projected_queries_ = keys_ = projected_keys_ = Tensor();
  if (path_ == AttentionPath::kFused && applied_dropout < 1.0F) {
    // attn::additive_attention projects, then never holds a score to report it as masked_softmax
    // does; tanh keeps finite inputs' scores bounded by Σ|w_v|, so checking these suffices.
    require_finite("w_v.weight", w_v_.weight());
    // Copies kept for the backward pass, in the storage of the last pass's (no fresh pages).
    FusedAttentionPass::Inputs kept = fused_.copy_inputs(queries, keys, values);
    Tensor output = fused_.additive(
        std::move(kept.queries), std::move(kept.keys), std::move(kept.values), W_q_.weight(),
        W_k_.weight(), Tensor::from(w_v_.weight().view().reshaped(Shape{num_hiddens()})),
        fused_options(valid_lens));
    fused_pass_recorded();
    return output;
  }
  projected_queries_ = W_q_.forward(queries, "queries");
  projected_keys_ = W_k_.forward(keys, "keys");
  queries_.assign(queries);
  keys_.assign(keys);
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

// With a = W_q q_i, b = W_k k_j and u_t = tanh(a_t + b_t), the score is S_ij = Σ_t w_t u_t, so
//   dw_t += dS_ij u_t,   da_it += dS_ij w_t (1 − u_t²),   db_jt += dS_ij w_t (1 − u_t²),
// and the projections' backward passes take da and db to dq, dk and the gradients of W_q, W_k.
AttentionGradients AdditiveAttention::backward(ConstTensorView grad_output) {
  if (fused_.ran()) {
    // The last pass was fused: the fused kernel recomputes the probabilities and tanh tile by
    // tile, and attn::additive_attention_backward carries them through the projections.
    AdditiveGradients fused = fused_.additive_backward(grad_output);
    W_q_.accumulate_weight_grad(fused.W_q);
    W_k_.accumulate_weight_grad(fused.W_k);
    fused.w_v.reshape(Shape{1, num_hiddens()});
    w_v_.accumulate_weight_grad(fused.w_v);
    return {std::move(fused.queries), std::move(fused.keys), std::move(fused.values)};
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
  load_state_views(views_of(state));
}

void AdditiveAttention::load_state_views(const StateViews& state) {
  attn::load_state_views(state, parameters(), "AdditiveAttention");
  forget_forward_pass();
}

}  // namespace attn
