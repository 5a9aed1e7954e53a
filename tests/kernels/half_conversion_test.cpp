// widen_half and narrow_to_half against half.hpp's scalar conversions, bit for bit, on every SIMD
// target this machine runs: every fp16 and bf16 bit pattern but NaNs widened, and floats that
// round at ties, to subnormals, to ±∞ and from subnormals narrowed, in counts with vector tails.
#include "attn/kernels/half_conversion.hpp"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "attn/core/half.hpp"
#include "attn/core/random.hpp"
#include "every_simd_target.hpp"

namespace attn {
namespace {

class HalfConversion : public testing::EverySimdTarget {};

bool is_nan_bits(HalfType type, uint16_t bits) {
  return type == HalfType::kFloat16 ? (bits & 0x7c00U) == 0x7c00U && (bits & 0x3ffU) != 0
                                    : (bits & 0x7f80U) == 0x7f80U && (bits & 0x7fU) != 0;
}

TEST_P(HalfConversion, WidensEveryBitPatternExactly) {
  for (const HalfType type : {HalfType::kFloat16, HalfType::kBFloat16}) {
    std::vector<uint16_t> bits;
    for (uint32_t pattern = 0; pattern <= 0xffffU; ++pattern) {
      if (!is_nan_bits(type, static_cast<uint16_t>(pattern)))
        bits.push_back(static_cast<uint16_t>(pattern));
    }
    bits.push_back(0x3c00U);  // an odd count: the scalar tail runs too
    std::vector<float> widened(bits.size());
    widen_half(type, bits.data(), widened.data(), bits.size());
    for (size_t i = 0; i < bits.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(widened[i]),
                std::bit_cast<uint32_t>(half_bits_to_float(type, bits[i])))
          << "bits 0x" << std::hex << bits[i] << " target " << hwy::TargetName(GetParam());
    }
  }
}

TEST_P(HalfConversion, NarrowsAsTheScalarConversionRoundsToNearestEven) {
  Rng rng(5);
  std::vector<float> values = {0.0F,
                               -0.0F,
                               1.0F,
                               -1.0F,
                               65504.0F,
                               65520.0F,
                               -65520.0F,
                               1e10F,
                               -1e10F,
                               6e-8F,
                               3e-8F,
                               2.98e-8F,
                               1e-30F,
                               -1e-40F,
                               1e-45F,
                               3.4e38F,
                               -3.4e38F,
                               0.1F,
                               1.0009766F,
                               1.0029297F,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity()};
  // Ties: halfway between adjacent fp16 and bf16 values, both parities.
  for (uint32_t base : {0x3f800000U, 0x3f810000U, 0x40000000U}) {
    values.push_back(std::bit_cast<float>(base | 0x8000U));  // bf16 tie
    values.push_back(std::bit_cast<float>(base | 0x1000U));  // fp16 tie
    values.push_back(std::bit_cast<float>(base | 0x3000U));
  }
  for (int i = 0; i < 100003; ++i) {
    values.push_back(rng.normal() *
                     std::exp2(static_cast<float>(static_cast<int>(rng.next_u64() % 60) - 30)));
  }
  for (const HalfType type : {HalfType::kFloat16, HalfType::kBFloat16}) {
    std::vector<uint16_t> narrowed(values.size());
    narrow_to_half(type, values.data(), narrowed.data(), values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_EQ(narrowed[i], float_to_half_bits(type, values[i]))
          << values[i] << " type " << static_cast<int>(type) << " target "
          << hwy::TargetName(GetParam());
    }
  }
}

TEST_P(HalfConversion, LargeArraysConvertOnTheThreadsAndEmptyOnesAreNoOps) {
  // Past the threads' threshold (a million elements), with a tail that fills no chunk.
  const size_t count = (size_t{1} << 20) + 12345;
  std::vector<uint16_t> bits(count);
  for (size_t i = 0; i < count; ++i) bits[i] = static_cast<uint16_t>((i * 40503U) & 0x7bffU);
  std::vector<float> widened(count);
  widen_half(HalfType::kFloat16, bits.data(), widened.data(), count);
  std::vector<uint16_t> back(count);
  narrow_to_half(HalfType::kFloat16, widened.data(), back.data(), count);
  EXPECT_EQ(back, bits);
  widen_half(HalfType::kBFloat16, nullptr, nullptr, 0);
  narrow_to_half(HalfType::kBFloat16, nullptr, nullptr, 0);
}

ATTN_INSTANTIATE_FOR_EVERY_SIMD_TARGET(HalfConversion);

}  // namespace
}  // namespace attn
