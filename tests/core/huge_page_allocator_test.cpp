// HugePageAllocator: blocks of 2 MiB and more start on a 2 MiB boundary (where a transparent huge
// page can back them), smaller ones on 64 bytes; contents survive as in any vector.
#include "attn/core/huge_page_allocator.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <new>
#include <vector>

namespace attn {
namespace {

uintptr_t address(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer);
}

TEST(HugePageAllocator, LargeBlocksStartOnAHugePageAndSmallOnesOnACacheLine) {
  const size_t large = (size_t{3} << 20) / sizeof(float) + 5;  // 3 MiB and a bit: rounded up
  std::vector<float, HugePageAllocator<float>> values(large);
  EXPECT_EQ(address(values.data()) % core_detail::kHugePageBytes, 0U);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 1000);
  values.resize(2 * large);  // regrows through the allocator, copying
  EXPECT_EQ(address(values.data()) % core_detail::kHugePageBytes, 0U);
  for (size_t i = 0; i < large; i += 4093) EXPECT_EQ(values[i], static_cast<float>(i % 1000));
  EXPECT_EQ(values[2 * large - 1], 0.0F);

  for (const size_t count : {size_t{1}, size_t{3}, size_t{1000}, size_t{500000}}) {
    std::vector<float, HugePageAllocator<float>> small(count, 2.0F);
    EXPECT_EQ(address(small.data()) % 64, 0U) << count;
    EXPECT_EQ(small.back(), 2.0F);
  }
  std::vector<float, HugePageAllocator<float>> empty;
  EXPECT_EQ(empty.size(), 0U);
}

TEST(HugePageAllocator, ImpossibleSizesThrowBadAlloc) {
  HugePageAllocator<double> allocator;
  EXPECT_THROW((void)allocator.allocate(SIZE_MAX / 4), std::bad_alloc);
}

}  // namespace
}  // namespace attn
