// AllocationError's message (the bytes asked for, and the same in binary units) and the numbers
// messages quote.
#include "attn/core/error.hpp"

#include <array>
#include <charconv>
#include <cstdio>
#include <string>

namespace attn {

namespace {
template <class T>
std::string shortest_text(T value) {
  char text[64];
  const std::to_chars_result result = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, result.ptr);
}
}  // namespace

std::string number_text(float value) {
  return shortest_text(value);
}
std::string number_text(double value) {
  return shortest_text(value);
}

AllocationError::AllocationError(std::size_t bytes) {
  constexpr std::array<const char*, 7> kUnits{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double size = static_cast<double>(bytes);
  size_t unit = 0;
  while (size >= 1024.0 && unit + 1 < kUnits.size()) {
    size /= 1024.0;
    ++unit;
  }
  std::array<char, 32> scaled{};
  std::snprintf(scaled.data(), scaled.size(), "%.3g %s", size, kUnits[unit]);
  message_ = "could not allocate " + std::to_string(bytes) + " bytes (" + scaled.data() + ")";
}

AllocationError::AllocationError(std::size_t bytes, std::string_view context,
                                 std::string_view detail)
    : AllocationError(bytes) {
  message_ = std::string(context) + ": " + message_ + std::string(detail);
}

}  // namespace attn
