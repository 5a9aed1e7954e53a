// The finiteness scans' inner loop: the largest |x| of a float run, as the bits of the float, with
// NaN and ±∞ above every finite value. Shared by core's require_finite and the functional API's.
#pragma once

#include <cstdint>

namespace attn::core_detail {

inline constexpr uint32_t kMagnitudeBits = 0x7fffffffU;   // clears the sign
inline constexpr uint32_t kFirstNonFinite = 0x7f800000U;  // +∞; NaNs lie above

// max over i of bits(values[i]) & kMagnitudeBits: the integer order of those bits is the float
// order of |x|, so one integer max reduction both finds the magnitude and detects NaN and ±∞.
// Serial, vectorised, and compiled for AVX-512, AVX2 and the baseline (picked at load time): the
// baseline SSE2 has no unsigned 32-bit max, and the layers scan every projection with it.
uint32_t largest_magnitude_bits(const float* values, int64_t count);

}  // namespace attn::core_detail
