// AttentionLayer: the shared pooling step (masked softmax → dropout → weighted sum) and input
// checks.
#include "attn/nn/attention_layer.hpp"

#include <cmath>
#include <string>

#include "attn/core/error.hpp"
#include "attn/kernels/masked_softmax.hpp"
#include "attn/kernels/masked_softmax_backward.hpp"
#include "attn/kernels/matmul.hpp"

namespace attn {

const Tensor& AttentionLayer::attention_weights() const {
  if (weights_deferred_) {
    attention_weights_ = fused_.weights();
    weights_deferred_ = false;
  }
  return attention_weights_;
}

const Tensor& AttentionLayer::dropout_mask() const {
  if (mask_deferred_) {
    dropout_mask_ = fused_.dropout_mask();
    mask_deferred_ = false;
  }
  return dropout_mask_;
}

void AttentionLayer::fused_pass_recorded() {
  attention_weights_ = Tensor();
  weights_deferred_ = true;
  dropout_mask_ = Tensor();
  mask_deferred_ = true;
  pooled_values_ = Tensor();
}

AttentionOptions AttentionLayer::fused_options(const ValidLengths& valid_lens) {
  AttentionOptions options;
  options.valid_lens = valid_lens;
  options.dropout = training_ ? dropout_.p() : 0.0F;
  options.seed = options.dropout > 0.0F ? dropout_.next_seed() : 0;
  return options;
}

Tensor AttentionLayer::pool(Tensor scores, const ValidLengths& valid_lens, ConstTensorView values) {
  fused_.clear();
  masked_softmax(scores, valid_lens, scores);
  attention_weights_ = scores;
  weights_deferred_ = false;
  dropout_mask_ = Tensor();
  mask_deferred_ = false;
  if (training_ && dropout_.p() > 0.0F) {
    dropout_mask_ = dropout_.draw_mask(scores.shape());
    for (int64_t index = 0; index < scores.numel(); ++index)
      scores.data()[index] *= dropout_mask_.data()[index];
  }
  pooled_values_ = Tensor::from(values);
  Tensor output(Shape{values.dim(0), scores.dim(1), values.dim(2)});
  batched_matmul(scores, values, output);
  return output;
}

void AttentionLayer::forget_forward_pass() {
  fused_.clear();
  attention_weights_ = Tensor();
  weights_deferred_ = false;
  dropout_mask_ = Tensor();
  mask_deferred_ = false;
  pooled_values_ = Tensor();
}

AttentionLayer::PoolGradients AttentionLayer::pool_backward(ConstTensorView grad_output,
                                                            std::string_view layer_name) const {
  const Tensor& weights = attention_weights();
  const Tensor& mask = dropout_mask();
  if (weights.rank() != 3) {
    throw ValueError(std::string(layer_name) +
                     ".backward: expected a forward pass first, got none");
  }
  const Shape output_shape{attention_weights_.dim(0), attention_weights_.dim(1),
                           pooled_values_.dim(2)};
  check_grad_output(grad_output, output_shape);
  Tensor dropped = attention_weights_;
  if (mask.numel() > 0) Dropout::apply_mask(dropped, mask);
  PoolGradients grads{Tensor(attention_weights_.shape()), Tensor(pooled_values_.shape())};
  batched_transposed_matmul(dropped, grad_output, grads.values);
  Tensor grad_weights(attention_weights_.shape());
  batched_matmul_transposed(grad_output, pooled_values_, grad_weights);
  if (mask.numel() > 0) Dropout::apply_mask(grad_weights, mask);
  masked_softmax_backward(attention_weights_, grad_weights, grads.scores);
  return grads;
}

bool dot_scores_stay_finite(ConstTensorView queries, ConstTensorView keys, ConstTensorView values,
                            int64_t depth, float scale, std::string_view what) {
  const std::string prefix(what);
  const float query_max = require_finite(prefix + "queries", queries);
  const float key_max = require_finite(prefix + "keys", keys);
  require_finite(prefix + "values", values);
  return dot_scores_stay_finite(query_max, key_max, depth, scale);
}

bool dot_scores_stay_finite(float query_max, float key_max, int64_t depth, float scale) {
  return static_cast<double>(query_max) * key_max * static_cast<double>(depth) *
             std::abs(static_cast<double>(scale)) <
         1e37;
}

void check_grad_output(ConstTensorView grad_output, const Shape& output_shape) {
  if (grad_output.shape() != output_shape) {
    throw ShapeError("grad_output: expected shape " + output_shape.str() +
                     " (that of the last forward pass's output), got shape " +
                     grad_output.shape().str());
  }
}

void check_attention_inputs(ConstTensorView queries, ConstTensorView keys, ConstTensorView values) {
  require_rank("queries", queries.shape(), 3);
  require_rank("keys", keys.shape(), 3);
  require_rank("values", values.shape(), 3);
  require_dim("keys", keys.shape(), 0, queries.dim(0), "the batch size of queries");
  require_dim("values", values.shape(), 0, queries.dim(0), "the batch size of queries");
  require_dim("values", values.shape(), 1, keys.dim(1), "the number of keys");
}

}  // namespace attn
