// WorkProgress: the one counting instance of the process, behind an atomic pointer.
#include "attn/core/work_progress.hpp"

#include <cstring>

namespace attn {

namespace {
std::atomic<WorkProgress*> counting{nullptr};
}  // namespace

WorkProgress::WorkProgress() : previous_(counting.exchange(this)) {}

WorkProgress::~WorkProgress() {
  counting.store(previous_);
}

void core_detail::note_tasks_planned(int64_t tasks, const char* work) {
  WorkProgress* progress = counting.load(std::memory_order_acquire);
  if (progress == nullptr) return;
  if (std::strcmp(progress->work_.load(std::memory_order_relaxed), work) != 0) {
    progress->done_.store(0, std::memory_order_relaxed);
    progress->planned_.store(tasks, std::memory_order_relaxed);
    progress->work_.store(work, std::memory_order_relaxed);
  } else {
    progress->planned_.fetch_add(tasks, std::memory_order_relaxed);
  }
}

void core_detail::note_task_done() {
  if (WorkProgress* progress = counting.load(std::memory_order_acquire)) {
    progress->done_.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace attn
