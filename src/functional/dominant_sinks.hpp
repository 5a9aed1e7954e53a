// Backward passes on rows whose attention sink outweighs every score: the forward's log-sum-exp is
// then the sink's to float precision, and P = exp(S − lse) falls under float's normal range.
#pragma once

#include <span>

#include "attn/core/strided_view.hpp"
#include "attn/core/tensor.hpp"
#include "attn/functional/attention_options.hpp"
#include "functional/prepared_attention.hpp"

namespace attn::functional_detail {

// Whether some row's log-sum-exp lies within 2⁻¹⁶·max(1, |sink|) of its head's sink (its scores
// then hold under about that share of its weight) and its output (the forward's, float or a
// half's bits, shaped (..., H, L, Ev) in the log-sum-exp's order) is not all zero. A row that sees
// no key has lse = sink too, and output 0: nothing to differentiate there, and such rows (padding,
// valid lengths of 0, a left-padded causal mask) took the widened half route and two scans of the
// inputs for nothing. False without sinks, for a ring's or a caller's base-2 log-sum-exp
// (options.log_sum_exp_spans_more_keys, options.log_sum_exp_recomputed_base_two), and for an
// output whose rows do not match the log-sum-exp (the pass refuses those).
template <class T>
bool sinks_outweigh_scores(std::span<const float> log_sum_exp, StridedView<const T> output,
                           const AttentionOptions& options);

// A contiguous copy of `grad_output` (laid out by `prepared`, whose options have no sinks) for a
// backward pass without sinks on `scores_log_sum_exp`, the base-2 log-sum-exp of each row's scores
// alone, whose P' = P / w_i: row i times w_i / c_i, where w_i = 1 / (1 + 2^(log2 e · sink − lse₂))
// is the scores' share of the row beside its sink and c_i the row's P' total (`totals`, 1 but where
// the float lost log(sum)). As row_totals.hpp's division, every gradient of the pass is then the
// true one: dV = Σ P'ᵀ dO', and dS = P' ⊙ (dP' − D') with D' = dO'·O. Rows of total 0 stay.
Tensor grad_output_beside_sinks(const PreparedAttention& prepared, ConstStridedView grad_output,
                                std::span<const float> scores_log_sum_exp,
                                std::span<const float> totals, std::span<const float> sinks);

// The sinks' gradient, −Σ_i (1 − w_i)·dO_i·O_i over each head's rows, in double, into
// `grad_sinks` (overwritten).
void sinks_gradient_beside_scores(const PreparedAttention& prepared, ConstStridedView output,
                                  ConstStridedView grad_output,
                                  std::span<const float> scores_log_sum_exp,
                                  std::span<const float> sinks, std::span<float> grad_sinks);

}  // namespace attn::functional_detail
