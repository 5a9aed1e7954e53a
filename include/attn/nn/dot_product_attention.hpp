// DotProductAttention: scores qᵀk · scale (default 1/√d), masked softmax, dropout, weighted sum —
// the book's DotProductAttention.
#pragma once

#include <cstdint>
#include <optional>

#include "attn/nn/attention_layer.hpp"

namespace attn {

class DotProductAttention : public AttentionLayer {
 public:
  // ValueError for a dropout outside [0, 1] or a scale that is not finite.
  explicit DotProductAttention(float dropout = 0.0F, std::optional<float> scale = std::nullopt,
                               uint64_t seed = 0);

  // queries (B, n, d), keys (B, m, d), values (B, m, v) → (B, n, v).
  Tensor forward(ConstTensorView queries, ConstTensorView keys, ConstTensorView values,
                 const ValidLengths& valid_lens = {});
  Tensor operator()(ConstTensorView queries, ConstTensorView keys, ConstTensorView values,
                    const ValidLengths& valid_lens = {}) {
    return forward(queries, keys, values, valid_lens);
  }

  // Gradients of sum(output ⊙ grad_output) for the last forward pass: with S = c·Q Kᵀ,
  // dQ = c·dS K and dK = c·dSᵀ Q; dV and dS come from the shared pooling step.
  AttentionGradients backward(ConstTensorView grad_output) const;

  // The scale in use for queries of size d.
  float scale_for(int64_t d) const;

 private:
  std::optional<float> scale_;
  Tensor queries_;
  Tensor keys_;
};

}  // namespace attn
