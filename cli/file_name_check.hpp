// The check of an option that names a file: an empty value (an unset shell variable, `--data ""`)
// is an error naming the option. Where a command tests the value for emptiness, it read as "not
// given": `attn train seq2seq --data ""` trained the bundled date task without a word.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace attn::cli {

// Declared as ->check(file_name_check()); a folder's option as ->check(file_name_check("a
// directory name")) (an empty --grads-out wrote queries.npy, keys.npy, ... into the working
// directory).
inline CLI::Validator file_name_check(std::string expected = "a file name") {
  return CLI::Validator(
      [expected](std::string& text) -> std::string {
        return text.empty() ? "expected " + expected + ", got ''" : std::string();
      },
      "");
}

}  // namespace attn::cli
