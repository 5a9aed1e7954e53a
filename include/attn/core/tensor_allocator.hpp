// TensorAllocator: the allocator behind Tensor's elements, 64-byte aligned. It leaves new elements
// unwritten, so that Tensor fills a large one on the OpenMP threads (the first touch of fresh pages
// is the costly part). No huge-page advice, unlike the KV cache's HugePageAllocator: a tensor lives
// for a call or two, and with that advice the MultiHeadAttention layer from Python ran 1.4-2.4x
// slower at n = 1024 on Zen 4 (transparent_hugepage/defrag "madvise": a fault in advised memory
// may compact memory before it returns).
#pragma once

#include <cstddef>
#include <limits>
#include <new>
#include <utility>

namespace attn {

namespace core_detail {
// `bytes` 64-byte aligned (a cache line, an AVX-512 vector); std::bad_alloc when the memory is
// not there.
void* allocate_tensor_storage(std::size_t bytes);
void free_tensor_storage(void* pointer) noexcept;
}  // namespace core_detail

template <class T>
struct TensorAllocator {
  using value_type = T;

  TensorAllocator() = default;
  template <class U>
  explicit TensorAllocator(const TensorAllocator<U>&) noexcept {}

  T* allocate(std::size_t count) {
    if (count > std::numeric_limits<std::size_t>::max() / sizeof(T)) throw std::bad_alloc();
    return static_cast<T*>(core_detail::allocate_tensor_storage(count * sizeof(T)));
  }
  void deallocate(T* pointer, std::size_t) noexcept { core_detail::free_tensor_storage(pointer); }

  // Default-initialisation (no write) where std::allocator value-initialises: resize(n) and a
  // vector(n) leave the elements for their owner to fill.
  template <class U>
  void construct(U* pointer) noexcept {
    ::new (static_cast<void*>(pointer)) U;
  }
  template <class U, class... Args>
  void construct(U* pointer, Args&&... args) {
    ::new (static_cast<void*>(pointer)) U(std::forward<Args>(args)...);
  }

  template <class U>
  bool operator==(const TensorAllocator<U>&) const noexcept {
    return true;
  }
};

}  // namespace attn
