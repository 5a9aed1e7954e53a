// Losses: mean squared error and the book's masked softmax cross-entropy, each with its gradient.
#include "attn/train/losses.hpp"

#include <cmath>
#include <string>

#include "attn/core/error.hpp"

namespace attn {

LossResult mse_loss(ConstTensorView prediction, ConstTensorView target, Reduction reduction) {
  if (prediction.shape() != target.shape()) {
    throw ShapeError("target: expected shape " + prediction.shape().str() +
                     " (that of prediction), got shape " + target.shape().str());
  }
  const int64_t count = prediction.numel();
  const double scale =
      reduction == Reduction::kMean && count > 0 ? 1.0 / static_cast<double>(count) : 1.0;
  LossResult result{0.0F, Tensor(prediction.shape())};
  double sum = 0.0;
  for (int64_t i = 0; i < count; ++i) {
    const double difference = static_cast<double>(prediction.data()[i]) - target.data()[i];
    sum += difference * difference;
    result.grad.data()[i] = static_cast<float>(2.0 * difference * scale);
  }
  result.loss = static_cast<float>(sum * scale);
  return result;
}

// Token loss ℓ = logsumexp(z) − z_y; dℓ/dz = softmax(z) − onehot(y). Each sequence's loss is
// (1/T) Σ_t mask_t ℓ_t, so its gradient is mask_t (softmax(z_t) − onehot(y_t)) / T.
SequenceLossResult masked_softmax_cross_entropy(ConstTensorView logits,
                                                std::span<const int64_t> labels,
                                                std::span<const int64_t> valid_lens) {
  require_rank("logits", logits.shape(), 3);
  const int64_t batch = logits.dim(0), steps = logits.dim(1), vocab = logits.dim(2);
  if (static_cast<int64_t>(labels.size()) != batch * steps) {
    throw ShapeError("labels: expected " + std::to_string(batch * steps) + " labels (shape (" +
                     std::to_string(batch) + ", " + std::to_string(steps) + ")), got " +
                     std::to_string(labels.size()));
  }
  if (static_cast<int64_t>(valid_lens.size()) != batch) {
    throw ShapeError("valid_lens: expected " + std::to_string(batch) + " lengths, got " +
                     std::to_string(valid_lens.size()));
  }
  SequenceLossResult result{Tensor(Shape{batch}), Tensor(logits.shape())};
  const double inverse_steps = steps > 0 ? 1.0 / static_cast<double>(steps) : 0.0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t length = valid_lens[static_cast<size_t>(b)];
    if (length < 0 || length > steps) {
      throw ValueError("valid_lens[" + std::to_string(b) + "]: expected a length in [0, " +
                       std::to_string(steps) + "], got " + std::to_string(length));
    }
    double sequence_loss = 0.0;
    for (int64_t t = 0; t < length; ++t) {
      const int64_t label = labels[static_cast<size_t>(b * steps + t)];
      if (label < 0 || label >= vocab) {
        throw ValueError("labels[" + std::to_string(b) + ", " + std::to_string(t) +
                         "]: expected a class in [0, " + std::to_string(vocab) + "), got " +
                         std::to_string(label));
      }
      const float* z = &logits(b, t, 0);
      float* dz = &result.grad(b, t, 0);
      float z_max = z[0];
      for (int64_t c = 1; c < vocab; ++c) z_max = std::max(z_max, z[c]);
      double sum = 0.0;
      for (int64_t c = 0; c < vocab; ++c) sum += std::exp(static_cast<double>(z[c]) - z_max);
      const double log_sum_exp = std::log(sum) + z_max;
      sequence_loss += log_sum_exp - z[label];
      for (int64_t c = 0; c < vocab; ++c) {
        dz[c] =
            static_cast<float>(std::exp(static_cast<double>(z[c]) - log_sum_exp) * inverse_steps);
      }
      dz[label] -= static_cast<float>(inverse_steps);
    }
    result.losses.data()[b] = static_cast<float>(sequence_loss * inverse_steps);
  }
  return result;
}

}  // namespace attn
