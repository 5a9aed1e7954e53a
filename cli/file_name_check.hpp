// The check of an option that names a file: an empty value (an unset shell variable, `--data ""`)
// is an error naming the option. Where a command tests the value for emptiness, it read as "not
// given": `attn train seq2seq --data ""` trained the bundled date task without a word.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace attn::cli {

// Declared as ->check(file_name_check()).
inline CLI::Validator file_name_check() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        return text.empty() ? "expected a file name, got ''" : std::string();
      },
      "");
}

}  // namespace attn::cli
