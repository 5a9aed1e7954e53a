// AttentionLayer: what every attention layer shares — training/evaluation mode, dropout on the
// attention weights, and the last weights kept for inspection.
#pragma once

#include <cstdint>

#include "attn/core/tensor.hpp"
#include "attn/core/valid_lengths.hpp"
#include "attn/nn/dropout.hpp"

namespace attn {

class AttentionLayer {
 public:
  // Layers start in training mode, as PyTorch modules do: call eval() for inference.
  void train(bool training = true) { training_ = training; }
  void eval() { training_ = false; }
  bool is_training() const { return training_; }

  // The weights of the last forward pass, before dropout: (B, n, m); empty before the first call.
  const Tensor& attention_weights() const { return attention_weights_; }
  // Re-seeds the generator behind dropout, so the next masks are reproducible.
  void seed_dropout(uint64_t seed) { dropout_.seed(seed); }
  float dropout() const { return dropout_.p(); }

 protected:
  AttentionLayer(float dropout, uint64_t seed) : dropout_(dropout, seed) {}

  // softmax(scores) with valid lengths → kept as attention_weights(); dropout in training mode;
  // then the weighted sum of values (B, m, v) → (B, n, v). `scores` (B, n, m) is consumed.
  Tensor pool(Tensor scores, const ValidLengths& valid_lens, ConstTensorView values);

 private:
  Dropout dropout_;
  bool training_ = true;
  Tensor attention_weights_;
};

// Throws ShapeError unless queries (B, n, ·), keys (B, m, ·) and values (B, m, ·) are rank 3 with
// matching batch and key counts.
void check_attention_inputs(ConstTensorView queries, ConstTensorView keys, ConstTensorView values);

}  // namespace attn
