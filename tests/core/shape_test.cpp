// Shape: construction limits, negative axes, element counts and printing.
#include "attn/core/shape.hpp"

#include <gtest/gtest.h>

#include "attn/core/error.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

TEST(Shape, CountsAndPrintsLikeNumPy) {
  const Shape shape{2, 3, 4};
  EXPECT_EQ(shape.rank(), 3);
  EXPECT_EQ(shape.numel(), 24);
  EXPECT_EQ(shape.dim(-1), 4);
  EXPECT_EQ(shape.str(), "(2, 3, 4)");
  EXPECT_EQ(Shape{5}.str(), "(5,)");
  EXPECT_EQ(Shape{}.str(), "()");
  EXPECT_EQ(Shape{}.numel(), 1);
  EXPECT_EQ((Shape{0, 7}.numel()), 0);
}

TEST(Shape, RejectsRankAboveEightAndNegativeDims) {
  EXPECT_NO_THROW((Shape{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_THROW_MESSAGE((Shape{1, 2, 3, 4, 5, 6, 7, 8, 9}), ShapeError,
                       "rank from 0 to 8, got rank 9");
  EXPECT_THROW_MESSAGE((Shape{2, -1}), ShapeError, "got -1 at axis 1");
  EXPECT_THROW_MESSAGE((Shape{2, 3}.dim(2)), ShapeError, "axis 2 is out of range for shape (2, 3)");
  EXPECT_THROW_MESSAGE((Shape{2, 3}.dim(-3)), ShapeError, "axis -3");
}

// Counts past what memory can address are refused where the shape is made: numel() of (2⁶², 2)
// wrapped around int64 before, and a layer of that size asked std::vector for a negative size.
TEST(Shape, RejectsCountsNoAddressSpaceHolds) {
  constexpr int64_t kHalf = int64_t{1} << 31;
  EXPECT_EQ((Shape{Shape::kMaxElements}.numel()), Shape::kMaxElements);
  EXPECT_THROW_MESSAGE((Shape{Shape::kMaxElements + 1}), ShapeError,
                       "shape: expected at most 2305843009213693951 elements");
  // 2³⁰ · 2³¹ = 2⁶¹ = kMaxElements + 1: the product's bound, not only each dimension's.
  EXPECT_EQ((Shape{int64_t{1} << 30, kHalf - 1}.numel()), (int64_t{1} << 61) - (int64_t{1} << 30));
  EXPECT_THROW_MESSAGE((Shape{int64_t{1} << 30, kHalf}), ShapeError, "got shape (1073741824, ");
  EXPECT_THROW_MESSAGE((Shape{int64_t{1} << 62, 2}), ShapeError,
                       "got shape (4611686018427387904, 2)");
  EXPECT_THROW_MESSAGE((Shape{kHalf, kHalf, kHalf, kHalf}), ShapeError, "elements");
  // A zero does not excuse the other dimensions: numel() multiplies them in order, and (2³¹)⁴
  // overflows before the zero.
  EXPECT_EQ((Shape{int64_t{1} << 30, 0, int64_t{1} << 30}.numel()), 0);
  EXPECT_THROW_MESSAGE((Shape{kHalf, kHalf, kHalf, kHalf, 0}), ShapeError, "elements");
}

TEST(Shape, ComparesDimsAndRank) {
  EXPECT_EQ((Shape{2, 3}), (Shape{2, 3}));
  EXPECT_NE((Shape{2, 3}), (Shape{3, 2}));
  EXPECT_NE((Shape{6}), (Shape{6, 1}));
}

}  // namespace
}  // namespace attn
