// BahdanauDecoder: the book's Seq2SeqAttentionDecoder — at each step additive attention over the
// encoder outputs (query: the previous top-layer hidden state), the context concatenated with the
// embedded input token into a multi-layer GRU, and a dense layer to vocabulary logits.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "attn/core/random.hpp"
#include "attn/core/tensor.hpp"
#include "attn/nn/dropout.hpp"
#include "attn/nn/embedding.hpp"
#include "attn/nn/gru.hpp"
#include "attn/nn/linear.hpp"
#include "attn/nn/state_dict.hpp"

namespace attn {

class BahdanauDecoder {
 public:
  // The attention's hidden size is num_hiddens, as the book's AdditiveAttention(num_hiddens,
  // dropout); the GRU takes num_hiddens + embed_size inputs (context first). ValueError for a
  // non-positive size or a dropout outside [0, 1].
  BahdanauDecoder(int64_t vocab_size, int64_t embed_size, int64_t num_hiddens, int64_t num_layers,
                  float dropout, uint64_t seed);

  // Starts a batch: enc_outputs (m, B, H) as the encoder returns them (the keys and values),
  // enc_state (L, B, H) the initial hidden state, valid_lens (B) in [0, m] the source lengths.
  // The keys are projected once here, not at every step. Forgets the previous batch's steps.
  void begin(ConstTensorView enc_outputs, ConstTensorView enc_state,
             std::span<const int64_t> valid_lens);
  // One step on input tokens (B) → logits (B, V). Every step is kept for backward() and
  // attention_weights(). ValueError before begin() or for an id outside the vocabulary.
  Tensor step(std::span<const int64_t> tokens);
  // Teacher forcing: inputs (B, steps) row-major → logits (B, steps, V), one step() per column.
  Tensor forward(std::span<const int64_t> inputs, int64_t steps);

  struct Gradients {
    Tensor enc_outputs;  // (m, B, H)
    Tensor enc_state;    // (L, B, H)
  };
  // Backpropagation through every step since begin(): grad_logits (B, steps, V). Accumulates the
  // parameter gradients. ValueError without steps, ShapeError for another shape.
  Gradients backward(ConstTensorView grad_logits);

  // The current hidden state (L, B, H).
  const Tensor& state() const { return hidden_; }
  // The attention weights of every step since begin(), before dropout: (steps, B, m).
  Tensor attention_weights() const;
  int64_t steps_taken() const { return static_cast<int64_t>(steps_.size()); }

  void train(bool training = true);
  bool is_training() const { return training_; }
  // Re-seeds the dropout of the GRU and of the attention weights, so the next masks reproduce.
  void seed_dropout(uint64_t seed);
  int64_t vocab_size() const { return dense_.out_features(); }
  int64_t num_hiddens() const { return rnn_.hidden_size(); }

  // "prefix.attention.W_k.weight", "prefix.attention.W_q.weight", "prefix.attention.w_v.weight",
  // "prefix.embedding.weight", "prefix.rnn.weight_ih_l0", ..., "prefix.dense.weight",
  // "prefix.dense.bias": the book's state-dict names.
  void append_parameters(const std::string& prefix, std::vector<NamedParameter>& parameters);

 private:
  struct StepRecord {
    std::vector<int64_t> tokens;  // (B)
    Tensor query;                 // (B, H): the top layer's hidden state before the step
    Tensor features;              // (B, m, h): tanh(W_q query + W_k key) for valid keys
    Tensor weights;               // (B, m)
    Tensor dropout_mask;          // (B, m); empty without dropout
    Gru::Trace gru;
    Tensor output;  // (B, H): the GRU's top output, the dense layer's input
  };

  Rng init_rng_;
  Linear W_k_;
  Linear W_q_;
  Linear w_v_;
  Embedding embedding_;
  Gru rnn_;
  Linear dense_;
  Dropout attention_dropout_;
  bool training_ = true;

  // The current batch.
  bool begun_ = false;
  Tensor keys_;            // (B, m, H): enc_outputs batch-major
  Tensor projected_keys_;  // (B, m, h)
  std::vector<int64_t> valid_lens_;
  Tensor hidden_;  // (L, B, H)
  std::vector<StepRecord> steps_;
};

}  // namespace attn
