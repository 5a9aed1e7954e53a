// Seq2Seq: the book's encoder–decoder with Bahdanau attention (EncoderDecoder of Seq2SeqEncoder
// and Seq2SeqAttentionDecoder), its hyper-parameters, teacher-forced forward and backward passes,
// and the masked loss of one batch.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "attn/core/tensor.hpp"
#include "attn/nn/state_dict.hpp"
#include "attn/seq2seq/decoder.hpp"
#include "attn/seq2seq/encoder.hpp"

namespace attn {

struct Seq2SeqConfig {
  int64_t source_vocab_size = 0;
  int64_t target_vocab_size = 0;
  int64_t embed_size = 32;
  int64_t num_hiddens = 64;
  int64_t num_layers = 1;
  float dropout = 0.0F;
  // Whether the decoder may attend to the source's <eos>. The book's model does (true). With a
  // unidirectional encoder the state at <eos> holds the whole source, so a decoder that may attend
  // to it learns to read the last token there, one step late; the date task trains with false,
  // which keeps its alignment heatmaps on the tokens themselves (year ↔ year).
  bool attend_to_eos = true;
};

// A batch as the book's data loader gives it: source and target ids (batch, steps) padded with
// <pad>, and their valid lengths (which count the <eos>).
struct Seq2SeqBatch {
  int64_t batch = 0;
  int64_t source_steps = 0;
  int64_t target_steps = 0;
  std::vector<int64_t> source;
  std::vector<int64_t> source_valid_lens;
  std::vector<int64_t> target;
  std::vector<int64_t> target_valid_lens;
};

// The lengths the decoder's attention uses: `valid_lens` (which count the <eos>) as they are when
// `attend_to_eos`, else one fewer for every sequence that ends in <eos>. `source` is (batch,
// steps).
std::vector<int64_t> attention_valid_lens(std::span<const int64_t> source,
                                          std::span<const int64_t> valid_lens, int64_t steps,
                                          bool attend_to_eos);

class Seq2Seq {
 public:
  // Embeddings from N(0, 1); every Linear and GRU weight matrix re-drawn with Xavier-uniform, as
  // the book's init_seq2seq; biases keep PyTorch's defaults. ValueError for a size < 1 or a
  // dropout outside [0, 1].
  Seq2Seq(const Seq2SeqConfig& config, uint64_t seed);

  const Seq2SeqConfig& config() const { return config_; }
  Seq2SeqEncoder& encoder() { return encoder_; }
  BahdanauDecoder& decoder() { return decoder_; }

  // Teacher forcing: encodes `source` (batch, source_steps), then decodes from `decoder_inputs`
  // (batch, target_steps) → logits (batch, target_steps, V).
  Tensor forward(std::span<const int64_t> source, std::span<const int64_t> source_valid_lens,
                 std::span<const int64_t> decoder_inputs, int64_t batch, int64_t source_steps,
                 int64_t target_steps);
  // Gradients of the last forward pass's logits: accumulates every parameter's gradient.
  void backward(ConstTensorView grad_logits);

  // One batch's loss: the decoder reads <bos> followed by the target shifted right, and the loss
  // is the softmax cross-entropy of the target tokens averaged over the non-padding ones (the
  // book's Seq2Seq.loss). The decoder runs only as many steps as the longest target needs, which
  // changes nothing: padding positions carry no loss. With `backward`, also accumulates the
  // gradients of that mean. Returns the mean token loss.
  double batch_loss(const Seq2SeqBatch& batch, bool backward);

  void train(bool training = true);
  void eval() { train(false); }
  // Re-seeds every dropout generator (encoder GRU, decoder GRU, attention), so the next forward
  // pass draws the same masks as another started from the same seed.
  void seed_dropout(uint64_t seed);

  // "encoder.embedding.weight", "encoder.rnn.weight_ih_l0", ..., "decoder.attention.W_k.weight",
  // ..., "decoder.dense.bias".
  std::vector<NamedParameter> parameters();
  StateDict state_dict() const;
  // Strict: ShapeError naming a missing, unexpected or mis-shaped tensor.
  void load_state_dict(const StateDict& state);

 private:
  Seq2SeqConfig config_;
  Seq2SeqEncoder encoder_;
  BahdanauDecoder decoder_;
};

}  // namespace attn
