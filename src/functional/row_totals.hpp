// Backward passes on rows whose float log-sum-exp lost log(sum) to its own magnitude (scores near
// −1e9 from an additive mask that hides a whole row, or beyond 1e7): the kernels' P = exp(S − lse)
// is then the true P_i times one factor per row, its total c_i; grad_output divided by c_i makes
// the backward exact again.
#pragma once

#include <span>

#include "attn/core/shape.hpp"
#include "attn/core/strided_view.hpp"
#include "attn/core/tensor.hpp"
#include "attn/functional/attention_options.hpp"
#include "functional/prepared_attention.hpp"

namespace attn::functional_detail {

// Whether some row's log-sum-exp is beyond float's precision (log_sum_exp_beyond_float_precision:
// finite and beyond 256 in magnitude), and it is this call's own (not
// a ring's block pair's, over more keys: options.log_sum_exp_spans_more_keys; nor a caller's base
// 2 one, options.log_sum_exp_recomputed_base_two, whose totals it divided out). Below it the
// kernels' own error dominates; above it a pass of scores for the rows' totals is worth it.
bool log_sum_exp_loses_precision(std::span<const float> log_sum_exp,
                                 const AttentionOptions& options);

// Whether a call of at most kMaxDecodeQueries queries per head has a row whose scores reach far
// from 0 (|lse| beyond kFarFromZero + log(keys)), on its own log-sum-exp (as above). Such a call's
// forward ran on the decode kernel, or on prefill tiles beside the backward's FewQueryProducts,
// and its float log-sum-exp and output then disagree with the backward's recomputed scores by a
// few ulps of the scores' magnitude: P = exp(S − lse) summed to 1 ± 3e−5, and the gradients
// carried it (dV 5× PyTorch's error near ±60; tools/gradient_error_by_magnitude.py). The backward
// then takes its rows from its own scores (prefill_without_scans.hpp's RowSource; docs/kernels.md,
// "A few queries' backward at scores far from 0").
bool few_queries_far_from_zero(const Shape& query, const Shape& key,
                               std::span<const float> log_sum_exp, const AttentionOptions& options);

// A contiguous copy of `grad_output` (output-shaped, laid out by `prepared`) whose row i is divided
// by its total (`totals`, one per row in the log-sum-exp's order) where that total strays from 1
// by more than 1e−6. With P'_i = c_i·P_i and dO'_i = dO_i / c_i: dV = Σ_i P'_iᵀ dO'_i, D'_i = D_i /
// c_i, dP'_i = dP_i / c_i and dS'_i = P'_i ⊙ (dP'_i − D'_i) are exactly the true ones, dropout, the
// soft cap's derivative and the sinks' gradient included (each linear in those terms). Rows whose
// total is 0 see nothing and stay.
// Whether some row's total (> 0) strays from 1 by more than grad_output_over_row_totals leaves.
bool rows_stray(std::span<const float> totals);

Tensor grad_output_over_row_totals(const PreparedAttention& prepared, ConstStridedView grad_output,
                                   std::span<const float> totals);

}  // namespace attn::functional_detail
