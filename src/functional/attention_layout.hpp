// How the functional API lays a PyTorch-shaped tensor (..., H, L, E) over the kernels' heads:
// axis 0 the batch, axis −3 the heads, the axes between them enumerated as slices (one kernel
// call each), the last two a matrix per head. Also broadcasting (PyTorch's rules) and the scans
// of strided inputs for NaN and infinity.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "attn/core/half.hpp"
#include "attn/core/shape.hpp"
#include "attn/core/strided_view.hpp"
#include "attn/kernels/heads_view.hpp"

namespace attn::functional_detail {

// Which axis of a tensor of rank `rank` (2 to 8) plays which part.
struct AxisRoles {
  int rank = 0;
  int batch = -1;       // −1: none (a batch of 1)
  int heads = -1;       // −1: none (one head)
  int slice_begin = 0;  // axes [slice_begin, slice_end) are enumerated as slices
  int slice_end = 0;
};

// Rank 2: one matrix. Rank 3: (B, L, E), or (H, L, E) when `rank3_heads`. Rank ≥ 4:
// (B, slices..., H, L, E).
AxisRoles axis_roles(int rank, bool rank3_heads);

// A tensor under those roles: the heads of slice s are at data + slice_offsets[s].
struct HeadsLayout {
  int64_t batch = 1, heads = 1, rows = 0, cols = 0;
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0, col_stride = 1;
  std::vector<int64_t> slice_offsets;

  template <class T>
  BasicHeadsView<T> slice(T* data, size_t s) const {
    return {
        data + slice_offsets[s], batch, heads, rows, cols, batch_stride, head_stride, row_stride};
  }
};

HeadsLayout heads_layout(const AxisRoles& roles, const Shape& shape,
                         std::span<const int64_t> strides);

// Whether `shape` broadcasts to `target` (aligned from the last axis, each axis equal or 1).
bool broadcasts_to(const Shape& shape, const Shape& target);

// The strides that read a tensor of `shape` / `strides` broadcast to `target` (aligned from the
// last axis; a missing or size-1 axis repeats with stride 0). ShapeError naming `name` when the
// shapes do not broadcast.
std::vector<int64_t> broadcast_strides(std::string_view name, const Shape& shape,
                                       std::span<const int64_t> strides, const Shape& target,
                                       std::string_view target_description);

// Rows [begin, end) of a view's axis −2 (the keys of key and value): the part of an input the
// kernels read. The default is every row.
struct RowRange {
  int64_t begin = 0;
  int64_t end = -1;  // −1: through the last row
};

// ValueError naming `name` and the index of the first NaN or ±∞ among `rows` (indexed in the whole
// view); returns their largest magnitude.
float require_finite(std::string_view name, const ConstStridedView& view, RowRange rows = {});

// ShapeError unless `values` is empty or holds one value per query head (`heads`); ValueError
// naming `name` and the index of the first NaN or ±∞ (ALiBi slopes, sinks).
void require_per_head(std::string_view name, std::span<const float> values, int64_t heads);

// require_per_head for ALiBi slopes, and a ValueError naming the index of the first whose
// magnitude passes float's largest over log2 e (2.36e38): the kernels' base-2 scores take the
// slope times log2 e, which overflowed, and ∞ times the diagonal's distance 0 gave NaN outputs.
// A negative slope (scores that grow with the distance) must also keep its term at
// `longest_distance` finite: +∞ there gave NaN outputs.
void require_alibi_slopes(std::span<const float> slopes, int64_t heads, int64_t longest_distance);

// require_per_head for sinks, and a ValueError naming the index of the first of magnitude past
// 2^127 (3e38 overflowed times log2 e: an infinite log-sum-exp, NaN gradients; −1.8e38 fell under
// the −2^127 that a mask's lower entries are raised to).
void require_sinks(std::span<const float> sinks, int64_t heads);

// ValueError naming `name` and the index of the first NaN, +∞ or entry above 2^127 (an additive
// mask may hold −∞; the kernels add entries in base 2, where larger ones overflow).
void require_mask_values(std::string_view name, const ConstStridedView& view);

// Whether a view's rows lie back to back along its last axis (stride 1, or at most one element;
// a rank-0 view is one element): the kernels read such rows in place, others are copied first.
template <class T>
bool rows_contiguous(const StridedView<T>& view) {
  return view.rank() == 0 || view.dim(-1) <= 1 || view.stride(-1) == 1;
}

// A contiguous copy of a view (for inputs whose last axis is not contiguous).
Tensor contiguous_copy(const ConstStridedView& view);
// The reverse: a contiguous array of to's shape, in C order, into the elements of `to`.
void store_elements(const float* from, const MutableStridedView& to);

// Half-precision tensors (fp16 or bf16 bits, `type`), for the functional API's half overloads.
using ConstHalfStridedView = StridedView<const uint16_t>;
using MutableHalfStridedView = StridedView<uint16_t>;
// ValueError unless `type` is HalfType::kFloat16 or kBFloat16 (a value cast from another integer
// would be read as bfloat16 without a word).
void require_half_type(HalfType type);
// require_mask_values on a float mask's half-precision entries (NaN, +∞, bf16 above 2^127).
void require_mask_values(std::string_view name, HalfType type, const ConstHalfStridedView& view);
// require_finite's scan and message on half-precision data; returns the largest magnitude.
float require_finite(std::string_view name, HalfType type, const ConstHalfStridedView& view,
                     RowRange rows = {});
// A contiguous copy of the bits.
std::vector<uint16_t> contiguous_copy(const ConstHalfStridedView& view);
void store_elements(const uint16_t* from, const MutableHalfStridedView& to);
// A contiguous float32 tensor of the values (exact: every fp16 and bf16 value is a float).
Tensor widened_copy(HalfType type, const ConstHalfStridedView& view);
// Writes `from` (a contiguous tensor of to's shape) into `to`, each value rounded to `type`.
void store_rounded(HalfType type, const Tensor& from, const MutableHalfStridedView& to);
// The same, and each value's rounding residual (output_residual in flash_attention.hpp) into
// `residual`, of to's shape.
void store_rounded(HalfType type, const Tensor& from, const MutableHalfStridedView& to,
                   const MutableHalfStridedView& residual);
// A contiguous float32 tensor of a rounded output's values before their rounding: `rounded`
// widened plus the residuals in `residual` (output_with_residual), of its shape.
Tensor widened_copy(HalfType type, const ConstHalfStridedView& rounded,
                    const ConstHalfStridedView& residual);

}  // namespace attn::functional_detail
