// The kernels' ways of running work on OpenMP threads: run_parallel_tasks, where each thread builds
// its own scratch once per call, tasks are handed out one at a time, and a thread whose scratch
// could not be allocated makes the call fail with an error instead of crashing; useful_threads,
// how many threads a call's work is worth; and for_each_index, a loop that enters an OpenMP region
// only when asked to.
#pragma once

#include <omp.h>

#include <cstddef>
#include <cstdint>

#include "attn/core/error.hpp"
#include "attn/core/work_progress.hpp"
#include "core/fork_safety.hpp"
#include "kernels/scratch_memory.hpp"

namespace attn {

// The error for a thread's scratch that could not be allocated (`memory` null, its deleter holding
// the bytes asked for).
inline AllocationError scratch_allocation_error(const char* kernel, const ScratchMemory& memory) {
  return AllocationError(memory.get_deleter().bytes, kernel, " of per-thread scratch memory");
}

enum class TaskSchedule {
  kDynamic,  // the next free thread takes the next task: tasks of unequal cost (masks, causal)
  kStatic,   // thread t takes tasks t, t + T, …: reproducible per-thread partial sums
};

// The threads worth waking for `work` (flops, bytes: the caller's unit) when each should get at
// least `per_thread` of it, from 1 to omp_get_max_threads(): an OpenMP fork and join costs about
// a microsecond on two threads (Zen 4) and more on more, so a call of a few microseconds of work
// runs on fewer threads, down to the caller's alone.
// The kernels' units: flops for the fused passes (2·10⁵, about 2 µs on one core: n = m = 8 with 8
// heads of 64 ran slower on two threads than on one, n = m = 16 faster, Zen 4), bytes of keys and
// values read for decoding (64 KiB, about 1.5 µs: 16 keys of 8 heads of 64 ran slower on two
// threads, 64 keys faster).
inline constexpr double kFlopsPerThread = 2e5;
inline constexpr double kDecodeBytesPerThread = 64.0 * 1024;
inline int useful_threads(double work, double per_thread) {
  const double wanted = work / per_thread;
  const int most = omp_get_max_threads();
  return wanted >= most ? most : wanted < 2.0 ? 1 : static_cast<int>(wanted);
}

// The threads run_parallel_tasks runs on for `max_threads` (0: no limit beyond OpenMP's): what
// a kernel's tasks may count on when guessing which task a thread takes next.
inline int team_threads(int max_threads) {
  const int threads = omp_get_max_threads();
  return max_threads > 0 && max_threads < threads ? max_threads : threads;
}

// Runs body(task, scratch, thread) for every task in [0, tasks), where scratch =
// make_scratch() is built once per thread and must expose `memory` (null when allocation failed),
// on at most `max_threads` threads (0: omp_get_max_threads()). Throws AllocationError (a
// std::bad_alloc; Python's MemoryError) naming `kernel` and the bytes when a thread's scratch could
// not be allocated: scratch.memory is a ScratchMemory (scratch_memory.hpp), whose deleter holds
// the bytes asked for.
template <class MakeScratch, class Body>
void run_parallel_tasks(int64_t tasks, const char* kernel, TaskSchedule schedule,
                        const MakeScratch& make_scratch, const Body& body, int max_threads = 0) {
  const int threads = team_threads(max_threads);
  core_detail::note_tasks_planned(tasks, kernel);
  // One thread to run on, or one task: the calling thread runs them, outside any OpenMP region.
  // Entering one costs libgomp 0.35 µs and a futex system call even for a team of one
  // (for_each_index); a decode-sized call (1 query, 8 heads of 64, 16 keys) entered three.
  if (tasks <= 1 || threads == 1) {
    auto scratch = make_scratch();
    if (scratch.memory == nullptr) throw scratch_allocation_error(kernel, scratch.memory);
    for (int64_t task = 0; task < tasks; ++task) {
      body(task, scratch, 0);
      core_detail::note_task_done();
    }
    return;
  }
  bool out_of_memory = false;
  std::size_t refused_bytes = 0;
  core_detail::note_parallel_region(threads);
#pragma omp parallel num_threads(threads)
  {
    auto scratch = make_scratch();
    const bool usable = scratch.memory != nullptr;
    if (!usable) {
#pragma omp critical(attn_scratch_refused)
      {
        out_of_memory = true;
        refused_bytes = scratch.memory.get_deleter().bytes;
      }
    }
    // Every thread of the team meets the worksharing loop, as OpenMP requires of all or none (a
    // thread that skipped it left the others' loop barrier waiting on a thread that never came);
    // one without scratch takes its tasks and runs none: the call throws anyway.
    const int thread = omp_get_thread_num();
    if (schedule == TaskSchedule::kDynamic) {
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < tasks; ++task) {
        if (usable) body(task, scratch, thread);
        core_detail::note_task_done();
      }
    } else {
#pragma omp for schedule(static, 1)
      for (int64_t task = 0; task < tasks; ++task) {
        if (usable) body(task, scratch, thread);
        core_detail::note_task_done();
      }
    }
  }
  if (out_of_memory)
    throw scratch_allocation_error(kernel, ScratchMemory(nullptr, {refused_bytes}));
}

// body(i) for every i in [0, count): on the OpenMP threads (static schedule) when `parallel`, else
// in the calling thread without entering an OpenMP region — which an `if` clause would still
// enter, for the 0.35 µs and the futex system call that libgomp 12 charges a team of one.
template <class Body>
void for_each_index(int64_t count, bool parallel, const Body& body) {
  if (!parallel || count <= 1) {
    for (int64_t i = 0; i < count; ++i) body(i);
    return;
  }
  core_detail::note_parallel_region(omp_get_max_threads());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) body(i);
}

}  // namespace attn
