// Rng: reproducibility from a seed and the ranges and moments of its draws.
#include "attn/core/random.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace attn {
namespace {

TEST(Rng, SameSeedSameSequence) {
  Rng first(42), second(42), other(43);
  bool differs = false;
  for (int draw = 0; draw < 100; ++draw) {
    const float value = first.uniform();
    EXPECT_EQ(value, second.uniform());
    differs = differs || value != other.uniform();
  }
  EXPECT_TRUE(differs);
}

TEST(Rng, UniformStaysInRangeWithTheRightMean) {
  Rng rng(7);
  double sum = 0;
  constexpr int kDraws = 100000;
  for (int draw = 0; draw < kDraws; ++draw) {
    const float value = rng.uniform(-2.0F, 3.0F);
    ASSERT_GE(value, -2.0F);
    ASSERT_LT(value, 3.0F);
    sum += value;
  }
  // Standard error of the mean: 5/√12/√1e5 ≈ 0.0046; 0.03 is over six of them.
  EXPECT_NEAR(sum / kDraws, 0.5, 0.03);
}

TEST(Rng, NormalHasUnitVariance) {
  Rng rng(11);
  double sum = 0, squares = 0;
  constexpr int kDraws = 100000;
  for (int draw = 0; draw < kDraws; ++draw) {
    const double value = rng.normal();
    ASSERT_TRUE(std::isfinite(value));
    sum += value;
    squares += value * value;
  }
  // Standard errors ≈ 0.003 for the mean and ≈ 0.0045 for the variance.
  EXPECT_NEAR(sum / kDraws, 0.0, 0.02);
  EXPECT_NEAR(squares / kDraws, 1.0, 0.03);
}

}  // namespace
}  // namespace attn
