// The book's kernel regression: the data as specified, the loss falling every epoch, and the
// trained width beating the nonparametric model on the test grid.
#include "attn/train/nadaraya_watson.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "test_support.hpp"

namespace attn {
namespace {

TEST(NadarayaWatson, DataFollowTheBook) {
  const NadarayaWatsonData data = make_nadaraya_watson_data(0);
  ASSERT_EQ(data.x_train.numel(), 50);
  EXPECT_TRUE(std::is_sorted(data.x_train.span().begin(), data.x_train.span().end()));
  EXPECT_GE(data.x_train(0), 0.0F);
  EXPECT_LT(data.x_train(49), 5.0F);
  ASSERT_EQ(data.x_test.numel(), 50);
  EXPECT_FLOAT_EQ(data.x_test(49), 4.9F);
  EXPECT_NEAR(data.y_truth(10), 2 * std::sin(1.0) + 1.0, 1e-6);
  double squared_noise = 0;
  for (int64_t i = 0; i < 50; ++i) {
    const double x = data.x_train(i);
    const double noise = data.y_train(i) - (2 * std::sin(x) + std::pow(x, 0.8));
    squared_noise += noise * noise;
  }
  // Noise of standard deviation 0.5: the sample variance of 50 draws lies in [0.12, 0.42] with
  // probability above 99.9%.
  EXPECT_GT(squared_noise / 50, 0.12);
  EXPECT_LT(squared_noise / 50, 0.42);
}

TEST(NadarayaWatson, TrainingLowersTheLossEveryEpochAndBeatsTheFixedKernel) {
  const NadarayaWatsonData data = make_nadaraya_watson_data(0);
  std::vector<int> epochs_seen;
  const NadarayaWatsonFit fit =
      fit_nadaraya_watson(data, {}, [&](int epoch, float) { epochs_seen.push_back(epoch); });
  EXPECT_EQ(epochs_seen, (std::vector<int>{1, 2, 3, 4, 5}));
  ASSERT_EQ(fit.epoch_losses.size(), 5U);
  for (size_t epoch = 1; epoch < fit.epoch_losses.size(); ++epoch) {
    EXPECT_LT(fit.epoch_losses[epoch], fit.epoch_losses[epoch - 1]) << "epoch " << epoch + 1;
  }
  EXPECT_GT(fit.trained_width, fit.initial_width);
  EXPECT_LT(fit.parametric_test_mse, fit.nonparametric_test_mse);
  // Each row of attention weights is a distribution over the 50 training points.
  for (int64_t row = 0; row < 50; row += 7) {
    double sum = 0;
    for (int64_t column = 0; column < 50; ++column) sum += fit.parametric_weights(row, column);
    EXPECT_NEAR(sum, 1.0, 1e-5);
  }
}

}  // namespace
}  // namespace attn
