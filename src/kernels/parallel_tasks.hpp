// The fused kernels' one way of running tasks on OpenMP threads: each thread builds its own
// scratch once per call, tasks are handed out one at a time, and a thread whose scratch could not
// be allocated makes the call fail with an error instead of crashing.
#pragma once

#include <omp.h>

#include <cstdint>
#include <string>

#include "attn/core/error.hpp"

namespace attn {

enum class TaskSchedule {
  kDynamic,  // the next free thread takes the next task: tasks of unequal cost (masks, causal)
  kStatic,   // thread t takes tasks t, t + T, …: reproducible per-thread partial sums
};

// Runs body(task, scratch, thread) for every task in [0, tasks), where scratch =
// make_scratch() is built once per thread and must expose `memory` (null when allocation failed).
// Throws Error naming `kernel` when a thread's scratch could not be allocated.
template <class MakeScratch, class Body>
void run_parallel_tasks(int64_t tasks, const char* kernel, TaskSchedule schedule,
                        const MakeScratch& make_scratch, const Body& body) {
  bool out_of_memory = false;
#pragma omp parallel
  {
    auto scratch = make_scratch();
    if (scratch.memory == nullptr) {
#pragma omp atomic write
      out_of_memory = true;
    } else {
      const int thread = omp_get_thread_num();
      if (schedule == TaskSchedule::kDynamic) {
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; ++task) body(task, scratch, thread);
      } else {
#pragma omp for schedule(static, 1)
        for (int64_t task = 0; task < tasks; ++task) body(task, scratch, thread);
      }
    }
  }
  if (out_of_memory)
    throw Error(std::string(kernel) + ": could not allocate per-thread scratch memory");
}

}  // namespace attn
