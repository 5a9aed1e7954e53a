// The kernels' thread helpers (src/kernels/parallel_tasks.hpp): useful_threads' bounds,
// run_parallel_tasks running every task once, on at most the threads asked for, in the calling
// thread when one is asked for, and naming the kernel and the bytes when a thread's scratch is
// missing (every thread's or one of several); for_each_index visiting every index once, serially or
// on the threads.
#include "kernels/parallel_tasks.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "attn/core/error.hpp"
#include "kernels/scratch_memory.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

// Scratch as the kernels' structs expose it: `memory`, null when its allocation failed (its deleter
// then holding the bytes asked for).
struct FakeScratch {
  ScratchMemory memory;
};

FakeScratch allocated_scratch() {
  return {carve_scratch(16, [](const auto& take) { take(1); })};
}

// Sets the OpenMP thread count for a scope.
class ThreadCount {
 public:
  explicit ThreadCount(int threads) : saved_(omp_get_max_threads()) {
    omp_set_num_threads(threads);
  }
  ~ThreadCount() { omp_set_num_threads(saved_); }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;

 private:
  int saved_;
};

TEST(UsefulThreads, OneThreadPerShareOfWorkWithinOneAndTheThreadCount) {
  const ThreadCount threads(4);
  EXPECT_EQ(useful_threads(0.0, 100.0), 1);
  EXPECT_EQ(useful_threads(199.0, 100.0), 1);
  EXPECT_EQ(useful_threads(200.0, 100.0), 2);
  EXPECT_EQ(useful_threads(399.0, 100.0), 3);
  EXPECT_EQ(useful_threads(400.0, 100.0), 4);
  EXPECT_EQ(useful_threads(1e30, 100.0), 4);
}

// Runs `tasks` tasks on at most `max_threads` threads of `threads`: how often each task ran, the
// largest thread index seen, and whether every task ran on the calling thread.
struct TaskRun {
  std::vector<int> counts;
  int largest_thread = -1;
  bool all_on_caller = true;
};
TaskRun run_tasks(int threads, int64_t tasks, int max_threads) {
  const ThreadCount count(threads);
  std::vector<std::atomic<int>> counts(static_cast<size_t>(tasks));
  std::atomic<int> largest{-1};
  std::atomic<bool> on_caller{true};
  const std::thread::id caller = std::this_thread::get_id();
  run_parallel_tasks(
      tasks, "test kernel", TaskSchedule::kDynamic, [] { return allocated_scratch(); },
      [&](int64_t task, FakeScratch& scratch, int thread) {
        EXPECT_NE(scratch.memory, nullptr);
        counts[static_cast<size_t>(task)].fetch_add(1);
        int seen = largest.load();
        while (thread > seen && !largest.compare_exchange_weak(seen, thread)) {
        }
        if (std::this_thread::get_id() != caller) on_caller.store(false);
        // Long enough that every thread of the team takes some of the tasks.
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      },
      max_threads);
  TaskRun run;
  for (const auto& c : counts) run.counts.push_back(c.load());
  run.largest_thread = largest.load();
  run.all_on_caller = on_caller.load();
  return run;
}

TEST(RunParallelTasks, RunsEveryTaskOnceOnAtMostTheThreadsAskedFor) {
  const std::vector<int> once(37, 1);
  const TaskRun serial = run_tasks(1, 37, 0);
  EXPECT_EQ(serial.counts, once);
  EXPECT_EQ(serial.largest_thread, 0);
  EXPECT_TRUE(serial.all_on_caller);

  const TaskRun capped = run_tasks(3, 37, 1);  // one thread asked for: the caller's
  EXPECT_EQ(capped.counts, once);
  EXPECT_TRUE(capped.all_on_caller);

  const TaskRun two = run_tasks(3, 37, 2);
  EXPECT_EQ(two.counts, once);
  EXPECT_LE(two.largest_thread, 1);

  const TaskRun all = run_tasks(3, 37, 0);
  EXPECT_EQ(all.counts, once);
  EXPECT_LE(all.largest_thread, 2);

  const TaskRun single_task = run_tasks(3, 1, 0);  // one task: the caller's thread
  EXPECT_EQ(single_task.counts, std::vector<int>{1});
  EXPECT_TRUE(single_task.all_on_caller);
  EXPECT_EQ(run_tasks(3, 0, 0).counts, std::vector<int>{});
}

// Out of memory, as the layers' own allocations: an AllocationError (Python's MemoryError) with
// the kernel and the size, whether the caller's thread or a team's failed.
TEST(RunParallelTasks, NamesTheKernelAndTheBytesWhenScratchIsMissing) {
  for (const int threads : {1, 3}) {
    const ThreadCount count(threads);
    bool ran = false;
    EXPECT_THROW_MESSAGE(
        run_parallel_tasks(
            8, "flash_attention_forward", TaskSchedule::kStatic,
            [] { return FakeScratch{ScratchMemory(nullptr, ScratchFree{3 << 20})}; },
            [&](int64_t, FakeScratch&, int) { ran = true; }),
        AllocationError,
        "flash_attention_forward: could not allocate 3145728 bytes (3 MiB) of per-thread scratch "
        "memory");
    EXPECT_FALSE(ran) << threads << " threads";
  }
}

// One thread's scratch refused, the others' allocated: the call still throws (after the other
// threads ran their tasks), no task runs without scratch, and no thread waits for ever on one that
// left the worksharing loop (every thread of the team must meet it).
TEST(RunParallelTasks, ThrowsWhenOneThreadOfSeveralHasNoScratch) {
  const ThreadCount count(3);
  for (const TaskSchedule schedule : {TaskSchedule::kDynamic, TaskSchedule::kStatic}) {
    std::atomic<int> without_scratch{0};
    EXPECT_THROW_MESSAGE(
        run_parallel_tasks(
            9, "flash_attention_backward", schedule,
            [] {
              if (omp_get_thread_num() == 1)
                return FakeScratch{ScratchMemory(nullptr, ScratchFree{5 << 10})};
              return allocated_scratch();
            },
            [&](int64_t, FakeScratch& scratch, int) {
              if (scratch.memory == nullptr) without_scratch.fetch_add(1);
            }),
        AllocationError,
        "flash_attention_backward: could not allocate 5120 bytes (5 KiB) of per-thread scratch "
        "memory");
    EXPECT_EQ(without_scratch.load(), 0);
  }
}

// carve_scratch's refusal keeps the size it asked for, for that message.
TEST(CarveScratch, ARefusedOrImpossibleSizeIsNullAndKeepsItsBytes) {
  const ScratchMemory impossible = carve_scratch(16, [](const auto& take) { take(SIZE_MAX / 2); });
  EXPECT_EQ(impossible, nullptr);
  EXPECT_EQ(impossible.get_deleter().bytes, SIZE_MAX);
  const ScratchMemory fine = carve_scratch(16, [](const auto& take) { take(3); });
  ASSERT_NE(fine, nullptr);
  EXPECT_EQ(fine.get_deleter().bytes, 16 * sizeof(float));  // rounded up to the lanes
}

TEST(ForEachIndex, VisitsEveryIndexOnceSeriallyOrOnTheThreads) {
  const ThreadCount count(3);
  for (const bool parallel : {false, true}) {
    std::vector<std::atomic<int>> visits(101);
    std::atomic<bool> on_caller{true};
    const std::thread::id caller = std::this_thread::get_id();
    for_each_index(101, parallel, [&](int64_t i) {
      visits[static_cast<size_t>(i)].fetch_add(1);
      if (std::this_thread::get_id() != caller) on_caller.store(false);
    });
    for (const auto& v : visits) EXPECT_EQ(v.load(), 1) << "parallel " << parallel;
    if (!parallel) {
      EXPECT_TRUE(on_caller.load());
    }
  }
}

}  // namespace
}  // namespace attn
