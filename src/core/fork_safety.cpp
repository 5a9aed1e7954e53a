// note_parallel_region and the pthread_atfork handlers it relies on: the forking thread's OpenMP
// pool released before a fork, one thread in a child where that failed.
#include "core/fork_safety.hpp"

#include <omp.h>
#include <pthread.h>

#include <atomic>

#include "attn/core/threads.hpp"

namespace attn {

namespace core_detail {

namespace {

// Whether a region of more than one thread has started on this thread (GNU OpenMP then keeps a
// pool for it).
thread_local bool started_threads = false;

// Set in the parent just before a fork, on the forking thread (whose copy the child runs on):
// whether its OpenMP pool was released. Per thread, so that two threads forking at once each
// read their own.
thread_local bool pool_released = false;
std::atomic<bool> forked_after_threads{false};

// Runs in the parent, on the thread about to fork. GNU OpenMP keeps a pool of threads for each
// thread that started parallel regions — attn's, or another library's sharing the runtime
// (PyTorch's operators: a child forked after PyTorch's parallel work hung in attn's first
// parallel region, where attn had no mark of it) — and a fork copies the forking thread alone, so
// the child's next region of more than one thread waited forever for the pool's threads. Released
// here (OpenMP 5's omp_pause_resource_all; libgomp frees the calling thread's pool), the child
// starts threads of its own, and the parent again at its next region. It fails inside a parallel
// region: the child then runs on one thread (after_fork_in_child).
void before_fork() {
  pool_released = omp_pause_resource_all(omp_pause_soft) == 0;
}

// Runs in the child, on the thread that forked (the child's only thread). omp_set_num_threads
// only writes the thread's own count. The Python module keeps its own count on top
// (bindings/python/module.cpp), reading forked_after_threads().
void after_fork_in_child() {
  if (pool_released || !started_threads) return;
  forked_after_threads.store(true);
  omp_set_num_threads(1);
}

// Registered once, when the library loads.
[[maybe_unused]] const bool fork_handlers_registered =
    pthread_atfork(before_fork, nullptr, after_fork_in_child) == 0;

}  // namespace

void note_parallel_region(int threads) {
  if (threads > 1) started_threads = true;
}

}  // namespace core_detail

bool forked_after_threads() {
  return core_detail::forked_after_threads.load();
}

}  // namespace attn
