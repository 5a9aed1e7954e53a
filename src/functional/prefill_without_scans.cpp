// prefill_without_scans: the fused forward pass checked from the rows its kernel read.
#include "functional/prefill_without_scans.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attn/core/tensor.hpp"
#include "attn/kernels/flash_attention.hpp"
#include "attn/kernels/heads_view.hpp"
#include "functional/attention_layout.hpp"
#include "functional/finite_range.hpp"
#include "functional/prepared_attention.hpp"
#include "functional/row_totals.hpp"

namespace attn::functional_detail {

namespace {

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

// A backward call's option gradients started (start_option_gradients) and its slices run and
// checked: run(run_slice, zero_slice) calls run_slice(s, &read) over the slices, then asks of what
// they read what the scanned path asks of its scan: every row finite, the scores' bound, and sums
// that need no scaling (PreparedAttention::gradient_shifts zero: the scanned path's kernel call
// was then this one). Otherwise zero_slice(s) over them all, the option gradients zeroed again,
// and false.
class CheckedBackward {
 public:
  CheckedBackward(const PreparedAttention& prepared, const AttentionOptions& options,
                  MutableStridedView grad_mask, std::span<float> grad_sinks)
      : mask_gradient(grad_mask.data() != nullptr),
        prepared_(prepared),
        options_(options),
        grad_mask_(grad_mask),
        grad_sinks_(grad_sinks) {
    start_option_gradients(options_, grad_mask_, grad_sinks_);
  }

  ScoreMaskGradient mask_gradient_of(size_t s) const {
    return mask_gradient ? prepared_.mask_gradient(grad_mask_.data(), s) : ScoreMaskGradient{};
  }
  float* sinks_gradient() const { return grad_sinks_.empty() ? nullptr : grad_sinks_.data(); }

  template <class RunSlice, class ZeroSlice>
  bool run(const RunSlice& run_slice, const ZeroSlice& zero_slice) const {
    prepared_.require_mask_values();
    bool finite = true;
    BackwardReadMagnitudes largest;
    for (size_t s = 0; s < prepared_.slices(); ++s) {
      BackwardReadMagnitudes read;
      run_slice(s, &read);
      for (const float magnitude :
           {read.query, read.key, read.value, read.output, read.grad_output}) {
        finite = finite && std::isfinite(magnitude);
      }
      largest = {std::max(largest.query, read.query), std::max(largest.key, read.key),
                 std::max(largest.value, read.value), std::max(largest.output, read.output),
                 std::max(largest.grad_output, read.grad_output)};
    }
    if (finite && prepared_.scores_within_range(largest.query, largest.key)) {
      const double scale = std::fabs(static_cast<double>(prepared_.scale()));
      const auto shifts = prepared_.gradient_shifts(
          largest.grad_output, largest.output, largest.value, scale * largest.key,
          scale * largest.query, mask_gradient || !grad_sinks_.empty());
      if (shifts.grad_output == 0 && shifts.value == 0) return true;
    }
    for (size_t s = 0; s < prepared_.slices(); ++s) zero_slice(s);
    start_option_gradients(options_, grad_mask_, grad_sinks_);  // zeroes them again
    return false;
  }

  const bool mask_gradient;

 private:
  const PreparedAttention& prepared_;
  const AttentionOptions& options_;
  MutableStridedView grad_mask_;
  std::span<float> grad_sinks_;
};

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
                           std::span<float> log_sum_exp, StridedView<uint16_t> output_residual) {
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
  const bool residual = output_residual.data() != nullptr;
  const auto residual_layout =
      residual ? prepared.output_layout("output_residual",
                                        MutableStridedView(nullptr, output_residual.shape(),
                                                           output_residual.strides()))
               : out;
  prepared.require_log_sum_exp(log_sum_exp, true);
  return run_checked(
      prepared,
      [&](size_t s, ReadMagnitudes* read) {
        flash_attention_forward(
            type, prepared.query_layout().slice(query.data(), s),
            prepared.key_layout().slice(key.data(), s),
            prepared.value_layout().slice(value.data(), s), prepared.valid_lens(),
            prepared.kernel_options(s), out.slice(output.data(), s),
            log_sum_exp.empty() ? nullptr : prepared.slice_log_sum_exp(log_sum_exp, s), read,
            residual ? residual_layout.slice(output_residual.data(), s) : HalfHeadsView{});
      },
      [&](size_t s) { fill_heads(out.slice(output.data(), s), uint16_t{0}); }, log_sum_exp);
}

bool backward_without_scans(ConstStridedView query, ConstStridedView key, ConstStridedView value,
                            ConstStridedView output, ConstStridedView grad_output,
                            std::span<const float> log_sum_exp, const AttentionOptions& options,
                            MutableStridedView grad_query, MutableStridedView grad_key,
                            MutableStridedView grad_value, MutableStridedView grad_mask,
                            std::span<float> grad_sinks, RowSource rows) {
  if (!rows_contiguous(query) || !rows_contiguous(key) || !rows_contiguous(value) ||
      !rows_contiguous(output) || !rows_contiguous(grad_output)) {
    return false;
  }
  // The scanned path's checks of shapes, layouts and options, in its order; the data is the
  // caller's.
  const PreparedAttention prepared(query, key, value, options, PreparedAttention::kShapesOnly);
  const CheckedBackward checked(prepared, options, grad_mask, grad_sinks);
  prepared.output_layout("output", output);
  prepared.output_layout("grad_output", grad_output);
  prepared.require_log_sum_exp(log_sum_exp, false);
  const auto grad_q = prepared.input_layout("grad_query", grad_query, query.shape());
  const auto grad_k = prepared.input_layout("grad_key", grad_key, key.shape());
  const auto grad_v = prepared.input_layout("grad_value", grad_value, value.shape());
  const auto zero_slice = [&](size_t s) {
    fill_heads(grad_q.slice(grad_query.data(), s), 0.0F);
    fill_heads(grad_k.slice(grad_key.data(), s), 0.0F);
    fill_heads(grad_v.slice(grad_value.data(), s), 0.0F);
  };
  // Recounted rows: a non-finite key gives a non-finite log-sum-exp here, and the pass below, which
  // reads the same keys, reports it (the scanned path then names it).
  std::vector<float> recounted, totals;
  Tensor rescaled_grad_output, output_again;
  const bool recounted_rows =
      rows == RowSource::kRecounted || rows == RowSource::kRecountedWithTotals;
  if (recounted_rows) {
    recounted.resize(log_sum_exp.size());
    totals.resize(log_sum_exp.size());
    for (size_t s = 0; s < prepared.slices(); ++s) {
      flash_attention_recomputed_log_sum_exp(
          prepared.query(s), prepared.key(s), prepared.valid_lens(),
          prepared.kernel_options(s, checked.mask_gradient),
          prepared.slice_log_sum_exp(std::span<float>(recounted), s),
          prepared.slice_log_sum_exp(std::span<float>(totals), s));
    }
    if (rows == RowSource::kRecountedWithTotals && rows_stray(totals)) {
      rescaled_grad_output = grad_output_over_row_totals(prepared, grad_output, totals);
      grad_output = rescaled_grad_output;
    }
  } else if (rows == RowSource::kForwardAgain) {
    // The caller's output, which the pass no longer reads, is still checked as the pass checks
    // it: one not finite goes to the scanned path, which names it (a few queries' rows).
    const auto given = prepared.output_layout("output", output);
    for (size_t s = 0; s < prepared.slices(); ++s) {
      if (!heads_finite(given.slice(output.data(), s))) {
        for (size_t t = 0; t < prepared.slices(); ++t) zero_slice(t);
        return false;
      }
    }
    // The prefill kernels' output and log-sum-exp: checked as a forward call is (false for what it
    // leaves to the scanned path, which then recounts the rows instead).
    output_again = Tensor(output.shape());
    recounted.resize(log_sum_exp.size());
    if (!prefill_without_scans(query, key, value, options, output_again, recounted)) {
      for (size_t s = 0; s < prepared.slices(); ++s) zero_slice(s);
      return false;
    }
    output = output_again;
  }
  const std::span<const float> lse = rows != RowSource::kGiven ? recounted : log_sum_exp;
  const auto out = prepared.output_layout("output", output);
  const auto grad_out = prepared.output_layout("grad_output", grad_output);
  return checked.run(
      [&](size_t s, BackwardReadMagnitudes* read) {
        flash_attention_backward(
            prepared.query(s), prepared.key(s), prepared.value(s), out.slice(output.data(), s),
            grad_out.slice(grad_output.data(), s), prepared.slice_log_sum_exp(lse, s),
            prepared.valid_lens(), prepared.kernel_options(s, checked.mask_gradient),
            grad_q.slice(grad_query.data(), s), grad_k.slice(grad_key.data(), s),
            grad_v.slice(grad_value.data(), s), checked.mask_gradient_of(s),
            checked.sinks_gradient(), read,
            recounted_rows ? LogSumExpKind::kRecomputedBaseTwo : LogSumExpKind::kForward);
      },
      zero_slice);
}

bool backward_without_scans(HalfType type, StridedView<const uint16_t> query,
                            StridedView<const uint16_t> key, StridedView<const uint16_t> value,
                            StridedView<const uint16_t> output,
                            StridedView<const uint16_t> grad_output,
                            std::span<const float> log_sum_exp, const AttentionOptions& options,
                            StridedView<uint16_t> grad_query, StridedView<uint16_t> grad_key,
                            StridedView<uint16_t> grad_value, MutableStridedView grad_mask,
                            std::span<float> grad_sinks,
                            StridedView<const uint16_t> output_residual) {
  if (!rows_contiguous(query) || !rows_contiguous(key) || !rows_contiguous(value) ||
      !rows_contiguous(output) || !rows_contiguous(grad_output) ||
      !rows_contiguous(output_residual)) {
    return false;
  }
  // The scanned path's checks of shapes, layouts and options, in its order, on float views
  // without data (kShapesOnly reads none): the layouts, in elements, address the half bits.
  const auto shape_only = [](const auto& view) {
    return MutableStridedView(nullptr, view.shape(), view.strides());
  };
  const PreparedAttention prepared(shape_only(query), shape_only(key), shape_only(value), options,
                                   PreparedAttention::kShapesOnly);
  const CheckedBackward checked(prepared, options, grad_mask, grad_sinks);
  const auto out = prepared.output_layout("output", output);
  const auto grad_out = prepared.output_layout("grad_output", grad_output);
  const bool residual = output_residual.data() != nullptr;
  const auto residual_layout =
      residual ? prepared.output_layout("output_residual", output_residual) : out;
  prepared.require_log_sum_exp(log_sum_exp, false);
  const auto grad_q = prepared.input_layout("grad_query", shape_only(grad_query), query.shape());
  const auto grad_k = prepared.input_layout("grad_key", shape_only(grad_key), key.shape());
  const auto grad_v = prepared.input_layout("grad_value", shape_only(grad_value), value.shape());
  // Sums that would need scaling fail the check: the scanned path widens the inputs for them.
  return checked.run(
      [&](size_t s, BackwardReadMagnitudes* read) {
        flash_attention_backward(
            type, prepared.query_layout().slice(query.data(), s),
            prepared.key_layout().slice(key.data(), s),
            prepared.value_layout().slice(value.data(), s), out.slice(output.data(), s),
            grad_out.slice(grad_output.data(), s), prepared.slice_log_sum_exp(log_sum_exp, s),
            prepared.valid_lens(), prepared.kernel_options(s, checked.mask_gradient),
            grad_q.slice(grad_query.data(), s), grad_k.slice(grad_key.data(), s),
            grad_v.slice(grad_value.data(), s), checked.mask_gradient_of(s),
            checked.sinks_gradient(), read,
            residual ? residual_layout.slice(output_residual.data(), s) : ConstHalfHeadsView{});
      },
      [&](size_t s) {
        fill_heads(grad_q.slice(grad_query.data(), s), uint16_t{0});
        fill_heads(grad_k.slice(grad_key.data(), s), uint16_t{0});
        fill_heads(grad_v.slice(grad_value.data(), s), uint16_t{0});
      });
}

}  // namespace attn::functional_detail
