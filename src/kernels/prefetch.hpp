// Software prefetch that the compiler cannot delete: every prefetch in the kernels goes through
// PrefetchLine (one cache line) or PrefetchLines (a row's lines).
#pragma once

#include <cstdint>

namespace attn {

// Where a requested line should wait: L1 (x86's prefetcht0) or L2 (prefetcht1).
enum class PrefetchInto { kL1, kL2 };

// Requests the cache line holding `address` for reading. GCC 12 treats __builtin_prefetch as
// free of side effects and deletes a loop whose body is only prefetches once that loop sits in a
// template's instance: from 0fad2a8 (PrefetchMatrixRow, a template) to 2026-11-30 the kernels
// held no prefetcht0 at all, and the strided copies that 7fe1536 had made wait on memory again.
// An asm statement marked volatile is kept wherever it is written; the prefetch instructions are
// the same ones __builtin_prefetch would give (GCC emits prefetcht1 for its write hint on CPUs
// without PREFETCHW, as attn's baseline compiles, so writes take the read form here too).
template <PrefetchInto kLevel>
inline void PrefetchLine(const void* address) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  if constexpr (kLevel == PrefetchInto::kL1) {
    asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(address)));
  } else {
    asm volatile("prefetcht1 %0" : : "m"(*static_cast<const char*>(address)));
  }
#else
  __builtin_prefetch(address, 0, kLevel == PrefetchInto::kL1 ? 3 : 2);
#endif
}

// The address of the cache line holding `address`: rounded down as an integer, since the line may
// start before the object `address` points into.
inline std::uintptr_t LineStart(const void* address) {
  return reinterpret_cast<std::uintptr_t>(address) / 64 * 64;
}

// Requests the cache lines of the `bytes` bytes from `first` on (an input's row), for reading:
// every line from the one holding the first byte to the one holding the last (rows of (B, S, H·E)
// inputs start inside a line; counted from the first byte, a row of 256 bytes 16 into a line left
// its fifth line to be waited on).
// Always inlined, so that the prefetches sit in the copying kernels themselves, where
// tests/kernels/check_prefetches.py finds them (out of line, the function is no target's).
template <PrefetchInto kLevel>
[[gnu::always_inline]] inline void PrefetchLines(const void* first, std::int64_t bytes) {
  if (bytes <= 0) return;
  const std::uintptr_t end =
      reinterpret_cast<std::uintptr_t>(first) + static_cast<std::uintptr_t>(bytes);
  for (std::uintptr_t line = LineStart(first); line < end; line += 64)
    PrefetchLine<kLevel>(reinterpret_cast<const void*>(line));
}

}  // namespace attn
