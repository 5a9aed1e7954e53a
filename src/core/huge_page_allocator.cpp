// The allocation behind HugePageAllocator: 2 MiB-aligned blocks advised MADV_HUGEPAGE.
#include "attn/core/huge_page_allocator.hpp"

#include <cstdlib>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "attn/core/error.hpp"

namespace attn::core_detail {

namespace {
constexpr std::size_t kSmallAlignment = 64;

std::size_t huge_rounded(std::size_t bytes) {
  return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
}
}  // namespace

void* allocate_large_buffer(std::size_t bytes) {
  if (bytes < kHugePageBytes) {
    try {
      return ::operator new(bytes == 0 ? 1 : bytes, std::align_val_t(kSmallAlignment));
    } catch (const std::bad_alloc&) {
      throw AllocationError(bytes);
    }
  }
  if (bytes > std::numeric_limits<std::size_t>::max() - kHugePageBytes)
    throw AllocationError(bytes);
  void* pointer = std::aligned_alloc(kHugePageBytes, huge_rounded(bytes));
  if (pointer == nullptr) throw AllocationError(bytes);
#if defined(MADV_HUGEPAGE)
  // Advice only: a kernel without transparent huge pages refuses it, and 4 KiB pages serve.
  (void)madvise(pointer, huge_rounded(bytes), MADV_HUGEPAGE);
#endif
  return pointer;
}

void free_large_buffer(void* pointer, std::size_t bytes) noexcept {
  if (pointer == nullptr) return;
  if (bytes < kHugePageBytes) {
    ::operator delete(pointer, std::align_val_t(kSmallAlignment));
  } else {
    std::free(pointer);
  }
}

}  // namespace attn::core_detail
