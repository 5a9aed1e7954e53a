// TensorAllocator's kept blocks: a freed block of 64 KiB or more goes to the next tensor of its
// size, smaller ones and sizes over the limit go back to the system, the kept bytes stay within
// 256 MiB and 16 blocks for blocks of 1 MiB or more, 16 MiB and 32 blocks for those of 64 KiB to
// 1 MiB, neither set evicting the other's, and release_cached_tensor_storage frees them.
#include "attn/core/tensor_allocator.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/core/tensor.hpp"

namespace attn {
namespace {

using Floats = std::vector<float, TensorAllocator<float>>;
constexpr size_t kMiB = size_t{1} << 20;

size_t floats(size_t bytes) {
  return bytes / sizeof(float);
}

// Memory the system refuses is a std::bad_alloc (what callers catch; Python's MemoryError) that
// says how much was asked for, where std::bad_alloc's own message is "std::bad_alloc". 2⁶² bytes
// are more than any 48- or 57-bit address space maps.
TEST(TensorAllocator, RefusedMemoryNamesItsSize) {
  EXPECT_STREQ(AllocationError(3 << 20).what(), "could not allocate 3145728 bytes (3 MiB)");
  EXPECT_STREQ(AllocationError(1536).what(), "could not allocate 1536 bytes (1.5 KiB)");
  EXPECT_STREQ(AllocationError(1536, "capacity", " for 3 tokens").what(),
               "capacity: could not allocate 1536 bytes (1.5 KiB) for 3 tokens");
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer ends the process on an allocation it cannot serve (its "
                  "allocation-size-too-big report) instead of throwing";
#endif
  TensorAllocator<float> allocator;
  try {
    (void)allocator.allocate(std::size_t{1} << 60);
    ADD_FAILURE() << "expected AllocationError";
  } catch (const AllocationError& error) {
    EXPECT_STREQ(error.what(), "could not allocate 4611686018427387904 bytes (4 EiB)");
  }
  EXPECT_THROW((Tensor(Shape{int64_t{1} << 40, 1024})), std::bad_alloc);
}

TEST(TensorAllocator, AFreedLargeBlockGoesToTheNextTensorOfItsSize) {
  release_cached_tensor_storage();
  const float* first = nullptr;
  {
    const Tensor output(Shape{4, 8, 1024, 64});  // 8 MiB, filled with zeros
    first = output.data();
  }
  EXPECT_EQ(cached_tensor_storage_bytes(), 8 * kMiB);
  Tensor again;
  again.assign_uninitialized(Shape{4, 8, 1024, 64});
  EXPECT_EQ(again.data(), first);
  EXPECT_EQ(cached_tensor_storage_bytes(), 0U);
  // Another size does not take it; the block itself is usable (written and read back whole).
  {
    Floats other(floats(8 * kMiB) + 16, 1.0F);
    EXPECT_NE(other.data(), first);
  }
  for (int64_t e = 0; e < again.numel(); e += 4099) again.data()[e] = static_cast<float>(e);
  for (int64_t e = 0; e < again.numel(); e += 4099)
    EXPECT_EQ(again.data()[e], static_cast<float>(e));
  release_cached_tensor_storage();
  EXPECT_EQ(cached_tensor_storage_bytes(), 0U);
}

constexpr size_t kKiB = size_t{1} << 10;

TEST(TensorAllocator, SmallBlocksAndBlocksOverTheLimitAreNotKept) {
  release_cached_tensor_storage();
  { const Floats small(floats(64 * kKiB) - 1); }
  EXPECT_EQ(cached_tensor_storage_bytes(), 0U);
  { const Floats medium(floats(64 * kKiB)); }
  EXPECT_EQ(cached_tensor_storage_bytes(), 64 * kKiB);
  { const Floats one_mib(floats(kMiB)); }
  EXPECT_EQ(cached_tensor_storage_bytes(), 64 * kKiB + kMiB);
  { const Floats huge(floats(257 * kMiB)); }
  EXPECT_EQ(cached_tensor_storage_bytes(), 64 * kKiB + kMiB);
  release_cached_tensor_storage();
  EXPECT_EQ(cached_tensor_storage_bytes(), 0U);
}

TEST(TensorAllocator, MediumBlocksAreKeptApartWithinTheirOwnLimits) {
  release_cached_tensor_storage();
  const float* large = nullptr;
  {
    const Floats eight_mib(floats(8 * kMiB));
    large = eight_mib.data();
  }
  {
    // 40 blocks of 100 KiB … 490 KiB freed in order: the 32 newest are kept (the set's block
    // limit), the 8 MiB block with them.
    std::vector<Floats> blocks;
    for (size_t b = 0; b < 40; ++b) blocks.emplace_back(floats((100 + 10 * b) * kKiB));
    const float* newest = blocks.back().data();
    blocks.clear();
    size_t medium = 0;
    for (size_t b = 8; b < 40; ++b) medium += (100 + 10 * b) * kKiB;
    EXPECT_EQ(cached_tensor_storage_bytes(), 8 * kMiB + medium);
    const Floats again(floats(490 * kKiB));
    EXPECT_EQ(again.data(), newest);
  }
  Floats eight_mib(floats(8 * kMiB));
  EXPECT_EQ(eight_mib.data(), large) << "medium blocks evicted a large one";
  {
    // 17 blocks of 1000 KiB: at most 16 MiB of medium blocks (the oldest go first).
    std::vector<Floats> blocks;
    for (size_t b = 0; b < 17; ++b) blocks.emplace_back(floats(1000 * kKiB));
    blocks.clear();
  }
  EXPECT_LE(cached_tensor_storage_bytes(), 16 * kMiB);
  release_cached_tensor_storage();
  EXPECT_EQ(cached_tensor_storage_bytes(), 0U);
}

TEST(TensorAllocator, KeptBlocksStayWithinTheLimitsOldestFreedFirst) {
  release_cached_tensor_storage();
  {
    std::vector<Floats> blocks;
    for (size_t b = 0; b < 20; ++b) blocks.emplace_back(floats((b + 1) * kMiB));
    const float* newest = blocks.back().data();
    blocks.clear();  // freed in order: 1 MiB first, 20 MiB last
    // 16 blocks at most: 5 … 20 MiB (200 MiB) are kept.
    EXPECT_EQ(cached_tensor_storage_bytes(), 200 * kMiB);
    Floats again(floats(20 * kMiB));
    EXPECT_EQ(again.data(), newest);
  }
  // 200 MiB kept; two 100 MiB blocks freed: the second pushes the total past 256 MiB, so the
  // oldest go first until it fits.
  {
    std::vector<Floats> blocks;
    blocks.emplace_back(floats(100 * kMiB));
    blocks.emplace_back(floats(100 * kMiB));
    blocks.clear();
  }
  EXPECT_LE(cached_tensor_storage_bytes(), 256 * kMiB);
  EXPECT_GE(cached_tensor_storage_bytes(), 200 * kMiB);
  release_cached_tensor_storage();
  EXPECT_EQ(cached_tensor_storage_bytes(), 0U);
}

}  // namespace
}  // namespace attn
