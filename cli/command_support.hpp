// What the subcommands share: adding the option or file an error came from to its message, the
// output directory, the checks of output paths, and the panel grid for multi-head attention
// weights.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

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

// A file a command reads or writes, with the option (or option and name) that gives it, for
// messages such as "--weights-out w.npy is also --out".
struct CommandFile {
  std::string option;
  std::filesystem::path path;
};

// What an output file holds, which fixes the extensions it may have.
// kArray: a .npy file or a .safetensors one.
enum class OutputKind { kNpy, kArray, kPicture, kAny };

struct OutputFile {
  std::string option;
  std::filesystem::path path;
  OutputKind kind = OutputKind::kAny;
};

// Checks every output of a command before the first is written, so that a bad one cannot fail the
// command after it replaced a good file: its folder exists, it is not a folder itself, its
// extension fits its kind (.npy; .png, .svg or .pdf), no two outputs are the same file, and no
// output is one of the inputs (hard and symbolic links included). FileError or ValueError naming
// the options.
void check_outputs(const std::vector<OutputFile>& outputs, const std::vector<CommandFile>& inputs);

// Heatmap options for multi-head weights (batch·heads, n, m) viewed as (batch, heads, n, m):
// one row per batch element, one column per head, each panel titled with both.
HeatmapOptions head_grid_options(int64_t batch, int64_t heads);

}  // namespace attn::cli
