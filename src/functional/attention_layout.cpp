// The functional API's tensor layouts: axis roles, heads views per slice, broadcasting, scans.
#include "functional/attention_layout.hpp"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/kernels/flash_attention.hpp"
#include "attn/kernels/half_conversion.hpp"
#include "core/fork_safety.hpp"
#include "core/magnitude_scan.hpp"

namespace attn::functional_detail {

AxisRoles axis_roles(int rank, bool rank3_heads) {
  AxisRoles roles;
  roles.rank = rank;
  if (rank == 3) {
    (rank3_heads ? roles.heads : roles.batch) = 0;
  } else if (rank >= 4) {
    roles.batch = 0;
    roles.heads = rank - 3;
    roles.slice_begin = 1;
    roles.slice_end = rank - 3;
  }
  return roles;
}

HeadsLayout heads_layout(const AxisRoles& roles, const Shape& shape,
                         std::span<const int64_t> strides) {
  HeadsLayout layout;
  const int rank = roles.rank;
  layout.rows = shape[rank - 2];
  layout.cols = shape[rank - 1];
  layout.row_stride = strides[static_cast<size_t>(rank - 2)];
  layout.col_stride = strides[static_cast<size_t>(rank - 1)];
  if (roles.batch >= 0) {
    layout.batch = shape[roles.batch];
    layout.batch_stride = strides[static_cast<size_t>(roles.batch)];
  }
  if (roles.heads >= 0) {
    layout.heads = shape[roles.heads];
    layout.head_stride = strides[static_cast<size_t>(roles.heads)];
  }
  // Every index combination of the slice axes, last axis fastest.
  layout.slice_offsets.assign(1, 0);
  for (int axis = roles.slice_begin; axis < roles.slice_end; ++axis) {
    std::vector<int64_t> next;
    next.reserve(layout.slice_offsets.size() * static_cast<size_t>(shape[axis]));
    for (const int64_t offset : layout.slice_offsets) {
      for (int64_t index = 0; index < shape[axis]; ++index)
        next.push_back(offset + index * strides[static_cast<size_t>(axis)]);
    }
    layout.slice_offsets = std::move(next);
  }
  return layout;
}

bool broadcasts_to(const Shape& shape, const Shape& target) {
  const int rank = shape.rank(), target_rank = target.rank();
  if (rank > target_rank) return false;
  for (int axis = 0; axis < rank; ++axis) {
    const int64_t size = shape[axis];
    if (size != 1 && size != target[target_rank - rank + axis]) return false;
  }
  return true;
}

std::vector<int64_t> broadcast_strides(std::string_view name, const Shape& shape,
                                       std::span<const int64_t> strides, const Shape& target,
                                       std::string_view target_description) {
  if (!broadcasts_to(shape, target)) {
    throw ShapeError(std::string(name) + ": expected a shape that broadcasts to " + target.str() +
                     " (" + std::string(target_description) + "), got " + shape.str());
  }
  const int rank = shape.rank(), target_rank = target.rank();
  std::vector<int64_t> result(static_cast<size_t>(target_rank), 0);
  for (int axis = 0; axis < rank; ++axis) {
    const int target_axis = target_rank - rank + axis;
    if (shape[axis] == target[target_axis] && target[target_axis] != 1)
      result[static_cast<size_t>(target_axis)] = strides[static_cast<size_t>(axis)];
  }
  return result;
}

namespace {
// Calls visit(offset, flat index) for every element of a view, last axis fastest.
template <class Visit>
void for_each_element(const Shape& shape, std::span<const int64_t> strides, const Visit& visit) {
  const int rank = shape.rank();
  if (shape.numel() == 0) return;
  std::vector<int64_t> index(static_cast<size_t>(rank), 0);
  int64_t offset = 0;
  for (int64_t flat = 0;; ++flat) {
    visit(offset, flat);
    int axis = rank - 1;
    for (; axis >= 0; --axis) {
      const auto a = static_cast<size_t>(axis);
      if (++index[a] < shape[axis]) {
        offset += strides[a];
        break;
      }
      offset -= (index[a] - 1) * strides[a];
      index[a] = 0;
    }
    if (axis < 0) return;
  }
}
}  // namespace

// Calls visit(row, flat index of its first element) for every row along the last axis of a view
// whose last axis is contiguous, so the caller's inner loop runs over contiguous floats (and
// vectorises): the scans below check 50 million floats in milliseconds, not in a fifth of a second
// as one element at a time did.
template <class T, class Visit>
void for_each_row(const StridedView<T>& view, const Visit& visit) {
  const int rank = view.rank();
  if (rank == 0) {
    visit(view.data(), int64_t{0});
    return;
  }
  const int64_t cols = view.dim(-1);
  const Shape rows = Shape::from_dims(view.shape().data(), rank - 1);
  for_each_element(rows, view.strides().first(static_cast<size_t>(rank - 1)),
                   [&](int64_t offset, int64_t row) { visit(view.data() + offset, row * cols); });
}

// The largest of run_largest(first, count) over the elements of a view whose last axis is
// contiguous, taken in runs of up to 64 Ki elements that lie back to back: a contiguous view's
// elements in order, or each row joined by the rows that follow it in memory. (One call per row
// of 64 spent more on its set-up and final reduction than on the row, and listing the rows of a
// contiguous view cost as much again: 10% of a 1 × 8 × 32 × 64 call, Zen 4.) On the OpenMP
// threads from a million elements (inputs of a few MB and more).
template <class Bits, class T, class RunLargest>
Bits largest_over_runs(const StridedView<const T>& view, const RunLargest& run_largest) {
  constexpr int64_t kLongestRun = int64_t{1} << 16;
  const int64_t count = view.numel();
  std::vector<std::pair<const T*, int64_t>> runs;
  if (view.is_contiguous()) {
    for (int64_t first = 0; first < count; first += kLongestRun)
      runs.emplace_back(view.data() + first, std::min(kLongestRun, count - first));
  } else {
    const int64_t cols = view.rank() == 0 ? 1 : view.dim(-1);
    for_each_row(view, [&](const T* row, int64_t) {
      auto* last = runs.empty() ? nullptr : &runs.back();
      if (last != nullptr && last->first + last->second == row &&
          last->second + cols <= kLongestRun) {
        last->second += cols;
      } else {
        runs.emplace_back(row, cols);
      }
    });
  }
  Bits largest = 0;
  // A branch rather than an OpenMP `if` clause: a region kept serial by one still costs a futex
  // system call (kernels/parallel_tasks.hpp).
  if (count <= (int64_t{1} << 20)) {
    for (const auto& [first, size] : runs) largest = std::max(largest, run_largest(first, size));
    return largest;
  }
  const auto run_count = static_cast<int64_t>(runs.size());
  core_detail::note_parallel_region(omp_get_max_threads());
#pragma omp parallel for reduction(max : largest)
  for (int64_t r = 0; r < run_count; ++r) {
    const auto& [first, size] = runs[static_cast<size_t>(r)];
    largest = std::max(largest, run_largest(first, size));
  }
  return largest;
}

void require_per_head(std::string_view name, std::span<const float> values, int64_t heads) {
  if (values.empty()) return;
  if (static_cast<int64_t>(values.size()) != heads) {
    throw ShapeError(std::string(name) + ": expected one value per query head (" +
                     std::to_string(heads) + "), got " + std::to_string(values.size()));
  }
  for (size_t h = 0; h < values.size(); ++h) {
    if (!std::isfinite(values[h])) {
      throw ValueError(std::string(name) + ": expected finite values, got " +
                       std::to_string(values[h]) + " at index " + std::to_string(h));
    }
  }
}

namespace {

// Rows of a view's axis −2 as a view of their own, with the map from its flat indices back to
// the whole view's (the index a message names).
template <class T>
struct NarrowedRows {
  StridedView<const T> view;
  int64_t first_row = 0, kept_rows = 1, all_rows = 1, cols = 1;

  int64_t whole_index(int64_t flat) const {
    if (kept_rows == all_rows) return flat;
    const int64_t block = kept_rows * cols;
    return flat / block * all_rows * cols + first_row * cols + flat % block;
  }
};

template <class T>
NarrowedRows<T> narrow_rows(const StridedView<const T>& view, RowRange rows) {
  const int rank = view.rank();
  if (rank < 2) return {view};
  const int64_t all = view.dim(-2);
  const int64_t begin = std::clamp<int64_t>(rows.begin, 0, all);
  const int64_t end = rows.end < 0 ? all : std::clamp<int64_t>(rows.end, begin, all);
  if (begin == 0 && end == all) return {view, 0, all, all, view.dim(-1)};
  int64_t dims[Shape::kMaxRank];
  for (int axis = 0; axis < rank; ++axis) dims[axis] = view.dim(axis);
  dims[rank - 2] = end - begin;
  return {StridedView<const T>(view.data() + begin * view.stride(-2), Shape::from_dims(dims, rank),
                               view.strides()),
          begin, end - begin, all, view.dim(-1)};
}

}  // namespace

float require_finite(std::string_view name, const ConstStridedView& whole, RowRange rows) {
  // An empty tensor has nothing to check, however many rows a zero-width last axis gives it.
  if (whole.numel() == 0) return 0.0F;
  if (whole.rank() > 0 && whole.dim(-1) > 1 && whole.stride(-1) != 1) {
    return require_finite(name, ConstStridedView(contiguous_copy(whole)), rows);
  }
  const NarrowedRows<float> narrowed = narrow_rows(whole, rows);
  const ConstStridedView& view = narrowed.view;
  if (view.numel() == 0) return 0.0F;
  const int64_t cols = view.rank() == 0 ? 1 : view.dim(-1);
  // The largest |x| as the bits of the float, NaN and ±∞ above every finite value
  // (core_detail::largest_magnitude_bits, run by run): one scan finds the magnitude and detects
  // them.
  const auto largest = largest_over_runs<uint32_t>(view, core_detail::largest_magnitude_bits);
  if (largest >= core_detail::kFirstNonFinite) {
    // Rare: read the rows again, in order, to name the first culprit.
    for_each_row(view, [&](const float* row, int64_t flat) {
      for (int64_t j = 0; j < cols; ++j) {
        if (std::isfinite(row[j])) continue;
        throw ValueError(std::string(name) + ": expected finite values, got " +
                         (std::isnan(row[j]) ? "NaN"
                          : row[j] > 0       ? "inf"
                                             : "-inf") +
                         " at flat index " + std::to_string(narrowed.whole_index(flat + j)));
      }
    });
  }
  return std::bit_cast<float>(largest);
}

namespace {

// 1 when values[0, count) hold a NaN or +∞ (a float mask's −∞ is allowed), branch-free: the
// comparison is false for exactly those.
// The largest mask entry the kernels take: they add entries in base 2 (times log2 e), where one
// past 2^127 · log2 e ≈ 2.45e38 overflows (3e38 gave NaN weights and gradients where the forward
// was right); entries below −2^127 add −2^127 instead (score_modifiers-inl.h).
constexpr float kLargestMaskEntry = 0x1p127F;

// 1 when [values, values + count) holds a NaN, +∞ or an entry past kLargestMaskEntry.
uint32_t holds_nan_or_too_large(const float* values, int64_t count) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < count; ++i) bad |= values[i] <= kLargestMaskEntry ? 0U : 1U;
  return bad;
}

[[noreturn]] void refuse_mask_entry(std::string_view name, float value, int64_t flat) {
  if (std::isnan(value) || value == std::numeric_limits<float>::infinity()) {
    throw ValueError(std::string(name) + ": expected finite values or -inf, got " +
                     (std::isnan(value) ? "NaN" : "inf") + " at flat index " +
                     std::to_string(flat));
  }
  throw ValueError(std::string(name) +
                   ": expected entries of at most 2^127 (1.7e38: attn adds "
                   "them to the scores in base 2, where larger ones overflow), got " +
                   number_text(value) + " at flat index " + std::to_string(flat));
}

}  // namespace

void require_mask_values(std::string_view name, const ConstStridedView& view) {
  // A mask with a contiguous last axis is checked run by run, vectorised and on the OpenMP threads
  // from a million entries (entry by entry this was 4% of a causal n = 2048 call with the mask as
  // floats, Zen 5); the entries are walked one by one to name a culprit, or for other strides.
  if (rows_contiguous(view) && largest_over_runs<uint32_t>(view, holds_nan_or_too_large) == 0) {
    return;
  }
  const float* data = view.data();
  for_each_element(view.shape(), view.strides(), [&](int64_t offset, int64_t flat) {
    const float value = data[offset];
    if (!(value <= kLargestMaskEntry)) refuse_mask_entry(name, value, flat);
  });
}

// The elements of a view, in C order, into `destination`.
template <class T>
void copy_elements(const StridedView<const T>& view, T* destination) {
  const T* source = view.data();
  for_each_element(view.shape(), view.strides(),
                   [&](int64_t offset, int64_t flat) { destination[flat] = source[offset]; });
}

Tensor contiguous_copy(const ConstStridedView& view) {
  Tensor copy(view.shape());
  copy_elements(view, copy.data());
  return copy;
}

namespace {
template <class T>
void store_all_elements(const T* from, const StridedView<T>& to) {
  T* destination = to.data();
  for_each_element(to.shape(), to.strides(),
                   [&](int64_t offset, int64_t flat) { destination[offset] = from[flat]; });
}
}  // namespace

void store_elements(const float* from, const MutableStridedView& to) {
  store_all_elements(from, to);
}
void store_elements(const uint16_t* from, const MutableHalfStridedView& to) {
  store_all_elements(from, to);
}

float require_finite(std::string_view name, HalfType type, const ConstHalfStridedView& whole,
                     RowRange rows) {
  // Both formats keep the sign in the top bit and order magnitudes as their other bits do, with an
  // all-ones exponent for ±∞ and NaN: one pass of integer maxima finds the magnitude and detects
  // them, as the float scan does — run by run over contiguous bits (vpmaxuw), on the OpenMP
  // threads from a million elements (one element at a time, through the strided walk, had made
  // a bf16 call from Python half again slower than the kernel at n = 1024).
  if (whole.numel() == 0) return 0.0F;
  if (whole.rank() > 0 && whole.dim(-1) > 1 && whole.stride(-1) != 1) {
    const std::vector<uint16_t> copy = contiguous_copy(whole);
    return require_finite(name, type, ConstHalfStridedView(copy.data(), whole.shape()), rows);
  }
  const NarrowedRows<uint16_t> narrowed = narrow_rows(whole, rows);
  const ConstHalfStridedView& view = narrowed.view;
  if (view.numel() == 0) return 0.0F;
  const uint16_t exponent = type == HalfType::kFloat16 ? 0x7c00U : 0x7f80U;
  const auto largest = largest_over_runs<uint16_t>(view, [](const uint16_t* run, int64_t count) {
    uint16_t run_largest = 0;
    for (int64_t j = 0; j < count; ++j)
      run_largest = std::max(run_largest, static_cast<uint16_t>(run[j] & 0x7fffU));
    return run_largest;
  });
  if ((largest & exponent) == exponent) {
    // Rare: read the elements again, in order, to name the first culprit.
    const uint16_t* data = view.data();
    for_each_element(view.shape(), view.strides(), [&](int64_t offset, int64_t flat) {
      const uint16_t bits = data[offset];
      if ((bits & exponent) != exponent) return;
      throw ValueError(std::string(name) + ": expected finite values, got " +
                       ((bits & 0x7fffU) != exponent ? "NaN"
                        : (bits & 0x8000U) == 0      ? "inf"
                                                     : "-inf") +
                       " at flat index " + std::to_string(narrowed.whole_index(flat)));
    });
  }
  return half_bits_to_float(type, largest);
}

namespace {

// 1 when half bits [0, count) with this all-ones exponent hold a NaN or an entry above the
// largest taken (kLargest: fp16's largest finite, bf16's 2^127): a magnitude above ∞'s (NaN of
// either sign) or a positive value above kLargest, +∞ among them. Branch-free, in signed 16-bit
// comparisons with constants, which SSE2 has (pcmpgtw), so that the baseline build vectorises it:
// with unsigned ones and captured values it stayed scalar, a sixth of a bf16 call at n = 256 with
// a bf16 mask.
template <int16_t kExponent, int16_t kLargest>
uint16_t holds_half_nan_or_too_large(const uint16_t* run, int64_t count) {
  int16_t bad = 0;
  for (int64_t j = 0; j < count; ++j) {
    const auto bits = static_cast<int16_t>(run[j]);
    const auto magnitude = static_cast<int16_t>(bits & 0x7fff);
    bad |= static_cast<int16_t>((magnitude > kExponent) | (bits > kLargest));
  }
  return static_cast<uint16_t>(bad);
}

}  // namespace

void require_mask_values(std::string_view name, HalfType type, const ConstHalfStridedView& view) {
  // As the float scan: NaN, +∞ and (bf16) entries past 2^127 found run by run over contiguous
  // rows, element by element to name the first.
  constexpr int16_t kFloat16Largest = 0x7bff, kBFloat16Largest = 0x7f00;  // 65504, 2^127
  const bool float16 = type == HalfType::kFloat16;
  if (rows_contiguous(view)) {
    const uint16_t bad =
        float16 ? largest_over_runs<uint16_t>(view, holds_half_nan_or_too_large<0x7c00, 0x7bff>)
                : largest_over_runs<uint16_t>(view, holds_half_nan_or_too_large<0x7f80, 0x7f00>);
    if (bad == 0) return;
  }
  const int16_t exponent = float16 ? 0x7c00 : 0x7f80;
  const int16_t largest = float16 ? kFloat16Largest : kBFloat16Largest;
  const uint16_t* data = view.data();
  for_each_element(view.shape(), view.strides(), [&](int64_t offset, int64_t flat) {
    const auto bits = static_cast<int16_t>(data[offset]);
    if ((bits & 0x7fff) <= exponent && bits <= largest) return;
    refuse_mask_entry(name, half_bits_to_float(type, data[offset]), flat);
  });
}

std::vector<uint16_t> contiguous_copy(const ConstHalfStridedView& view) {
  std::vector<uint16_t> copy(static_cast<size_t>(view.numel()));
  copy_elements(view, copy.data());
  return copy;
}

Tensor widened_copy(HalfType type, const ConstHalfStridedView& view) {
  Tensor copy(view.shape());
  if (view.numel() == 0) return copy;
  // Whole contiguous rows at SIMD speed (widen_half): one element at a time through the strided
  // walk had made the half backward pass 60 ms slower than the float one at n = 1024.
  if (view.rank() > 0 && view.dim(-1) > 1 && view.stride(-1) != 1) {
    const std::vector<uint16_t> contiguous = contiguous_copy(view);
    widen_half(type, contiguous.data(), copy.data(), contiguous.size());
    return copy;
  }
  if (view.is_contiguous()) {
    widen_half(type, view.data(), copy.data(), static_cast<size_t>(view.numel()));
    return copy;
  }
  const auto cols = static_cast<size_t>(view.rank() == 0 ? 1 : view.dim(-1));
  for_each_row(view, [&](const uint16_t* row, int64_t flat) {
    widen_half(type, row, copy.data() + flat, cols);
  });
  return copy;
}

void store_rounded(HalfType type, const Tensor& from, const MutableHalfStridedView& to) {
  if (to.numel() == 0) return;
  if (to.is_contiguous()) {
    narrow_to_half(type, from.data(), to.data(), static_cast<size_t>(to.numel()));
    return;
  }
  if (to.rank() > 0 && to.dim(-1) > 1 && to.stride(-1) != 1) {
    const float* source = from.data();
    uint16_t* destination = to.data();
    for_each_element(to.shape(), to.strides(), [&](int64_t offset, int64_t flat) {
      destination[offset] = float_to_half_bits(type, source[flat]);
    });
    return;
  }
  const auto cols = static_cast<size_t>(to.rank() == 0 ? 1 : to.dim(-1));
  for_each_row(to, [&](uint16_t* row, int64_t flat) {
    narrow_to_half(type, from.data() + flat, row, cols);
  });
}

void store_rounded(HalfType type, const Tensor& from, const MutableHalfStridedView& to,
                   const MutableHalfStridedView& residual) {
  const auto count = static_cast<size_t>(to.numel());
  std::vector<uint16_t> rounded(count), residual_bits(count);
  narrow_to_half(type, from.data(), rounded.data(), count);
  for (size_t i = 0; i < count; ++i)
    residual_bits[i] = output_residual(type, from.data()[i], rounded[i]);
  store_elements(rounded.data(), to);
  store_elements(residual_bits.data(), residual);
}

Tensor widened_copy(HalfType type, const ConstHalfStridedView& rounded,
                    const ConstHalfStridedView& residual) {
  Tensor values(rounded.shape());
  const std::vector<uint16_t> rounded_bits = contiguous_copy(rounded);
  const std::vector<uint16_t> residual_bits = contiguous_copy(residual);
  for (size_t i = 0; i < rounded_bits.size(); ++i)
    values.data()[i] = output_with_residual(type, rounded_bits[i], residual_bits[i]);
  return values;
}

void require_half_type(HalfType type) {
  if (type != HalfType::kFloat16 && type != HalfType::kBFloat16) {
    throw ValueError("type: expected HalfType::kFloat16 or HalfType::kBFloat16, got the value " +
                     std::to_string(static_cast<int>(type)));
  }
}

}  // namespace attn::functional_detail
