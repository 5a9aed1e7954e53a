// Paths that a signal ending the process must not leave behind: the temporary files of writes in
// progress, and folders a run created for outputs it has not yet written.
#pragma once

#include <filesystem>

namespace attn {

// Registers `path` while it lives: if SIGINT, SIGTERM or SIGHUP ends the process meanwhile (Ctrl-C
// during `attn run`'s writes left its staged temporaries and a new --grads-out folder behind) and
// the program installed remove_pending_paths_on_signals, the handler removes it. Files go first,
// then folders (rmdir: only an empty one). Registration is lock-free and allocation-free past the
// path's copy; at most 64 paths are pending at once, further ones go unregistered.
class PendingRemoval {
 public:
  enum class Kind { kFile, kFolder };
  PendingRemoval() = default;
  PendingRemoval(const std::filesystem::path& path, Kind kind);
  ~PendingRemoval() { release(); }
  PendingRemoval(PendingRemoval&& other) noexcept : slot_(other.slot_) { other.slot_ = -1; }
  PendingRemoval& operator=(PendingRemoval&& other) noexcept;
  PendingRemoval(const PendingRemoval&) = delete;
  PendingRemoval& operator=(const PendingRemoval&) = delete;

  // No longer to be removed (renamed into place, removed already, or kept).
  void release();

 private:
  int slot_ = -1;
};

// Handlers for SIGINT, SIGTERM and SIGHUP that remove every pending path, then end the process by
// the same signal with its default action (the shell sees it as before). For programs: a library
// leaves its host's signals alone.
void remove_pending_paths_on_signals();

}  // namespace attn
