// DotProductAttention: the book's bmm(Q, Kᵀ)/√d, then the shared pooling step.
#include "attn/nn/dot_product_attention.hpp"

#include <cmath>
#include <string>

#include "attn/core/error.hpp"
#include "attn/kernels/flash_attention.hpp"
#include "attn/kernels/masked_softmax.hpp"
#include "attn/kernels/matmul.hpp"

namespace attn {

DotProductAttention::DotProductAttention(float dropout, std::optional<float> scale, uint64_t seed)
    : AttentionLayer(dropout, seed), scale_(scale) {
  if (scale_ && !std::isfinite(*scale_)) {
    throw ValueError("scale: expected a finite number, got " + std::to_string(*scale_));
  }
}

float DotProductAttention::scale_for(int64_t d) const {
  if (scale_) return *scale_;
  return d > 0 ? 1.0F / std::sqrt(static_cast<float>(d)) : 1.0F;
}

Tensor DotProductAttention::forward(ConstTensorView queries, ConstTensorView keys,
                                    ConstTensorView values, const ValidLengths& valid_lens) {
  check_attention_inputs(queries, keys, values);
  require_dim("keys", keys.shape(), 2, queries.dim(2), "the size of each query");
  valid_lens.check("valid_lens", queries.dim(0), queries.dim(1), keys.dim(1));
  queries_ = Tensor::from(queries);
  keys_ = Tensor::from(keys);
  valid_lens_ = valid_lens;
  const float scale = scale_for(queries.dim(2));
  const float applied_dropout = is_training() ? dropout() : 0.0F;
  output_ = Tensor();
  values_ = Tensor();
  log_sum_exp_.clear();
  // The fused kernel takes dropout in [0, 1); p = 1 (everything dropped) takes the reference path.
  if (path_ == AttentionPath::kFused && applied_dropout < 1.0F &&
      dot_scores_stay_finite(queries, keys, values, queries.dim(2), scale)) {
    fused_options_ = FlashAttentionOptions();
    fused_options_.scale = scale;
    fused_options_.dropout = applied_dropout;
    fused_options_.seed = applied_dropout > 0.0F ? next_dropout_seed() : 0;
    Tensor output(Shape{queries.dim(0), queries.dim(1), values.dim(2)});
    log_sum_exp_.resize(static_cast<size_t>(queries.dim(0) * queries.dim(1)));
    flash_attention_forward(single_head(queries, "queries"), single_head(keys, "keys"),
                            single_head(values, "values"), valid_lens, fused_options_,
                            single_head(output.view(), "out"), log_sum_exp_.data());
    defer_weights(values, applied_dropout > 0.0F);
    values_ = Tensor::from(values);
    output_ = output;
    return output;
  }
  Tensor scores(Shape{queries.dim(0), queries.dim(1), keys.dim(1)});
  batched_matmul_transposed(queries, keys, scores);
  for (float& score : scores.span()) score *= scale;
  return pool(std::move(scores), valid_lens, values);
}

Tensor DotProductAttention::compute_dropout_mask() const {
  return flash_attention_dropout_mask(fused_options_, queries_.dim(0), queries_.dim(1),
                                      keys_.dim(1));
}

Tensor DotProductAttention::compute_weights() const {
  Tensor scores(Shape{queries_.dim(0), queries_.dim(1), keys_.dim(1)});
  batched_matmul_transposed(queries_, keys_, scores);
  const float scale = scale_for(queries_.dim(2));
  for (float& score : scores.span()) score *= scale;
  masked_softmax(scores, valid_lens_, scores);
  return scores;
}

AttentionGradients DotProductAttention::backward(ConstTensorView grad_output) const {
  if (output_.rank() == 3) {
    // The last pass was fused: the fused backward recomputes the probabilities tile by tile.
    check_grad_output(grad_output, output_.shape());
    AttentionGradients grads{Tensor(queries_.shape()), Tensor(keys_.shape()),
                             Tensor(values_.shape())};
    flash_attention_backward(
        single_head(queries_, "queries"), single_head(keys_, "keys"),
        single_head(values_, "values"), single_head(output_, "out"),
        single_head(grad_output, "grad_output"), log_sum_exp_.data(), valid_lens_, fused_options_,
        single_head(grads.queries, "grad_queries"), single_head(grads.keys, "grad_keys"),
        single_head(grads.values, "grad_values"));
    return grads;
  }
  PoolGradients pooled = pool_backward(grad_output, "DotProductAttention");
  const float scale = scale_for(queries_.dim(2));
  for (float& value : pooled.scores.span()) value *= scale;
  AttentionGradients grads{Tensor(queries_.shape()), Tensor(keys_.shape()),
                           std::move(pooled.values)};
  batched_matmul(pooled.scores, keys_, grads.queries);
  batched_transposed_matmul(pooled.scores, queries_, grads.keys);
  return grads;
}

}  // namespace attn
