// prefill_without_scans: the fused forward pass checked from the rows its kernel read.
#include "functional/prefill_without_scans.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "attn/kernels/flash_attention.hpp"
#include "attn/kernels/heads_view.hpp"
#include "functional/finite_range.hpp"
#include "functional/prepared_attention.hpp"

namespace attn::functional_detail {

namespace {

template <class T>
bool rows_contiguous(const StridedView<T>& view) {
  return view.rank() == 0 || view.dim(-1) <= 1 || view.stride(-1) == 1;
}

// Runs run_slice(s, &read) over the prepared call's slices and checks what they read: every row
// finite, the scores' bound, values that need no scaling. Otherwise zero_slice(s) over them all,
// zeros in the log-sum-exp, and false.
template <class RunSlice, class ZeroSlice>
bool run_checked(const PreparedAttention& prepared, const RunSlice& run_slice,
                 const ZeroSlice& zero_slice, std::span<float> log_sum_exp) {
  prepared.require_mask_values();
  bool finite = true;
  float query_max = 0.0F, key_max = 0.0F, value_max = 0.0F;
  for (size_t s = 0; s < prepared.slices(); ++s) {
    ReadMagnitudes read;
    run_slice(s, &read);
    finite =
        finite && std::isfinite(read.query) && std::isfinite(read.key) && std::isfinite(read.value);
    query_max = std::max(query_max, read.query);
    key_max = std::max(key_max, read.key);
    value_max = std::max(value_max, read.value);
  }
  if (finite && prepared.scores_within_range(query_max, key_max) &&
      shift_for(prepared.value_sum_bound(value_max)) == 0) {
    return true;
  }
  for (size_t s = 0; s < prepared.slices(); ++s) zero_slice(s);
  std::fill(log_sum_exp.begin(), log_sum_exp.end(), 0.0F);
  return false;
}

}  // namespace

bool prefill_without_scans(ConstStridedView query, ConstStridedView key, ConstStridedView value,
                           const AttentionOptions& options, MutableStridedView output,
                           std::span<float> log_sum_exp) {
  if (!rows_contiguous(query) || !rows_contiguous(key) || !rows_contiguous(value)) return false;
  // Shapes and options checked as the scanned path checks them; the data is the caller's.
  const PreparedAttention prepared(query, key, value, options, PreparedAttention::kShapesOnly);
  const auto out = prepared.output_layout("output", output);
  prepared.require_log_sum_exp(log_sum_exp, true);
  return run_checked(
      prepared,
      [&](size_t s, ReadMagnitudes* read) {
        flash_attention_forward(
            prepared.query(s), prepared.key(s), prepared.value(s), prepared.valid_lens(),
            prepared.kernel_options(s), out.slice(output.data(), s),
            log_sum_exp.empty() ? nullptr : prepared.slice_log_sum_exp(log_sum_exp, s), read);
      },
      [&](size_t s) { fill_heads(out.slice(output.data(), s), 0.0F); }, log_sum_exp);
}

bool prefill_without_scans(HalfType type, StridedView<const uint16_t> query,
                           StridedView<const uint16_t> key, StridedView<const uint16_t> value,
                           const AttentionOptions& options, StridedView<uint16_t> output,
                           std::span<float> log_sum_exp) {
  if (!rows_contiguous(query) || !rows_contiguous(key) || !rows_contiguous(value)) return false;
  // The shapes as float views without data (kShapesOnly reads none): the layouts, in elements,
  // address the half bits.
  const auto shape_only = [](const auto& view) {
    return ConstStridedView(nullptr, view.shape(), view.strides());
  };
  const PreparedAttention prepared(shape_only(query), shape_only(key), shape_only(value), options,
                                   PreparedAttention::kShapesOnly);
  const auto out = prepared.output_layout(
      "output", MutableStridedView(nullptr, output.shape(), output.strides()));
  prepared.require_log_sum_exp(log_sum_exp, true);
  return run_checked(
      prepared,
      [&](size_t s, ReadMagnitudes* read) {
        flash_attention_forward(
            type, prepared.query_layout().slice(query.data(), s),
            prepared.key_layout().slice(key.data(), s),
            prepared.value_layout().slice(value.data(), s), prepared.valid_lens(),
            prepared.kernel_options(s), out.slice(output.data(), s),
            log_sum_exp.empty() ? nullptr : prepared.slice_log_sum_exp(log_sum_exp, s), read);
      },
      [&](size_t s) { fill_heads(out.slice(output.data(), s), uint16_t{0}); }, log_sum_exp);
}

}  // namespace attn::functional_detail
