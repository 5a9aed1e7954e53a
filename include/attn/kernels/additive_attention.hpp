// Fused additive (Bahdanau) attention on the CPU: the scores w_vᵀ tanh(a_i + b_j) computed tile by
// tile with a vectorised tanh and the same online softmax, masks, dropout and threads as the
// dot-product kernels (flash_attention.hpp); never builds the book's (B, n, m, h) feature tensor,
// nor (B, n, m).
#pragma once

#include <cstdint>
#include <span>

#include "attn/core/valid_lengths.hpp"
#include "attn/kernels/fused_options.hpp"
#include "attn/kernels/heads_view.hpp"

namespace attn {

// Forward: scores S_ij = Σ_t w_v[t] · tanh(a_it + b_jt) from the projected queries a = W_q q
// (B·H: n × h) and keys b = W_k k (B·H: m × h), then the masks and softmax of
// flash_attention_forward (options.scale, softcap, ALiBi and sinks must be left unset: w_v carries
// any scale; ValueError otherwise). Key/value heads must match the query heads.
// Accuracy: tanh within 3.5e-7 relative per term.
void additive_attention_forward(ConstHeadsView projected_queries, ConstHeadsView projected_keys,
                                std::span<const float> w_v, ConstHeadsView values,
                                const ValidLengths& valid_lens,
                                const FlashAttentionOptions& options, HeadsView out,
                                float* log_sum_exp = nullptr);

// Backward: gradients of sum(out ⊙ grad_out) with respect to the projected queries a
// (B·H: n × h), the projected keys b (B·H: m × h), w_v (h) and the values (B·H: m × dv),
// recomputing the probabilities tile by tile from the forward pass's `log_sum_exp` and
// tanh(a_i + b_j) wherever it is needed; never builds (B, n, m) nor (B, n, m, h). `out` and
// `log_sum_exp` must come from additive_attention_forward with the same inputs, lengths and
// options. Layouts as the forward pass; grad_projected_queries, grad_projected_keys, grad_v are
// overwritten, and so is grad_w_v (h), with the sum over every batch element and head.
// Work is split over (batch, head) pairs, and over chunks of keys when there are fewer pairs than
// threads; results are reproducible for a fixed thread count. Extra memory: about
// 2n·(h + dv) + 64·(h + dv + 12·lanes) floats per thread, plus B·H·h floats (and, when heads are
// split, about threads·n·h).
// Accuracy: float32 sums of n or m terms per gradient with tanh within 3.5e-7 relative; tests use
// 1e-5 relative to each gradient's magnitude. ShapeError/ValueError for inconsistent arguments.
void additive_attention_backward(ConstHeadsView projected_queries, ConstHeadsView projected_keys,
                                 std::span<const float> w_v, ConstHeadsView values,
                                 ConstHeadsView out, ConstHeadsView grad_out,
                                 const float* log_sum_exp, const ValidLengths& valid_lens,
                                 const FlashAttentionOptions& options,
                                 HeadsView grad_projected_queries, HeadsView grad_projected_keys,
                                 std::span<float> grad_w_v, HeadsView grad_v);

// The weights of an additive forward pass, P_ij = exp(S_ij − log_sum_exp_i), into `weights`
// (B·H: n × m), as flash_attention_weights.
void additive_attention_weights(ConstHeadsView projected_queries, ConstHeadsView projected_keys,
                                std::span<const float> w_v, const float* log_sum_exp,
                                const ValidLengths& valid_lens,
                                const FlashAttentionOptions& options, HeadsView weights);

// Each row's total of those weights with its sink's, Σ_j exp(S_ij − lse_i) + exp(sink − lse_i),
// into `totals` (B·H·n): 1 up to rounding, except where the float log-sum-exp lost log(sum) to
// its own magnitude (rows of scores near −1e9, as a large additive mask gives them), whose
// weights and gradients then all carry the total as one factor.
void additive_attention_row_totals(ConstHeadsView projected_queries, ConstHeadsView projected_keys,
                                   std::span<const float> w_v, const float* log_sum_exp,
                                   const ValidLengths& valid_lens,
                                   const FlashAttentionOptions& options, float* totals);

}  // namespace attn
