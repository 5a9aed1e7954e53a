// fp16 and bfloat16 conversions: every fp16 value to float and back, and millions of random
// floats to fp16 against the compiler's own _Float16 rounding (where it has one); bfloat16 against
// rounding in double.
#include "attn/core/half.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

namespace attn {
namespace {

bool is_half_nan(uint16_t bits) {
  return (bits & 0x7c00U) == 0x7c00U && (bits & 0x3ffU) != 0;
}

TEST(Half, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const auto half = static_cast<uint16_t>(bits);
    const float value = half_to_float(half);
    if (is_half_nan(half)) {
      EXPECT_TRUE(std::isnan(value)) << bits;
      EXPECT_TRUE(is_half_nan(float_to_half(value))) << bits;
    } else {
      EXPECT_EQ(float_to_half(value), half) << bits;
    }
  }
  EXPECT_EQ(half_to_float(0x3c00), 1.0F);
  EXPECT_EQ(half_to_float(0x7bff), 65504.0F);
  EXPECT_EQ(half_to_float(0x0001), 0x1p-24F);
  EXPECT_EQ(float_to_half(65520.0F), 0x7c00);  // ties to even: past the largest finite
  EXPECT_EQ(float_to_half(-1e9F), 0xfc00);
  EXPECT_EQ(float_to_half(0x1p-26F), 0x0000);  // below half the smallest subnormal
}

TEST(Half, RandomFloatsRoundAsTheCompilersFloat16) {
#ifdef __FLT16_MAX__
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2'000'000; ++trial) {
    auto bits = static_cast<uint32_t>(rng());
    float value;
    std::memcpy(&value, &bits, sizeof value);
    if (trial % 2 == 1) {  // values in fp16's range, where rounding matters most
      value = std::ldexp(static_cast<float>(rng() % 2'000'000) / 1e6F,
                         static_cast<int>(rng() % 40) - 30);
    }
    const auto expected_half = static_cast<_Float16>(value);
    uint16_t expected;
    std::memcpy(&expected, &expected_half, sizeof expected);
    const uint16_t actual = float_to_half(value);
    if (is_half_nan(expected)) {
      EXPECT_TRUE(is_half_nan(actual)) << value;
    } else {
      ASSERT_EQ(actual, expected) << std::hexfloat << value;
    }
  }
#else
  GTEST_SKIP() << "this compiler has no _Float16 to compare with";
#endif
}

TEST(BFloat16, RoundsToNearestEven) {
  std::mt19937 rng(8);
  for (int trial = 0; trial < 1'000'000; ++trial) {
    auto bits = static_cast<uint32_t>(rng());
    float value;
    std::memcpy(&value, &bits, sizeof value);
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(value))));
      continue;
    }
    const uint16_t actual = float_to_bfloat16(value);
    // The two bfloat16 values around `value` (truncation and the next one up in magnitude);
    // the nearer wins, ties to the even mantissa.
    const auto down = static_cast<uint16_t>(bits >> 16), up = static_cast<uint16_t>(down + 1);
    const double below = std::fabs(static_cast<double>(value) - bfloat16_to_float(down));
    // Past the largest finite bfloat16, the next value up is 2¹²⁸ (where IEEE rounding measures).
    const double up_value = (up & 0x7fffU) == 0x7f80U ? std::copysign(std::ldexp(1.0, 128), value)
                                                      : bfloat16_to_float(up);
    const double above = std::fabs(up_value - value);
    const uint16_t expected = below < above      ? down
                              : above < below    ? up
                              : (down & 1U) == 0 ? down
                                                 : up;
    if (std::isinf(value) || (bits & 0xffffU) == 0) {
      ASSERT_EQ(actual, down) << value;
    } else {
      ASSERT_EQ(actual, expected) << std::hexfloat << value;
    }
  }
  EXPECT_EQ(bfloat16_to_float(float_to_bfloat16(1.0F)), 1.0F);
  EXPECT_EQ(float_to_bfloat16(std::numeric_limits<float>::infinity()), 0x7f80);
}

}  // namespace
}  // namespace attn
