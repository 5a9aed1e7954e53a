// FusedAttentionPass: what an attention layer keeps of a forward pass through the functional API
// (attn::scaled_dot_product_attention or attn::additive_attention) — its inputs, output,
// log-sum-exp and options — for the backward pass and for the weights and dropout multipliers
// computed on request. One record for every attention layer.
#pragma once

#include <cstdint>
#include <vector>

#include "attn/core/tensor.hpp"
#include "attn/functional/additive_attention.hpp"
#include "attn/functional/attention_options.hpp"
#include "attn/functional/scaled_dot_product_attention.hpp"

namespace attn {

class FusedAttentionPass {
 public:
  // Whether a forward pass has been recorded (since the last clear()).
  bool ran() const { return family_ != Family::kNone; }
  void clear();

  // Dot-product attention over (B, n, heads·d) queries, (B, m, heads·d) keys and (B, m, heads·dv)
  // values, each read as `heads` heads in place (columns [h·d, (h+1)·d)); returns (B, n, heads·dv)
  // with the heads side by side. `options` must hold no views (masks, ALiBi, sinks): the book's
  // layers use valid lengths, causal, scale and dropout. Keeps the tensors for backward(); the
  // output is written into the storage of the previous pass's output when that holds enough.
  const Tensor& dot_product(Tensor queries, Tensor keys, Tensor values, int64_t heads,
                            AttentionOptions options);
  // A pass's queries, keys and values.
  struct Inputs {
    Tensor queries, keys, values;
  };
  // Forgets the recorded pass (as clear()) but hands its inputs over, so that a layer's next
  // projections or copies reuse their storage (and keeps its output's for the next pass).
  Inputs release_inputs();
  // release_inputs() with the views copied into them (Tensor::assign).
  Inputs copy_inputs(ConstTensorView queries, ConstTensorView keys, ConstTensorView values);
  // Additive attention with the parameters as they are now (copies are kept for the weights).
  Tensor additive(Tensor queries, Tensor keys, Tensor values, Tensor W_q, Tensor W_k, Tensor w_v,
                  AttentionOptions options);

  // Gradients of sum(output ⊙ grad_output) for the recorded dot-product pass, shaped as its inputs.
  // ShapeError unless grad_output has the output's shape; ValueError before any pass.
  AttentionBackward dot_product_backward(ConstTensorView grad_output) const;
  // The same for a recorded additive pass, with the parameters' gradients.
  AdditiveGradients additive_backward(ConstTensorView grad_output) const;

  // The recorded pass's attention weights (before dropout), (B·heads, n, m).
  Tensor weights() const;
  // Its dropout multipliers (0 or 1/(1 − p)), (B·heads, n, m); empty without dropout.
  Tensor dropout_mask() const;

  const Tensor& output() const { return output_; }
  const AttentionOptions& options() const { return options_; }

 private:
  enum class Family { kNone, kDotProduct, kAdditive };

  // A (B, rows, heads·width) tensor as (B, heads, rows, width) (heads > 1), or as it is.
  template <class T>
  StridedView<T> heads_of(T* data, const Shape& shape) const;
  void check_grad_output(ConstTensorView grad_output, Family family) const;
  // clear(), the output's storage kept for the next pass's output.
  void clear_keeping_output();
  Tensor to_batch_heads(Tensor scores) const;

  Family family_ = Family::kNone;
  int64_t heads_ = 1;
  Tensor queries_, keys_, values_, output_;
  Tensor W_q_, W_k_, w_v_;
  // The additive pass's W_q q and W_k k, for its backward pass and weights.
  AdditiveProjections projections_;
  std::vector<float> log_sum_exp_;
  AttentionOptions options_;
};

}  // namespace attn
