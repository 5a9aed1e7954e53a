// attn::gaussian_kernel_pooling against the double reference (the book's Nadaraya–Watson pooling),
// with valid lengths 0 and m and per-query lengths; errors name the argument.
#include "attn/functional/gaussian_kernel_pooling.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "attn/core/error.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

// Float32 scores and a softmax over ≤ 40 keys against double: 1e-5 relative, as the layers' tests.
constexpr double kTolerance = 1e-5;

TEST(FunctionalGaussianPooling, MatchesTheReference) {
  Rng rng(3);
  const Tensor q = testing::random_tensor(Shape{3, 7, 2}, rng),
               k = testing::random_tensor(Shape{3, 40, 2}, rng),
               v = testing::random_tensor(Shape{3, 40, 3}, rng);
  for (const ValidLengths& lengths : {ValidLengths(), ValidLengths::per_batch({0, 40, 13}),
                                      ValidLengths::per_query(std::vector<int64_t>(21, 5), 3, 7)}) {
    const PoolingResult result = gaussian_kernel_pooling(q, k, v, 1.7F, lengths);
    const reference::Result expected = reference::gaussian_kernel_pooling(
        testing::to_reference(q), testing::to_reference(k), testing::to_reference(v),
        testing::expand(lengths, 3, 7, 40), 1.7);
    EXPECT_TRUE(testing::close_to(result.output, expected.output.values, kTolerance));
    EXPECT_TRUE(testing::close_to(result.weights, expected.weights.values, kTolerance));
  }
  EXPECT_THROW_MESSAGE(gaussian_kernel_pooling(q, k, v, NAN), ValueError,
                       "width: expected a finite number");
  EXPECT_THROW_MESSAGE(gaussian_kernel_pooling(q, k, Tensor(Shape{3, 39, 3}), 1.0F), ShapeError,
                       "values: expected dimension 1 to be 40 (the number of keys)");
}

// Without the weights: the same output from blocks of 64 query rows (150 queries: two blocks and a
// tail), and no (B, n, m) tensor returned.
TEST(FunctionalGaussianPooling, WithoutWeightsMatchesTheReferenceInRowBlocks) {
  Rng rng(4);
  const Tensor q = testing::random_tensor(Shape{2, 150, 2}, rng),
               k = testing::random_tensor(Shape{2, 30, 2}, rng),
               v = testing::random_tensor(Shape{2, 30, 3}, rng);
  std::vector<int64_t> per_query;
  for (int64_t index = 0; index < 2 * 150; ++index) per_query.push_back(index % 31);
  for (const ValidLengths& lengths : {ValidLengths(), ValidLengths::per_batch({0, 17}),
                                      ValidLengths::per_query(per_query, 2, 150)}) {
    const PoolingResult result = gaussian_kernel_pooling(q, k, v, 0.8F, lengths, false);
    EXPECT_EQ(result.weights.numel(), 0);
    const reference::Result expected = reference::gaussian_kernel_pooling(
        testing::to_reference(q), testing::to_reference(k), testing::to_reference(v),
        testing::expand(lengths, 2, 150, 30), 0.8);
    EXPECT_TRUE(testing::close_to(result.output, expected.output.values, kTolerance));
  }
  EXPECT_THROW_MESSAGE(gaussian_kernel_pooling(q, k, v, 1.0F, ValidLengths::per_batch({1}), false),
                       ShapeError, "valid_lens");
}

// Keys so far from a query (or a width so large) that every score of its row is beyond float:
// the nearest valid key takes all the weight, as the limit of the softmax gives it, with and
// without the weights. Float scores of −∞ throughout gave zero weights and a zero output.
TEST(FunctionalGaussianPooling, RowsOfScoresBeyondFloatWeighTheNearestKey) {
  const Tensor q(Shape{1, 2, 1}, {0.0F, 5e19F});
  const Tensor k(Shape{1, 3, 1}, {2e20F, 1e20F, 3e20F});
  const Tensor v(Shape{1, 3, 2}, {1.0F, 2.0F, 3.0F, 4.0F, 5.0F, 6.0F});
  for (const bool need_weights : {true, false}) {
    SCOPED_TRACE(need_weights ? "with weights" : "without weights");
    // Query 0 sees every key (nearest: key 1), query 1 only key 0 (its valid length is 1).
    const PoolingResult result =
        gaussian_kernel_pooling(q, k, v, 1.0F, ValidLengths::per_query({3, 1}, 1, 2), need_weights);
    EXPECT_TRUE(testing::close_to(result.output, {3.0, 4.0, 1.0, 2.0}, 0.0));
    if (need_weights) {
      EXPECT_TRUE(testing::close_to(result.weights, {0, 1, 0, 1, 0, 0}, 0.0));
    }
  }
  // A width of 1e30 on ordinary inputs: the same limit.
  const Tensor near(Shape{1, 1, 1}, {0.9F});
  const Tensor keys(Shape{1, 2, 1}, {0.0F, 1.0F});
  EXPECT_TRUE(testing::close_to(
      gaussian_kernel_pooling(near, keys, v.view().reshaped(Shape{1, 2, 3}), 1e30F).output,
      {4.0, 5.0, 6.0}, 0.0));
}

TEST(FunctionalGaussianPooling, NonFiniteInputsAreNamed) {
  Tensor q(Shape{1, 1, 2}), k(Shape{1, 3, 2}), v(Shape{1, 3, 2});
  for (const float bad : {NAN, INFINITY}) {
    for (Tensor* input : {&q, &k, &v}) {
      input->data()[1] = bad;
      const char* name = input == &q ? "queries" : input == &k ? "keys" : "values";
      EXPECT_THROW_MESSAGE(gaussian_kernel_pooling(q, k, v, 1.0F), ValueError, name);
      EXPECT_THROW_MESSAGE(gaussian_kernel_pooling(q, k, v, 1.0F, {}, false), ValueError, name);
      input->data()[1] = 0.0F;
    }
  }
}

}  // namespace
}  // namespace attn
