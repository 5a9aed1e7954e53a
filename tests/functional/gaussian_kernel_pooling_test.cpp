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

}  // namespace
}  // namespace attn
