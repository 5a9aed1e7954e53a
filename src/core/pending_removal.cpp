// PendingRemoval's registry: fixed slots that a signal handler reads with async-signal-safe calls
// only (unlink, rmdir, signal, raise).
#include "attn/core/pending_removal.hpp"

#include <unistd.h>

#include <array>
#include <atomic>
#include <csignal>
#include <cstring>
#include <string>

namespace attn {

namespace {

constexpr size_t kSlots = 64;
constexpr size_t kPathBytes = 4096;

// A slot's state: free, being written by its owner, or pending (the handler reads it).
enum State : int { kFree = 0, kWriting = 1, kPending = 2 };

struct Slot {
  std::atomic<int> state{kFree};
  PendingRemoval::Kind kind = PendingRemoval::Kind::kFile;
  char path[kPathBytes] = {};
};

std::array<Slot, kSlots> slots;

void remove_pending(PendingRemoval::Kind kind) {
  for (Slot& slot : slots) {
    if (slot.state.load(std::memory_order_acquire) != kPending || slot.kind != kind) continue;
    if (kind == PendingRemoval::Kind::kFile) {
      ::unlink(slot.path);
    } else {
      ::rmdir(slot.path);
    }
  }
}

extern "C" void remove_and_end(int signal_number) {
  remove_pending(PendingRemoval::Kind::kFile);
  remove_pending(PendingRemoval::Kind::kFolder);
  std::signal(signal_number, SIG_DFL);
  std::raise(signal_number);
}

}  // namespace

PendingRemoval::PendingRemoval(const std::filesystem::path& path, Kind kind) {
  const std::string text = path.string();
  if (text.empty() || text.size() >= kPathBytes) return;
  for (size_t index = 0; index < kSlots; ++index) {
    int expected = kFree;
    if (!slots[index].state.compare_exchange_strong(expected, kWriting,
                                                    std::memory_order_acq_rel)) {
      continue;
    }
    std::memcpy(slots[index].path, text.c_str(), text.size() + 1);
    slots[index].kind = kind;
    slots[index].state.store(kPending, std::memory_order_release);
    slot_ = static_cast<int>(index);
    return;
  }
}

PendingRemoval& PendingRemoval::operator=(PendingRemoval&& other) noexcept {
  if (this != &other) {
    release();
    slot_ = other.slot_;
    other.slot_ = -1;
  }
  return *this;
}

void PendingRemoval::release() {
  if (slot_ < 0) return;
  slots[static_cast<size_t>(slot_)].state.store(kFree, std::memory_order_release);
  slot_ = -1;
}

void remove_pending_paths_on_signals() {
  for (const int signal_number : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction action {};
    action.sa_handler = remove_and_end;
    sigemptyset(&action.sa_mask);
    ::sigaction(signal_number, &action, nullptr);
  }
}

}  // namespace attn
