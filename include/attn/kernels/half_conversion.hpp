// Half-precision conversions of whole arrays at SIMD speed: fp16 / bf16 bits widened to floats
// (exact) and floats rounded to them (to nearest even, as half.hpp's scalar conversions), on the
// OpenMP threads for large arrays. What the functional API's half-precision paths copy through.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attn/core/half.hpp"

namespace attn {

// to[i] = the float of from[i], i < count.
void widen_half(HalfType type, const uint16_t* from, float* to, size_t count);
// to[i] = the `type` bits nearest to from[i], i < count; bit-equal to float_to_half_bits for every
// finite value and ±∞ (a NaN's result is unspecified: callers check their inputs are finite).
void narrow_to_half(HalfType type, const float* from, uint16_t* to, size_t count);

}  // namespace attn
