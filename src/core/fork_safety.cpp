// note_parallel_region and the pthread_atfork child handler it relies on.
#include "core/fork_safety.hpp"

#include <omp.h>
#include <pthread.h>

namespace attn::core_detail {

namespace {

// Whether a region of more than one thread has started on this thread (GNU OpenMP then keeps a
// pool for it).
thread_local bool started_threads = false;

// Runs in the child, on the thread that forked (the child's only thread): its pool's threads were
// not copied, and the next region of more than one thread would wait for them forever (measured:
// an attn call in a child forked after one in the parent never returned). omp_set_num_threads
// only writes the thread's own count. The Python module keeps its own count on top
// (bindings/python/module.cpp).
void after_fork_in_child() {
  if (started_threads) omp_set_num_threads(1);
}

// Registered once, when the library loads.
[[maybe_unused]] const bool child_handler_registered =
    pthread_atfork(nullptr, nullptr, after_fork_in_child) == 0;

}  // namespace

void note_parallel_region(int threads) {
  if (threads > 1) started_threads = true;
}

}  // namespace attn::core_detail
