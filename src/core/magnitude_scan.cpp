// largest_magnitude_bits, multiversioned (GCC/Clang target_clones) so that the scan runs 16 or 8
// lanes wide where the CPU allows, without the kernels' Highway dispatch (core sits below them).
#include "core/magnitude_scan.hpp"

#include <algorithm>
#include <bit>

namespace attn::core_detail {

__attribute__((target_clones("avx512f", "avx2", "default"))) uint32_t largest_magnitude_bits(
    const float* values, int64_t count) {
  uint32_t largest = 0;
  for (int64_t index = 0; index < count; ++index) {
    largest = std::max(largest, std::bit_cast<uint32_t>(values[index]) & kMagnitudeBits);
  }
  return largest;
}

}  // namespace attn::core_detail
