// How far attn's kernels have come through a long call, for a caller that shows progress (attn
// run's progress line): the work under way, its tasks planned and finished, read from any thread.
#pragma once

#include <atomic>
#include <cstdint>

namespace attn {

namespace core_detail {

// For attn's kernels (and ring attention's pairs): called where work is planned, on the thread
// that starts it (`work` a string literal), and by whichever thread finishes a task. One atomic
// load when nothing counts.
void note_tasks_planned(int64_t tasks, const char* work);
void note_task_done();

}  // namespace core_detail

// While one is alive, each kernel call of the process reports the tasks it plans (blocks of query
// rows of some heads) and each task it finishes. Counts follow the work under way: a call of
// another kernel ("flash_attention_backward" after "flash_attention_forward") starts them again,
// a further call of the same one adds to them. One at a time: a second one, while the first lives,
// counts instead of it until it ends. Create and destroy them on one thread, innermost first, and
// only while no other thread runs attn's kernels: those count into whichever one is current, so a
// kernel call that outlived its WorkProgress would count into freed memory.
class WorkProgress {
 public:
  WorkProgress();
  ~WorkProgress();
  WorkProgress(const WorkProgress&) = delete;
  WorkProgress& operator=(const WorkProgress&) = delete;

  // The name of the work under way ("" before any), as the kernel gave it: a string literal.
  const char* work() const { return work_.load(std::memory_order_relaxed); }
  int64_t planned() const { return planned_.load(std::memory_order_relaxed); }
  int64_t done() const { return done_.load(std::memory_order_relaxed); }

 private:
  friend void core_detail::note_tasks_planned(int64_t tasks, const char* work);
  friend void core_detail::note_task_done();
  std::atomic<const char*> work_{""};
  std::atomic<int64_t> planned_{0};
  std::atomic<int64_t> done_{0};
  WorkProgress* previous_ = nullptr;
};

}  // namespace attn
