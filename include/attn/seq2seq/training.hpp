// Training a Seq2Seq as the book's train_seq2seq does: shuffled minibatches, teacher forcing, the
// masked cross-entropy, gradient clipping and Adam, with a progress callback per batch.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "attn/seq2seq/corpus.hpp"
#include "attn/seq2seq/model.hpp"
#include "attn/train/adam.hpp"

namespace attn {

struct Seq2SeqTrainingOptions {
  int64_t epochs = 10;
  int64_t batch_size = 64;
  float lr = 0.005F;
  float grad_clip =
      1.0F;  // the global gradient norm is clipped to this, as the book's grad_clipping
  // The learning rate is multiplied by this after every epoch (1 keeps it constant).
  float lr_decay = 1.0F;
  uint64_t seed = 0;  // the order of the examples in every epoch, and dropout
};

struct Seq2SeqTrainingProgress {
  int64_t epoch = 0;  // 1-based
  int64_t epochs = 0;
  int64_t batch = 0;  // 1-based, within the epoch
  int64_t batches = 0;
  double loss = 0.0;               // this batch's mean token loss
  double epoch_loss = 0.0;         // the mean token loss of the epoch so far
  double tokens_per_second = 0.0;  // target tokens (with <eos>) per second, since the start
  double seconds = 0.0;
};

struct Seq2SeqTrainingHistory {
  std::vector<double> epoch_losses;  // mean token loss of every epoch
  std::vector<double> batch_losses;
  int64_t tokens = 0;
  double seconds = 0.0;
};

// The batch of `rows` of the encoded sources and targets. ValueError for a row out of range;
// ShapeError when sources and targets differ in count.
Seq2SeqBatch make_batch(const EncodedSequences& source, const EncodedSequences& target,
                        std::span<const int64_t> rows);

// One update: zero the gradients, forward and backward on `batch`, clip, step. Returns the mean
// token loss before the update.
double train_step(Seq2Seq& model, Adam& optimizer, const Seq2SeqBatch& batch, float grad_clip);

// Trains in training mode, then leaves the model in evaluation mode. ValueError for a
// non-positive epoch count or batch size, or no examples.
Seq2SeqTrainingHistory train_seq2seq(
    Seq2Seq& model, const EncodedSequences& source, const EncodedSequences& target,
    const Seq2SeqTrainingOptions& options,
    const std::function<void(const Seq2SeqTrainingProgress&)>& on_batch = {});

}  // namespace attn
