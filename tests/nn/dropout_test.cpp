// Dropout on attention weights: inverted scaling in training mode, none in evaluation mode, weights
// kept before dropout, and masks reproducible from a seed.
#include "attn/nn/dropout.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "attn/core/error.hpp"
#include "attn/nn/dot_product_attention.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

// With values = identity (m × m), the layer's output is exactly the weights after dropout.
Tensor identity_values(int64_t m) {
  Tensor values(Shape{1, m, m});
  for (int64_t j = 0; j < m; ++j) values(0, j, j) = 1.0F;
  return values;
}

TEST(Dropout, TrainingModeDropsAndRescalesEvaluationModeDoesNot) {
  constexpr int64_t kQueries = 200, kKeys = 50;
  constexpr float kP = 0.3F;
  Rng rng(8);
  const Tensor q = testing::random_tensor(Shape{1, kQueries, 4}, rng);
  const Tensor k = testing::random_tensor(Shape{1, kKeys, 4}, rng);
  DotProductAttention attention(kP, std::nullopt, /*seed=*/3);
  ASSERT_TRUE(attention.is_training());  // PyTorch modules start in training mode
  const Tensor dropped = attention(q, k, identity_values(kKeys));
  const Tensor weights = attention.attention_weights();
  int64_t zeros = 0;
  for (int64_t index = 0; index < dropped.numel(); ++index) {
    const float kept = dropped.data()[index];
    if (kept == 0.0F) {
      ++zeros;
    } else {
      // The fused pass's weights against attention_weights()'s (another path, in base e): each
      // within the forward's 1e-5 of the truth; a missing or wrong 1/(1 − p) is off by 43%.
      ASSERT_NEAR(kept, weights.data()[index] / (1.0F - kP), 1e-5F * kept);
    }
  }
  // 10000 Bernoulli(0.3) draws: standard deviation 0.0046 of the fraction; allow 5 of them.
  EXPECT_NEAR(static_cast<double>(zeros) / static_cast<double>(dropped.numel()), kP, 0.023);

  attention.eval();
  const Tensor evaluated = attention(q, k, identity_values(kKeys));
  // Evaluation mode runs the fused kernel, which rounds differently from the reference path by a
  // few ulps; any dropped (0) or rescaled (×1/0.7) weight would differ by far more than 1e-6.
  EXPECT_TRUE(testing::close_to(evaluated, testing::to_doubles(weights), 1e-6));
}

TEST(Dropout, SameSeedSameMask) {
  Rng rng(9);
  const Tensor q = testing::random_tensor(Shape{2, 6, 4}, rng);
  const Tensor k = testing::random_tensor(Shape{2, 6, 4}, rng);
  const Tensor v = testing::random_tensor(Shape{2, 6, 5}, rng);
  DotProductAttention first(0.5F, std::nullopt, 11), second(0.5F, std::nullopt, 11);
  const Tensor a = first(q, k, v);
  const Tensor b = second(q, k, v);
  EXPECT_EQ(a.values(), b.values());
  const Tensor c = first(q, k, v);  // the generator moved on
  EXPECT_NE(a.values(), c.values());
  first.seed_dropout(11);
  EXPECT_EQ(first(q, k, v).values(), a.values());
}

TEST(Dropout, EdgeProbabilities) {
  Tensor ones = Tensor::full(Shape{10}, 1.0F);
  Dropout(0.0F).apply(ones);
  EXPECT_EQ(ones.to_vector(), std::vector<float>(10, 1.0F));
  Dropout(1.0F).apply(ones);
  EXPECT_EQ(ones.to_vector(), std::vector<float>(10, 0.0F));
  EXPECT_THROW_MESSAGE(Dropout(-0.1F), ValueError,
                       "dropout: expected a probability in [0, 1], got -0.1");
  EXPECT_THROW_MESSAGE(Dropout(std::nanf("")), ValueError,
                       "dropout: expected a probability in [0, 1]");
}

// A drawn mask applied again reproduces apply()'s result (the same generator state), and a mask of
// another shape is refused.
TEST(Dropout, ApplyMaskReproducesTheDrawnDropout) {
  Rng rng(5);
  const Tensor values = testing::random_tensor(Shape{3, 7}, rng);
  Tensor dropped = values;
  Dropout(0.4F, 21).apply(dropped);
  const Tensor mask = Dropout(0.4F, 21).draw_mask(values.shape());
  Tensor masked = values;
  Dropout::apply_mask(masked, mask);
  EXPECT_EQ(masked.values(), dropped.values());
  EXPECT_THROW_MESSAGE(Dropout::apply_mask(masked, Tensor(Shape{7, 3})), ShapeError,
                       "dropout mask: expected shape (3, 7), got (7, 3)");
}

}  // namespace
}  // namespace attn
