// prefill_without_scans: the fused forward pass checked from the rows its kernel read.
#include "functional/prefill_without_scans.hpp"

#include <algorithm>
#include <cmath>

#include "attn/kernels/flash_attention.hpp"
#include "attn/kernels/heads_view.hpp"
#include "functional/finite_range.hpp"
#include "functional/prepared_attention.hpp"

namespace attn::functional_detail {

namespace {

bool rows_contiguous(const ConstStridedView& view) {
  return view.rank() == 0 || view.dim(-1) <= 1 || view.stride(-1) == 1;
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
  prepared.require_mask_values();
  bool finite = true;
  float query_max = 0.0F, key_max = 0.0F, value_max = 0.0F;
  for (size_t s = 0; s < prepared.slices(); ++s) {
    ReadMagnitudes read;
    flash_attention_forward(
        prepared.query(s), prepared.key(s), prepared.value(s), prepared.valid_lens(),
        prepared.kernel_options(s), out.slice(output.data(), s),
        log_sum_exp.empty() ? nullptr : prepared.slice_log_sum_exp(log_sum_exp, s), &read);
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
  for (size_t s = 0; s < prepared.slices(); ++s) fill_heads(out.slice(output.data(), s), 0.0F);
  return false;
}

}  // namespace attn::functional_detail
