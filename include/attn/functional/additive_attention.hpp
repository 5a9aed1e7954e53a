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

// W_q q (..., L, h) and W_k k (..., S, h) as additive_attention computed them. A caller that keeps
// them (a layer, for its backward pass and weights) hands them back to additive_attention_backward
// and additive_attention_weights, which then skip projecting again: at the book's Bahdanau
// decoder step (B = 64, one query, 10 keys, 256 hidden units) the projections are a third of the
// backward pass's products. They must come from the same queries, keys and parameters.
struct AdditiveProjections {
  Tensor queries;
  Tensor keys;
};

// queries (..., L, Dq), keys (..., S, Dk), values (..., S, Dv) → (..., L, Dv), the leading axes
// equal (rank 2 to 8; one head). Options: valid lengths, causal, window, attn_mask and dropout
// as scaled_dot_product_attention; scale, softcap, ALiBi, sinks and enable_gqa belong to dot
// products and are refused. With `projections`, W_q q and W_k k are moved there.
AttentionForward additive_attention(ConstStridedView queries, ConstStridedView keys,
                                    ConstStridedView values, const AdditiveParameters& parameters,
                                    const AttentionOptions& options = {},
                                    AdditiveProjections* projections = nullptr);

struct AdditiveGradients {
  Tensor queries;
  Tensor keys;
  Tensor values;
  Tensor W_q;
  Tensor W_k;
  Tensor w_v;  // (h)
};

// Gradients of sum(output ⊙ grad_output); `output` and `log_sum_exp` from the forward pass, and
// `projections` (or null: computed again) too; ShapeError when they are not shaped as W_q q, W_k k.
AdditiveGradients additive_attention_backward(ConstStridedView queries, ConstStridedView keys,
                                              ConstStridedView values,
                                              const AdditiveParameters& parameters,
                                              ConstStridedView output, ConstStridedView grad_output,
                                              std::span<const float> log_sum_exp,
                                              const AttentionOptions& options = {},
                                              const AdditiveProjections* projections = nullptr);

// The attention weights of the forward pass (before dropout), (..., L, S), on request;
// `projections` as for additive_attention_backward.
Tensor additive_attention_weights(ConstStridedView queries, ConstStridedView keys,
                                  const AdditiveParameters& parameters,
                                  std::span<const float> log_sum_exp,
                                  const AttentionOptions& options = {},
                                  const AdditiveProjections* projections = nullptr);

}  // namespace attn
