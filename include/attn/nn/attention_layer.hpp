// AttentionLayer: what every attention layer shares — training/evaluation mode, dropout on the
// attention weights, the last weights kept for inspection, and the pooling step's backward pass.
#pragma once

#include <cstdint>

#include "attn/core/tensor.hpp"
#include "attn/core/valid_lengths.hpp"
#include "attn/nn/dropout.hpp"
#include "attn/nn/fused_attention_pass.hpp"

namespace attn {

// Which implementation a layer runs: the fused kernel (default; never builds the (B, n, m) score
// tensor) or the plain reference path that builds it, as the book's code does.
enum class AttentionPath { kFused, kReference };

// Gradients of a loss with respect to an attention layer's inputs, shaped like them.
struct AttentionGradients {
  Tensor queries;
  Tensor keys;
  Tensor values;
};

// Backward passes are explicit: forward() keeps what its backward() needs (copies of the inputs
// and intermediates), and backward(grad_output) returns the input gradients while accumulating the
// parameter gradients. Layers compose by calling each other's forward and backward in turn, which
// keeps every derivation local and readable (see docs/training.md).
class AttentionLayer {
 public:
  // Layers start in training mode, as PyTorch modules do: call eval() for inference.
  void train(bool training = true) { training_ = training; }
  void eval() { training_ = false; }
  bool is_training() const { return training_; }

  // The weights of the last forward pass, before dropout: (B, n, m); empty before the first call.
  // After a fused forward pass (which never holds them) they are computed on this first request.
  const Tensor& attention_weights() const;
  // The dropout multipliers of the last forward pass (0 or 1/(1−p), shaped like the weights);
  // empty when it applied no dropout (evaluation mode or p = 0).
  // After a fused pass they are regenerated from the kernel's counter-based hash on this request.
  const Tensor& dropout_mask() const;
  // Re-seeds the generator behind dropout, so the next masks are reproducible.
  void seed_dropout(uint64_t seed) { dropout_.seed(seed); }
  float dropout() const { return dropout_.p(); }

 protected:
  AttentionLayer(float dropout, uint64_t seed) : dropout_(dropout, seed) {}
  virtual ~AttentionLayer() = default;
  AttentionLayer(const AttentionLayer&) = default;
  AttentionLayer& operator=(const AttentionLayer&) = default;
  AttentionLayer(AttentionLayer&&) = default;
  AttentionLayer& operator=(AttentionLayer&&) = default;

  // The fused path: the layer runs its forward pass through fused_ (the functional API), then
  // calls fused_pass_recorded(), after which attention_weights() and dropout_mask() come from
  // fused_ on the first request.
  FusedAttentionPass fused_;
  void fused_pass_recorded();
  // Drops what the last forward pass kept, so that backward() asks for a new one: after new
  // parameters are loaded its gradients would mix the old weights' intermediates with the new
  // weights (PyTorch refuses a backward through parameters changed in place, too).
  void forget_forward_pass();
  // The options of a fused pass in this layer's mode: dropout (and a seed for it, drawn from this
  // layer's generator) in training mode only.
  AttentionOptions fused_options(const ValidLengths& valid_lens);

  // The reference path: softmax(scores) with valid lengths → kept as attention_weights(); dropout
  // in training mode; then the weighted sum of values (B, m, v) → (B, n, v). `scores` (B, n, m)
  // is consumed; fused_ is cleared.
  Tensor pool(Tensor scores, const ValidLengths& valid_lens, ConstTensorView values);

  struct PoolGradients {
    Tensor scores;  // (B, n, m)
    Tensor values;  // (B, m, v)
  };
  // The backward pass of the last pool(): with P the weights and D the dropout multipliers,
  // O = (P ⊙ D) V gives dV = (P ⊙ D)ᵀ dO and dP = (dO Vᵀ) ⊙ D, then the softmax backward gives
  // dS. ValueError before any forward pass; ShapeError if grad_output is not shaped like O.
  PoolGradients pool_backward(ConstTensorView grad_output, std::string_view layer_name) const;

 private:
  Dropout dropout_;
  bool training_ = true;
  // Filled on demand after a fused pass (until then *_deferred_), hence mutable.
  mutable Tensor attention_weights_;
  mutable bool weights_deferred_ = false;
  mutable Tensor dropout_mask_;  // empty when the last forward pass applied no dropout
  mutable bool mask_deferred_ = false;
  Tensor pooled_values_;  // the reference path's values, for pool_backward
};

// The fused kernels never hold the scores, so they cannot report a NaN or infinite one as
// masked_softmax does. Throws ValueError for non-finite queries, keys or values (names prefixed by
// `what`, e.g. "projected "), and returns whether every dot-product score is certainly finite:
// |scale|·depth·max|q|·max|k| < 1e37. When it is not, layers take the reference path, which reports
// the bad score.
bool dot_scores_stay_finite(ConstTensorView queries, ConstTensorView keys, ConstTensorView values,
                            int64_t depth, float scale, std::string_view what = "");
// The same bound for inputs already known finite, from their largest magnitudes.
bool dot_scores_stay_finite(float query_max, float key_max, int64_t depth, float scale);

// Throws ShapeError unless queries (B, n, ·), keys (B, m, ·) and values (B, m, ·) are rank 3 with
// matching batch and key counts.
void check_attention_inputs(ConstTensorView queries, ConstTensorView keys, ConstTensorView values);

// Throws ShapeError unless a backward pass's grad_output has the last forward pass's output shape.
void check_grad_output(ConstTensorView grad_output, const Shape& output_shape);

}  // namespace attn
