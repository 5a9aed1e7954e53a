// Where the fused kernels' products read a matrix's rows (RowsView), and when they can read the
// caller's rows in place instead of a per-thread padded copy (DenseRows).
#pragma once

#include <cstddef>

namespace attn {

// Row i at data + i·stride: the caller's rows in place, or a thread's packed copy.
struct RowsView {
  const float* data = nullptr;
  std::size_t stride = 0;
  const float* row(std::size_t i) const { return data + i * stride; }
};

// Float rows that lie back to back (PyTorch's contiguous (B, H, n, d)) and fill whole vectors of
// `lanes`, as packed rows do. Rows further apart (the layers' (B, n, H·d) heads, 2 KiB apart at
// H·d = 512) stay packed: read in place they were no faster, a tile's rows falling into few L1
// sets, and at long sequences they span more pages than the TLB maps.
template <class View>
bool DenseRows(const View& view, std::size_t lanes) {
  return view.row_stride == view.cols && static_cast<std::size_t>(view.cols) % lanes == 0;
}

}  // namespace attn
