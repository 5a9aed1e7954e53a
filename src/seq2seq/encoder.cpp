// Seq2SeqEncoder: embedding lookups in time-major order, then the GRU, and the reverse.
#include "attn/seq2seq/encoder.hpp"

#include "attn/core/error.hpp"

namespace attn {

Seq2SeqEncoder::Seq2SeqEncoder(int64_t vocab_size, int64_t embed_size, int64_t num_hiddens,
                               int64_t num_layers, float dropout, uint64_t seed)
    : init_rng_(seed),
      embedding_(vocab_size, embed_size, init_rng_),
      rnn_(embed_size, num_hiddens, num_layers, dropout, seed ^ 0x3c6ef372ULL) {}

GruOutput Seq2SeqEncoder::forward(std::span<const int64_t> source, int64_t batch, int64_t steps) {
  if (batch < 0 || steps < 0 || static_cast<int64_t>(source.size()) != batch * steps) {
    throw ShapeError("source: expected batch × steps = " + std::to_string(batch) + " × " +
                     std::to_string(steps) + " ids, got " + std::to_string(source.size()));
  }
  // The book embeds X.t(): step-major rows, so the GRU reads (steps, batch, embed).
  time_major_ids_.resize(source.size());
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < steps; ++t)
      time_major_ids_[static_cast<size_t>(t * batch + b)] =
          source[static_cast<size_t>(b * steps + t)];
  Tensor embedded = embedding_.forward(time_major_ids_, "source");
  embedded.reshape(Shape{steps, batch, embedding_.embedding_dim()});
  return rnn_.forward(embedded);
}

void Seq2SeqEncoder::backward(ConstTensorView grad_outputs, ConstTensorView grad_state) {
  GruGradients grads = rnn_.backward(grad_outputs, grad_state);
  embedding_.backward(time_major_ids_,
                      grads.inputs.view().reshaped(
                          Shape{grads.inputs.dim(0) * grads.inputs.dim(1), grads.inputs.dim(2)}));
}

void Seq2SeqEncoder::append_parameters(const std::string& prefix,
                                       std::vector<NamedParameter>& parameters) {
  embedding_.append_parameters(prefix + ".embedding", parameters);
  rnn_.append_parameters(prefix + ".rnn", parameters);
}

}  // namespace attn
