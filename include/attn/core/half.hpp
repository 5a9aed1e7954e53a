// IEEE binary16 (fp16) and bfloat16 conversions from and to float, bit-exact and portable: what
// KV caches and half-precision inputs store. Rounding to nearest, ties to even, as NumPy and
// PyTorch round; NaN stays NaN and ±∞ stays ±∞; fp16 overflow gives ±∞, underflow subnormals or 0.
#pragma once

#include <bit>
#include <cstdint>

namespace attn {

// Which 16-bit float format a half-precision tensor's elements are in.
enum class HalfType { kFloat16, kBFloat16 };

// The float of one element of `type`.
constexpr float half_bits_to_float(HalfType type, uint16_t bits);
// The `type` bits nearest to `value`.
constexpr uint16_t float_to_half_bits(HalfType type, float value);

// The float of fp16 bits.
constexpr float half_to_float(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000U) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fU;
  uint32_t mantissa = half & 0x3ffU;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000U | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return std::bit_cast<float>(sign);
    // Subnormal: m·2⁻²⁴, exact in float.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24F;
    return sign != 0 ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112U) << 23) | (mantissa << 13));
}

// The fp16 bits nearest to `value`.
constexpr uint16_t float_to_half(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000U);
  const uint32_t magnitude = bits & 0x7fffffffU;
  if (magnitude >= 0x7f800000U) {  // ∞ or NaN (keep NaN quiet and nonzero)
    return static_cast<uint16_t>(sign | 0x7c00U | (magnitude > 0x7f800000U ? 0x200U : 0U));
  }
  if (magnitude >= 0x477ff000U) return static_cast<uint16_t>(sign | 0x7c00U);  // rounds past 65504
  if (magnitude < 0x38800000U) {
    // Below fp16's smallest normal 2⁻¹⁴: a subnormal m·2⁻²⁴, m = round(|x|·2²⁴) (exact in float
    // arithmetic: the product is a scaling by a power of two, then one rounding to integer).
    const float scaled = std::bit_cast<float>(magnitude) * 0x1p24F;
    auto rounded = static_cast<uint32_t>(scaled);
    const float remainder = scaled - static_cast<float>(rounded);
    if (remainder > 0.5F || (remainder == 0.5F && (rounded & 1U) != 0)) ++rounded;
    return static_cast<uint16_t>(sign | rounded);
  }
  // Normal: rebias the exponent, round the 23-bit mantissa to 10 bits (carry into the exponent is
  // the right result).
  const uint32_t rebased = magnitude - (112U << 23);
  const uint32_t round_bit = 1U << 12, sticky = round_bit - 1U;
  uint32_t result = rebased >> 13;
  if ((rebased & round_bit) != 0 && ((rebased & sticky) != 0 || (result & 1U) != 0)) ++result;
  return static_cast<uint16_t>(sign | result);
}

// The float of bfloat16 bits (the upper half of a float's).
constexpr float bfloat16_to_float(uint16_t bfloat16) {
  return std::bit_cast<float>(static_cast<uint32_t>(bfloat16) << 16);
}

// The bfloat16 bits nearest to `value`.
constexpr uint16_t float_to_bfloat16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffU) > 0x7f800000U) return static_cast<uint16_t>((bits >> 16) | 0x40U);
  const uint32_t rounding = 0x7fffU + ((bits >> 16) & 1U);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

constexpr float half_bits_to_float(HalfType type, uint16_t bits) {
  return type == HalfType::kFloat16 ? half_to_float(bits) : bfloat16_to_float(bits);
}

constexpr uint16_t float_to_half_bits(HalfType type, float value) {
  return type == HalfType::kFloat16 ? float_to_half(value) : float_to_bfloat16(value);
}

}  // namespace attn
