// The training loop: epoch shuffles from the seed, batches, clipped Adam steps, timing.
#include "attn/seq2seq/training.hpp"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "attn/core/error.hpp"
#include "attn/core/random.hpp"
#include "attn/train/gradient_clipping.hpp"

namespace attn {

Seq2SeqBatch make_batch(const EncodedSequences& source, const EncodedSequences& target,
                        std::span<const int64_t> rows) {
  if (source.count != target.count) {
    throw ShapeError("target: expected as many sequences as the source (" +
                     std::to_string(source.count) + "), got " + std::to_string(target.count));
  }
  Seq2SeqBatch batch;
  batch.batch = static_cast<int64_t>(rows.size());
  batch.source_steps = source.num_steps;
  batch.target_steps = target.num_steps;
  for (const int64_t row : rows) {
    if (row < 0 || row >= source.count) {
      throw ValueError("rows: expected indices in [0, " + std::to_string(source.count) + "), got " +
                       std::to_string(row));
    }
    const auto at = static_cast<size_t>(row);
    batch.source.insert(batch.source.end(), source.ids.begin() + row * source.num_steps,
                        source.ids.begin() + (row + 1) * source.num_steps);
    batch.target.insert(batch.target.end(), target.ids.begin() + row * target.num_steps,
                        target.ids.begin() + (row + 1) * target.num_steps);
    batch.source_valid_lens.push_back(source.valid_lens[at]);
    batch.target_valid_lens.push_back(target.valid_lens[at]);
  }
  return batch;
}

double train_step(Seq2Seq& model, Adam& optimizer, const Seq2SeqBatch& batch, float grad_clip) {
  optimizer.zero_grad();
  const double loss = model.batch_loss(batch, true);
  clip_grad_norm(optimizer.parameters(), grad_clip);
  optimizer.step();
  return loss;
}

Seq2SeqTrainingHistory train_seq2seq(
    Seq2Seq& model, const EncodedSequences& source, const EncodedSequences& target,
    const Seq2SeqTrainingOptions& options,
    const std::function<void(const Seq2SeqTrainingProgress&)>& on_batch) {
  if (options.epochs < 1 || options.batch_size < 1) {
    throw ValueError(
        "train_seq2seq: expected at least 1 epoch and a batch size of at least 1, got " +
        std::to_string(options.epochs) + " and " + std::to_string(options.batch_size));
  }
  if (source.count < 1) throw ValueError("train_seq2seq: expected training examples, got none");
  if (source.count != target.count) {
    throw ShapeError("target: expected as many sequences as the source (" +
                     std::to_string(source.count) + "), got " + std::to_string(target.count));
  }
  AdamOptions adam;
  adam.lr = options.lr;
  Adam optimizer(model.parameters(), adam);
  Rng rng(options.seed);
  model.train();

  Seq2SeqTrainingHistory history;
  std::vector<int64_t> order(static_cast<size_t>(source.count));
  std::iota(order.begin(), order.end(), int64_t{0});
  const int64_t batches = (source.count + options.batch_size - 1) / options.batch_size;
  const auto start = std::chrono::steady_clock::now();
  float lr = options.lr;
  for (int64_t epoch = 1; epoch <= options.epochs; ++epoch) {
    // Fisher–Yates from the seeded generator, so the order is the same on every platform.
    for (size_t i = order.size() - 1; i > 0; --i)
      std::swap(order[i], order[static_cast<size_t>(rng.next_u64() % (i + 1))]);
    double epoch_total = 0.0;
    int64_t epoch_tokens = 0;
    for (int64_t batch_index = 0; batch_index < batches; ++batch_index) {
      const int64_t first = batch_index * options.batch_size;
      const int64_t count = std::min(options.batch_size, source.count - first);
      const Seq2SeqBatch batch =
          make_batch(source, target,
                     std::span<const int64_t>(order.data() + first, static_cast<size_t>(count)));
      const double loss = train_step(model, optimizer, batch, options.grad_clip);
      int64_t tokens = 0;
      for (const int64_t length : batch.target_valid_lens) tokens += length;
      epoch_total += loss * static_cast<double>(tokens);
      epoch_tokens += tokens;
      history.tokens += tokens;
      history.batch_losses.push_back(loss);
      history.seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (on_batch) {
        Seq2SeqTrainingProgress progress;
        progress.epoch = epoch;
        progress.epochs = options.epochs;
        progress.batch = batch_index + 1;
        progress.batches = batches;
        progress.loss = loss;
        progress.epoch_loss = epoch_total / static_cast<double>(std::max<int64_t>(epoch_tokens, 1));
        progress.seconds = history.seconds;
        progress.tokens_per_second =
            history.seconds > 0.0 ? static_cast<double>(history.tokens) / history.seconds : 0.0;
        on_batch(progress);
      }
    }
    history.epoch_losses.push_back(epoch_total /
                                   static_cast<double>(std::max<int64_t>(epoch_tokens, 1)));
    lr *= options.lr_decay;
    optimizer.set_lr(lr);
  }
  model.eval();
  return history;
}

}  // namespace attn
