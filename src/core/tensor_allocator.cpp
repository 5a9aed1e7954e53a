// The allocation behind TensorAllocator, and the blocks it keeps for reuse (tensor_allocator.hpp).
#include "attn/core/tensor_allocator.hpp"

#include <cstddef>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define ATTN_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ATTN_ASAN 1
#endif
#endif
#ifdef ATTN_ASAN
#include <sanitizer/asan_interface.h>
#endif

#include "attn/core/error.hpp"

namespace attn {

namespace {

constexpr std::size_t kAlignment = 64;
constexpr std::size_t kMiB = std::size_t{1} << 20;

// Two sets of kept blocks, each within its own limits, so that a call's many mid-sized tensors (a
// Bahdanau decoder step's projections and gradients, 0.1-1 MiB) never push out the large ones:
struct KeptLimits {
  std::size_t smallest, bytes, blocks;
};
constexpr KeptLimits kLargeBlocks{kMiB, 256 * kMiB, 16};      // ≥ 1 MiB
constexpr KeptLimits kMediumBlocks{64 << 10, 16 * kMiB, 32};  // 64 KiB … 1 MiB

void free_block(void* pointer) noexcept {
  ::operator delete(pointer, std::align_val_t(kAlignment));
}

// Freed blocks by size, oldest first; a new tensor takes the newest of its size (its pages are the
// likeliest to be in cache). Under AddressSanitizer a kept block stays poisoned, so a read or write
// through a freed tensor is still reported.
class KeptBlocks {
 public:
  explicit KeptBlocks(const KeptLimits& limits) : limits_(limits) {
    blocks_.reserve(limits.blocks);
  }

  void* take(std::size_t bytes) noexcept {
    const std::lock_guard lock(mutex_);
    for (auto block = blocks_.rbegin(); block != blocks_.rend(); ++block) {
      if (block->second != bytes) continue;
      void* pointer = block->first;
      blocks_.erase(std::next(block).base());
      kept_bytes_ -= bytes;
#ifdef ATTN_ASAN
      ASAN_UNPOISON_MEMORY_REGION(pointer, bytes);
#endif
      return pointer;
    }
    return nullptr;
  }

  // Keeps the block, freeing the oldest ones over the limits; false when it is too large to keep.
  bool keep(void* pointer, std::size_t bytes) noexcept {
    if (bytes > limits_.bytes) return false;
    const std::lock_guard lock(mutex_);
    std::size_t evicted = 0;
    while (kept_bytes_ + bytes > limits_.bytes || blocks_.size() - evicted >= limits_.blocks) {
      release_block(blocks_[evicted].first, blocks_[evicted].second);
      kept_bytes_ -= blocks_[evicted].second;
      ++evicted;
    }
    blocks_.erase(blocks_.begin(), blocks_.begin() + static_cast<std::ptrdiff_t>(evicted));
    blocks_.emplace_back(pointer, bytes);  // within the capacity reserved: no allocation
    kept_bytes_ += bytes;
#ifdef ATTN_ASAN
    ASAN_POISON_MEMORY_REGION(pointer, bytes);
#endif
    return true;
  }

  void release() noexcept {
    const std::lock_guard lock(mutex_);
    for (const auto& [block, size] : blocks_) release_block(block, size);
    blocks_.clear();  // the capacity stays
    kept_bytes_ = 0;
  }

  std::size_t bytes() noexcept {
    const std::lock_guard lock(mutex_);
    return kept_bytes_;
  }

 private:
  static void release_block(void* pointer, std::size_t bytes) noexcept {
#ifdef ATTN_ASAN
    ASAN_UNPOISON_MEMORY_REGION(pointer, bytes);
#else
    (void)bytes;
#endif
    free_block(pointer);
  }

  const KeptLimits limits_;
  std::mutex mutex_;
  std::vector<std::pair<void*, std::size_t>> blocks_;
  std::size_t kept_bytes_ = 0;
};

// Never destroyed: a tensor freed during static destruction (a static layer's) still finds them.
// First made by an allocation of a kept size, before any such block can be freed.
KeptBlocks& large_blocks() {
  static auto* blocks = new KeptBlocks(kLargeBlocks);
  return *blocks;
}
KeptBlocks& medium_blocks() {
  static auto* blocks = new KeptBlocks(kMediumBlocks);
  return *blocks;
}

// The kept blocks a block of `bytes` goes to, or null for a size never kept.
KeptBlocks* kept_blocks_for(std::size_t bytes) {
  if (bytes >= kLargeBlocks.smallest) return &large_blocks();
  if (bytes >= kMediumBlocks.smallest) return &medium_blocks();
  return nullptr;
}

}  // namespace

namespace core_detail {

void* allocate_tensor_storage(std::size_t bytes) {
  if (KeptBlocks* kept = kept_blocks_for(bytes)) {
    if (void* pointer = kept->take(bytes)) return pointer;
  }
  try {
    return ::operator new(bytes == 0 ? 1 : bytes, std::align_val_t(kAlignment));
  } catch (const std::bad_alloc&) {
    throw AllocationError(bytes);
  }
}

void free_tensor_storage(void* pointer, std::size_t bytes) noexcept {
  if (pointer == nullptr) return;
  KeptBlocks* kept = kept_blocks_for(bytes);
  if (kept != nullptr && kept->keep(pointer, bytes)) return;
  free_block(pointer);
}

}  // namespace core_detail

void release_cached_tensor_storage() noexcept {
  large_blocks().release();
  medium_blocks().release();
}

std::size_t cached_tensor_storage_bytes() noexcept {
  return large_blocks().bytes() + medium_blocks().bytes();
}

}  // namespace attn
