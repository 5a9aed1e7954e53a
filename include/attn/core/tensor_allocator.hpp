// TensorAllocator: the allocator behind Tensor's elements, 64-byte aligned. It leaves new elements
// unwritten, so that Tensor fills a large one on the OpenMP threads (the first touch of fresh pages
// is the costly part). No huge-page advice, unlike the KV cache's HugePageAllocator: a tensor lives
// for a call or two, and with that advice the MultiHeadAttention layer from Python ran 1.4-2.4x
// slower at n = 1024 on Zen 4 (transparent_hugepage/defrag "madvise": a fault in advised memory
// may compact memory before it returns). Freed blocks of 1 MiB or more are kept, up to 256 MiB
// and 16 blocks, and blocks of 64 KiB to 1 MiB apart, up to 16 MiB and 32 blocks, each for the
// next tensor of the same size (a call's output, a backward pass's gradients): fresh pages
// from the kernel fault at their first touch, 2048 faults for the 8 MiB output of B = 4, 8 heads,
// n = 1024, d = 64 — glibc hands blocks over 32 MiB straight back to the kernel, and programs that
// lower that threshold (compare_pytorch.py, to see peak memory) hand back every block; below it,
// glibc trims freed memory at the heap's top back to the kernel too, so the projections and
// gradients of a Bahdanau decoder step (0.1-0.7 MiB) faulted afresh at every call, 17% of its
// backward pass. Like malloc's own free lists, the kept blocks are the process's, not a tensor's;
// the kernels' per-thread scratch takes and returns them too (src/kernels/scratch_memory.hpp).
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
// Frees, or keeps for reuse, a block allocate_tensor_storage gave for `bytes`.
void free_tensor_storage(void* pointer, std::size_t bytes) noexcept;
}  // namespace core_detail

// Frees the blocks kept for reuse (what torch.cuda.empty_cache is to PyTorch's GPU tensors);
// later tensors allocate afresh and are kept again when freed.
void release_cached_tensor_storage() noexcept;
// Bytes kept for reuse now.
std::size_t cached_tensor_storage_bytes() noexcept;

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
  void deallocate(T* pointer, std::size_t count) noexcept {
    core_detail::free_tensor_storage(pointer, count * sizeof(T));
  }

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
