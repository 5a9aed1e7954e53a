// Tensor and views: construction checks, row-major indexing, reshaping and slicing without copies.
#include "attn/core/tensor.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

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

// assign copies any view: into the storage it has when the element count allows (no allocation at
// a layer's next call), across the OpenMP chunks from 2^20 elements on (a count off the chunks),
// and from a view of the tensor itself (a slice, which it must read before it shrinks).
TEST(Tensor, AssignCopiesIntoTheStorageItHas) {
  Tensor target;
  for (const int64_t count : {int64_t{0}, int64_t{5}, (int64_t{1} << 20) + 4097}) {
    std::vector<float> values(static_cast<size_t>(count));
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 1009) - 504.5F;
    const Tensor source(Shape{count}, values);
    target.assign(source.view());
    EXPECT_EQ(target.shape(), source.shape());
    ASSERT_EQ(target.values(), source.values()) << count << " elements";
    if (count > 0) {
      EXPECT_NE(target.data(), source.data());
    }
  }
  const float* storage = target.data();
  Tensor same_count = Tensor::full(Shape{2, 4, (int64_t{1} << 20) / 8 + 512}, 3.0F);
  target.assign(same_count.view());
  EXPECT_EQ(target.data(), storage) << "the storage it had is reused";
  EXPECT_EQ(target.shape(), same_count.shape());
  EXPECT_EQ(target.values(), same_count.values());

  Tensor rows(Shape{3, 2}, {1, 2, 3, 4, 5, 6});
  rows.assign(rows.view()[1]);
  EXPECT_EQ(rows.shape(), (Shape{2}));
  EXPECT_EQ(rows.to_vector(), (std::vector<float>{3, 4}));
}

// Tensor's storage leaves new elements unwritten (TensorAllocator) and the constructors fill them,
// on the OpenMP threads from 2^20 elements on: every length around that threshold and its chunks
// (2^16), in storage that last held other values (freed just before, so the allocator is likely to
// hand it back unzeroed), comes out as asked, 64-byte aligned.
TEST(Tensor, FreshTensorsHoldWhatTheyWereGivenAtEveryLength) {
  constexpr int64_t kThreshold = int64_t{1} << 20, kChunk = int64_t{1} << 16;
  for (const int64_t count : {int64_t{0}, int64_t{1}, int64_t{17}, kThreshold - 1, kThreshold,
                              kThreshold + 1, kThreshold + kChunk + 3, 3 * kThreshold + 5}) {
    const Shape shape{count};
    { const Tensor garbage = Tensor::full(shape, 7.0F); }
    const Tensor zeros(shape);
    ASSERT_EQ(zeros.numel(), count);
    EXPECT_EQ(max_magnitude(zeros), 0.0F) << count << " elements";
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(zeros.data()) % 64, 0U) << count << " elements";

    const Tensor sevens = Tensor::full(shape, 7.0F);
    EXPECT_EQ(std::count(sevens.values().begin(), sevens.values().end(), 7.0F), count);

    std::vector<float> ramp(static_cast<size_t>(count));
    for (size_t i = 0; i < ramp.size(); ++i) ramp[i] = static_cast<float>(i % 1000) - 500.0F;
    const Tensor copied(shape, ramp);
    EXPECT_EQ(copied.to_vector(), ramp) << count << " elements";
    EXPECT_EQ(Tensor::from(copied.view()).values(), copied.values()) << count << " elements";
  }
}

TEST(TensorChecks, NameTheArgument) {
  EXPECT_THROW_MESSAGE(require_rank("queries", Shape{2, 3}, 3), ShapeError,
                       "queries: expected a tensor of rank 3, got shape (2, 3) (rank 2)");
  EXPECT_THROW_MESSAGE(
      require_dim("keys", Shape{2, 3, 4}, 0, 5, "the batch size of queries"), ShapeError,
      "keys: expected dimension 0 to be 5 (the batch size of queries), got shape (2, 3, 4)");
}

// require_finite returns max |x| and names the first NaN or ±∞; all_finite says whether there is
// one; max_magnitude gives max |x|, or +∞ when there is one. Lengths around the vector widths
// (tails of 1–15 floats) and past the 2^20 floats from which the scan runs in chunks on the OpenMP
// threads, with the culprit first, last, or in a tail.
TEST(Tensor, FiniteScansFindTheMagnitudeAndTheFirstCulpritAtEveryLength) {
  for (const int64_t count : {int64_t{1}, int64_t{7}, int64_t{16}, int64_t{33}, int64_t{1000},
                              (int64_t{1} << 20) + 1, (int64_t{1} << 21) + 13}) {
    Tensor values(Shape{count});
    for (int64_t i = 0; i < count; ++i) values.data()[i] = static_cast<float>(i % 97) - 48.0F;
    values.data()[count / 2] = -1.5e30F;  // the largest magnitude, negative
    EXPECT_EQ(require_finite("x", values), 1.5e30F) << count;
    EXPECT_TRUE(all_finite(values)) << count;
    EXPECT_EQ(max_magnitude(values), 1.5e30F) << count;
    for (const int64_t where : {int64_t{0}, count - 1, count / 3}) {
      for (const float bad :
           {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
        Tensor copy = Tensor::from(values);
        copy.data()[where] = bad;
        if (where != count - 1) copy.data()[count - 1] = std::numeric_limits<float>::infinity();
        EXPECT_FALSE(all_finite(copy)) << count << " " << where;
        EXPECT_EQ(max_magnitude(copy), std::numeric_limits<float>::infinity())
            << count << " " << where;
        const std::string expected =
            "at flat index " + std::to_string(std::min(where, count - 1)) + " of shape";
        try {
          require_finite("x", copy);
          ADD_FAILURE() << "no error for count " << count << ", index " << where;
        } catch (const ValueError& error) {
          EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
          EXPECT_EQ(std::string(error.what()).rfind("x: expected finite values, got ", 0), 0U)
              << error.what();
        }
      }
    }
  }
}

}  // namespace
}  // namespace attn
