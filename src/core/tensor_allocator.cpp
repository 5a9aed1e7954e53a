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

namespace attn {

namespace {

constexpr std::size_t kAlignment = 64;
constexpr std::size_t kSmallestKept = std::size_t{1} << 20;
constexpr std::size_t kKeptBytesLimit = std::size_t{256} << 20;
constexpr std::size_t kKeptBlocksLimit = 16;

void free_block(void* pointer) noexcept {
  ::operator delete(pointer, std::align_val_t(kAlignment));
}

// Freed blocks by size, oldest first; a new tensor takes the newest of its size (its pages are the
// likeliest to be in cache). Under AddressSanitizer a kept block stays poisoned, so a read or write
// through a freed tensor is still reported.
class KeptBlocks {
 public:
  KeptBlocks() { blocks_.reserve(kKeptBlocksLimit); }

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
    if (bytes > kKeptBytesLimit) return false;
    const std::lock_guard lock(mutex_);
    std::size_t evicted = 0;
    while (kept_bytes_ + bytes > kKeptBytesLimit || blocks_.size() - evicted >= kKeptBlocksLimit) {
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

  std::mutex mutex_;
  std::vector<std::pair<void*, std::size_t>> blocks_;
  std::size_t kept_bytes_ = 0;
};

// Never destroyed: a tensor freed during static destruction (a static layer's) still finds it.
// First made by an allocation of kSmallestKept or more, before any such block can be freed.
KeptBlocks& kept_blocks() {
  static auto* blocks = new KeptBlocks;
  return *blocks;
}

}  // namespace

namespace core_detail {

void* allocate_tensor_storage(std::size_t bytes) {
  if (bytes >= kSmallestKept) {
    if (void* pointer = kept_blocks().take(bytes)) return pointer;
  }
  return ::operator new(bytes == 0 ? 1 : bytes, std::align_val_t(kAlignment));
}

void free_tensor_storage(void* pointer, std::size_t bytes) noexcept {
  if (pointer == nullptr) return;
  if (bytes >= kSmallestKept && kept_blocks().keep(pointer, bytes)) return;
  free_block(pointer);
}

}  // namespace core_detail

void release_cached_tensor_storage() noexcept {
  kept_blocks().release();
}

std::size_t cached_tensor_storage_bytes() noexcept {
  return kept_blocks().bytes();
}

}  // namespace attn
