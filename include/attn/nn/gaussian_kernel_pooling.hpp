// GaussianKernelPooling: Nadaraya–Watson kernel regression as attention pooling — scores
// −½‖(q − k)·w‖² with a width w (1 for the book's nonparametric model, learnable in its
// parametric one), masked softmax, dropout, weighted sum.
#pragma once

#include <cstdint>
#include <vector>

#include "attn/nn/attention_layer.hpp"
#include "attn/nn/state_dict.hpp"

namespace attn {

class GaussianKernelPooling : public AttentionLayer {
 public:
  // ValueError for a width that is not finite or a dropout outside [0, 1].
  explicit GaussianKernelPooling(float width = 1.0F, float dropout = 0.0F, uint64_t seed = 0);

  // queries (B, n, d), keys (B, m, d), values (B, m, v) → (B, n, v). The book's scalar inputs are
  // the case d = v = 1: x_test (n) against x_train (m) is queries (1, n, 1), keys (1, m, 1).
  Tensor forward(ConstTensorView queries, ConstTensorView keys, ConstTensorView values,
                 const ValidLengths& valid_lens = {});
  Tensor operator()(ConstTensorView queries, ConstTensorView keys, ConstTensorView values,
                    const ValidLengths& valid_lens = {}) {
    return forward(queries, keys, values, valid_lens);
  }

  // Gradients of sum(output ⊙ grad_output) for the last forward pass; accumulates the gradient
  // of the width w (see parameters()).
  AttentionGradients backward(ConstTensorView grad_output);

  float width() const { return width_.data()[0]; }
  // "w", shape (1,), as the book's NWKernelRegression names its parameter.
  std::vector<NamedParameter> parameters();
  StateDict state_dict() const;
  // Both throw ValueError for a width that is not finite (after loading it, as PyTorch's module
  // would hold it).
  // New parameters end the last forward pass: backward() then asks for another.
  void load_state_dict(const StateDict& state);
  void load_state_views(const StateViews& state);

 private:
  Tensor width_;
  Tensor width_grad_;
  // Kept by forward() for backward().
  Tensor queries_;
  Tensor keys_;
};

}  // namespace attn
