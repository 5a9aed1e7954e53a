// AdditiveAttention: scores w_vᵀ tanh(W_q q + W_k k) with hidden size h, for queries and keys of
// different sizes — the book's AdditiveAttention (Bahdanau), parameters named as its state dict.
#pragma once

#include <cstdint>
#include <vector>

#include "attn/nn/attention_layer.hpp"
#include "attn/nn/linear.hpp"
#include "attn/nn/state_dict.hpp"

namespace attn {

class AdditiveAttention : public AttentionLayer {
 public:
  // W_q (h, query_size), W_k (h, key_size), w_v (1, h), no bias; `seed` drives initialisation and
  // dropout. ValueError for a non-positive size or a dropout outside [0, 1].
  AdditiveAttention(int64_t key_size, int64_t query_size, int64_t num_hiddens, float dropout,
                    uint64_t seed = 0);

  // queries (B, n, query_size), keys (B, m, key_size), values (B, m, v) → (B, n, v).
  Tensor forward(ConstTensorView queries, ConstTensorView keys, ConstTensorView values,
                 const ValidLengths& valid_lens = {});
  Tensor operator()(ConstTensorView queries, ConstTensorView keys, ConstTensorView values,
                    const ValidLengths& valid_lens = {}) {
    return forward(queries, keys, values, valid_lens);
  }

  // Gradients of sum(output ⊙ grad_output) for the last forward pass; accumulates the gradients of
  // W_q, W_k and w_v (see parameters()).
  AttentionGradients backward(ConstTensorView grad_output);

  int64_t key_size() const { return W_k_.in_features(); }
  int64_t query_size() const { return W_q_.in_features(); }
  int64_t num_hiddens() const { return W_q_.out_features(); }

  // "W_q.weight", "W_k.weight", "w_v.weight".
  std::vector<NamedParameter> parameters();
  StateDict state_dict() const;
  // New parameters end the last forward pass: backward() then asks for another.
  void load_state_dict(const StateDict& state);
  void load_state_views(const StateViews& state);

  // The fused kernels (default) never build the (B, n, m) scores, forward or backward: the
  // backward pass recomputes them tile by tile from the forward pass's log-sum-exp. The reference
  // path is the book's computation and its backward pass builds the weights.
  void set_path(AttentionPath path) { path_ = path; }
  AttentionPath path() const { return path_; }

 private:
  Tensor compute_scores() const;

  Rng init_rng_;
  // Declared (so initialised) in the book's order: W_k, W_q, w_v.
  Linear W_k_;
  Linear W_q_;
  Linear w_v_;
  // Kept by a reference forward pass for its backward pass (a fused pass keeps its own, in fused_).
  Tensor queries_;
  Tensor keys_;
  Tensor projected_queries_;
  Tensor projected_keys_;
  AttentionPath path_ = AttentionPath::kFused;
};

}  // namespace attn
