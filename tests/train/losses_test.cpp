// Losses: hand-computed values, and gradients against central differences of a double-precision
// restatement of each loss.
#include "attn/train/losses.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "attn/core/error.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

TEST(MseLoss, MeanAndSumWithGradients) {
  const Tensor prediction(Shape{2, 2}, {1, 2, 3, 4}), target(Shape{2, 2}, {1, 0, 3, 7});
  const LossResult mean = mse_loss(prediction, target);
  EXPECT_FLOAT_EQ(mean.loss, (4.0F + 9.0F) / 4.0F);
  EXPECT_TRUE(testing::close_to(mean.grad, {0, 1, 0, -1.5}, 1e-7));
  const LossResult sum = mse_loss(prediction, target, Reduction::kSum);
  EXPECT_FLOAT_EQ(sum.loss, 13.0F);
  EXPECT_TRUE(testing::close_to(sum.grad, {0, 4, 0, -6}, 1e-7));
  EXPECT_THROW_MESSAGE(mse_loss(prediction, Tensor(Shape{4})), ShapeError,
                       "target: expected shape (2, 2) (that of prediction), got shape (4,)");
}

// The book's MaskedSoftmaxCELoss in double: per sequence, (1/T) Σ_{t < len} −log softmax(z_t)[y_t].
double reference_sequence_losses_sum(const std::vector<double>& logits, int64_t batch,
                                     int64_t steps, int64_t vocab,
                                     const std::vector<int64_t>& labels,
                                     const std::vector<int64_t>& lengths) {
  double total = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < lengths[static_cast<size_t>(b)]; ++t) {
      const double* z = &logits[static_cast<size_t>((b * steps + t) * vocab)];
      double sum = 0;
      for (int64_t c = 0; c < vocab; ++c) sum += std::exp(z[c]);
      total += (std::log(sum) - z[labels[static_cast<size_t>(b * steps + t)]]) /
               static_cast<double>(steps);
    }
  return total;
}

TEST(MaskedSoftmaxCrossEntropy, HandValueAndPadding) {
  // Uniform logits over 4 classes: each valid token costs log 4; padding costs nothing; the mean
  // is over all T = 3 steps, as the book's loss.
  const Tensor logits(Shape{2, 3, 4});
  const std::vector<int64_t> labels{0, 1, 2, 3, 3, 3}, lengths{3, 1};
  const SequenceLossResult result = masked_softmax_cross_entropy(logits, labels, lengths);
  EXPECT_TRUE(testing::close_to(result.losses, {std::log(4.0), std::log(4.0) / 3}, 1e-6));
  for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(result.grad(1, 2, c), 0.0F);  // padding
  EXPECT_NEAR(result.grad(0, 0, 0), (0.25 - 1.0) / 3.0, 1e-7);
  EXPECT_NEAR(result.grad(0, 0, 1), 0.25 / 3.0, 1e-7);
}

TEST(MaskedSoftmaxCrossEntropy, GradientMatchesFiniteDifferences) {
  Rng rng(12);
  constexpr int64_t kBatch = 3, kSteps = 4, kVocab = 5;
  const Tensor logits = testing::random_tensor(Shape{kBatch, kSteps, kVocab}, rng, 3.0F);
  const std::vector<int64_t> labels{0, 4, 2, 1, 3, 3, 0, 2, 1, 1, 4, 0}, lengths{4, 0, 2};
  const SequenceLossResult result = masked_softmax_cross_entropy(logits, labels, lengths);
  const std::vector<double> z = testing::to_doubles(logits);
  const std::vector<double> expected = testing::numerical_gradients(
      [&](const std::vector<std::vector<double>>& x) {
        return reference_sequence_losses_sum(x[0], kBatch, kSteps, kVocab, labels, lengths);
      },
      {z}, 1e-6)[0];
  // The gradient is computed in double and rounded once to float32: 1e-6 relative is ample.
  EXPECT_TRUE(testing::close_to(result.grad, expected, 1e-6));
  double total = 0;
  for (const float loss : result.losses.span()) total += loss;
  EXPECT_NEAR(total, reference_sequence_losses_sum(z, kBatch, kSteps, kVocab, labels, lengths),
              1e-5);
}

TEST(MaskedSoftmaxCrossEntropy, StableForHugeLogitsAndChecksArguments) {
  const Tensor logits(Shape{1, 1, 3}, {1e30F, -1e30F, 0.0F});
  const SequenceLossResult result =
      masked_softmax_cross_entropy(logits, std::vector<int64_t>{0}, std::vector<int64_t>{1});
  EXPECT_EQ(result.losses(0), 0.0F);
  EXPECT_THROW_MESSAGE(
      masked_softmax_cross_entropy(logits, std::vector<int64_t>{3}, std::vector<int64_t>{1}),
      ValueError, "labels[0, 0]: expected a class in [0, 3), got 3");
  EXPECT_THROW_MESSAGE(
      masked_softmax_cross_entropy(logits, std::vector<int64_t>{0}, std::vector<int64_t>{2}),
      ValueError, "valid_lens[0]: expected a length in [0, 1], got 2");
  EXPECT_THROW_MESSAGE(
      masked_softmax_cross_entropy(logits, std::vector<int64_t>{0, 1}, std::vector<int64_t>{1}),
      ShapeError, "labels: expected 1 labels");
}

}  // namespace
}  // namespace attn
