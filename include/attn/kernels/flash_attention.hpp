// Fused scaled dot-product attention on the CPU (FlashAttention-2's algorithm): query tiles ×
// key tiles with an online softmax, never materialising the n × m score matrix. SIMD through
// Highway, chosen at run time for the machine; threads through OpenMP.
#pragma once

#include <cstdint>
#include <span>

#include "attn/core/valid_lengths.hpp"
#include "attn/kernels/heads_view.hpp"

namespace attn {

struct FlashAttentionOptions {
  float scale = 1.0F;  // scores are scale · qᵀk
  // Bottom-right aligned, as FlashAttention-2: query i of n sees keys j ≤ i + m − n (combined with
  // the valid lengths by minimum).
  bool causal = false;
  // Dropout on the attention weights (inverted: kept weights are scaled by 1/(1−p)), decided per
  // (seed, batch·head, query, key) by a counter-based hash, so forward and backward agree without
  // storing a mask. p in [0, 1).
  float dropout = 0.0F;
  uint64_t seed = 0;
};

// The multipliers (0 or 1/(1−p)) that the kernels apply for these options, materialised as
// (batch·heads, n, m) for inspection and tests.
Tensor flash_attention_dropout_mask(const FlashAttentionOptions& options, int64_t batch_heads,
                                    int64_t queries, int64_t keys);

// out[b, h] = softmax(scale · Q Kᵀ, masked) V for every batch element b and head h, where query i
// of batch element b sees its first valid_lens.length(b, i) keys (the same for every head) and a
// query that sees no key gets a zero output. Layouts: q (B·H: n × d), k (B·H: m × d),
// v (B·H: m × dv), out (B·H: n × dv), all strided (see HeadsView).
// `log_sum_exp`, when not null, receives B·H·n values (batch, head, query order): the natural log
// of each row's softmax denominator including the max, −∞ for a row that sees no key, for the
// backward pass. Throws ShapeError/ValueError for inconsistent shapes or lengths.
// Accuracy: within a few float32 ulps of the plain path per accumulated term (tests use 1e-5
// relative to the output's magnitude). Extra memory: per thread, a packed copy of one head's keys
// and values, m·(d + dv) floats, plus tiles of a few tens of kilobytes.
void flash_attention_forward(ConstHeadsView q, ConstHeadsView k, ConstHeadsView v,
                             const ValidLengths& valid_lens, const FlashAttentionOptions& options,
                             HeadsView out, float* log_sum_exp = nullptr);

// Fused additive (Bahdanau) attention, forward: scores S_ij = Σ_t w_v[t] · tanh(a_it + b_jt) from
// the projected queries a = W_q q (B·H: n × h) and keys b = W_k k (B·H: m × h), computed tile by
// tile with a vectorised tanh and the same online softmax, masks, dropout and threads as
// flash_attention_forward; never builds the book's (B, n, m, h) feature tensor, nor (B, n, m).
// options.scale is ignored (w_v carries the scale). Accuracy: tanh within 3.5e-7 relative per term.
void additive_attention_forward(ConstHeadsView projected_queries, ConstHeadsView projected_keys,
                                std::span<const float> w_v, ConstHeadsView values,
                                const ValidLengths& valid_lens,
                                const FlashAttentionOptions& options, HeadsView out,
                                float* log_sum_exp = nullptr);

// Fused additive attention, backward: gradients of sum(out ⊙ grad_out) with respect to the
// projected queries a (B·H: n × h), the projected keys b (B·H: m × h), w_v (h) and the values
// (B·H: m × dv), recomputing the probabilities tile by tile from the forward pass's `log_sum_exp`
// and tanh(a_i + b_j) wherever it is needed; never builds (B, n, m) nor (B, n, m, h). `out` and
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

// FlashAttention-2's backward pass: gradients of sum(out ⊙ grad_out) with respect to q, k and v,
// recomputing the probabilities tile by tile from the forward pass's `log_sum_exp` instead of
// storing them. `out` and `log_sum_exp` must come from flash_attention_forward with the same
// inputs, lengths and options. Layouts as the forward pass; grad_q, grad_k, grad_v are overwritten.
// Work is split over (batch, head) pairs, so B·H ≥ threads keeps every thread busy. Extra memory:
// about 6·(n + m)·d floats per thread.
void flash_attention_backward(ConstHeadsView q, ConstHeadsView k, ConstHeadsView v,
                              ConstHeadsView out, ConstHeadsView grad_out, const float* log_sum_exp,
                              const ValidLengths& valid_lens, const FlashAttentionOptions& options,
                              HeadsView grad_q, HeadsView grad_k, HeadsView grad_v);

}  // namespace attn
