// Masked softmax backward: one dot product and one scaled difference per row.
#include "attn/kernels/masked_softmax_backward.hpp"

#include "attn/core/error.hpp"

namespace attn {

void masked_softmax_backward(ConstTensorView weights, ConstTensorView grad_weights,
                             TensorView grad_scores) {
  require_rank("weights", weights.shape(), 3);
  if (grad_weights.shape() != weights.shape()) {
    throw ShapeError("grad_weights: expected shape " + weights.shape().str() +
                     " (that of weights), got shape " + grad_weights.shape().str());
  }
  if (grad_scores.shape() != weights.shape()) {
    throw ShapeError("grad_scores: expected shape " + weights.shape().str() +
                     " (that of weights), got shape " + grad_scores.shape().str());
  }
  const int64_t rows = weights.dim(0) * weights.dim(1), keys = weights.dim(2);
  for (int64_t row = 0; row < rows; ++row) {
    const float* y = weights.data() + row * keys;
    const float* dy = grad_weights.data() + row * keys;
    float* ds = grad_scores.data() + row * keys;
    float inner = 0.0F;
    for (int64_t j = 0; j < keys; ++j) inner += y[j] * dy[j];
    for (int64_t j = 0; j < keys; ++j) ds[j] = y[j] * (dy[j] - inner);
  }
}

Tensor masked_softmax_backward(ConstTensorView weights, ConstTensorView grad_weights) {
  Tensor grad_scores(weights.shape());
  masked_softmax_backward(weights, grad_weights, grad_scores);
  return grad_scores;
}

}  // namespace attn
