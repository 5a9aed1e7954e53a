// attn::scaled_dot_product_attention: checks PyTorch-shaped arguments, lays them over the fused
// kernels' heads (slices of leading axes one kernel call each), and resolves AttentionOptions into
// the kernels' FlashAttentionOptions.
#include "attn/functional/scaled_dot_product_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/kernels/flash_attention.hpp"
#include "functional/attention_layout.hpp"
#include "functional/decode_route.hpp"
#include "functional/dominant_sinks.hpp"
#include "functional/finite_range.hpp"
#include "functional/memory_overlap.hpp"
#include "functional/prefill_without_scans.hpp"
#include "functional/prepared_attention.hpp"
#include "functional/row_totals.hpp"
#include "kernels/dropout_hash.hpp"

namespace attn {

using functional_detail::PreparedAttention;

bool log_sum_exp_beyond_float_precision(std::span<const float> log_sum_exp) {
  constexpr float kPreciseLogSumExp = 256.0F;
  return std::any_of(log_sum_exp.begin(), log_sum_exp.end(), [](float value) {
    return std::isfinite(value) && std::fabs(value) > kPreciseLogSumExp;
  });
}

int64_t log_sum_exp_size(const Shape& query) {
  if (query.rank() < 2) return 0;
  // The product of every axis but E, formed directly: numel / E divides by zero when E = 0.
  int64_t rows = 1;
  for (int axis = 0; axis + 1 < query.rank(); ++axis) rows *= query[axis];
  return rows;
}

void scaled_dot_product_attention(ConstStridedView query, ConstStridedView key,
                                  ConstStridedView value, const AttentionOptions& options,
                                  MutableStridedView output, std::span<float> log_sum_exp) {
  functional_detail::require_own_elements("output", output);
  if (functional_detail::forward_writes_over_inputs<float>(output, log_sum_exp, query, key, value,
                                                           options)) {
    functional_detail::forward_apart(
        output, log_sum_exp, [&](MutableStridedView apart, std::span<float> apart_log_sum_exp) {
          scaled_dot_product_attention(query, key, value, options, apart, apart_log_sum_exp);
        });
    return;
  }
  // Decoding shapes: the decode kernel, which checks what it reads (decode_route.hpp); the
  // prefill path below when it declines or finds something non-finite.
  if (functional_detail::decode_without_scans(query, key, value, options, output, log_sum_exp))
    return;
  // Other calls on plain rows: the fused kernel, which reports what it read, checked after.
  if (functional_detail::prefill_without_scans(query, key, value, options, output, log_sum_exp))
    return;
  PreparedAttention prepared(query, key, value, options, PreparedAttention::kDotProduct);
  const auto out = prepared.output_layout("output", output);
  prepared.require_log_sum_exp(log_sum_exp, true);
  // The kernel's unnormalised sum reaches S·max|v| (times dropout's 1/(1−p)): values near float's
  // maximum are scaled down by a power of two first and the output back up after.
  const int shift = functional_detail::shift_for(prepared.value_sum_bound());
  prepared.scale_value(shift);
  for (size_t s = 0; s < prepared.slices(); ++s) {
    flash_attention_forward(
        prepared.query(s), prepared.key(s), prepared.value(s), prepared.valid_lens(),
        prepared.kernel_options(s), out.slice(output.data(), s),
        log_sum_exp.empty() ? nullptr : prepared.slice_log_sum_exp(log_sum_exp, s));
  }
  if (shift > 0) {
    for (size_t s = 0; s < prepared.slices(); ++s) {
      functional_detail::scale_heads(out.slice(output.data(), s), shift);
      // Only dropout's 1/(1−p) can take a convex combination of finite values out of range.
      functional_detail::require_finite_result(out.slice(output.data(), s), "output",
                                               "values and dropout");
    }
  }
}

AttentionForward scaled_dot_product_attention(ConstStridedView query, ConstStridedView key,
                                              ConstStridedView value,
                                              const AttentionOptions& options) {
  AttentionForward result;
  // Unwritten until the kernel's threads write every element (no zero-fill pass first).
  result.output.assign_uninitialized(functional_detail::output_shape(query, value));
  result.log_sum_exp.resize(static_cast<size_t>(log_sum_exp_size(query.shape())));
  scaled_dot_product_attention(query, key, value, options, result.output, result.log_sum_exp);
  return result;
}

namespace {

// flash_attention_recomputed_log_sum_exp over every slice of `prepared`, with the kernel options
// the pass that reads it uses (`mask_gradient` as it passes it), and the rows' P totals when
// `totals` is not null.
std::vector<float> recomputed_log_sum_exp(const PreparedAttention& prepared, size_t rows,
                                          bool mask_gradient,
                                          std::vector<float>* totals = nullptr) {
  std::vector<float> recomputed(rows);
  if (totals != nullptr) totals->assign(rows, 1.0F);
  for (size_t s = 0; s < prepared.slices(); ++s) {
    flash_attention_recomputed_log_sum_exp(
        prepared.query(s), prepared.key(s), prepared.valid_lens(),
        prepared.kernel_options(s, mask_gradient),
        prepared.slice_log_sum_exp(std::span<float>(recomputed), s),
        totals != nullptr ? prepared.slice_log_sum_exp(std::span<float>(*totals), s) : nullptr);
  }
  return recomputed;
}

// The backward pass of a call some of whose rows have a sink that outweighs every score (their
// float log-sum-exp is the sink's, and P = exp(S − lse) falls under float's range 88 below it:
// dQ, dK and dV came out up to a quarter off): a pass over the scores alone, on their own base-2
// log-sum-exp, with grad_output's rows times the scores' share (dominant_sinks.hpp), and the sinks'
// gradient in double.
void backward_beside_dominant_sinks(ConstStridedView query, ConstStridedView key,
                                    ConstStridedView value, ConstStridedView output,
                                    ConstStridedView grad_output,
                                    std::span<const float> log_sum_exp,
                                    const AttentionOptions& options, MutableStridedView grad_query,
                                    MutableStridedView grad_key, MutableStridedView grad_value,
                                    MutableStridedView grad_mask, std::span<float> grad_sinks) {
  // A layout without sinks (one scan of the inputs), with the call's own checks of the sinks.
  AttentionOptions scores_only = options;
  scores_only.sinks = {};
  const PreparedAttention prepared(query, key, value, scores_only, PreparedAttention::kDotProduct);
  functional_detail::require_sinks(options.sinks, prepared.query_layout().heads);
  prepared.output_layout("output", output);
  prepared.output_layout("grad_output", grad_output);
  prepared.require_log_sum_exp(log_sum_exp, false);
  const bool mask_gradient = grad_mask.data() != nullptr;
  std::vector<float> totals;
  const std::vector<float> scores_log_sum_exp =
      recomputed_log_sum_exp(prepared, log_sum_exp.size(), mask_gradient, &totals);
  const Tensor shared_grad_output = functional_detail::grad_output_beside_sinks(
      prepared, grad_output, scores_log_sum_exp, totals, options.sinks);
  scores_only.log_sum_exp_recomputed_base_two = true;
  scaled_dot_product_attention_backward(query, key, value, output, shared_grad_output,
                                        scores_log_sum_exp, scores_only, grad_query, grad_key,
                                        grad_value, grad_mask, {});
  if (!grad_sinks.empty()) {
    functional_detail::sinks_gradient_beside_scores(prepared, output, grad_output,
                                                    scores_log_sum_exp, options.sinks, grad_sinks);
    functional_detail::require_finite_result(grad_sinks.data(),
                                             static_cast<int64_t>(grad_sinks.size()), "grad_sinks",
                                             "query, key, value and grad_output");
  }
}

}  // namespace

void scaled_dot_product_attention_log_sum_exp_base_two(ConstStridedView query, ConstStridedView key,
                                                       ConstStridedView value,
                                                       const AttentionOptions& options,
                                                       std::span<float> log_sum_exp_base_two,
                                                       std::span<float> totals) {
  const PreparedAttention prepared(query, key, value, options, PreparedAttention::kDotProduct);
  prepared.require_log_sum_exp(log_sum_exp_base_two, false);
  prepared.require_log_sum_exp(totals, false);
  for (size_t s = 0; s < prepared.slices(); ++s) {
    flash_attention_recomputed_log_sum_exp(
        prepared.query(s), prepared.key(s), prepared.valid_lens(), prepared.kernel_options(s),
        prepared.slice_log_sum_exp(log_sum_exp_base_two, s), prepared.slice_log_sum_exp(totals, s));
  }
}

void scaled_dot_product_attention_backward(
    ConstStridedView query, ConstStridedView key, ConstStridedView value, ConstStridedView output,
    ConstStridedView grad_output, std::span<const float> log_sum_exp,
    const AttentionOptions& options, MutableStridedView grad_query, MutableStridedView grad_key,
    MutableStridedView grad_value, MutableStridedView grad_mask, std::span<float> grad_sinks) {
  functional_detail::require_own_elements("grad_query", grad_query);
  functional_detail::require_own_elements("grad_key", grad_key);
  functional_detail::require_own_elements("grad_value", grad_value);
  if (functional_detail::backward_writes_over_inputs<float>(
          grad_query, grad_key, grad_value, grad_mask, grad_sinks, query, key, value, output,
          grad_output, log_sum_exp, options)) {
    // Gradients over an input (written in place of the queries): computed apart, then stored.
    functional_detail::backward_apart<float>(
        {grad_query, grad_key, grad_value}, grad_mask, grad_sinks,
        [&](MutableStridedView gq, MutableStridedView gk, MutableStridedView gv,
            MutableStridedView gm, std::span<float> gs) {
          scaled_dot_product_attention_backward(query, key, value, output, grad_output, log_sum_exp,
                                                options, gq, gk, gv, gm, gs);
        });
    return;
  }
  // Rows whose sink outweighs every score: a pass over the scores alone (dominant_sinks.hpp).
  if (functional_detail::sinks_outweigh_scores(log_sum_exp, output, options)) {
    backward_beside_dominant_sinks(query, key, value, output, grad_output, log_sum_exp, options,
                                   grad_query, grad_key, grad_value, grad_mask, grad_sinks);
    return;
  }
  // A row masked to −1e9, or of scores beyond ±1e4, loses log(sum) from its float log-sum-exp:
  // recomputed from the forward's, its P would be off by 2^δ, δ a few of its ulps, which
  // overflows or vanishes at large magnitudes. Such calls take a pass of scores first, for a
  // log-sum-exp from the very scores the backward computes (|lse| > 256 needs scores beyond ±240).
  const bool lost_precision = functional_detail::log_sum_exp_loses_precision(log_sum_exp, options);
  // So do calls of a few queries whose scores reach far from 0: their forward (the decode kernel,
  // or the prefill's tile of few rows) and the backward round each score apart by a few of its
  // ulps, which P = exp(S − lse) from the forward's log-sum-exp carries (row_totals.hpp). Heads
  // of more than kBackwardFewQueries queries run the prefill forward again instead, whose output
  // then agrees with P too (D = dO·O; prefill_without_scans.hpp's RowSource).
  const bool few_far = !lost_precision && functional_detail::few_queries_far_from_zero(
                                              query.shape(), key.shape(), log_sum_exp, options);
  using functional_detail::RowSource;
  RowSource rows = lost_precision ? RowSource::kRecountedWithTotals : RowSource::kGiven;
  if (few_far) {
    rows = query.shape()[query.rank() - 2] > kBackwardFewQueries ? RowSource::kForwardAgain
                                                                 : RowSource::kRecounted;
  }
  // The scanned path below recounts every such row (the forward again's among them).
  const bool recount_rows = rows != RowSource::kGiven;
  // A caller's base-2 log-sum-exp (a ring's block pairs at large scores) takes the same kernel.
  const bool base_two = recount_rows || options.log_sum_exp_recomputed_base_two;
  // Plain and recounted rows: the kernel, which reports what it read, checked after
  // (prefill_without_scans.hpp).
  if (!options.log_sum_exp_recomputed_base_two &&
      functional_detail::backward_without_scans(query, key, value, output, grad_output, log_sum_exp,
                                                options, grad_query, grad_key, grad_value,
                                                grad_mask, grad_sinks, rows)) {
    return;
  }
  PreparedAttention prepared(query, key, value, options, PreparedAttention::kDotProduct);
  const bool mask_gradient = grad_mask.data() != nullptr;
  const bool sinks_gradient = !grad_sinks.empty();
  functional_detail::start_option_gradients(options, grad_mask, grad_sinks);
  prepared.output_layout("output", output);
  prepared.output_layout("grad_output", grad_output);
  prepared.require_log_sum_exp(log_sum_exp, false);
  // The recomputed log-sum-exp gives each row's largest score P = 1; where the float lost log(sum)
  // (ties at 1e9) its row's P totals the keys' count, which dividing grad_output's row cancels.
  std::vector<float> totals;
  const std::vector<float> recomputed =
      recount_rows ? recomputed_log_sum_exp(prepared, log_sum_exp.size(), mask_gradient, &totals)
                   : std::vector<float>();
  Tensor rescaled_grad_output;
  if (lost_precision) {
    rescaled_grad_output =
        functional_detail::grad_output_over_row_totals(prepared, grad_output, totals);
    grad_output = rescaled_grad_output;
  }
  const auto grad_q = prepared.input_layout("grad_query", grad_query, query.shape());
  const auto grad_k = prepared.input_layout("grad_key", grad_key, key.shape());
  const auto grad_v = prepared.input_layout("grad_value", grad_value, value.shape());
  // The kernel's sums (dV, dS, dQ, dK, the mask's and the sinks' gradients) are bounded by products
  // of the inputs' magnitudes: near float's maximum, grad_output, value and output are scaled down
  // by powers of two first and the gradients back up after (finite_range.hpp).
  const double scale = std::fabs(static_cast<double>(prepared.scale()));
  const auto shifts = prepared.gradient_shifts(
      functional_detail::require_finite("grad_output", grad_output),
      functional_detail::require_finite("output", output), scale * prepared.key_max(),
      scale * prepared.query_max(), mask_gradient || sinks_gradient);
  Tensor grad_output_copy, output_copy;
  if (shifts.grad_output > 0) {
    grad_output_copy = functional_detail::scaled_copy(grad_output, shifts.grad_output);
    grad_output = grad_output_copy;
  }
  if (shifts.value > 0) {
    output_copy = functional_detail::scaled_copy(output, shifts.value);
    output = output_copy;
    prepared.scale_value(shifts.value);
  }
  const auto out = prepared.output_layout("output", output);
  const auto grad_out = prepared.output_layout("grad_output", grad_output);
  const std::span<const float> lse = recount_rows ? recomputed : log_sum_exp;
  for (size_t s = 0; s < prepared.slices(); ++s) {
    flash_attention_backward(
        prepared.query(s), prepared.key(s), prepared.value(s), out.slice(output.data(), s),
        grad_out.slice(grad_output.data(), s), prepared.slice_log_sum_exp(lse, s),
        prepared.valid_lens(), prepared.kernel_options(s, mask_gradient),
        grad_q.slice(grad_query.data(), s), grad_k.slice(grad_key.data(), s),
        grad_v.slice(grad_value.data(), s),
        mask_gradient ? prepared.mask_gradient(grad_mask.data(), s) : ScoreMaskGradient{},
        sinks_gradient ? grad_sinks.data() : nullptr, nullptr,
        base_two ? LogSumExpKind::kRecomputedBaseTwo : LogSumExpKind::kForward);
  }
  const int both = shifts.grad_output + shifts.value;
  if (both == 0) return;
  constexpr std::string_view kInputs = "query, key, value and grad_output";
  for (size_t s = 0; s < prepared.slices(); ++s) {
    const std::pair<HeadsView, int> gradients[] = {
        {grad_q.slice(grad_query.data(), s), both},
        {grad_k.slice(grad_key.data(), s), both},
        {grad_v.slice(grad_value.data(), s), shifts.grad_output}};
    const char* names[] = {"grad_query", "grad_key", "grad_value"};
    for (size_t g = 0; g < 3; ++g) {
      functional_detail::scale_heads(gradients[g].first, gradients[g].second);
      functional_detail::require_finite_result(gradients[g].first, names[g], kInputs);
    }
  }
  if (mask_gradient) {
    functional_detail::scale_values(grad_mask.data(), grad_mask.numel(), both);
    functional_detail::require_finite_result(grad_mask.data(), grad_mask.numel(), "grad_mask",
                                             kInputs);
  }
  if (sinks_gradient) {
    const auto count = static_cast<int64_t>(grad_sinks.size());
    functional_detail::scale_values(grad_sinks.data(), count, both);
    functional_detail::require_finite_result(grad_sinks.data(), count, "grad_sinks", kInputs);
  }
}

AttentionBackward scaled_dot_product_attention_backward(
    ConstStridedView query, ConstStridedView key, ConstStridedView value, ConstStridedView output,
    ConstStridedView grad_output, std::span<const float> log_sum_exp,
    const AttentionOptions& options, bool mask_gradient, bool sinks_gradient) {
  functional_detail::OptionGradients option_gradients =
      functional_detail::new_option_gradients(options, mask_gradient, sinks_gradient);
  AttentionBackward grads{Tensor(), Tensor(), Tensor(), std::move(option_gradients.attn_mask),
                          std::move(option_gradients.sinks)};
  // Unwritten until the kernel's threads write every element (or fill them with 0 where nothing
  // flows back): no zero-fill pass first.
  grads.query.assign_uninitialized(query.shape());
  grads.key.assign_uninitialized(key.shape());
  grads.value.assign_uninitialized(value.shape());
  scaled_dot_product_attention_backward(
      query, key, value, output, grad_output, log_sum_exp, options, grads.query, grads.key,
      grads.value, mask_gradient ? MutableStridedView(grads.attn_mask) : MutableStridedView(),
      grads.sinks.span());
  return grads;
}

Tensor attention_weights(ConstStridedView query, ConstStridedView key,
                         std::span<const float> log_sum_exp, const AttentionOptions& options) {
  // The values do not enter the weights: a stand-in with the keys' layout and one column.
  const PreparedAttention prepared(query, key, std::nullopt, options,
                                   PreparedAttention::kDotProduct);
  prepared.require_log_sum_exp(log_sum_exp, false);
  Tensor weights(prepared.scores_shape());
  const auto layout = prepared.layout_like_scores(weights);
  // Rows whose float log-sum-exp lost log(sum) take their own, as the backward pass does: exp(S −
  // lse) from the forward's would be off by a factor per row that could vanish.
  // So do a few queries' rows at scores far from 0, whose forward summed each score in another
  // order (row_totals.hpp): their weights then sum to 1 as the backward's P does.
  const bool imprecise_rows =
      functional_detail::log_sum_exp_loses_precision(log_sum_exp, options) ||
      functional_detail::few_queries_far_from_zero(query.shape(), key.shape(), log_sum_exp,
                                                   options);
  const std::vector<float> recomputed =
      imprecise_rows ? recomputed_log_sum_exp(prepared, log_sum_exp.size(), false)
                     : std::vector<float>();
  const std::span<const float> lse = imprecise_rows ? recomputed : log_sum_exp;
  for (size_t s = 0; s < prepared.slices(); ++s) {
    flash_attention_weights(
        prepared.query(s), prepared.key(s), prepared.slice_log_sum_exp(lse, s),
        prepared.valid_lens(), prepared.kernel_options(s), layout.slice(weights.data(), s),
        imprecise_rows ? LogSumExpKind::kRecomputedBaseTwo : LogSumExpKind::kForward);
  }
  return weights;
}

Tensor attention_dropout_mask(const Shape& query, const Shape& key,
                              const AttentionOptions& options) {
  const Tensor q(query), k(key);
  const PreparedAttention prepared(q, k, std::nullopt, options, PreparedAttention::kShapesOnly);
  Tensor mask(prepared.scores_shape());
  const auto layout = prepared.layout_like_scores(mask);
  const int64_t batch = layout.batch, heads = layout.heads, n = layout.rows, m = layout.cols;
  for (size_t s = 0; s < prepared.slices(); ++s) {
    const Tensor slice =
        flash_attention_dropout_mask(prepared.kernel_options(s), batch * heads, n, m);
    const HeadsView destination = layout.slice(mask.data(), s);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < m; ++j)
            destination.matrix(b, h)[i * destination.row_stride + j] = slice(b * heads + h, i, j);
  }
  return mask;
}

}  // namespace attn
