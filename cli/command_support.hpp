// What the subcommands share: adding the option or file an error came from to its message, the
// output directory, the checks of output paths, outputs written all or none, and the panel grid
// for multi-head attention weights.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/core/pending_removal.hpp"
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
// A float as it is typed (3e+38, 0.5, 0.005): std::to_string wrote 3e38 in 39 digits and 1e-7 as
// 0.000000.
std::string float_text(float value);
// The double nearest the float's shortest decimal (0.005F as 0.005, not 0.004999999888241291), for
// JSON records that show the value given.
double shortest_double(float value);

void create_output_directory(const std::filesystem::path& directory,
                             const std::string& option = "--out");

// FileError unless --grads-out `directory` could be created: the directory is made only once
// there is something to write into it, so a file in its place is found here, before the work.
void check_gradients_directory(const std::string& directory);

// Runs `write` (which checks and stages a run's outputs) after creating `gradients_directory`
// (--grads-out; none when empty); when `write` throws, a directory this call created is removed
// again, so a failed run leaves no output behind, empty folders included.
void write_with_gradients_directory(const std::string& gradients_directory,
                                    const std::function<void()>& write);

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
  // Why the kind is narrower than the option's usual one, for the message when the extension does
  // not fit ("--ring writes .npy files only"), so `--out x.safetensors` with --ring is not refused
  // as though --out never took safetensors; empty for none.
  std::string kind_reason = {};
};

// Checks every output of a command before the first is written, so that a bad one cannot fail the
// command after it replaced a good file: its folder exists, it is not a folder itself, its
// extension fits its kind (.npy; .png, .svg or .pdf), no two outputs are the same file, and no
// output is one of the inputs (hard and symbolic links included). FileError or ValueError naming
// the options.
void check_outputs(const std::vector<OutputFile>& outputs, const std::vector<CommandFile>& inputs);

// Outputs written all or none. Each is written to a temporary file beside its target, named to end
// in the target's extension (the writers pick the format by it), and the targets are replaced,
// each by a rename within its folder, only once every output has been written; when any write
// fails, or commit() is never reached, the temporaries are removed and no target is touched. (A
// rename that fails after others succeeded cannot be undone; renames within one folder fail only
// where creating the temporary there would have failed first.)
class StagedOutputs {
 public:
  StagedOutputs() = default;
  StagedOutputs(const StagedOutputs&) = delete;
  StagedOutputs& operator=(const StagedOutputs&) = delete;
  // Removes the temporaries that commit() did not rename.
  ~StagedOutputs();

  // Reserves a temporary for `target` and runs `write` on it; an attn::Error it throws (or the
  // reservation's) is re-thrown as "<option>: ..." with the temporary's name replaced by the
  // target's, so that messages name the file the user asked for.
  void write(const std::string& option, const std::filesystem::path& target,
             const std::function<void(const std::filesystem::path&)>& write);
  // Renames every temporary over its target, in the order written, keeping an existing target's
  // permission bits; FileError naming the option and the target when a rename fails.
  void commit();

 private:
  struct Staged {
    std::string option;
    std::filesystem::path target;
    std::filesystem::path temporary;
    PendingRemoval pending;  // the temporary, for a signal that ends the run before commit()
  };
  std::vector<Staged> staged_;
};

// Heatmap options for multi-head weights (batch·heads, n, m) viewed as (batch, heads, n, m):
// one row per batch element, one column per head, each panel titled with both.
HeatmapOptions head_grid_options(int64_t batch, int64_t heads);

}  // namespace attn::cli
