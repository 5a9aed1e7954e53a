// AdditiveAttention: project queries and keys once, then score every (query, key) pair without
// building the book's (B, n, m, h) feature tensor.
#include "attn/nn/additive_attention.hpp"

#include <cmath>

namespace attn {

AdditiveAttention::AdditiveAttention(int64_t key_size, int64_t query_size, int64_t num_hiddens,
                                     float dropout, uint64_t seed)
    : AttentionLayer(dropout, seed ^ 0x5eed'd50'9017ULL),
      init_rng_(seed),
      W_k_(key_size, num_hiddens, false, init_rng_),
      W_q_(query_size, num_hiddens, false, init_rng_),
      w_v_(num_hiddens, 1, false, init_rng_) {}

Tensor AdditiveAttention::forward(ConstTensorView queries, ConstTensorView keys,
                                  ConstTensorView values, const ValidLengths& valid_lens) {
  check_attention_inputs(queries, keys, values);
  valid_lens.check("valid_lens", queries.dim(0), queries.dim(1), keys.dim(1));
  const Tensor projected_queries = W_q_.forward(queries, "queries");
  const Tensor projected_keys = W_k_.forward(keys, "keys");
  const int64_t batch = queries.dim(0), n = queries.dim(1), m = keys.dim(1), hidden = num_hiddens();
  const float* w_v = w_v_.weight().data();
  Tensor scores(Shape{batch, n, m});
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      const float* q = &projected_queries(b, i, 0);
      for (int64_t j = 0; j < m; ++j) {
        const float* k = &projected_keys(b, j, 0);
        float score = 0.0F;
        for (int64_t t = 0; t < hidden; ++t) score += w_v[t] * std::tanh(q[t] + k[t]);
        scores(b, i, j) = score;
      }
    }
  }
  return pool(std::move(scores), valid_lens, values);
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
