// Tensor and views: construction checks, row-major indexing, reshaping and slicing without copies.
#include "attn/core/tensor.hpp"

#include <gtest/gtest.h>

#include "attn/core/error.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

TEST(Tensor, IndexesRowMajor) {
  Tensor tensor(Shape{2, 3, 4});
  for (int64_t index = 0; index < tensor.numel(); ++index)
    tensor.data()[index] = static_cast<float>(index);
  EXPECT_EQ(tensor(1, 2, 3), 23.0F);
  EXPECT_EQ(tensor(0, 1, 0), 4.0F);
  Tensor rank4(Shape{2, 2, 2, 2}, std::vector<float>(16, 0.0F));
  rank4(1, 0, 1, 1) = 7.0F;
  EXPECT_EQ(rank4.data()[8 + 2 + 1], 7.0F);
}

TEST(Tensor, DefaultIsEmpty) {
  const Tensor empty;
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.shape(), (Shape{0}));
  EXPECT_EQ(ConstTensorView().numel(), 0);
}

TEST(Tensor, RejectsWrongValueCount) {
  EXPECT_THROW_MESSAGE((Tensor(Shape{2, 3}, std::vector<float>(5))), ShapeError,
                       "shape (2, 3) needs 6 values, got 5");
}

TEST(TensorView, SlicesAndReshapesWithoutCopying) {
  Tensor tensor(Shape{2, 3, 4});
  const TensorView second = tensor.view()[1];
  EXPECT_EQ(second.shape(), (Shape{3, 4}));
  EXPECT_EQ(second.data(), tensor.data() + 12);
  second(2, 1) = 5.0F;
  EXPECT_EQ(tensor(1, 2, 1), 5.0F);
  const ConstTensorView flat = tensor.view().reshaped(Shape{6, 4});
  EXPECT_EQ(flat.data(), tensor.data());
  EXPECT_EQ(flat(5, 1), 5.0F);
  EXPECT_THROW_MESSAGE(tensor.view().reshaped(Shape{5, 5}), ShapeError,
                       "cannot view 24 elements of shape (2, 3, 4) as shape (5, 5)");
  EXPECT_THROW_MESSAGE(tensor.view()[2], ShapeError, "2 is out of range");
  EXPECT_THROW_MESSAGE(tensor.view()[-1], ShapeError, "-1 is out of range");
}

TEST(Tensor, CopiesAreDeep) {
  Tensor original = Tensor::full(Shape{3}, 1.5F);
  Tensor copy = original;
  copy(0) = 2.0F;
  EXPECT_EQ(original(0), 1.5F);
  const Tensor from_view = Tensor::from(original.view());
  EXPECT_NE(from_view.data(), original.data());
  EXPECT_EQ(from_view.values(), original.values());
}

TEST(TensorChecks, NameTheArgument) {
  EXPECT_THROW_MESSAGE(require_rank("queries", Shape{2, 3}, 3), ShapeError,
                       "queries: expected a tensor of rank 3, got shape (2, 3) (rank 2)");
  EXPECT_THROW_MESSAGE(
      require_dim("keys", Shape{2, 3, 4}, 0, 5, "the batch size of queries"), ShapeError,
      "keys: expected dimension 0 to be 5 (the batch size of queries), got shape (2, 3, 4)");
}

}  // namespace
}  // namespace attn
