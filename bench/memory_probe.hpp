// Peak extra memory of a piece of code: the growth of the process's peak resident set (VmHWM)
// while it runs, after the peak is reset to the current resident set through /proc/self/clear_refs.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

namespace attn::bench {

// Runs `action` once and returns how many bytes the peak resident set grew beyond the resident
// set just before it, after malloc_trim(0) has returned every free page of every arena to the
// system (so memory freed by an earlier case cannot hide this one's allocations). The allocator
// keeps glibc's default policy: the timed passes see what a user's process sees (an earlier
// version fixed the mmap threshold at 64 KiB, which page-faulted every large buffer in every pass);
// nullopt when the kernel does not offer the peak reset (Linux < 4.0, no /proc). Accurate to a few
// pages per thread (the kernel batches RSS counter updates).
std::optional<int64_t> peak_extra_bytes(const std::function<void()>& action);

}  // namespace attn::bench
