// Seq2Seq: initialisation as the book's init_seq2seq, the teacher-forced passes and the masked
// token-mean loss.
#include "attn/seq2seq/model.hpp"

#include <algorithm>
#include <cmath>

#include "attn/core/error.hpp"
#include "attn/seq2seq/vocabulary.hpp"
#include "attn/train/losses.hpp"

namespace attn {

namespace {

void check_config(const Seq2SeqConfig& config) {
  if (config.source_vocab_size < 1 || config.target_vocab_size < 1 || config.embed_size < 1 ||
      config.num_hiddens < 1 || config.num_layers < 1) {
    throw ValueError(
        "Seq2Seq: expected vocabulary sizes, embed_size, num_hiddens and num_layers of at least "
        "1, got " +
        std::to_string(config.source_vocab_size) + ", " + std::to_string(config.target_vocab_size) +
        ", " + std::to_string(config.embed_size) + ", " + std::to_string(config.num_hiddens) +
        " and " + std::to_string(config.num_layers));
  }
  if (!(config.dropout >= 0.0F && config.dropout <= 1.0F)) {
    throw ValueError("Seq2Seq: expected a dropout in [0, 1], got " +
                     std::to_string(config.dropout));
  }
}

const Seq2SeqConfig& checked(const Seq2SeqConfig& config) {
  check_config(config);
  return config;
}

}  // namespace

Seq2Seq::Seq2Seq(const Seq2SeqConfig& config, uint64_t seed)
    : config_(checked(config)),
      encoder_(config.source_vocab_size, config.embed_size, config.num_hiddens, config.num_layers,
               config.dropout, seed),
      decoder_(config.target_vocab_size, config.embed_size, config.num_hiddens, config.num_layers,
               config.dropout, seed ^ 0x510e527fULL) {
  Rng rng(seed ^ 0x9b05688cULL);
  for (const NamedParameter& parameter : parameters()) {
    const bool matrix = parameter.tensor->rank() == 2;
    const bool embedding = parameter.name.find("embedding") != std::string::npos;
    if (!matrix || embedding) continue;
    const auto fan_out = static_cast<float>(parameter.tensor->dim(0));
    const auto fan_in = static_cast<float>(parameter.tensor->dim(1));
    const float bound = std::sqrt(6.0F / (fan_in + fan_out));
    for (float& value : parameter.tensor->span()) value = rng.uniform(-bound, bound);
  }
}

std::vector<int64_t> attention_valid_lens(std::span<const int64_t> source,
                                          std::span<const int64_t> valid_lens, int64_t steps,
                                          bool attend_to_eos) {
  std::vector<int64_t> lengths(valid_lens.begin(), valid_lens.end());
  if (attend_to_eos) return lengths;
  for (size_t b = 0; b < lengths.size(); ++b) {
    const int64_t length = lengths[b];
    if (length < 1 || length > steps) continue;  // the decoder reports the bad length
    const auto last = static_cast<size_t>(static_cast<int64_t>(b) * steps + length - 1);
    if (last < source.size() && source[last] == Vocabulary::kEos) lengths[b] = length - 1;
  }
  return lengths;
}

Tensor Seq2Seq::forward(std::span<const int64_t> source, std::span<const int64_t> source_valid_lens,
                        std::span<const int64_t> decoder_inputs, int64_t batch,
                        int64_t source_steps, int64_t target_steps) {
  GruOutput encoded = encoder_.forward(source, batch, source_steps);
  decoder_.begin(
      encoded.outputs, encoded.state,
      attention_valid_lens(source, source_valid_lens, source_steps, config_.attend_to_eos));
  return decoder_.forward(decoder_inputs, target_steps);
}

void Seq2Seq::backward(ConstTensorView grad_logits) {
  BahdanauDecoder::Gradients grads = decoder_.backward(grad_logits);
  encoder_.backward(grads.enc_outputs, grads.enc_state);
}

double Seq2Seq::batch_loss(const Seq2SeqBatch& batch, bool backward) {
  const int64_t rows = batch.batch, target_steps = batch.target_steps;
  if (static_cast<int64_t>(batch.target.size()) != rows * target_steps ||
      static_cast<int64_t>(batch.target_valid_lens.size()) != rows) {
    throw ShapeError("target: expected " + std::to_string(rows) + " × " +
                     std::to_string(target_steps) + " ids and " + std::to_string(rows) +
                     " valid lengths, got " + std::to_string(batch.target.size()) + " and " +
                     std::to_string(batch.target_valid_lens.size()));
  }
  int64_t steps = 1;
  int64_t tokens = 0;
  for (const int64_t length : batch.target_valid_lens) {
    if (length < 0 || length > target_steps) {
      throw ValueError("target_valid_lens: expected lengths in [0, " +
                       std::to_string(target_steps) + "], got " + std::to_string(length));
    }
    steps = std::max(steps, length);
    tokens += length;
  }
  std::vector<int64_t> inputs(static_cast<size_t>(rows * steps));
  std::vector<int64_t> labels(static_cast<size_t>(rows * steps));
  for (int64_t b = 0; b < rows; ++b) {
    for (int64_t t = 0; t < steps; ++t) {
      const auto at = static_cast<size_t>(b * steps + t);
      labels[at] = batch.target[static_cast<size_t>(b * target_steps + t)];
      inputs[at] =
          t == 0 ? Vocabulary::kBos : batch.target[static_cast<size_t>(b * target_steps + t - 1)];
    }
  }
  const Tensor logits =
      forward(batch.source, batch.source_valid_lens, inputs, rows, batch.source_steps, steps);
  SequenceLossResult result = masked_softmax_cross_entropy(logits, labels, batch.target_valid_lens);
  // Each sequence's loss is a mean over `steps`; rescale to a mean over the valid tokens.
  const double scale = tokens > 0 ? static_cast<double>(steps) / static_cast<double>(tokens) : 0.0;
  double total = 0.0;
  for (const float loss : result.losses.span()) total += loss;
  if (backward) {
    for (float& value : result.grad.span()) value *= static_cast<float>(scale);
    this->backward(result.grad);
  }
  return total * scale;
}

void Seq2Seq::train(bool training) {
  encoder_.train(training);
  decoder_.train(training);
}

void Seq2Seq::seed_dropout(uint64_t seed) {
  encoder_.rnn().seed_dropout(seed);
  decoder_.seed_dropout(seed ^ 0x510e527fULL);
}

std::vector<NamedParameter> Seq2Seq::parameters() {
  std::vector<NamedParameter> parameters;
  encoder_.append_parameters("encoder", parameters);
  decoder_.append_parameters("decoder", parameters);
  return parameters;
}

StateDict Seq2Seq::state_dict() const {
  // parameters() hands out mutable pointers, but collecting only copies through them.
  return collect_state_dict(const_cast<Seq2Seq*>(this)->parameters());
}

void Seq2Seq::load_state_dict(const StateDict& state) {
  attn::load_state_dict(state, parameters(), "Seq2Seq");
}

}  // namespace attn
