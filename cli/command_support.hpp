// What the subcommands share: adding the option or file an error came from to its message, the
// output directory, and the panel grid for multi-head attention weights.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>

#include "attn/core/error.hpp"
#include "attn/viz/heatmap.hpp"

namespace attn::cli {

// Throws an exception of the same attn type as `error` (ShapeError, ValueError, FileError or
// Error) carrying `message` instead, so the CLI can add context without losing the kind.
[[noreturn]] void rethrow_with_message(const Error& error, const std::string& message);

// Runs `action` and returns its result; an attn::Error it throws is re-thrown with
// "<context>: " in front, e.g. "--params: model.safetensors: ...".
template <class Action>
decltype(auto) with_context(const std::string& context, Action&& action) {
  try {
    return std::forward<Action>(action)();
  } catch (const Error& error) {
    rethrow_with_message(error, context + ": " + error.what());
  }
}

// Creates `directory` and its parents unless it exists; FileError naming `option` and the
// directory when that fails or a file is in the way.
void create_output_directory(const std::filesystem::path& directory,
                             const std::string& option = "--out");

// Heatmap options for multi-head weights (batch·heads, n, m) viewed as (batch, heads, n, m):
// one row per batch element, one column per head, each panel titled with both.
HeatmapOptions head_grid_options(int64_t batch, int64_t heads);

}  // namespace attn::cli
