// HugePageAllocator: a std::allocator for large, long-lived buffers read from memory over and over
// (the KV cache), asking the kernel for transparent huge pages so that one core's sequential reads
// are not cut at every 4 KiB page boundary.
#pragma once

#include <cstddef>
#include <limits>
#include <new>

namespace attn {

namespace core_detail {
// Blocks of kHugePageBytes or more: aligned to it and advised MADV_HUGEPAGE (Linux; honoured where
// /sys/kernel/mm/transparent_hugepage/enabled is "madvise" or "always"); smaller ones: 64-byte
// aligned. std::bad_alloc when the memory is not there.
inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;
void* allocate_large_buffer(std::size_t bytes);
void free_large_buffer(void* pointer, std::size_t bytes) noexcept;
}  // namespace core_detail

template <class T>
struct HugePageAllocator {
  using value_type = T;

  HugePageAllocator() = default;
  template <class U>
  explicit HugePageAllocator(const HugePageAllocator<U>&) noexcept {}

  T* allocate(std::size_t count) {
    if (count > std::numeric_limits<std::size_t>::max() / sizeof(T)) throw std::bad_alloc();
    return static_cast<T*>(core_detail::allocate_large_buffer(count * sizeof(T)));
  }
  void deallocate(T* pointer, std::size_t count) noexcept {
    core_detail::free_large_buffer(pointer, count * sizeof(T));
  }

  template <class U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
};

}  // namespace attn
