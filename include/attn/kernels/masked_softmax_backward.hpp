// The vector–Jacobian product of masked softmax, from the forward pass's weights.
#pragma once

#include "attn/core/tensor.hpp"

namespace attn {

// Derivation: on a row with valid keys V, y_j = exp(s_j) / Σ_{k∈V} exp(s_k) for j ∈ V and y_j = 0
// otherwise, so ∂y_j/∂s_k = y_j (δ_jk − y_k) for j, k ∈ V and 0 when either is masked. Hence
//   ds_k = Σ_j dy_j ∂y_j/∂s_k = y_k (dy_k − Σ_j y_j dy_j),
// which is exactly 0 at masked keys and on fully masked rows (where y = 0), with no mask needed.
// weights and grad_weights (B, n, m) → grad_scores (B, n, m); grad_scores may alias grad_weights.
void masked_softmax_backward(ConstTensorView weights, ConstTensorView grad_weights,
                             TensorView grad_scores);
Tensor masked_softmax_backward(ConstTensorView weights, ConstTensorView grad_weights);

}  // namespace attn
