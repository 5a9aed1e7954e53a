// Where the fused kernels' products read a matrix's rows (RowsView), when they can read the
// caller's rows in place instead of a per-thread padded copy (DenseRows), and the prefetch that
// copying strided rows needs (PrefetchMatrixRow).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/prefetch.hpp"

namespace attn {

// Row i at data + (i − first)·stride: the caller's rows in place (first 0), or a thread's packed
// copy of rows from `first` on.
struct RowsView {
  const float* data = nullptr;
  std::size_t stride = 0;
  std::size_t first = 0;
  const float* row(std::size_t i) const { return data + (i - first) * stride; }
};

// Float rows that lie back to back (PyTorch's contiguous (B, H, n, d)) and fill whole vectors of
// `lanes`, as packed rows do. Rows further apart (the layers' (B, n, H·d) heads, 2 KiB apart at
// H·d = 512) stay packed: read in place they were no faster, a tile's rows falling into few L1
// sets, and at long sequences they span more pages than the TLB maps.
template <class View>
bool DenseRows(const View& view, std::size_t lanes) {
  return view.row_stride == view.cols && static_cast<std::size_t>(view.cols) % lanes == 0;
}

// Requests the lines of row `row` of matrix (b, h) of a heads view (attn/kernels/heads_view.hpp)
// into L1. Copying strided rows a few lines each, one row at a time, waited on every row's misses
// (2.5% of the AVX2 forward on the layers' layout at n = 1024, Zen 4); rows requested some rows
// ahead overlap them.
template <class View>
[[gnu::always_inline]] inline void PrefetchMatrixRow(const View& view, std::int64_t b,
                                                     std::int64_t h, std::int64_t row) {
  const auto* first = view.matrix(b, h) + row * view.row_stride;
  PrefetchLines<PrefetchInto::kL1>(first, view.cols * static_cast<std::int64_t>(sizeof(*first)));
}

// The same of `half_view` when `half` (a pass on fp16/bf16 data), else of `view`.
template <class View, class HalfView>
[[gnu::always_inline]] inline void PrefetchMatrixRow(bool half, const View& view,
                                                     const HalfView& half_view, std::int64_t b,
                                                     std::int64_t h, std::int64_t row) {
  if (half) {
    PrefetchMatrixRow(half_view, b, h, row);
  } else {
    PrefetchMatrixRow(view, b, h, row);
  }
}

}  // namespace attn
