// escaped(): the one way file bytes enter attn's error messages.
#include "io/excerpt.hpp"

namespace attn::io_detail {

std::string escaped(std::string_view bytes, size_t max_length) {
  constexpr char kHex[] = "0123456789abcdef";
  std::string text;
  const size_t shown = bytes.size() < max_length ? bytes.size() : max_length;
  for (size_t index = 0; index < shown; ++index) {
    const auto byte = static_cast<unsigned char>(bytes[index]);
    if (byte == '\\') {
      text += "\\\\";
    } else if (byte >= 0x20 && byte < 0x7F) {
      text += static_cast<char>(byte);
    } else if (byte == '\n') {
      text += "\\n";
    } else if (byte == '\r') {
      text += "\\r";
    } else if (byte == '\t') {
      text += "\\t";
    } else {
      text += "\\x";
      text += kHex[byte >> 4];
      text += kHex[byte & 0xF];
    }
  }
  if (shown < bytes.size()) text += "...";
  return text;
}

}  // namespace attn::io_detail
