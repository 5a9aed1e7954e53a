// SpreadPrefetch: the lines of rows a kernel will need (or write) later, requested a few at a time
// over the work that runs before then, so that they wait in L2 instead of stalling their first use.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/prefetch.hpp"

namespace attn {

// Requests the lines of some rows a few at a time, spread over work that runs meanwhile (the
// forward pass: the next query tile's rows while this one's key tiles run, so that they come from
// L2 rather than memory when the tile starts, and (for writing) the output rows the tile stores at
// its end). Requested all at once they would fill the core's miss queues and stall the products
// beside them.
class SpreadPrefetch {
 public:
  static constexpr int kMaxRanges = 4;
  static constexpr std::int64_t kMaxLinesPerStep = 32;

  SpreadPrefetch() = default;
  // `rows` rows of `row_bytes` bytes each, `stride` bytes apart from `first`, requested for
  // reading (prefetcht1) also where they will be written: PREFETCHW for the forward's output rows
  // measured level to 0.8% slower (Zen 1, 2026-11-30). Each row's lines are counted from the line
  // holding its first byte, one more where rows may start inside a line (`first` or `stride` not
  // a multiple of 64), so that a row's last, partial line is requested too: left to the hardware,
  // the bf16 forward's packing of (B, S, H·E) rows that start 16 bytes into a line waited on every
  // third line (Zen 4). At most kMaxRanges ranges; more are ignored.
  void add(const void* first, std::int64_t rows, std::int64_t row_bytes, std::int64_t stride) {
    if (count_ == kMaxRanges || first == nullptr || rows <= 0 || row_bytes <= 0) return;
    const bool misaligned = reinterpret_cast<std::uintptr_t>(first) % 64 != 0 || stride % 64 != 0;
    const std::int64_t lines = (row_bytes + 63) / 64 + (misaligned ? 1 : 0);
    ranges_[count_++] = {static_cast<const char*>(first), rows, lines, stride};
    lines_left_ += rows * lines;
  }
  std::int64_t lines_left() const { return lines_left_; }
  // The line the next request starts at (null when none is left).
  const void* next_line() const {
    if (current_ == count_) return nullptr;
    return LineAt(ranges_[current_], row_, line_);
  }
  // Lines to request per step of `steps` to request them all, at most kMaxLinesPerStep: a short
  // task (n = 128: two key tiles) requesting its next task's 512 lines in two bursts ran 5% slower
  // (Zen 5), its rows being in L2 already.
  // raise_max_lines raises that bound for rows that come from L3 or memory, not L2.
  std::int64_t lines_per_step(std::int64_t steps) const {
    return std::min(max_lines_, (lines_left_ + steps - 1) / std::max<std::int64_t>(steps, 1));
  }
  // Raises lines_per_step's bound to `max_lines` (never lowers it).
  void raise_max_lines(std::int64_t max_lines) { max_lines_ = std::max(max_lines_, max_lines); }
  // Requests the next `lines` lines (fewer when fewer are left).
  void request(std::int64_t lines) {
    for (; lines > 0 && current_ < count_; --lines) {
      const Range& range = ranges_[current_];
      PrefetchLine<PrefetchInto::kL2>(LineAt(range, row_, line_));
      --lines_left_;
      if (++line_ == range.lines_per_row) {
        line_ = 0;
        if (++row_ == range.rows) {
          row_ = 0;
          ++current_;
        }
      }
    }
  }

 private:
  struct Range {
    const char* first;
    std::int64_t rows, lines_per_row, stride;
  };
  // The start of line `line` of row `row`, counted from the line holding the row's first byte.
  static const void* LineAt(const Range& range, std::int64_t row, std::int64_t line) {
    return reinterpret_cast<const void*>(LineStart(range.first + row * range.stride) +
                                         static_cast<std::uintptr_t>(line) * 64);
  }
  Range ranges_[kMaxRanges] = {};
  int count_ = 0, current_ = 0;
  std::int64_t row_ = 0, line_ = 0, lines_left_ = 0, max_lines_ = kMaxLinesPerStep;
};

// Rows [first_row, first_row + rows) of matrix (b, h) of `view`, or of `half_view` on a pass over
// half-precision data (`half`), added to `prefetch` (the heads views of
// attn/kernels/heads_view.hpp).
template <class View, class HalfView>
void AddMatrixRows(SpreadPrefetch& prefetch, bool half, const View& view, const HalfView& half_view,
                   std::int64_t b, std::int64_t h, std::int64_t first_row, std::int64_t rows) {
  if (half) {
    prefetch.add(half_view.matrix(b, h) + first_row * half_view.row_stride, rows,
                 half_view.cols * 2, half_view.row_stride * 2);
  } else {
    prefetch.add(view.matrix(b, h) + first_row * view.row_stride, rows, view.cols * 4,
                 view.row_stride * 4);
  }
}

}  // namespace attn
