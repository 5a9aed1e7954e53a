// SpreadPrefetch's bookkeeping: how many lines its ranges hold, how it spreads them over steps, and
// the order in which requests walk rows and ranges (a prefetch itself has no observable effect).
#include "kernels/spread_prefetch.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace attn {
namespace {

TEST(SpreadPrefetch, CountsTheLinesOfEveryRowOfEveryRange) {
  std::vector<char> rows(4096);
  SpreadPrefetch prefetch;
  prefetch.add(rows.data(), 3, 256, 512);         // 4 lines a row
  prefetch.add(rows.data() + 2048, 2, 100, 128);  // 2 lines a row (100 bytes round up)
  EXPECT_EQ(prefetch.lines_left(), 3 * 4 + 2 * 2);
  EXPECT_EQ(prefetch.next_line(), rows.data());
}

TEST(SpreadPrefetch, IgnoresEmptyRangesAndNullRows) {
  std::vector<char> rows(1024);
  SpreadPrefetch prefetch;
  prefetch.add(nullptr, 4, 256, 256);
  prefetch.add(rows.data(), 0, 256, 256);
  prefetch.add(rows.data(), 4, 0, 256);
  EXPECT_EQ(prefetch.lines_left(), 0);
  EXPECT_EQ(prefetch.next_line(), nullptr);
  prefetch.request(8);  // nothing to request: no effect
  EXPECT_EQ(prefetch.lines_left(), 0);
}

TEST(SpreadPrefetch, RequestsWalkEachRowsLinesThenTheNextRowThenTheNextRange) {
  std::vector<char> rows(8192);
  SpreadPrefetch prefetch;
  prefetch.add(rows.data(), 2, 128, 1024);      // lines at 0, 64, 1024, 1088
  prefetch.add(rows.data() + 4096, 1, 192, 0);  // lines at 4096, 4160, 4224
  prefetch.request(1);
  EXPECT_EQ(prefetch.next_line(), rows.data() + 64);
  prefetch.request(1);
  EXPECT_EQ(prefetch.next_line(), rows.data() + 1024);
  prefetch.request(2);
  EXPECT_EQ(prefetch.next_line(), rows.data() + 4096);
  EXPECT_EQ(prefetch.lines_left(), 3);
  prefetch.request(2);
  EXPECT_EQ(prefetch.next_line(), rows.data() + 4224);
  prefetch.request(5);  // more than are left: stops at the end
  EXPECT_EQ(prefetch.next_line(), nullptr);
  EXPECT_EQ(prefetch.lines_left(), 0);
}

TEST(SpreadPrefetch, SpreadsItsLinesOverTheStepsUpToACap) {
  std::vector<char> rows(64 * 1024);
  SpreadPrefetch prefetch;
  prefetch.add(rows.data(), 64, 256, 256);     // 256 lines
  EXPECT_EQ(prefetch.lines_per_step(16), 16);  // all of them over 16 steps
  EXPECT_EQ(prefetch.lines_per_step(10), 26);  // rounded up: none left over
  EXPECT_EQ(prefetch.lines_per_step(2), 32);   // a short task: at most 32 a step
  EXPECT_EQ(prefetch.lines_per_step(0), 32);   // no steps: as one, capped
}

TEST(SpreadPrefetch, HoldsAtMostItsRanges) {
  std::vector<char> rows(1024);
  SpreadPrefetch prefetch;
  for (int range = 0; range < SpreadPrefetch::kMaxRanges + 2; ++range)
    prefetch.add(rows.data(), 1, 64, 64);
  EXPECT_EQ(prefetch.lines_left(), SpreadPrefetch::kMaxRanges);
}

}  // namespace
}  // namespace attn
