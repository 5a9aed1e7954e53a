// Peak extra memory of a piece of code: the growth of the process's peak resident set (VmHWM)
// while it runs, after the peak is reset to the current resident set through /proc/self/clear_refs.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

namespace attn::bench {

// Makes every allocation above 64 KiB a fresh mapping that free() returns to the system, so memory
// freed by an earlier case cannot hide a later case's allocations. Call once, before measuring.
void prepare_allocator_for_memory_probe();

// Runs `action` once and returns how many bytes the peak resident set grew beyond the resident
// set just before it; nullopt when the kernel does not offer the peak reset (Linux < 4.0, no
// /proc). Accurate to a few pages per thread (the kernel batches RSS counter updates).
std::optional<int64_t> peak_extra_bytes(const std::function<void()>& action);

}  // namespace attn::bench
