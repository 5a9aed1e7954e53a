// mask_intervals (src/functional/mask_intervals.hpp): which masks are one interval of keys per
// row, and the ranges it reads from them, for bool and float masks, broadcast and strided.
#include "functional/mask_intervals.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

namespace attn::functional_detail {
namespace {

constexpr float kHidden = -std::numeric_limits<float>::infinity();

// A (1, 1, n, m) float mask (0 where visible), row i's visible keys [first(i), last(i)).
template <class First, class Last>
std::vector<float> float_rows(int64_t n, int64_t m, First first, Last last) {
  std::vector<float> mask(static_cast<size_t>(n * m), kHidden);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = first(i); j < last(i); ++j) mask[static_cast<size_t>(i * m + j)] = 0.0F;
  return mask;
}

TEST(MaskIntervals, RowsOfOneIntervalGiveTheirRanges) {
  const int64_t n = 5, m = 9;
  // Left padding of 2, then causal bottom-right; row 0 sees nothing.
  const std::vector<float> mask = float_rows(
      n, m, [](int64_t) { return int64_t{2}; },
      [](int64_t i) { return i == 0 ? 2 : m - n + i + 1; });
  std::vector<int64_t> ranges;
  ASSERT_TRUE(mask_intervals({MaskKind::kFloat, mask.data(), 0, 0, m, 1}, 1, 3, n, m, ranges));
  ASSERT_EQ(ranges.size(), static_cast<size_t>(2 * 3 * n));
  for (int64_t h = 0; h < 3; ++h) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t* range = ranges.data() + 2 * (h * n + i);
      // An empty row reads as [m, m).
      EXPECT_EQ(range[0], i == 0 ? m : 2) << h << " " << i;
      EXPECT_EQ(range[1], i == 0 ? m : m - n + i + 1) << h << " " << i;
    }
  }
  // The same as bools, stored transposed (keys × queries: row stride 1, column stride n).
  std::vector<uint8_t> bools(static_cast<size_t>(n * m));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j)
      bools[static_cast<size_t>(j * n + i)] = mask[static_cast<size_t>(i * m + j)] == 0.0F ? 1 : 0;
  std::vector<int64_t> from_bools;
  ASSERT_TRUE(mask_intervals({MaskKind::kBool, bools.data(), 0, 0, 1, n}, 1, 3, n, m, from_bools));
  EXPECT_EQ(from_bools, ranges);
  // Broadcast over the queries: row 0's range for every row.
  ASSERT_TRUE(mask_intervals({MaskKind::kFloat, mask.data() + m, 0, 0, 0, 1}, 1, 1, n, m, ranges));
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(ranges[static_cast<size_t>(2 * i)], 2);
    EXPECT_EQ(ranges[static_cast<size_t>(2 * i + 1)], m - n + 2);
  }
}

TEST(MaskIntervals, GapsAndBiasesAreNoIntervals) {
  const int64_t n = 3, m = 8;
  std::vector<int64_t> ranges;
  std::vector<float> mask = float_rows(
      n, m, [](int64_t) { return int64_t{0}; }, [](int64_t) { return m; });
  mask[static_cast<size_t>(2 * m + 7)] = 0.5F;  // a bias in the last row's last entry
  EXPECT_FALSE(mask_intervals({MaskKind::kFloat, mask.data(), 0, 0, m, 1}, 1, 1, n, m, ranges));
  mask[static_cast<size_t>(2 * m + 7)] = 0.0F;
  mask[static_cast<size_t>(1 * m + 3)] = kHidden;  // a gap in row 1
  EXPECT_FALSE(mask_intervals({MaskKind::kFloat, mask.data(), 0, 0, m, 1}, 1, 1, n, m, ranges));
  mask[static_cast<size_t>(1 * m + 3)] = 0.0F;
  EXPECT_TRUE(mask_intervals({MaskKind::kFloat, mask.data(), 0, 0, m, 1}, 1, 1, n, m, ranges));
  // A visible key after the hidden tail.
  std::vector<uint8_t> bools(static_cast<size_t>(m), 0);
  bools[1] = bools[2] = bools[6] = 1;
  EXPECT_FALSE(mask_intervals({MaskKind::kBool, bools.data(), 0, 0, 0, 1}, 1, 1, n, m, ranges));
  bools[6] = 0;
  EXPECT_TRUE(mask_intervals({MaskKind::kBool, bools.data(), 0, 0, 0, 1}, 1, 1, n, m, ranges));
  EXPECT_EQ(ranges[0], 1);
  EXPECT_EQ(ranges[1], 3);
}

}  // namespace
}  // namespace attn::functional_detail
