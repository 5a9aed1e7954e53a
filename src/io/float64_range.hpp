// The float64 values of a file that float32, attn's type, cannot hold: finite in the file, ∞ once
// rounded. The readers refuse them naming the value the file held, not the ∞ it became.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstring>
#include <optional>
#include <span>

namespace attn::io_detail {

struct Float64PastFloatRange {
  size_t index = 0;
  double value = 0.0;
};

// The first value of `data` (the file's float64 values, in the order decoded into `rounded`)
// that is finite but rounded to ±∞; nothing when there is none. ±∞ and NaN in the file stay
// what they are, for the checks of their use.
inline std::optional<Float64PastFloatRange> first_float64_past_float_range(
    std::span<const std::byte> data, std::span<const float> rounded) {
  for (size_t index = 0; index < rounded.size(); ++index) {
    if (!std::isinf(rounded[index])) continue;
    double value;
    std::memcpy(&value, data.data() + index * sizeof(double), sizeof(double));
    if (!std::isinf(value)) return Float64PastFloatRange{index, value};
  }
  return std::nullopt;
}

}  // namespace attn::io_detail
