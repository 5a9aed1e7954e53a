// ValidLengths: per-batch and per-query lookups, range and shape checks, per-head repetition.
#include "attn/core/valid_lengths.hpp"

#include <gtest/gtest.h>

#include "attn/core/error.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

TEST(ValidLengths, LooksUpPerBatchAndPerQuery) {
  const ValidLengths all;
  EXPECT_EQ(all.length(1, 2, 7), 7);
  const ValidLengths per_batch = ValidLengths::per_batch({2, 3});
  EXPECT_EQ(per_batch.length(1, 0, 4), 3);
  EXPECT_EQ(per_batch.shape(), (Shape{2}));
  const ValidLengths per_query = ValidLengths::per_query({1, 3, 2, 4}, 2, 2);
  EXPECT_EQ(per_query.length(0, 1, 4), 3);
  EXPECT_EQ(per_query.length(1, 0, 4), 2);
  EXPECT_EQ(per_query.shape(), (Shape{2, 2}));
}

TEST(ValidLengths, ConvertsFromInt32AndInt64) {
  const std::vector<int32_t> narrow{1, 2, 3, 4, 5, 6};
  const ValidLengths lengths =
      ValidLengths::from_shape(std::span<const int32_t>(narrow), Shape{2, 3});
  EXPECT_EQ(lengths.kind(), ValidLengths::Kind::kPerQuery);
  EXPECT_EQ(lengths.length(1, 2, 9), 6);
  const std::vector<int64_t> wide{4, 5};
  EXPECT_EQ(ValidLengths::from_shape(std::span<const int64_t>(wide), Shape{2}).length(1, 0, 9), 5);
  EXPECT_THROW_MESSAGE(ValidLengths::from_shape(std::span<const int64_t>(wide), Shape{1, 1, 2}),
                       ShapeError, "expected shape (B,) or (B, n), got shape (1, 1, 2)");
}

TEST(ValidLengths, CheckNamesIndexAndValue) {
  EXPECT_THROW_MESSAGE(
      ValidLengths::per_batch({2, 5}).check("valid_lens", 2, 3, 4), ValueError,
      "valid_lens[1]: expected a valid length in [0, 4] (the number of keys), got 5");
  EXPECT_THROW_MESSAGE(ValidLengths::per_batch({-1, 2}).check("valid_lens", 2, 3, 4), ValueError,
                       "valid_lens[0]: expected a valid length in [0, 4]");
  EXPECT_THROW_MESSAGE(
      ValidLengths::per_query({1, 2, 3, 9}, 2, 2).check("valid_lens", 2, 2, 4), ValueError,
      "valid_lens[1, 1]: expected a valid length in [0, 4] (the number of keys), got 9");
  EXPECT_THROW_MESSAGE(ValidLengths::per_batch({1, 2, 3}).check("valid_lens", 2, 3, 4), ShapeError,
                       "expected shape (2,) to match scores of shape (2, 3, 4), got shape (3,)");
  EXPECT_THROW_MESSAGE(ValidLengths::per_query({1, 2}, 1, 2).check("valid_lens", 1, 3, 4),
                       ShapeError, "expected shape (1, 3)");
  EXPECT_NO_THROW(ValidLengths::per_batch({0, 4}).check("valid_lens", 2, 3, 4));
}

TEST(ValidLengths, PerQueryRefusesNegativeSizes) {
  // (−1)·(−2) = 2 lengths: the count matched, and the message read "needs 2 lengths, got 2".
  EXPECT_THROW_MESSAGE(ValidLengths::per_query({1, 2}, -1, -2), ShapeError,
                       "valid_lens: expected a shape (batch, queries) of sizes ≥ 0, got (-1, -2)");
  EXPECT_THROW_MESSAGE(ValidLengths::per_query({}, 0, -1), ShapeError, "got (0, -1)");
}

TEST(ValidLengths, CausalMaskIsAlignedBottomRight) {
  // n = 2 queries, m = 4 keys: query 0 sees keys 0..2, query 1 sees all four.
  EXPECT_EQ(ValidLengths().with_causal_mask(1, 2, 4).values(), (std::vector<int64_t>{3, 4}));
  // n = 4 > m = 2: the first two queries see nothing.
  EXPECT_EQ(ValidLengths().with_causal_mask(1, 4, 2).values(), (std::vector<int64_t>{0, 0, 1, 2}));
  // Combined with padding: the smaller length wins.
  EXPECT_EQ(ValidLengths::per_batch({2, 3}).with_causal_mask(2, 3, 3).values(),
            (std::vector<int64_t>{1, 2, 2, 1, 2, 3}));
}

TEST(ValidLengths, RepeatInterleaveMatchesTorch) {
  // torch.repeat_interleave(tensor([3, 2]), 2, dim=0) == tensor([3, 3, 2, 2]).
  EXPECT_EQ(ValidLengths::per_batch({3, 2}).repeat_interleave(2).values(),
            (std::vector<int64_t>{3, 3, 2, 2}));
  const ValidLengths repeated = ValidLengths::per_query({1, 2, 3, 4}, 2, 2).repeat_interleave(3);
  EXPECT_EQ(repeated.shape(), (Shape{6, 2}));
  EXPECT_EQ(repeated.values(), (std::vector<int64_t>{1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4}));
}

}  // namespace
}  // namespace attn
