// Batched products: random shapes against double loops, and shape errors.
#include "attn/kernels/matmul.hpp"

#include <gtest/gtest.h>

#include "attn/core/error.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

// Inner products of k ≤ 33 normal terms: float32 accumulation error ≤ k·2⁻²⁴·Σ|a·b|, well under
// 1e-5 of the result's magnitude (≥ 1 by close_to's floor).
constexpr double kTolerance = 1e-5;

TEST(BatchedMatmul, MatchesDoubleLoops) {
  Rng rng(5);
  for (const int64_t batch : {1, 2})
    for (const int64_t rows : {1, 4})
      for (const int64_t inner : {1, 33})
        for (const int64_t cols : {1, 9}) {
          const Tensor a = testing::random_tensor(Shape{batch, rows, inner}, rng);
          const Tensor rhs = testing::random_tensor(Shape{batch, inner, cols}, rng);
          const Tensor rhs_t = testing::random_tensor(Shape{batch, cols, inner}, rng);
          Tensor out(Shape{batch, rows, cols}), out_t(Shape{batch, rows, cols});
          batched_matmul(a, rhs, out);
          batched_matmul_transposed(a, rhs_t, out_t);
          std::vector<double> expected, expected_t;
          for (int64_t b = 0; b < batch; ++b)
            for (int64_t i = 0; i < rows; ++i)
              for (int64_t j = 0; j < cols; ++j) {
                double sum = 0, sum_t = 0;
                for (int64_t t = 0; t < inner; ++t) {
                  sum += static_cast<double>(a(b, i, t)) * rhs(b, t, j);
                  sum_t += static_cast<double>(a(b, i, t)) * rhs_t(b, j, t);
                }
                expected.push_back(sum);
                expected_t.push_back(sum_t);
              }
          EXPECT_TRUE(testing::close_to(out, expected, kTolerance));
          EXPECT_TRUE(testing::close_to(out_t, expected_t, kTolerance));
        }
}

TEST(BatchedMatmul, RejectsMismatchedShapes) {
  Tensor out(Shape{2, 3, 5});
  EXPECT_THROW_MESSAGE(batched_matmul(Tensor(Shape{2, 3, 4}), Tensor(Shape{2, 5, 5}), out),
                       ShapeError, "rhs: expected dimension 1 to be 4 (the last dimension of a)");
  EXPECT_THROW_MESSAGE(batched_matmul(Tensor(Shape{2, 3, 4}), Tensor(Shape{1, 4, 5}), out),
                       ShapeError, "rhs: expected dimension 0 to be 2 (the batch size of a)");
  EXPECT_THROW_MESSAGE(
      batched_matmul_transposed(Tensor(Shape{2, 3, 4}), Tensor(Shape{2, 6, 4}), out), ShapeError,
      "out: expected shape (2, 3, 6), got shape (2, 3, 5)");
}

}  // namespace
}  // namespace attn
