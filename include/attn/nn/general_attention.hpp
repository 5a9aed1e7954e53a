// GeneralAttention: Luong's "general" score a(q, k) = qᵀ M k with M = Wᵀ, computed as (W q)·k — the
// answer to the book's exercise "using matrix multiplications only, design a scoring function for
// queries and keys of different lengths". The queries are projected once, then the fused
// dot-product kernel scores them against the keys unscaled, with the same valid lengths and dropout
// as the book's other layers.
#pragma once

#include <cstdint>
#include <vector>

#include "attn/nn/attention_layer.hpp"
#include "attn/nn/linear.hpp"
#include "attn/nn/state_dict.hpp"

namespace attn {

class GeneralAttention : public AttentionLayer {
 public:
  // W (key_size, query_size), PyTorch's nn.Linear(query_size, key_size, bias=False) under the
  // state-dict name "W.weight". ValueError for a non-positive size or a dropout outside [0, 1].
  GeneralAttention(int64_t query_size, int64_t key_size, float dropout = 0.0F, uint64_t seed = 0);

  // queries (B, n, query_size), keys (B, m, key_size), values (B, m, v) → (B, n, v); scores
  // S_ij = (W q_i)·k_j, masked softmax over the valid lengths, dropout in training mode.
  Tensor forward(ConstTensorView queries, ConstTensorView keys, ConstTensorView values,
                 const ValidLengths& valid_lens = {});
  Tensor operator()(ConstTensorView queries, ConstTensorView keys, ConstTensorView values,
                    const ValidLengths& valid_lens = {}) {
    return forward(queries, keys, values, valid_lens);
  }

  // Gradients of sum(output ⊙ grad_output) for the last forward pass: the dot-product backward
  // gives dq' for the projected queries q' = W q, then dq = dq' W and dW += dq'ᵀ q.
  AttentionGradients backward(ConstTensorView grad_output);

  int64_t query_size() const { return W_.in_features(); }
  int64_t key_size() const { return W_.out_features(); }

  // "W.weight".
  std::vector<NamedParameter> parameters();
  StateDict state_dict() const;
  // New parameters end the last forward pass: backward() then asks for another.
  void load_state_dict(const StateDict& state);
  void load_state_views(const StateViews& state);

  // The fused path (default) runs attn::scaled_dot_product_attention on the projected queries;
  // the reference path builds the (B, n, m) scores as the book's layers do.
  void set_path(AttentionPath path) { path_ = path; }
  AttentionPath path() const { return path_; }

 private:
  Rng init_rng_;
  Linear W_;
  AttentionPath path_ = AttentionPath::kFused;
  // Kept by forward() for backward(): the queries always, the reference path's keys and
  // projections too (a fused pass keeps its own in fused_).
  Tensor queries_;
  Tensor projected_queries_;
  Tensor keys_;
};

}  // namespace attn
