// The allocation behind TensorAllocator.
#include "attn/core/tensor_allocator.hpp"

#include <new>

namespace attn::core_detail {

namespace {
constexpr std::size_t kAlignment = 64;
}  // namespace

void* allocate_tensor_storage(std::size_t bytes) {
  return ::operator new(bytes == 0 ? 1 : bytes, std::align_val_t(kAlignment));
}

void free_tensor_storage(void* pointer) noexcept {
  if (pointer != nullptr) ::operator delete(pointer, std::align_val_t(kAlignment));
}

}  // namespace attn::core_detail
