// GeneralAttention: project the queries by W, then the dot-product path (fused or the book's).
#include "attn/nn/general_attention.hpp"

#include <cmath>

#include "attn/core/error.hpp"
#include "attn/kernels/matmul.hpp"

namespace attn {

GeneralAttention::GeneralAttention(int64_t query_size, int64_t key_size, float dropout,
                                   uint64_t seed)
    : AttentionLayer(dropout, seed ^ 0x5eed'd50'9017ULL),
      init_rng_(seed),
      W_(require_positive_size("query_size", query_size),
         require_positive_size("key_size", key_size), false, init_rng_) {}

Tensor GeneralAttention::forward(ConstTensorView queries, ConstTensorView keys,
                                 ConstTensorView values, const ValidLengths& valid_lens) {
  check_attention_inputs(queries, keys, values);
  require_dim("keys", keys.shape(), -1, key_size(), "the layer's key size");
  valid_lens.check("valid_lens", queries.dim(0), queries.dim(1), keys.dim(1));
  // Each input checked under its own name (a NaN value was "projected values"), and a projection
  // that overflows names W, as MultiHeadAttention's do (it was "projected queries: expected
  // finite values", of a tensor the caller never saw).
  require_finite("queries", queries);
  const float key_max = require_finite("keys", keys);
  require_finite("values", values);
  queries_.assign(queries);
  // The last fused pass's projection, keys and values lend their storage to this call's.
  FusedAttentionPass::Inputs kept = fused_.release_inputs();
  Tensor projected = std::move(kept.queries);
  W_.forward_into(queries, projected, "queries");
  const float projected_max = max_magnitude(projected);
  if (!std::isfinite(projected_max)) {
    require_finite("W.weight", W_.weight());
    throw ValueError(
        "W: the projection of the queries overflows float32 (beyond ±3.4e38) although both are "
        "finite; scale the queries or W.weight down");
  }
  keys_ = projected_queries_ = Tensor();
  const float applied_dropout = is_training() ? dropout() : 0.0F;
  // As DotProductAttention: p = 1 and scores that could overflow take the reference path.
  if (path_ == AttentionPath::kFused && applied_dropout < 1.0F &&
      dot_scores_stay_finite(projected_max, key_max, key_size(), 1.0F)) {
    AttentionOptions options = fused_options(valid_lens);
    options.scale = 1.0F;  // Luong's general score is unscaled
    kept.keys.assign(keys);
    kept.values.assign(values);
    Tensor output = fused_.dot_product(std::move(projected), std::move(kept.keys),
                                       std::move(kept.values), 1, std::move(options));
    fused_pass_recorded();
    return output;
  }
  projected_queries_ = std::move(projected);
  keys_.assign(keys);
  Tensor scores(Shape{queries.dim(0), queries.dim(1), keys.dim(1)});
  batched_matmul_transposed(projected_queries_, keys, scores);
  return pool(std::move(scores), valid_lens, values);
}

AttentionGradients GeneralAttention::backward(ConstTensorView grad_output) {
  Tensor grad_projected;
  AttentionGradients grads;
  if (fused_.ran()) {
    AttentionBackward fused = fused_.dot_product_backward(grad_output);
    grad_projected = std::move(fused.query);
    grads.keys = std::move(fused.key);
    grads.values = std::move(fused.value);
  } else {
    PoolGradients pooled = pool_backward(grad_output, "GeneralAttention");
    grad_projected = Tensor(projected_queries_.shape());
    grads.keys = Tensor(keys_.shape());
    batched_matmul(pooled.scores, keys_, grad_projected);
    batched_transposed_matmul(pooled.scores, projected_queries_, grads.keys);
    grads.values = std::move(pooled.values);
  }
  grads.queries = W_.backward(queries_, grad_projected);
  return grads;
}

std::vector<NamedParameter> GeneralAttention::parameters() {
  std::vector<NamedParameter> parameters;
  W_.append_parameters("W", parameters);
  return parameters;
}

StateDict GeneralAttention::state_dict() const {
  // parameters() hands out mutable pointers, but collecting only copies through them.
  return collect_state_dict(const_cast<GeneralAttention*>(this)->parameters());
}

void GeneralAttention::load_state_dict(const StateDict& state) {
  load_state_views(views_of(state));
}

void GeneralAttention::load_state_views(const StateViews& state) {
  attn::load_state_views(state, parameters(), "GeneralAttention");
  forget_forward_pass();
}

}  // namespace attn
