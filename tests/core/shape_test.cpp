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
  EXPECT_THROW_MESSAGE((Shape{1, 2, 3, 4, 5, 6, 7, 8, 9}), ShapeError, "rank from 0 to 8, got rank 9");
  EXPECT_THROW_MESSAGE((Shape{2, -1}), ShapeError, "got -1 at axis 1");
  EXPECT_THROW_MESSAGE((Shape{2, 3}.dim(2)), ShapeError, "axis 2 is out of range for shape (2, 3)");
  EXPECT_THROW_MESSAGE((Shape{2, 3}.dim(-3)), ShapeError, "axis -3");
}

TEST(Shape, ComparesDimsAndRank) {
  EXPECT_EQ((Shape{2, 3}), (Shape{2, 3}));
  EXPECT_NE((Shape{2, 3}), (Shape{3, 2}));
  EXPECT_NE((Shape{6}), (Shape{6, 1}));
}

}  // namespace
}  // namespace attn
