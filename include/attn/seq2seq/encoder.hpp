// Seq2SeqEncoder: the book's GRU encoder — token embedding, then a multi-layer GRU over the source
// sequence, whose outputs become the decoder's attention keys and values.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "attn/core/tensor.hpp"
#include "attn/nn/embedding.hpp"
#include "attn/nn/gru.hpp"
#include "attn/nn/state_dict.hpp"

namespace attn {

class Seq2SeqEncoder {
 public:
  // ValueError for a non-positive size or a dropout outside [0, 1].
  Seq2SeqEncoder(int64_t vocab_size, int64_t embed_size, int64_t num_hiddens, int64_t num_layers,
                 float dropout, uint64_t seed);

  // source: ids (batch, steps), row-major as the book's X → outputs (steps, batch, H) and the
  // final state (L, batch, H). ValueError for an id outside the vocabulary, ShapeError when
  // source does not hold batch × steps ids.
  GruOutput forward(std::span<const int64_t> source, int64_t batch, int64_t steps);
  // Gradients of the last forward pass's outputs (steps, batch, H) and state (L, batch, H, or
  // empty): accumulates the embedding's and the GRU's parameter gradients.
  void backward(ConstTensorView grad_outputs, ConstTensorView grad_state);

  void train(bool training = true) { rnn_.train(training); }
  bool is_training() const { return rnn_.is_training(); }
  Embedding& embedding() { return embedding_; }
  Gru& rnn() { return rnn_; }

  // "prefix.embedding.weight", "prefix.rnn.weight_ih_l0", ...
  void append_parameters(const std::string& prefix, std::vector<NamedParameter>& parameters);

 private:
  Rng init_rng_;
  Embedding embedding_;
  Gru rnn_;
  std::vector<int64_t> time_major_ids_;  // the last forward pass's ids, step by step
};

}  // namespace attn
