// Gru: a multi-layer gated recurrent unit with PyTorch's equations, gate order (r, z, n),
// initialisation and parameter names, dropout between layers, and backpropagation through time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attn/core/random.hpp"
#include "attn/core/tensor.hpp"
#include "attn/nn/dropout.hpp"
#include "attn/nn/state_dict.hpp"

namespace attn {

struct GruOutput {
  Tensor outputs;  // (T, B, H): the top layer's hidden state at every step
  Tensor state;    // (L, B, H): every layer's hidden state after the last step
};

struct GruGradients {
  Tensor inputs;         // (T, B, input_size)
  Tensor initial_state;  // (L, B, H)
};

// For every layer l, with x the layer's input at a step and h the hidden state before it (nn.GRU):
//   r = σ(W_ir x + b_ir + W_hr h + b_hr)
//   z = σ(W_iz x + b_iz + W_hz h + b_hz)
//   n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn))
//   h' = (1 − z) ⊙ n + z ⊙ h
// weight_ih_l{l} (3H, in) stacks W_ir, W_iz, W_in in that order, weight_hh_l{l} (3H, H) the hidden
// ones, bias_ih_l{l} and bias_hh_l{l} (3H) the biases. Layer l > 0 takes layer l − 1's outputs,
// after dropout in training mode. Time-major, as nn.GRU with batch_first=False.
class Gru {
 public:
  // What a backward pass needs from one forward call. A model that calls the GRU several times
  // (a decoder, one step per call) keeps one trace per call.
  class Trace {
   public:
    bool empty() const { return layers_.empty(); }

   private:
    friend class Gru;
    struct Layer {
      Tensor inputs;        // (T, B, in): the layer's inputs, after dropout
      Tensor dropout_mask;  // (T, B, in) multipliers applied to them; empty when none
      Tensor states;        // (T + 1, B, H): the hidden state before step 0, after every step
      Tensor reset;         // (T, B, H): r
      Tensor update;        // (T, B, H): z
      Tensor candidate;     // (T, B, H): n
      Tensor hidden_new;    // (T, B, H): W_hn h + b_hn, which the gradient of r needs
    };
    std::vector<Layer> layers_;
  };

  // Every parameter drawn uniformly from ±1/√hidden_size, as nn.GRU; `seed` drives that and the
  // dropout. ValueError for a non-positive size or layer count, or a dropout outside [0, 1].
  Gru(int64_t input_size, int64_t hidden_size, int64_t num_layers, float dropout = 0.0F,
      uint64_t seed = 0);

  // inputs (T, B, input_size); initial_state (L, B, H), or empty for zeros. Records into `trace`.
  // ShapeError naming the argument for any other shape.
  GruOutput forward(ConstTensorView inputs, ConstTensorView initial_state, Trace& trace);
  // The same, keeping the trace in the layer for backward(grad_outputs, grad_state).
  GruOutput forward(ConstTensorView inputs, ConstTensorView initial_state = {}) {
    return forward(inputs, initial_state, last_trace_);
  }

  // Backpropagation through time: the gradients of sum(outputs ⊙ grad_outputs) + sum(state ⊙
  // grad_state) for the forward call that recorded `trace`; grad_state may be empty (zero).
  // Accumulates the parameter gradients. ValueError for an empty trace, ShapeError for gradients
  // shaped unlike the outputs.
  GruGradients backward(const Trace& trace, ConstTensorView grad_outputs,
                        ConstTensorView grad_state);
  GruGradients backward(ConstTensorView grad_outputs, ConstTensorView grad_state = {}) {
    return backward(last_trace_, grad_outputs, grad_state);
  }

  // Training mode (the default, as PyTorch modules) applies dropout between layers.
  void train(bool training = true) { training_ = training; }
  void eval() { training_ = false; }
  bool is_training() const { return training_; }
  void seed_dropout(uint64_t seed) { dropout_.seed(seed); }

  int64_t input_size() const { return input_size_; }
  int64_t hidden_size() const { return hidden_size_; }
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  float dropout() const { return dropout_.p(); }

  // "prefix.weight_ih_l0", "prefix.weight_hh_l0", "prefix.bias_ih_l0", "prefix.bias_hh_l0", then
  // layer 1, ...; without the "prefix." for an empty prefix, as nn.GRU's own state dict.
  void append_parameters(const std::string& prefix, std::vector<NamedParameter>& parameters);
  std::vector<NamedParameter> parameters();
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

 private:
  struct LayerParameters {
    Tensor weight_ih, weight_hh, bias_ih, bias_hh;
    Tensor weight_ih_grad, weight_hh_grad, bias_ih_grad, bias_hh_grad;
  };

  int64_t input_size_;
  int64_t hidden_size_;
  std::vector<LayerParameters> layers_;
  Dropout dropout_;
  bool training_ = true;
  Trace last_trace_;
};

}  // namespace attn
