// Linear: PyTorch-style initialisation bounds, determinism from a seed, and the product itself.
#include "attn/nn/linear.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "attn/core/error.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

TEST(Linear, InitialisesUniformWithinOneOverSqrtFanIn) {
  Rng rng(1);
  const Linear layer(/*in_features=*/16, /*out_features=*/300, /*bias=*/true, rng);
  const float bound = 0.25F;  // 1/√16
  float lowest = 1, highest = -1;
  double sum_squares = 0;
  for (const float value : layer.weight().span()) {
    lowest = std::min(lowest, value);
    highest = std::max(highest, value);
    sum_squares += value * value;
  }
  EXPECT_GE(lowest, -bound);
  EXPECT_LT(highest, bound);
  // 4800 uniform draws: the extremes come within 1% of the bound, the variance is bound²/3.
  EXPECT_LT(lowest, -0.99F * bound);
  EXPECT_GT(highest, 0.99F * bound);
  EXPECT_NEAR(sum_squares / 4800.0, bound * bound / 3.0, 0.002);
  for (const float value : layer.bias().span()) EXPECT_LE(std::abs(value), bound);

  Rng same(1);
  EXPECT_EQ(Linear(16, 300, true, same).weight().values(), layer.weight().values());
}

TEST(Linear, ComputesXWTransposePlusBias) {
  Rng rng(2);
  Linear layer(3, 2, true, rng);
  layer.weight() = Tensor(Shape{2, 3}, {1, 2, 3, -1, 0, 1});
  layer.bias() = Tensor(Shape{2}, {0.5F, -0.5F});
  const Tensor y = layer.forward(Tensor(Shape{1, 2, 3}, {1, 1, 1, 2, 0, -1}));
  EXPECT_TRUE(testing::close_to(y, {6.5, -0.5, -0.5, -3.5}, 0.0));
  EXPECT_THROW_MESSAGE(
      layer.forward(Tensor(Shape{2, 4}), "keys"), ShapeError,
      "keys: expected the last dimension to be 3 (the layer's input size), got shape (2, 4)");
}

}  // namespace
}  // namespace attn
