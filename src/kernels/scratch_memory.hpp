// Per-thread scratch for the fused kernels: one aligned allocation carved into vector-aligned
// buffers, with each buffer's size written once.
#pragma once

#include <hwy/base.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>

#include "attn/core/tensor_allocator.hpp"

namespace attn {

// Scratch blocks come from and go back to the storage behind tensors
// (attn/core/tensor_allocator.hpp, 64-byte aligned), which keeps freed blocks from 64 KiB for the
// next call of the same size: through malloc, a small call's scratch grew the heap, faulted its
// fresh pages and was trimmed back at every call (47% of a 1 × 8 × 8 × 64 backward on one thread,
// Zen 4).
struct ScratchFree {
  std::size_t bytes = 0;
  void operator()(float* memory) const noexcept { core_detail::free_tensor_storage(memory, bytes); }
};
using ScratchMemory = std::unique_ptr<float[], ScratchFree>;

// Calls `layout(take)` twice: first with a `take(count)` that only adds up the floats each buffer
// needs (rounded up to `lanes`, so every buffer starts on a vector boundary), then, after one
// allocation, with a `take` that hands the buffers out in the same order. Returns the allocation,
// null when it failed (the buffers taken in the first pass are then null too), its deleter still
// holding the bytes asked for, which the caller's error names (SIZE_MAX: more than memory holds).
template <class Layout>
ScratchMemory carve_scratch(size_t lanes, const Layout& layout) {
  size_t total = 0;
  layout([&total, lanes](size_t count) -> float* {
    total += hwy::RoundUpTo(count, lanes);
    return nullptr;
  });
  if (total > SIZE_MAX / sizeof(float)) return ScratchMemory(nullptr, ScratchFree{SIZE_MAX});
  const size_t bytes = (total > 0 ? total : 1) * sizeof(float);
  ScratchMemory memory(nullptr, ScratchFree{bytes});
  try {
    memory.reset(static_cast<float*>(core_detail::allocate_tensor_storage(bytes)));
  } catch (const std::bad_alloc&) {
    return memory;  // null: the caller reports it
  }
#ifndef NDEBUG
  // Debug builds (the sanitizer tests) start every scratch with NaN, so that a kernel step reading
  // a lane no step wrote shows up in its results rather than reading a kept block's old values.
  std::fill_n(memory.get(), total, std::numeric_limits<float>::quiet_NaN());
#endif
  float* next = memory.get();
  layout([&next, lanes](size_t count) {
    float* start = next;
    next += hwy::RoundUpTo(count, lanes);
    return start;
  });
  return memory;
}

// The int32 and uint32 buffers share the float allocation (same size and alignment).
inline int32_t* as_int32(float* buffer) {
  return reinterpret_cast<int32_t*>(buffer);
}
inline uint32_t* as_uint32(float* buffer) {
  return reinterpret_cast<uint32_t*>(buffer);
}

}  // namespace attn
