// Bytes from a file quoted in an error message: cut short and escaped, so that a hostile header can
// make a message neither huge nor carry NULs, control characters or terminal escapes.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace attn::io_detail {

// At most `max_length` bytes of `bytes`, printable ASCII kept (backslash doubled), every other
// byte written \n, \r, \t or \xNN; "..." marks a cut. No quotes are added.
std::string escaped(std::string_view bytes, size_t max_length = 80);

}  // namespace attn::io_detail
