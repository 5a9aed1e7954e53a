// MultiHeadAttention: the book's multi-head attention — project queries, keys and values with
// W_q, W_k, W_v, run scaled dot-product attention on num_heads slices, concatenate, project by W_o.
#pragma once

#include <cstdint>
#include <vector>

#include "attn/nn/dot_product_attention.hpp"
#include "attn/nn/fused_attention_pass.hpp"
#include "attn/nn/linear.hpp"
#include "attn/nn/state_dict.hpp"

namespace attn {

class MultiHeadAttention {
 public:
  // W_q (h, query_size), W_k (h, key_size), W_v (h, value_size), W_o (h, h), with biases when
  // `bias`. ValueError when num_hiddens is not divisible by num_heads, a size is not positive, or
  // the dropout is outside [0, 1].
  MultiHeadAttention(int64_t key_size, int64_t query_size, int64_t value_size, int64_t num_hiddens,
                     int64_t num_heads, float dropout, bool bias = false, uint64_t seed = 0);

  // queries (B, n, query_size), keys (B, m, key_size), values (B, m, value_size) → (B, n, h);
  // each batch element's valid lengths apply to all of its heads.
  Tensor forward(ConstTensorView queries, ConstTensorView keys, ConstTensorView values,
                 const ValidLengths& valid_lens = {});
  Tensor operator()(ConstTensorView queries, ConstTensorView keys, ConstTensorView values,
                    const ValidLengths& valid_lens = {}) {
    return forward(queries, keys, values, valid_lens);
  }

  // Gradients of sum(output ⊙ grad_output) for the last forward pass; accumulates the gradients of
  // the four projections (see parameters()).
  AttentionGradients backward(ConstTensorView grad_output);

  void train(bool training = true) { attention_.train(training); }
  void eval() { attention_.eval(); }
  bool is_training() const { return attention_.is_training(); }
  float dropout() const { return attention_.dropout(); }
  void seed_dropout(uint64_t seed) {
    attention_.seed_dropout(seed);
    dropout_seeds_ = Rng(seed);
  }
  // (B·num_heads, n, m), batch-major then head, as the book's attention.attention_weights;
  // after a fused pass they are computed on this first request.
  const Tensor& attention_weights() const;
  // The dropout multipliers of the last pass, (B·num_heads, n, m); empty without dropout.
  const Tensor& dropout_mask() const;

  // The fused path (default) runs the flash kernel on the projections in place, head by head
  // through strides; it serves evaluation mode and dropout 0. The reference path is the book's:
  // transpose copies around a DotProductAttention.
  void set_path(AttentionPath path) { path_ = path; }
  AttentionPath path() const { return path_; }

  int64_t num_heads() const { return num_heads_; }
  int64_t num_hiddens() const { return W_o_.out_features(); }
  int64_t query_size() const { return W_q_.in_features(); }
  int64_t key_size() const { return W_k_.in_features(); }
  int64_t value_size() const { return W_v_.in_features(); }
  bool has_bias() const { return W_o_.has_bias(); }

  // "W_q.weight", "W_k.weight", "W_v.weight", "W_o.weight" (and ".bias" of each with bias).
  std::vector<NamedParameter> parameters();
  StateDict state_dict() const;
  // New parameters end the last forward pass: backward() then asks for another (its gradients
  // would mix the old weights' intermediates with the new weights).
  void load_state_dict(const StateDict& state);
  void load_state_views(const StateViews& state);

 private:
  int64_t num_heads_;
  Rng init_rng_;
  DotProductAttention attention_;
  Rng dropout_seeds_;  // keys the fused kernel's dropout, one seed per pass
  Linear W_q_;
  Linear W_k_;
  Linear W_v_;
  Linear W_o_;
  AttentionPath path_ = AttentionPath::kFused;
  // Kept by forward() for backward().
  Tensor queries_;
  Tensor keys_;
  Tensor values_;
  Tensor concatenated_heads_;  // the reference path's; a fused pass keeps its own (its output)
  // A fused forward pass: the projections (B, n, h) it ran on, its output and log-sum-exp.
  FusedAttentionPass fused_;
  mutable Tensor fused_weights_;  // computed on request
  mutable Tensor fused_mask_;     // computed on request
};

}  // namespace attn
