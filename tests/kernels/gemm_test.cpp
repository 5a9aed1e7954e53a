// attn::gemm (oneDNN's sgemm) against a double reference: every combination of transposes, padded
// leading dimensions, sizes that divide no kernel's tile, β = 0 and β ≠ 0, empty and depth-0
// products, thread counts 1 and 2; a refused leading dimension is a ValueError. linear_product
// (oneDNN's matmul, a Linear layer's x·Wᵀ + b) likewise, with and without its bias.
#include "attn/kernels/gemm.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <cfloat>
#include <cmath>
#include <string>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/core/random.hpp"

namespace attn {
namespace {

struct Product {
  int64_t rows, cols, depth;
  Transpose transpose_a, transpose_b;
  int64_t pad;  // extra columns in every leading dimension
};

// Element (i, k) of op(A) and (k, j) of op(B) as stored row-major with leading dimension ld.
float at(const std::vector<float>& m, int64_t ld, Transpose transposed, int64_t i, int64_t k) {
  return transposed == Transpose::kYes ? m[static_cast<size_t>(k * ld + i)]
                                       : m[static_cast<size_t>(i * ld + k)];
}

// C = α·op(A)·op(B) + β·C checked element by element against double sums. The bound: float
// accumulation of `depth` products errs by at most about depth·ε·Σ|a·b| (plus β·C's rounding);
// 4× that and an absolute 1e-30 leave room for any summation order.
void check(const Product& p, float alpha, float beta, uint64_t seed) {
  Rng rng(seed);
  const int64_t a_rows = p.transpose_a == Transpose::kYes ? p.depth : p.rows;
  const int64_t a_cols = p.transpose_a == Transpose::kYes ? p.rows : p.depth;
  const int64_t b_rows = p.transpose_b == Transpose::kYes ? p.cols : p.depth;
  const int64_t b_cols = p.transpose_b == Transpose::kYes ? p.depth : p.cols;
  const int64_t lda = a_cols + p.pad, ldb = b_cols + p.pad, ldc = p.cols + p.pad;
  std::vector<float> a(static_cast<size_t>(std::max<int64_t>(a_rows * lda, 1))),
      b(static_cast<size_t>(std::max<int64_t>(b_rows * ldb, 1))),
      c(static_cast<size_t>(std::max<int64_t>(p.rows * ldc, 1)));
  for (float& x : a) x = rng.uniform(-2.0F, 2.0F);
  for (float& x : b) x = rng.uniform(-2.0F, 2.0F);
  for (float& x : c) x = rng.uniform(-2.0F, 2.0F);
  const std::vector<float> c_before = c;
  gemm(p.transpose_a, p.transpose_b, p.rows, p.cols, p.depth, alpha, a.data(), lda, b.data(), ldb,
       beta, c.data(), ldc);
  for (int64_t i = 0; i < p.rows; ++i) {
    for (int64_t j = 0; j < p.cols; ++j) {
      double sum = 0.0, magnitude = 0.0;
      for (int64_t k = 0; k < p.depth; ++k) {
        const double term =
            static_cast<double>(at(a, lda, p.transpose_a, i, k)) * at(b, ldb, p.transpose_b, k, j);
        sum += term;
        magnitude += std::abs(term);
      }
      const double start = c_before[static_cast<size_t>(i * ldc + j)];
      const double expected = alpha * sum + (beta == 0.0F ? 0.0 : beta * start);
      const double bound = 4.0 * FLT_EPSILON *
                               (static_cast<double>(p.depth + 2) * std::abs(alpha) * magnitude +
                                std::abs(expected) + 2.0 * std::abs(start)) +
                           1e-30;
      ASSERT_NEAR(c[static_cast<size_t>(i * ldc + j)], expected, bound)
          << "rows " << p.rows << " cols " << p.cols << " depth " << p.depth << " at (" << i << ", "
          << j << ")";
    }
    // The padding columns of C are never written.
    for (int64_t j = p.cols; j < ldc; ++j)
      ASSERT_EQ(c[static_cast<size_t>(i * ldc + j)], c_before[static_cast<size_t>(i * ldc + j)]);
  }
}

TEST(Gemm, MatchesTheDoubleReferenceForEveryTransposeAndShape) {
  const Product shapes[] = {{1, 1, 1, Transpose::kNo, Transpose::kNo, 0},
                            {37, 29, 61, Transpose::kNo, Transpose::kNo, 3},
                            {37, 29, 61, Transpose::kNo, Transpose::kYes, 0},
                            {37, 29, 61, Transpose::kYes, Transpose::kNo, 5},
                            {37, 29, 61, Transpose::kYes, Transpose::kYes, 1},
                            {130, 67, 257, Transpose::kNo, Transpose::kYes, 7},
                            {1, 300, 129, Transpose::kNo, Transpose::kYes, 0},
                            {300, 1, 129, Transpose::kYes, Transpose::kNo, 2}};
  uint64_t seed = 1;
  const int saved_threads = omp_get_max_threads();
  for (const int threads : {1, 2}) {
    omp_set_num_threads(threads);
    for (const Product& p : shapes) {
      check(p, 1.0F, 0.0F, seed++);
      check(p, -0.75F, 0.5F, seed++);
    }
  }
  omp_set_num_threads(saved_threads);
}

TEST(Gemm, EmptyAndDepthZeroProducts) {
  // rows or cols 0: nothing happens; depth 0: C = β·C (0 where β = 0, whatever C held).
  std::vector<float> c = {1.0F, 2.0F, 3.0F, 4.0F};
  gemm(Transpose::kNo, Transpose::kNo, 0, 2, 3, 1.0F, nullptr, 3, nullptr, 2, 0.0F, c.data(), 2);
  gemm(Transpose::kNo, Transpose::kNo, 2, 0, 3, 1.0F, nullptr, 3, nullptr, 1, 0.0F, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{1.0F, 2.0F, 3.0F, 4.0F}));
  gemm(Transpose::kNo, Transpose::kNo, 2, 2, 0, 1.0F, nullptr, 1, nullptr, 2, 0.5F, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{0.5F, 1.0F, 1.5F, 2.0F}));
  c[0] = std::nanf("");
  gemm(Transpose::kNo, Transpose::kNo, 2, 2, 0, 1.0F, nullptr, 1, nullptr, 2, 0.0F, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{0.0F, 0.0F, 0.0F, 0.0F}));
}

// y = x·Wᵀ + b (W: out × in) checked element by element against double sums, bound as in check();
// y starts as NaN, so an element left unwritten fails.
void check_linear(int64_t rows, int64_t in, int64_t out, bool with_bias, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x(static_cast<size_t>(rows * in)), weight(static_cast<size_t>(out * in)),
      bias(static_cast<size_t>(out)), y(static_cast<size_t>(rows * out), std::nanf(""));
  for (float& value : x) value = rng.uniform(-2.0F, 2.0F);
  for (float& value : weight) value = rng.uniform(-2.0F, 2.0F);
  for (float& value : bias) value = rng.uniform(-2.0F, 2.0F);
  linear_product(rows, in, out, x.data(), weight.data(), with_bias ? bias.data() : nullptr,
                 y.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double sum = with_bias ? bias[static_cast<size_t>(o)] : 0.0, magnitude = std::abs(sum);
      for (int64_t k = 0; k < in; ++k) {
        const double term = static_cast<double>(x[static_cast<size_t>(r * in + k)]) *
                            weight[static_cast<size_t>(o * in + k)];
        sum += term;
        magnitude += std::abs(term);
      }
      const double bound =
          4.0 * FLT_EPSILON * (static_cast<double>(in + 2) * magnitude + std::abs(sum)) + 1e-30;
      ASSERT_NEAR(y[static_cast<size_t>(r * out + o)], sum, bound)
          << "rows " << rows << " in " << in << " out " << out << " at (" << r << ", " << o << ")"
          << (with_bias ? " with bias" : "");
    }
  }
}

TEST(LinearProduct, MatchesTheDoubleReferenceWithAndWithoutBias) {
  // (rows, in, out): one row (a decode step's projection), sizes that divide no kernel's tile, a
  // single output — on sgemm — and a layer's 512 × 512 weight and odd sizes from 16 rows of a
  // 256 × 256 weight up — on oneDNN's matmul.
  const int64_t shapes[][3] = {{1, 1, 1},     {1, 129, 300},  {16, 512, 512}, {37, 61, 29},
                               {300, 129, 1}, {130, 257, 67}, {37, 300, 259}};
  uint64_t seed = 100;
  const int saved_threads = omp_get_max_threads();
  for (const int threads : {1, 2}) {
    omp_set_num_threads(threads);
    for (const auto& shape : shapes) {
      check_linear(shape[0], shape[1], shape[2], false, seed++);
      check_linear(shape[0], shape[1], shape[2], true, seed++);
    }
  }
  omp_set_num_threads(saved_threads);
}

TEST(LinearProduct, EmptyInputsGiveTheBiasAndNoRowsWriteNothing) {
  const float bias[2] = {7.0F, -1.0F};
  std::vector<float> y(4, std::nanf(""));
  linear_product(2, 0, 2, nullptr, nullptr, bias, y.data());
  EXPECT_EQ(y, (std::vector<float>{7.0F, -1.0F, 7.0F, -1.0F}));
  linear_product(2, 0, 2, nullptr, nullptr, nullptr, y.data());
  EXPECT_EQ(y, (std::vector<float>{0.0F, 0.0F, 0.0F, 0.0F}));
  y.assign(4, 3.0F);
  linear_product(0, 5, 2, nullptr, nullptr, bias, y.data());
  linear_product(2, 5, 0, nullptr, nullptr, bias, y.data());
  EXPECT_EQ(y, (std::vector<float>{3.0F, 3.0F, 3.0F, 3.0F}));
}

TEST(Gemm, ARefusedLeadingDimensionIsAValueErrorNamingTheSizes) {
  std::vector<float> a(12, 1.0F), b(12, 1.0F), c(9, 0.0F);
  try {
    // A is 3 × 4 row-major: lda 2 < 4 columns.
    gemm(Transpose::kNo, Transpose::kNo, 3, 3, 4, 1.0F, a.data(), 2, b.data(), 3, 0.0F, c.data(),
         3);
    FAIL() << "no error";
  } catch (const ValueError& error) {
    EXPECT_NE(std::string(error.what()).find("gemm: oneDNN's sgemm refused rows = 3"),
              std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("lda = 2"), std::string::npos) << error.what();
  }
}

TEST(Gemm, NamesItsLibraryAndInstructionSet) {
  const std::string library = gemm_library();
  EXPECT_EQ(library.rfind("oneDNN ", 0), 0U) << library;
  EXPECT_NE(library.find('('), std::string::npos) << library;
}

}  // namespace
}  // namespace attn
