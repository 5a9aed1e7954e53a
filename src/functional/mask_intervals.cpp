// mask_intervals: an attention mask's rows read as intervals of visible keys.
#include "functional/mask_intervals.hpp"

#include <omp.h>

#include <algorithm>
#include <limits>

#include "core/fork_safety.hpp"
#include "kernels/score_masks.hpp"

namespace attn::functional_detail {

namespace {

constexpr float kHidden = -std::numeric_limits<float>::infinity();

// 1: the key takes part, 0: it is hidden, −1: a float entry other than 0 and −∞ (a bias).
int entry_state(uint8_t entry) {
  return entry != 0 ? 1 : 0;
}
int entry_state(float entry) {
  return entry == 0.0F ? 1 : entry == kHidden ? 0 : -1;
}
int entry_state(BFloat16Entry entry) {
  return entry_state(entry_value(entry));
}
int entry_state(Float16Entry entry) {
  return entry_state(entry_value(entry));
}

// The row's visible keys [range[0], range[1]), or false when they are not one interval.
template <class T>
bool row_interval(const T* row, int64_t stride, int64_t m, int64_t* range) {
  int64_t j = 0;
  int state = 0;
  while (j < m && (state = entry_state(row[j * stride])) == 0) ++j;
  if (state < 0) return false;
  range[0] = j;
  while (j < m && (state = entry_state(row[j * stride])) == 1) ++j;
  if (state < 0) return false;
  range[1] = j;
  return row_hides_all(row + j * stride, stride, m - j);  // the hidden tail, branch-free
}

// The rows of one head (b, h): each its own interval, on the OpenMP threads from a million
// entries (on one thread the scan of a 2048 × 2048 float mask was 3% of a causal call on two).
// A branch rather than an OpenMP `if` clause: a region kept serial by one still costs a futex
// system call (kernels/parallel_tasks.hpp).
template <class T>
bool head_intervals(const ScoreMask& mask, const T* entries, int64_t b, int64_t h, int64_t rows,
                    int64_t m, int64_t* head_ranges) {
  const auto row_of = [&](int64_t i) {
    return row_interval(entries + mask.offset(b, h, i, 0), mask.col_stride, m, head_ranges + 2 * i);
  };
  if (rows * m < (int64_t{1} << 20)) {
    for (int64_t i = 0; i < rows; ++i) {
      if (!row_of(i)) return false;
    }
    return true;
  }
  int intervals = 1;
  core_detail::note_parallel_region(omp_get_max_threads());
#pragma omp parallel for reduction(&& : intervals)
  for (int64_t i = 0; i < rows; ++i) intervals = intervals && row_of(i);
  return intervals != 0;
}

template <class T>
bool intervals_of(const ScoreMask& mask, int64_t batch, int64_t heads, int64_t n, int64_t m,
                  std::vector<int64_t>& ranges) {
  const auto* entries = static_cast<const T*>(mask.data);
  // A mask broadcast over the queries has one row per head: row 0's range for all.
  const int64_t rows = mask.row_stride == 0 ? std::min<int64_t>(n, 1) : n;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      int64_t* head_ranges = ranges.data() + 2 * (b * heads + h) * n;
      if (h > 0 && mask.head_stride == 0) {  // the first head's rows, read once
        std::copy_n(ranges.data() + 2 * b * heads * n, 2 * n, head_ranges);
        continue;
      }
      if (!head_intervals(mask, entries, b, h, rows, m, head_ranges)) return false;
      for (int64_t i = rows; i < n; ++i) std::copy_n(head_ranges, 2, head_ranges + 2 * i);
    }
  }
  return true;
}

}  // namespace

bool mask_intervals(const ScoreMask& mask, int64_t batch, int64_t heads, int64_t n, int64_t m,
                    std::vector<int64_t>& ranges) {
  ranges.assign(static_cast<size_t>(2 * batch * heads * n), 0);
  switch (mask.kind) {
    case MaskKind::kBool:
      return intervals_of<uint8_t>(mask, batch, heads, n, m, ranges);
    case MaskKind::kFloat: {
      bool intervals = false;
      with_float_entries(mask.entries, [&](auto entry_type) {
        intervals = intervals_of<decltype(entry_type)>(mask, batch, heads, n, m, ranges);
      });
      return intervals;
    }
    case MaskKind::kNone:
      break;
  }
  return false;
}

}  // namespace attn::functional_detail
