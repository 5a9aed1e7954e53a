// FusedAttentionPass: the layers' record of a functional forward pass, and what it computes later.
#include "attn/nn/fused_attention_pass.hpp"

#include <string>

#include "attn/core/error.hpp"

namespace attn {

void FusedAttentionPass::clear() {
  *this = FusedAttentionPass();
}

template <class T>
StridedView<T> FusedAttentionPass::heads_of(T* data, const Shape& shape) const {
  if (heads_ == 1) return StridedView<T>(data, shape);
  const int64_t batch = shape[0], rows = shape[1], width = shape[2] / heads_;
  const int64_t strides[4] = {rows * shape[2], width, shape[2], 1};
  return StridedView<T>(data, Shape{batch, heads_, rows, width}, strides);
}

void FusedAttentionPass::clear_keeping_output() {
  Tensor output = std::move(output_);
  clear();
  output_ = std::move(output);
}

FusedAttentionPass::Inputs FusedAttentionPass::release_inputs() {
  Inputs inputs{std::move(queries_), std::move(keys_), std::move(values_)};
  clear_keeping_output();
  return inputs;
}

FusedAttentionPass::Inputs FusedAttentionPass::copy_inputs(ConstTensorView queries,
                                                           ConstTensorView keys,
                                                           ConstTensorView values) {
  Inputs inputs = release_inputs();
  inputs.queries.assign(queries);
  inputs.keys.assign(keys);
  inputs.values.assign(values);
  return inputs;
}

const Tensor& FusedAttentionPass::dot_product(Tensor queries, Tensor keys, Tensor values,
                                              int64_t heads, AttentionOptions options) {
  clear_keeping_output();  // its storage, reused below
  heads_ = heads;
  queries_ = std::move(queries);
  keys_ = std::move(keys);
  values_ = std::move(values);
  options_ = std::move(options);
  output_.assign_zeros(Shape{queries_.dim(0), queries_.dim(1), values_.dim(2)});
  const ConstStridedView q = heads_of(queries_.data(), queries_.shape());
  log_sum_exp_.resize(static_cast<size_t>(log_sum_exp_size(q.shape())));
  scaled_dot_product_attention(q, heads_of(keys_.data(), keys_.shape()),
                               heads_of(values_.data(), values_.shape()), options_,
                               heads_of(output_.data(), output_.shape()), log_sum_exp_);
  family_ = Family::kDotProduct;
  return output_;
}

Tensor FusedAttentionPass::additive(Tensor queries, Tensor keys, Tensor values, Tensor W_q,
                                    Tensor W_k, Tensor w_v, AttentionOptions options) {
  clear();
  queries_ = std::move(queries);
  keys_ = std::move(keys);
  values_ = std::move(values);
  W_q_ = std::move(W_q);
  W_k_ = std::move(W_k);
  w_v_ = std::move(w_v);
  options_ = std::move(options);
  AttentionForward forward = additive_attention(queries_, keys_, values_, {W_q_, W_k_, w_v_.span()},
                                                options_, &projections_);
  output_ = std::move(forward.output);
  log_sum_exp_ = std::move(forward.log_sum_exp);
  family_ = Family::kAdditive;
  return output_;
}

void FusedAttentionPass::check_grad_output(ConstTensorView grad_output, Family family) const {
  if (family_ != family) {
    throw ValueError("backward: expected a fused forward pass first, got none");
  }
  if (grad_output.shape() != output_.shape()) {
    throw ShapeError("grad_output: expected shape " + output_.shape().str() +
                     " (that of the last forward pass's output), got shape " +
                     grad_output.shape().str());
  }
}

AttentionBackward FusedAttentionPass::dot_product_backward(ConstTensorView grad_output) const {
  check_grad_output(grad_output, Family::kDotProduct);
  AttentionBackward grads{
      Tensor(queries_.shape()), Tensor(keys_.shape()), Tensor(values_.shape()), {}, {}};
  scaled_dot_product_attention_backward(
      heads_of(queries_.data(), queries_.shape()), heads_of(keys_.data(), keys_.shape()),
      heads_of(values_.data(), values_.shape()), heads_of(output_.data(), output_.shape()),
      heads_of(grad_output.data(), grad_output.shape()), log_sum_exp_, options_,
      heads_of(grads.query.data(), grads.query.shape()),
      heads_of(grads.key.data(), grads.key.shape()),
      heads_of(grads.value.data(), grads.value.shape()));
  return grads;
}

AdditiveGradients FusedAttentionPass::additive_backward(ConstTensorView grad_output) const {
  check_grad_output(grad_output, Family::kAdditive);
  return additive_attention_backward(queries_, keys_, values_, {W_q_, W_k_, w_v_.span()}, output_,
                                     grad_output, log_sum_exp_, options_, &projections_);
}

// (B, heads, n, m) → (B·heads, n, m), the book's layout (heads of a batch element adjacent).
Tensor FusedAttentionPass::to_batch_heads(Tensor scores) const {
  if (scores.rank() == 4)
    scores.reshape(Shape{scores.dim(0) * scores.dim(1), scores.dim(2), scores.dim(3)});
  return scores;
}

Tensor FusedAttentionPass::weights() const {
  if (family_ == Family::kAdditive) {
    return additive_attention_weights(queries_, keys_, {W_q_, W_k_, w_v_.span()}, log_sum_exp_,
                                      options_, &projections_);
  }
  if (family_ != Family::kDotProduct) return {};
  return to_batch_heads(attention_weights(heads_of(queries_.data(), queries_.shape()),
                                          heads_of(keys_.data(), keys_.shape()), log_sum_exp_,
                                          options_));
}

Tensor FusedAttentionPass::dropout_mask() const {
  if (family_ == Family::kNone || options_.dropout == 0.0F) return {};
  // Dot-product shapes for both families: the multipliers depend on the shapes alone.
  const Shape queries{queries_.dim(0), queries_.dim(1), heads_};
  const Shape keys{keys_.dim(0), keys_.dim(1), heads_};
  return to_batch_heads(
      attention_dropout_mask(heads_of(static_cast<const float*>(nullptr), queries).shape(),
                             heads_of(static_cast<const float*>(nullptr), keys).shape(), options_));
}

}  // namespace attn
