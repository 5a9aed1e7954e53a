// JSON from files parsed within limits: nesting depth, the number of values (which bounds the
// parsed tree's memory) and repeated keys checked while parsing, every nlohmann exception turned
// into attn's FileError naming the file, and values quoted in messages without recursion.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace attn::io_detail {

struct JsonLimits {
  // Nesting of arrays and objects. safetensors' own reader stops at serde_json's recursion limit
  // of 128; attn's files need 3 levels, and 64 leaves room for any honest use.
  int max_depth = 64;
  // Values of any kind, containers included. Each costs a few dozen bytes once parsed, so this
  // bounds the tree's memory whatever the text's size.
  uint64_t max_values = 1'000'000;
};

// Parses `text`, the `what` ("header", "config.json") of `source`, both named in messages.
// FileError "<source>: <what> ..." for a syntax error, a number out of double's range, nesting
// deeper than limits.max_depth, more than limits.max_values values, or an object that names a key
// twice (parsers would otherwise silently keep one of the two values).
nlohmann::json parse_bounded_json(std::string_view text, std::string_view source,
                                  std::string_view what, const JsonLimits& limits = {});

// A JSON value as compact text for an error message: walked with an explicit stack (a deeply
// nested value cannot exhaust the call stack), cut after `max_length` characters, and every byte
// outside printable ASCII escaped.
std::string json_excerpt(const nlohmann::json& value, size_t max_length = 80);

// "an object", "an array", "a string", "a number", "a boolean" or "null".
std::string json_kind(const nlohmann::json& value);

}  // namespace attn::io_detail
