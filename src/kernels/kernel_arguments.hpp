// The argument checks every fused attention kernel shares: head layouts that agree (grouped-query
// heads included), options in range, lengths that fit. Each names the argument and what it got.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "attn/core/valid_lengths.hpp"
#include "attn/kernels/fused_options.hpp"
#include "attn/kernels/heads_view.hpp"

namespace attn {

// ShapeError unless `view` holds batch × heads matrices of rows × cols; `expected` says why.
void require_matrices(const ConstHeadsView& view, std::string_view name, int64_t batch,
                      int64_t heads, int64_t rows, int64_t cols, std::string_view expected);

// Checks q (B·H: n × d), k (B·H_kv: m × d), v (B·H_kv: m × dv) and out (B·H: n × dv) — H_kv
// dividing H — the options' ranges and the valid lengths. Returns false when there is nothing to
// compute (no batch, head, query or value column).
bool check_attention_arguments(const ConstHeadsView& q, const ConstHeadsView& k,
                               const ConstHeadsView& v, const ConstHeadsView& out,
                               const ValidLengths& valid_lens,
                               const FlashAttentionOptions& options);

// ValueError unless |diagonal_offset| < Shape::kMaxElements (2^61 − 1), as a window's sides are
// bounded (SlidingWindow::bounded): a query's diagonal key plus a side then stays within int64
// (INT64_MAX wrapped around and hid every key).
void require_diagonal_offset(int64_t diagonal_offset);

// ShapeError unless w_v holds one weight per hidden unit and the keys have the queries' heads;
// ValueError for the options additive attention does not take (scale ≠ 1 is ignored: w_v carries
// it; softcap, ALiBi and sinks are refused).
void require_additive_arguments(std::span<const float> w_v, const FlashAttentionOptions& options,
                                const ConstHeadsView& projected_queries,
                                const ConstHeadsView& projected_keys);

// The largest |q| and |k| for which additive scores take the exponential form
// (additive_scores-inl.h): e^{2(q + k)} then stays within [e^-42, e^42], and the product of two
// terms' denominators (e^{2(q + k)} + 1 each: one reciprocal for two terms) within e^84, far from
// float's overflow and subnormals.
inline constexpr float kAdditiveExponentialLimit = 10.5F;
// The largest |w_v| element for the exponential form: a pair's numerator w0·a1 + w1·a0 then stays
// below 2^64 · 2 e^42 < 2^126.
inline constexpr float kAdditiveExponentialWeightLimit = 0x1p64F;

// The largest |q| and |k| for four terms a reciprocal (AccumulateScaledTerms): each scaled
// denominator e^{2k} + e^{−2q} within [2e^−16, 2e^16], the product of four within [2^−89, 2^97].
inline constexpr float kAdditiveQuadLimit = 8.0F;
// The largest |w_v| element for four terms a reciprocal: the numerator, at most 4·max|w| times the
// denominators' product, stays below 2^123.
inline constexpr float kAdditiveQuadWeightLimit = 0x1p24F;
// The same for eight terms a reciprocal: each scaled denominator within [2e^−8, 2e^8], the product
// of eight within [2^−85, 2^101], the numerator (at most 8·max|w| times it) below 2^124.
inline constexpr float kAdditiveEightLimit = 4.0F;
inline constexpr float kAdditiveEightWeightLimit = 0x1p20F;

// How the additive kernels compute a score's terms (additive_scores-inl.h): tanh directly, or in
// the exponential form with two, four or eight terms a reciprocal (each form's value its count).
enum class AdditiveScoreForm : size_t {
  kTanh = 1,
  kExponentialPairs = 2,
  kExponentialQuads = 4,
  kExponentialEights = 8
};
inline bool exponential(AdditiveScoreForm form) {
  return form != AdditiveScoreForm::kTanh;
}
// The terms that share a reciprocal in `form` (AdditiveScoresOfQueries' `terms`; 1 for kTanh).
inline size_t terms_per_reciprocal(AdditiveScoreForm form) {
  return static_cast<size_t>(form);
}

// The exponential form where every element of the projected queries and keys lies within
// ±kAdditiveExponentialLimit and every weight within ±kAdditiveExponentialWeightLimit (NaN and ±∞
// do not), its quads and eights within theirs; else kTanh. The forward, backward and weights
// kernels ask it of the same inputs, so they all compute the same scores. `input_bound` ≥ 0 stands
// for the projections' largest magnitude (FlashAttentionOptions::additive_input_bound: the
// caller's scan of them), which is then not scanned again.
AdditiveScoreForm additive_score_form(const ConstHeadsView& projected_queries,
                                      const ConstHeadsView& projected_keys,
                                      std::span<const float> w_v, float input_bound = -1.0F);

// Throws ValueError unless `log_sum_exp` is given (a backward pass needs the forward pass's) for
// the `query_rows` query rows (B·H·n) there are; none have none (an empty span's data may be null).
void require_log_sum_exp(const float* log_sum_exp, int64_t query_rows);

}  // namespace attn
