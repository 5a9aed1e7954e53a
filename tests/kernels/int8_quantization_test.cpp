// quantize_rows_int8 against its scalar definition (max|x| / 127, std::lround, clamp), bit for bit,
// on every SIMD target this machine runs: halves that must round away from zero, rows of zeros,
// large and tiny magnitudes, strided sources, widths with vector tails, and the threaded path.
#include "attn/kernels/int8_quantization.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "attn/core/random.hpp"
#include "every_simd_target.hpp"

namespace attn {
namespace {

class Int8Quantization : public testing::EverySimdTarget {};

// The definition, row by row.
void quantise_reference(const std::vector<float>& from, size_t stride, size_t rows, size_t cols,
                        std::vector<int8_t>& to, std::vector<float>& scales) {
  for (size_t r = 0; r < rows; ++r) {
    float largest = 0.0F;
    for (size_t c = 0; c < cols; ++c) largest = std::max(largest, std::fabs(from[r * stride + c]));
    scales[r] = largest > 0.0F ? largest / 127.0F : 1.0F;
    // At float's ends: 127·scale within FLT_MAX, and a scale of at least the least subnormal.
    while (std::isinf(scales[r] * 127.0F)) scales[r] = std::nextafter(scales[r], 0.0F);
    scales[r] = std::max(scales[r], std::numeric_limits<float>::denorm_min());
    for (size_t c = 0; c < cols; ++c) {
      to[r * cols + c] = static_cast<int8_t>(
          std::clamp<long>(std::lround(from[r * stride + c] / scales[r]), -127, 127));
    }
  }
}

void expect_as_reference(const std::vector<float>& from, size_t stride, size_t rows, size_t cols) {
  std::vector<int8_t> got(rows * cols, 99), want(rows * cols);
  std::vector<float> got_scales(rows, -1.0F), want_scales(rows);
  quantize_rows_int8(from.data(), stride, rows, cols, got.data(), got_scales.data());
  quantise_reference(from, stride, rows, cols, want, want_scales);
  ASSERT_EQ(got_scales, want_scales) << "rows " << rows << ", cols " << cols;
  for (size_t e = 0; e < got.size(); ++e) {
    ASSERT_EQ(got[e], want[e]) << "element " << e << " (row " << e / cols << ", col " << e % cols
                               << "), cols " << cols << ", value "
                               << from[(e / cols) * stride + e % cols];
  }
}

TEST_P(Int8Quantization, RandomRowsMatchTheScalarDefinition) {
  Rng rng(91);
  for (const size_t cols : {size_t{1}, size_t{3}, size_t{7}, size_t{16}, size_t{33}, size_t{64},
                            size_t{128}, size_t{130}}) {
    for (const float magnitude : {1e-30F, 1e-3F, 1.0F, 3e4F, 1e37F}) {
      const size_t rows = 9, stride = cols + 5;  // strided: 5 floats between rows
      std::vector<float> from(rows * stride);
      for (float& value : from) value = magnitude * rng.normal();
      expect_as_reference(from, stride, rows, cols);
    }
  }
}

// Values whose quotient by the row's scale is exactly k + 0.5: std::lround goes away from zero, a
// vector round-to-nearest-even would not. The row's largest is 127 so that its scale is 1.
TEST_P(Int8Quantization, HalvesRoundAwayFromZero) {
  for (const size_t cols : {size_t{16}, size_t{37}, size_t{128}}) {
    std::vector<float> from(cols);
    for (size_t c = 0; c < cols; ++c) {
      const float half = static_cast<float>(c % 60) + 0.5F;
      from[c] = c % 2 == 0 ? half : -half;
    }
    from[cols / 2] = 127.0F;
    expect_as_reference(from, cols, 1, cols);
    std::vector<int8_t> got(cols);
    float scale = 0.0F;
    quantize_rows_int8(from.data(), cols, 1, cols, got.data(), &scale);
    EXPECT_EQ(scale, 1.0F);
    EXPECT_EQ(got[0], 1);   // 0.5
    EXPECT_EQ(got[1], -2);  // -1.5
    EXPECT_EQ(got[2], 3);   // 2.5
  }
}

TEST_P(Int8Quantization, RowsOfZerosGetScaleOneAndZeros) {
  const std::vector<float> zeros(3 * 40, 0.0F);
  std::vector<int8_t> got(3 * 40, 99);
  std::vector<float> scales(3, 0.0F);
  quantize_rows_int8(zeros.data(), 40, 3, 40, got.data(), scales.data());
  EXPECT_EQ(scales, std::vector<float>(3, 1.0F));
  EXPECT_EQ(got, std::vector<int8_t>(3 * 40, 0));
  quantize_rows_int8(nullptr, 0, 0, 40, nullptr, nullptr);  // no rows: nothing touched
}

// Rows at float's ends read back within half a step of their scale: a row holding FLT_MAX read
// back ∞ (127·(FLT_MAX / 127) rounds up past it), and a row under 1.8e-43 read back as zeros (its
// scale underflowed to 0).
TEST_P(Int8Quantization, RowsAtFloatsEndsReadBackWithinTheirBound) {
  constexpr float kMax = std::numeric_limits<float>::max();
  for (const float largest : {kMax, std::nextafter(kMax, 0.0F), 3e38F, 1e-44F, 1e-45F, 3e-43F}) {
    SCOPED_TRACE(largest);
    const size_t cols = 37;
    std::vector<float> from(cols);
    for (size_t c = 0; c < cols; ++c)
      from[c] = largest * (static_cast<float>(c) / static_cast<float>(cols - 1)) *
                (c % 2 == 1 ? -1.0F : 1.0F);
    expect_as_reference(from, cols, 1, cols);
    std::vector<int8_t> got(cols);
    float scale = 0.0F;
    quantize_rows_int8(from.data(), cols, 1, cols, got.data(), &scale);
    for (size_t c = 0; c < cols; ++c) {
      const float read = static_cast<float>(got[c]) * scale;
      ASSERT_TRUE(std::isfinite(read)) << "column " << c;
      // Half a step, and the scale's own rounding at the ends (one step under 1e-43).
      EXPECT_LE(std::fabs(static_cast<double>(read) - from[c]), static_cast<double>(scale))
          << "column " << c;
    }
  }
}

// A million values and more run on the OpenMP threads in blocks of rows: the same bytes.
TEST_P(Int8Quantization, LargeCountsOnTheThreadsMatchTheDefinition) {
  Rng rng(92);
  const size_t rows = 8300, cols = 128;  // blocks of 64 rows, the last one partial
  std::vector<float> from(rows * cols);
  for (float& value : from) value = rng.normal();
  expect_as_reference(from, cols, rows, cols);
}

ATTN_INSTANTIATE_FOR_EVERY_SIMD_TARGET(Int8Quantization);

}  // namespace
}  // namespace attn
