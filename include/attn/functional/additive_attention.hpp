// attn::additive_attention: the book's additive (Bahdanau) attention as a function, forward and
// backward, through the fused additive kernels: scores w_vᵀ tanh(W_q q + W_k k), never building
// the (…, L, S, h) feature tensor nor (…, L, S).
#pragma once

#include <span>

#include "attn/core/strided_view.hpp"
#include "attn/core/tensor.hpp"
#include "attn/functional/attention_options.hpp"
#include "attn/functional/scaled_dot_product_attention.hpp"

namespace attn {

// The parameters, as the book's nn.Linear weights: W_q (h, query size), W_k (h, key size),
// w_v (h) (the (1, h) weight of its last Linear, flattened).
struct AdditiveParameters {
  ConstStridedView W_q;
  ConstStridedView W_k;
  std::span<const float> w_v;
};

// queries (..., L, Dq), keys (..., S, Dk), values (..., S, Dv) → (..., L, Dv), the leading axes
// equal (rank 2 to 8; one head). Options: valid lengths, causal, window, attn_mask and dropout
// as scaled_dot_product_attention; scale, softcap, ALiBi, sinks and enable_gqa belong to dot
// products and are refused.
AttentionForward additive_attention(ConstStridedView queries, ConstStridedView keys,
                                    ConstStridedView values, const AdditiveParameters& parameters,
                                    const AttentionOptions& options = {});

struct AdditiveGradients {
  Tensor queries;
  Tensor keys;
  Tensor values;
  Tensor W_q;
  Tensor W_k;
  Tensor w_v;  // (h)
};

// Gradients of sum(output ⊙ grad_output); `output` and `log_sum_exp` from the forward pass.
AdditiveGradients additive_attention_backward(ConstStridedView queries, ConstStridedView keys,
                                              ConstStridedView values,
                                              const AdditiveParameters& parameters,
                                              ConstStridedView output, ConstStridedView grad_output,
                                              std::span<const float> log_sum_exp,
                                              const AttentionOptions& options = {});

// The attention weights of the forward pass (before dropout), (..., L, S), on request.
Tensor additive_attention_weights(ConstStridedView queries, ConstStridedView keys,
                                  const AdditiveParameters& parameters,
                                  std::span<const float> log_sum_exp,
                                  const AttentionOptions& options = {});

}  // namespace attn
