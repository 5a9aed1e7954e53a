// Masked softmax: hand-computed values, exact zeros for masked keys and empty rows, stability at
// large magnitudes, and a sweep of random shapes and masks against the double reference.
#include "attn/kernels/masked_softmax.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "attn/core/error.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

using testing::close_to;

// Weights are at most 1; float32 exp is within 1 ulp and a row sum of m ≤ 64 terms adds at most
// m·2⁻²⁴ ≈ 4e-6 relative, so 4e-6 bounds float32 round-off here.
constexpr double kWeightTolerance = 4e-6;

TEST(MaskedSoftmax, HandComputedRow) {
  const Tensor scores(Shape{1, 2, 4}, {1, 2, 3, 4, 0, 0, 0, 0});
  const Tensor weights = masked_softmax(scores, ValidLengths::per_batch({2}));
  const double first = std::exp(1.0) / (std::exp(1.0) + std::exp(2.0));
  EXPECT_TRUE(close_to(weights, {first, 1 - first, 0, 0, 0.5, 0.5, 0, 0}, kWeightTolerance));
}

TEST(MaskedSoftmax, MaskedKeysAreExactlyZeroAndEmptyRowsAreZero) {
  const Tensor scores(Shape{2, 2, 4}, {5, 1, 9, 2, 3, 3, 3, 3, 1, 2, 3, 4, 4, 3, 2, 1});
  const Tensor weights = masked_softmax(scores, ValidLengths::per_query({1, 3, 0, 4}, 2, 2));
  // Query (0, 0) sees one key: weight exactly 1 there, exactly 0 elsewhere.
  EXPECT_EQ(weights(0, 0, 0), 1.0F);
  for (int j = 1; j < 4; ++j) EXPECT_EQ(weights(0, 0, j), 0.0F);
  EXPECT_EQ(weights(0, 1, 3), 0.0F);
  // Valid length 0: no key contributes (the book would give 0.25 each, PyTorch NaN).
  for (int j = 0; j < 4; ++j) EXPECT_EQ(weights(1, 0, j), 0.0F);
  float sum = 0;
  for (int j = 0; j < 4; ++j) sum += weights(1, 1, j);
  EXPECT_NEAR(sum, 1.0F, 1e-6);
}

TEST(MaskedSoftmax, StableAtLargeMagnitudes) {
  for (const float magnitude : {1e4F, 1e8F, 3e38F}) {
    const Tensor scores(Shape{1, 1, 3}, {magnitude, -magnitude, magnitude});
    const Tensor weights = masked_softmax(scores);
    EXPECT_TRUE(close_to(weights, {0.5, 0.0, 0.5}, kWeightTolerance)) << "magnitude " << magnitude;
  }
  const Tensor lowest(Shape{1, 1, 2}, {-3e38F, -3e38F + 1e32F});
  const Tensor weights = masked_softmax(lowest);
  EXPECT_TRUE(close_to(weights, {0.0, 1.0}, kWeightTolerance));
}

TEST(MaskedSoftmax, AllMinusInfinityRowIsFullyMasked) {
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor scores(Shape{1, 2, 2}, {-inf, -inf, -inf, 1.0F});
  const Tensor weights = masked_softmax(scores);
  EXPECT_TRUE(close_to(weights, {0, 0, 0, 1}, 0.0));
}

TEST(MaskedSoftmax, RejectsNaNAndPlusInfinityInValidScores) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW_MESSAGE(masked_softmax(Tensor(Shape{1, 2, 3}, {0, 0, 0, 0, nan, 0})), ValueError,
                       "scores[0, 1, 1]: expected a finite score, got NaN");
  // The first entry at fault is named, +inf after a NaN as well as before one.
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_THROW_MESSAGE(masked_softmax(Tensor(Shape{1, 1, 3}, {0, inf, nan})), ValueError,
                       "scores[0, 0, 1]: expected a finite score, got +inf");
  try {
    masked_softmax(Tensor(Shape{1, 1, 2}, {nan, 0}));
    ADD_FAILURE() << "no error";
  } catch (const ValueError& error) {
    EXPECT_EQ(error.argument(), "scores");  // what callers with another name rename
  }
  // A NaN beyond the valid length is masked, so it is never read.
  const Tensor weights =
      masked_softmax(Tensor(Shape{1, 1, 2}, {0, nan}), ValidLengths::per_batch({1}));
  EXPECT_TRUE(close_to(weights, {1, 0}, 0.0));
}

TEST(MaskedSoftmax, RejectsBadShapesAndLengths) {
  EXPECT_THROW_MESSAGE(masked_softmax(Tensor(Shape{2, 4})), ShapeError,
                       "scores: expected a tensor of rank 3");
  EXPECT_THROW_MESSAGE(
      masked_softmax(Tensor(Shape{2, 2, 4}), ValidLengths::per_batch({2, 5})), ValueError,
      "valid_lens[1]: expected a valid length in [0, 4] (the number of keys), got 5");
  EXPECT_THROW_MESSAGE(masked_softmax(Tensor(Shape{2, 2, 4}), ValidLengths::per_batch({2})),
                       ShapeError, "valid_lens: expected shape (2,)");
  Tensor out(Shape{2, 2, 3});
  EXPECT_THROW_MESSAGE(masked_softmax(Tensor(Shape{2, 2, 4}), {}, out), ShapeError,
                       "weights: expected shape (2, 2, 4)");
}

// Random shapes (n = 1, m = 1, odd sizes), every kind of mask with lengths 0 and m, and score
// magnitudes from 1 to 1e4, against the double reference.
TEST(MaskedSoftmax, MatchesReferenceOnRandomShapes) {
  Rng rng(2024);
  for (const int64_t batch : {1, 3})
    for (const int64_t queries : {1, 5})
      for (const int64_t keys : {1, 7, 64})
        for (const float magnitude : {1.0F, 30.0F, 1e4F})
          for (int kind = 0; kind < 3; ++kind) {
            const Tensor scores =
                testing::random_tensor(Shape{batch, queries, keys}, rng, magnitude);
            ValidLengths lengths;
            if (kind == 1) {
              std::vector<int64_t> values;
              for (int64_t b = 0; b < batch; ++b)
                values.push_back(b == 0 ? keys
                                        : static_cast<int64_t>(rng.next_u64() %
                                                               static_cast<uint64_t>(keys + 1)));
              lengths = ValidLengths::per_batch(values);
            } else if (kind == 2) {
              std::vector<int64_t> values;
              for (int64_t index = 0; index < batch * queries; ++index) {
                values.push_back(
                    index == 0
                        ? 0
                        : static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(keys + 1)));
              }
              lengths = ValidLengths::per_query(values, batch, queries);
            }
            const Tensor weights = masked_softmax(scores, lengths);
            const auto expected = reference::masked_softmax(
                testing::to_reference(scores), testing::expand(lengths, batch, queries, keys));
            // At magnitude 1e4 the float32 score itself is only known to 1e4·2⁻²⁴ ≈ 6e-4, but the
            // reference sees the same rounded score, so only the kernel's round-off remains.
            ASSERT_TRUE(close_to(weights, expected.values, kWeightTolerance))
                << "B=" << batch << " n=" << queries << " m=" << keys << " magnitude=" << magnitude
                << " kind=" << kind;
          }
}

}  // namespace
}  // namespace attn
