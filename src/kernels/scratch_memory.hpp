// Per-thread scratch for the fused kernels: one aligned allocation carved into vector-aligned
// buffers, with each buffer's size written once.
#pragma once

#include <hwy/aligned_allocator.h>
#include <hwy/base.h>

#include <cstddef>
#include <cstdint>

namespace attn {

// Calls `layout(take)` twice: first with a `take(count)` that only adds up the floats each buffer
// needs (rounded up to `lanes`, so every buffer starts on a vector boundary), then, after one
// allocation, with a `take` that hands the buffers out in the same order. Returns the allocation,
// null when it failed (the buffers taken in the first pass are then null too).
template <class Layout>
hwy::AlignedFreeUniquePtr<float[]> carve_scratch(size_t lanes, const Layout& layout) {
  size_t total = 0;
  layout([&total, lanes](size_t count) -> float* {
    total += hwy::RoundUpTo(count, lanes);
    return nullptr;
  });
  hwy::AlignedFreeUniquePtr<float[]> memory = hwy::AllocateAligned<float>(total > 0 ? total : 1);
  if (memory != nullptr) {
    float* next = memory.get();
    layout([&next, lanes](size_t count) {
      float* start = next;
      next += hwy::RoundUpTo(count, lanes);
      return start;
    });
  }
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
