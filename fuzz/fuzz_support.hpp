// What attn's fuzz targets share: the input as a byte span, and the one rule every target checks —
// hostile bytes may be refused only with an attn::Error; anything else (a crash, a sanitizer
// report, a foreign exception, an infinite output) is a finding.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <span>
#include <string_view>

#include "attn/core/error.hpp"
#include "attn/core/tensor.hpp"

namespace attn::fuzz {

inline std::span<const std::byte> bytes_of(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const std::byte*>(data), size};
}

// Stops the run as a finding (libFuzzer saves the input that caused it).
[[noreturn]] inline void finding(std::string_view what) {
  std::fprintf(stderr, "attn fuzz finding: %.*s\n", static_cast<int>(what.size()), what.data());
  std::abort();
}

// Runs `body`; an attn::Error is an accepted refusal of the input, any other exception a finding.
template <class Body>
void refuse_only_with_attn_errors(const Body& body) {
  try {
    body();
  } catch (const Error&) {
    // Refused with attn's own error: what hostile input should get.
  } catch (const std::exception& error) {
    // std::bad_alloc included: attn bounds what a file can make it allocate.
    std::fprintf(stderr, "attn fuzz finding: a foreign exception escaped: %s\n", error.what());
    std::abort();
  }
}

// A finding unless every value is finite: attn's promise for finite inputs whose exact result is
// finite, and its error otherwise.
inline void require_finite_output(const Tensor& tensor, std::string_view what) {
  for (const float value : tensor.span()) {
    if (!std::isfinite(value)) finding(what);
  }
}

}  // namespace attn::fuzz
