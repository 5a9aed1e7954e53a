// The thread counts attn accepts for its OpenMP kernels, checked wherever a count comes in (the
// Python module's set_num_threads, `attn bench --threads`), and whether a forked process may use
// more than one.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "attn/core/error.hpp"

namespace attn {

// The largest thread count attn accepts. An OpenMP runtime starts one system thread per count:
// libgomp exits the whole process when it cannot create them (a few thousand on a typical
// machine) and crashes on a count of a million. 1024 is above any CPU attn runs on today.
inline constexpr int kMaxThreads = 1024;

// ValueError "<name>: expected a thread count in [1, 1024], got <threads>" unless it is one.
inline void check_thread_count(int64_t threads, std::string_view name) {
  if (threads < 1 || threads > kMaxThreads) {
    throw ValueError(std::string(name) + ": expected a thread count in [1, " +
                     std::to_string(kMaxThreads) + "], got " + std::to_string(threads));
  }
}

// Whether this process was forked from a thread that had run attn's parallel regions and whose
// OpenMP pool could not be released before the fork (a fork inside a parallel region): GNU OpenMP
// cannot start threads again there, so attn runs on one thread in it. Elsewhere attn releases the
// forking thread's pool before every fork, and a child keeps its thread count.
bool forked_after_threads();

}  // namespace attn
