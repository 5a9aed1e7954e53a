// DotProductAttention: the book's bmm(Q, Kᵀ)/√d, then the shared pooling step.
#include "attn/nn/dot_product_attention.hpp"

#include <cmath>
#include <string>

#include "attn/core/error.hpp"
#include "attn/kernels/masked_softmax.hpp"
#include "attn/kernels/matmul.hpp"

namespace attn {

DotProductAttention::DotProductAttention(float dropout, std::optional<float> scale, uint64_t seed)
    : AttentionLayer(dropout, seed), scale_(scale) {
  if (scale_ && !std::isfinite(*scale_)) {
    throw ValueError("scale: expected a finite number, got " + number_text(*scale_));
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
  const float scale = scale_for(queries.dim(2));
  const float applied_dropout = is_training() ? dropout() : 0.0F;
  queries_ = Tensor();
  keys_ = Tensor();
  // The fused kernel takes dropout in [0, 1); p = 1 (everything dropped) takes the reference
  // path, and so do scores that could overflow (it reports the bad score).
  if (path_ == AttentionPath::kFused && applied_dropout < 1.0F &&
      dot_scores_stay_finite(queries, keys, values, queries.dim(2), scale)) {
    AttentionOptions options = fused_options(valid_lens);
    options.scale = scale;
    // Copies kept for the backward pass, in the storage of the last pass's (no fresh pages).
    FusedAttentionPass::Inputs kept = fused_.copy_inputs(queries, keys, values);
    Tensor output = fused_.dot_product(std::move(kept.queries), std::move(kept.keys),
                                       std::move(kept.values), 1, std::move(options));
    fused_pass_recorded();
    return output;
  }
  queries_.assign(queries);
  keys_.assign(keys);
  Tensor scores(Shape{queries.dim(0), queries.dim(1), keys.dim(1)});
  batched_matmul_transposed(queries, keys, scores);
  for (float& score : scores.span()) score *= scale;
  return pool(std::move(scores), valid_lens, values);
}

AttentionGradients DotProductAttention::backward(ConstTensorView grad_output) const {
  if (fused_.ran()) {
    // The last pass was fused: the fused backward recomputes the probabilities tile by tile.
    AttentionBackward fused = fused_.dot_product_backward(grad_output);
    return {std::move(fused.query), std::move(fused.key), std::move(fused.value)};
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
