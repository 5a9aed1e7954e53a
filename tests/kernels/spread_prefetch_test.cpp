// SpreadPrefetch's bookkeeping: how many lines its ranges hold, how it spreads them over steps, and
// the order in which requests walk rows and ranges (a prefetch itself has no observable effect).
#include "kernels/spread_prefetch.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>

namespace attn {
namespace {

// A buffer whose first byte starts a cache line.
struct alignas(64) Lines {
  char bytes[64 * 1024];
};

TEST(SpreadPrefetch, CountsTheLinesOfEveryRowOfEveryRange) {
  const auto buffer = std::make_unique<Lines>();
  const char* rows = buffer->bytes;
  SpreadPrefetch prefetch;
  prefetch.add(rows, 3, 256, 512);         // 4 lines a row
  prefetch.add(rows + 2048, 2, 100, 128);  // 2 lines a row (100 bytes round up)
  EXPECT_EQ(prefetch.lines_left(), 3 * 4 + 2 * 2);
  EXPECT_EQ(prefetch.next_line(), rows);
}

TEST(SpreadPrefetch, RequestsTheLastPartialLineOfRowsThatStartInsideALine) {
  const auto buffer = std::make_unique<Lines>();
  const char* rows = buffer->bytes;
  SpreadPrefetch prefetch;
  // Rows of 128 bytes from byte 16, 1024 apart: each spans three lines, from the line at its start.
  prefetch.add(rows + 16, 2, 128, 1024);
  EXPECT_EQ(prefetch.lines_left(), 2 * 3);
  EXPECT_EQ(prefetch.next_line(), rows);
  prefetch.request(2);
  EXPECT_EQ(prefetch.next_line(), rows + 128);  // the line holding bytes 128 to 143
  prefetch.request(1);
  EXPECT_EQ(prefetch.next_line(), rows + 1024);
  // A stride that is not a multiple of 64 moves rows inside their lines: one more line each too.
  SpreadPrefetch strided;
  strided.add(rows, 2, 128, 1040);
  EXPECT_EQ(strided.lines_left(), 2 * 3);
  strided.request(3);
  EXPECT_EQ(strided.next_line(), rows + 1024);  // row 1 starts at 1040, inside the line at 1024
}

TEST(SpreadPrefetch, IgnoresEmptyRangesAndNullRows) {
  const auto buffer = std::make_unique<Lines>();
  SpreadPrefetch prefetch;
  prefetch.add(nullptr, 4, 256, 256);
  prefetch.add(buffer->bytes, 0, 256, 256);
  prefetch.add(buffer->bytes, 4, 0, 256);
  EXPECT_EQ(prefetch.lines_left(), 0);
  EXPECT_EQ(prefetch.next_line(), nullptr);
  prefetch.request(8);  // nothing to request: no effect
  EXPECT_EQ(prefetch.lines_left(), 0);
}

TEST(SpreadPrefetch, RequestsWalkEachRowsLinesThenTheNextRowThenTheNextRange) {
  const auto buffer = std::make_unique<Lines>();
  const char* rows = buffer->bytes;
  SpreadPrefetch prefetch;
  prefetch.add(rows, 2, 128, 1024);      // lines at 0, 64, 1024, 1088
  prefetch.add(rows + 4096, 1, 192, 0);  // lines at 4096, 4160, 4224
  prefetch.request(1);
  EXPECT_EQ(prefetch.next_line(), rows + 64);
  prefetch.request(1);
  EXPECT_EQ(prefetch.next_line(), rows + 1024);
  prefetch.request(2);
  EXPECT_EQ(prefetch.next_line(), rows + 4096);
  EXPECT_EQ(prefetch.lines_left(), 3);
  prefetch.request(2);
  EXPECT_EQ(prefetch.next_line(), rows + 4224);
  prefetch.request(5);  // more than are left: stops at the end
  EXPECT_EQ(prefetch.next_line(), nullptr);
  EXPECT_EQ(prefetch.lines_left(), 0);
}

TEST(SpreadPrefetch, SpreadsItsLinesOverTheStepsUpToACap) {
  const auto buffer = std::make_unique<Lines>();
  SpreadPrefetch prefetch;
  prefetch.add(buffer->bytes, 64, 256, 256);   // 256 lines
  EXPECT_EQ(prefetch.lines_per_step(16), 16);  // all of them over 16 steps
  EXPECT_EQ(prefetch.lines_per_step(10), 26);  // rounded up: none left over
  EXPECT_EQ(prefetch.lines_per_step(2), 32);   // a short task: at most 32 a step
  EXPECT_EQ(prefetch.lines_per_step(0), 32);   // no steps: as one, capped
  prefetch.raise_max_lines(64);                // rows from memory: a higher cap
  EXPECT_EQ(prefetch.lines_per_step(2), 64);
  prefetch.raise_max_lines(16);  // never lowered
  EXPECT_EQ(prefetch.lines_per_step(2), 64);
  prefetch.raise_max_lines(512);  // a higher cap: every line left over two steps
  EXPECT_EQ(prefetch.lines_per_step(2), 128);
}

TEST(SpreadPrefetch, HoldsAtMostItsRanges) {
  const auto buffer = std::make_unique<Lines>();
  SpreadPrefetch prefetch;
  for (int range = 0; range < SpreadPrefetch::kMaxRanges + 2; ++range)
    prefetch.add(buffer->bytes, 1, 64, 64);
  EXPECT_EQ(prefetch.lines_left(), SpreadPrefetch::kMaxRanges);
}

}  // namespace
}  // namespace attn
