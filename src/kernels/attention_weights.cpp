// The attention weights of a fused forward pass, recomputed on request: per query tile, the same
// score tiles, modifiers and masks as the forward and backward kernels, then P = exp(S − lse)
// written out row by row. Dot-product and additive scores. Layout as flash_attention.hpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/kernels/additive_attention.hpp"
#include "attn/kernels/flash_attention.hpp"
#include "kernels/kernel_arguments.hpp"
#include "kernels/parallel_tasks.hpp"
#include "kernels/score_masks.hpp"
#include "kernels/scratch_memory.hpp"

#ifndef ATTN_ATTENTION_WEIGHTS_SHARED
#define ATTN_ATTENTION_WEIGHTS_SHARED
namespace attn::weights_detail {

struct WeightsArgs {
  ConstHeadsView q, k;
  const float* log_sum_exp;
  const ValidLengths* valid_lens;
  FlashAttentionOptions options;
  HeadsView weights;
  const float* additive_weights;  // w_v for additive scores; null for dot products
  // The additive scores' form, as the forward pass chose it.
  AdditiveScoreForm additive_form = AdditiveScoreForm::kTanh;
  float* row_totals = nullptr;  // set: each row's total into it (B·H·n), no weights written
  // Set: each row's base-2 log-sum-exp of its own scores (unit log2 e), with its sink's term, into
  // it (B·H·n; −∞ for a row that sees nothing), no weights written and log_sum_exp not read. The
  // scores are the fp32 backward pass's FMA products bit for bit (its Gemm, or in heads of at
  // most kFewQueries queries its FewQueryProducts), so that its P of a row's largest score is
  // 2⁰ = 1 exactly at any magnitude (LogSumExpKind::kRecomputedBaseTwo).
  float* recomputed_log_sum_exp = nullptr;
  // With it, optional: each row's Σ 2^(S − that log-sum-exp), its sink's term included.
  float* recomputed_totals = nullptr;
  // Scores times this unit, exponentials then in base 2 where it is log2 e: the fp32 backward
  // pass's P (flash_attention_backward.cpp). A log-sum-exp read is in the same unit (natural for
  // 1, a recomputed one for log2 e).
  float unit = 1.0F;
};

constexpr size_t kQueryVectors = 4;
constexpr size_t kKeyTile = 64;

}  // namespace attn::weights_detail
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention_weights.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// Highway's headers must follow foreach_target.h.
#include <hwy/highway.h>

#include "kernels/additive_scores-inl.h"
#include "kernels/backward_tiles-inl.h"
#include "kernels/score_modifiers-inl.h"
#include "kernels/tile_gemm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using weights_detail::kKeyTile;
using weights_detail::kQueryVectors;
using weights_detail::WeightsArgs;

struct WeightsScratch {
  ScratchMemory memory;
  float* q_transposed;  // d × Br, scaled
  float* scores;        // Bc × Br
  float* key_rows;      // Bc × d: e^{2k} of a key tile (additive scores' exponential form)
  float* lse;           // Br
  int32_t* first;       // Br
  int32_t* last;        // Br

  WeightsScratch(size_t br, size_t depth, size_t lanes) {
    memory = carve_scratch(lanes, [&](const auto& take) {
      q_transposed = take(depth * br);
      scores = take(kKeyTile * br);
      key_rows = take(kKeyTile * depth);
      lse = take(br);
      first = as_int32(take(br));
      last = as_int32(take(br));
    });
  }
};

// The log-sum-exp is a float: where its magnitude is large (a row of scores near −1e9, as an
// additive mask hides a whole row; scores beyond 1e7) max + log(sum) loses log(sum) to rounding,
// and exp(S − lse) is the row's weights times one factor (four equal scores gave four weights of
// 1). Each row's weights, with its sink's, sum to 1: divide by their sum where it strays. The
// factor is at most 1 (lse rounds up from the row's maximum) and underflows nothing a key of the
// row keeps at float precision.
void RenormalizeRows(const WeightsArgs& args, int64_t h, size_t rows, const TileKeyRanges& ranges,
                     const float* lse, float* out) {
  constexpr double kStray = 1e-6;  // a sum of ≤ 1-ulp exponentials lands closer than this
  for (size_t r = 0; r < rows; ++r) {
    float* row = out + static_cast<int64_t>(r) * args.weights.row_stride;
    double total = 0.0;
    if (args.options.sinks != nullptr) {  // the sink's weight, in the scores' unit
      total = args.unit != 1.0F
                  ? std::exp2(static_cast<double>(args.options.sinks[h] * args.unit) - lse[r])
                  : std::exp(static_cast<double>(args.options.sinks[h]) - lse[r]);
    }
    for (int64_t j = ranges.begin; j < ranges.end; ++j) total += row[j];
    if (!(total > 0.0) || std::abs(total - 1.0) <= kStray) continue;  // hidden rows: all zero
    const auto factor = static_cast<float>(1.0 / total);
    for (int64_t j = ranges.begin; j < ranges.end; ++j) row[j] *= factor;
  }
}

// A recount's key tile (base 2; `keys` rows of Br lanes, the first `rows` lanes the tile's queries)
// added to each query's running maximum and its total Σ 2^(S − maximum) (in double, at least 1 once
// a score is seen): the tile's maxima as vectors, each total rescaled where its maximum moved, then
// the tile's exponentials (ProbabilityExp2, the backward's own 2^x, 1.6e−7) added lane by lane.
// (A scalar double exp2 per score took most of a 16-query recount: 9 ns a score.)
template <class D>
HWY_INLINE void AddTileToTotals(D d, size_t keys, size_t br, size_t rows, const float* scores,
                                float* maxima, double* totals) {
  const size_t lanes = hn::Lanes(d);
  const auto minus_infinity = hn::Set(d, -std::numeric_limits<float>::infinity());
  HWY_ALIGN float new_maxima[hn::MaxLanes(d)];
  HWY_ALIGN float exponentials[hn::MaxLanes(d)];
  for (size_t r0 = 0; r0 < rows; r0 += lanes) {
    const size_t count = std::min(lanes, rows - r0);
    auto tile_max = minus_infinity;
    for (size_t j = 0; j < keys; ++j)
      tile_max = hn::Max(tile_max, hn::Load(d, scores + j * br + r0));
    const auto new_max = hn::Max(hn::LoadU(d, maxima + r0), tile_max);
    hn::Store(new_max, d, new_maxima);
    for (size_t l = 0; l < count; ++l) {
      if (new_maxima[l] > maxima[r0 + l] && totals[r0 + l] > 0.0) {
        totals[r0 + l] *= std::exp2(static_cast<double>(maxima[r0 + l]) - new_maxima[l]);
      }
    }
    hn::StoreU(new_max, d, maxima + r0);
    // Lanes that have seen nothing keep −∞ scores against 0: 2^−∞ = 0, never ∞ − ∞.
    const auto base = hn::IfThenElse(hn::Eq(new_max, minus_infinity), hn::Zero(d), new_max);
    for (size_t j = 0; j < keys; ++j) {
      const auto shifted = hn::Sub(hn::Load(d, scores + j * br + r0), base);
      hn::Store(ProbabilityExp2(d, shifted), d, exponentials);
      for (size_t l = 0; l < count; ++l) totals[r0 + l] += exponentials[l];
    }
  }
}

void WeightsTile(const WeightsArgs& args, int64_t b, int64_t h, int64_t first_query,
                 WeightsScratch& s) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  const size_t br = kQueryVectors * lanes;
  const size_t depth = static_cast<size_t>(args.q.cols);
  const int64_t n = args.q.rows, m = args.k.rows;
  const size_t rows =
      static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(br), n - first_query));
  const int64_t kv_head = h / (args.q.heads / args.k.heads);
  QueryTile tile{b, h, first_query, rows, n, m, s.first, s.last, {}};
  tile.ranges = tile_key_ranges(*args.valid_lens, args.options, b, h, first_query, rows, br, n, m,
                                s.first, s.last);
  const float* q = args.q.matrix(b, h) + first_query * args.q.row_stride;
  const bool recomputes = args.recomputed_log_sum_exp != nullptr;
  const float* lse =
      recomputes ? nullptr : args.log_sum_exp + (b * args.q.heads + h) * n + first_query;
  for (size_t r = 0; r < br; ++r) {
    s.lse[r] =
        !recomputes && r < rows && lse[r] > -std::numeric_limits<float>::infinity() ? lse[r] : 0.0F;
  }
  // Zeros only in the query vectors the score products read.
  if (args.additive_weights != nullptr) {
    PrepareAdditiveQueries<kQueryVectors>(d, q, static_cast<size_t>(args.q.row_stride), rows, depth,
                                          args.options.scale * args.unit, br,
                                          exponential(args.additive_form), s.q_transposed);
  } else {
    TransposeScaledTile(q, static_cast<size_t>(args.q.row_stride), rows, depth,
                        args.options.scale * args.unit, br,
                        VectorsHolding(d, rows, kQueryVectors) * hn::Lanes(d), s.q_transposed);
  }
  // Base 2 (a recount, or weights from its log-sum-exp) in a head of at most kFewQueries queries:
  // the scores as the backward computes them there (FewQueryProducts, dot products along the
  // head, where a vector's lanes would hold one query), so that the recount, the weights and the
  // backward agree bit for bit (at scores of 1e9 one ulp is 2^±128 in P).
  const bool few_query_products = args.additive_weights == nullptr && args.unit != 1.0F &&
                                  n <= static_cast<int64_t>(kFewQueries);
  const bool totals_only = args.row_totals != nullptr;
  const bool writes_weights = !totals_only && !recomputes;
  float* out =
      writes_weights ? args.weights.matrix(b, h) + first_query * args.weights.row_stride : nullptr;
  for (size_t r = 0; r < rows && writes_weights; ++r)
    std::fill_n(out + static_cast<int64_t>(r) * args.weights.row_stride, m, 0.0F);
  // Summed in double: a float sum of m weights would carry m ulps.
  std::vector<double> totals(totals_only || recomputes ? br : 0, 0.0);
  // Recomputing (in base 2: flash_attention_recomputed_log_sum_exp's unit): each row's running
  // maximum score, totals[r] then Σ 2^(S − maximum), a key tile at a time (AddTileToTotals).
  std::vector<float> maxima(recomputes ? br : 0, -std::numeric_limits<float>::infinity());
  // The sink as one more score (a float, as the scores are).
  const auto add_sink = [&](size_t r, float sink) {
    if (sink > maxima[r]) {
      totals[r] = totals[r] * std::exp2(static_cast<double>(maxima[r]) - sink) + 1.0;
      maxima[r] = sink;
    } else {
      totals[r] += std::exp2(static_cast<double>(sink) - maxima[r]);
    }
  };
  const float* keys = args.k.matrix(b, kv_head);
  const auto key_stride = static_cast<size_t>(args.k.row_stride);
  for (int64_t key0 = tile.ranges.begin; key0 < tile.ranges.end;
       key0 += static_cast<int64_t>(kKeyTile)) {
    const size_t bc = static_cast<size_t>(
        std::min<int64_t>(static_cast<int64_t>(kKeyTile), tile.ranges.end - key0));
    const MaskCoverage coverage =
        mask_coverage(args.options.mask, b, h, first_query, rows, key0, bc);
    if (coverage == MaskCoverage::kNone) continue;
    const float* key_rows = keys + key0 * args.k.row_stride;
    if (exponential(args.additive_form)) {
      DoubledExponentialRows(d, key_rows, key_stride, bc, depth, s.key_rows);
      AdditiveScoresOfQueries<kQueryVectors, true>(d, rows, bc, s.key_rows, depth, s.q_transposed,
                                                   br, depth, args.additive_weights, s.scores,
                                                   terms_per_reciprocal(args.additive_form));
    } else if (args.additive_weights != nullptr) {
      AdditiveScoresOfQueries<kQueryVectors, false>(d, rows, bc, key_rows, key_stride,
                                                    s.q_transposed, br, depth,
                                                    args.additive_weights, s.scores, 1);
    } else if (few_query_products) {
      FewQueryProducts(bc, rows, br, key_rows, key_stride, q,
                       static_cast<size_t>(args.q.row_stride), depth,
                       args.options.scale * args.unit, s.scores);
    } else {
      GemmZeroPaddedColumns(d, bc, kQueryVectors, rows, key_rows, key_stride, 1, s.q_transposed, br,
                            depth, s.scores, br);
    }
    ApplyScoreModifiers(d, args.options, tile, key0, bc, br, br, coverage == MaskCoverage::kSome,
                        s.scores, nullptr, args.unit);
    if (recomputes) {
      AddTileToTotals(d, bc, br, rows, s.scores, maxima.data(), totals.data());
      continue;
    }
    if (args.unit != 1.0F) {
      ProbabilitiesFromScores<ProbabilityExp::kBaseTwo>(d, bc, br, br, s.lse, s.scores);
    } else {
      ProbabilitiesFromScores(d, bc, br, br, s.lse, s.scores);
    }
    for (size_t r = 0; r < rows; ++r) {
      if (totals_only) {
        for (size_t j = 0; j < bc; ++j) totals[r] += s.scores[j * br + r];
        continue;
      }
      float* row = out + static_cast<int64_t>(r) * args.weights.row_stride + key0;
      for (size_t j = 0; j < bc; ++j) row[j] = s.scores[j * br + r];
    }
  }
  if (writes_weights) {
    RenormalizeRows(args, h, rows, tile.ranges, s.lse, out);
    return;
  }
  if (recomputes) {
    float* row_lse = args.recomputed_log_sum_exp + (b * args.q.heads + h) * n + first_query;
    for (size_t r = 0; r < rows; ++r) {
      // The sink as one more score, in the keys' unit (a float, as the scores are).
      if (args.options.sinks != nullptr) add_sink(r, args.options.sinks[h] * args.unit);
      // A row's largest score plus a log of at least 0: exactly that score where the others add
      // less than its half ulp.
      const bool sees = maxima[r] > -std::numeric_limits<float>::infinity();
      row_lse[r] = sees ? static_cast<float>(static_cast<double>(maxima[r]) + std::log2(totals[r]))
                        : -std::numeric_limits<float>::infinity();
      // Where the float lost log(sum) (ties at scores of 1e9), the row's P total that many times 1.
      if (args.recomputed_totals != nullptr) {
        const double shift = static_cast<double>(maxima[r]) - row_lse[r];
        args.recomputed_totals[(b * args.q.heads + h) * n + first_query + static_cast<int64_t>(r)] =
            sees ? static_cast<float>(totals[r] * std::exp2(shift)) : 0.0F;
      }
    }
    return;
  }
  float* row_totals = args.row_totals + (b * args.q.heads + h) * n + first_query;
  for (size_t r = 0; r < rows; ++r) {
    // The sink's share in the keys' unit (2^(log2 e · sink − lse₂) in base 2), so that it carries
    // the same factor as the keys' P.
    if (args.options.sinks != nullptr) {
      const double sink = static_cast<double>(args.options.sinks[h]) * args.unit - s.lse[r];
      totals[r] += args.unit != 1.0F ? std::exp2(sink) : std::exp(sink);
    }
    row_totals[r] = static_cast<float>(totals[r]);
  }
}

void AttentionWeights(const WeightsArgs& args) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  const size_t br = kQueryVectors * lanes;
  const int64_t tiles_per_head =
      (args.q.rows + static_cast<int64_t>(br) - 1) / static_cast<int64_t>(br);
  const int64_t tasks = args.q.batch * args.q.heads * tiles_per_head;
  run_parallel_tasks(
      tasks, "attention weights", TaskSchedule::kDynamic,
      [&] { return WeightsScratch(br, static_cast<size_t>(args.q.cols), lanes); },
      [&](int64_t task, WeightsScratch& scratch, int) {
        const int64_t head = task / tiles_per_head;
        WeightsTile(args, head / args.q.heads, head % args.q.heads,
                    (task % tiles_per_head) * static_cast<int64_t>(br), scratch);
      });
}

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {

HWY_EXPORT(AttentionWeights);

namespace {
void compute_weights(const weights_detail::WeightsArgs& args) {
  if (args.recomputed_log_sum_exp == nullptr)
    require_log_sum_exp(args.log_sum_exp, args.q.batch * args.q.heads * args.q.rows);
  // The values' shape does not matter here: check the rest against a stand-in of one column.
  const ConstHeadsView values{nullptr, args.k.batch, args.k.heads, args.k.rows, 1, 0, 0, 0};
  const ConstHeadsView out{nullptr, args.q.batch, args.q.heads, args.q.rows, 1, 0, 0, 0};
  if (!check_attention_arguments(args.q, args.k, values, out, *args.valid_lens, args.options))
    return;
  if (args.row_totals == nullptr && args.recomputed_log_sum_exp == nullptr) {
    require_matrices(args.weights, "weights", args.q.batch, args.q.heads, args.q.rows, args.k.rows,
                     "one row per query, one column per key");
  }
  HWY_DYNAMIC_DISPATCH(AttentionWeights)(args);
}
}  // namespace

void flash_attention_weights(ConstHeadsView q, ConstHeadsView k, const float* log_sum_exp,
                             const ValidLengths& valid_lens, const FlashAttentionOptions& options,
                             HeadsView weights, LogSumExpKind kind) {
  weights_detail::WeightsArgs args{q, k, log_sum_exp, &valid_lens, options, weights, nullptr};
  if (kind == LogSumExpKind::kRecomputedBaseTwo) args.unit = std::numbers::log2e_v<float>;
  compute_weights(args);
}

void flash_attention_recomputed_log_sum_exp(ConstHeadsView q, ConstHeadsView k,
                                            const ValidLengths& valid_lens,
                                            const FlashAttentionOptions& options,
                                            float* log_sum_exp_base_two, float* totals) {
  if (log_sum_exp_base_two == nullptr && q.batch * q.heads * q.rows > 0)
    throw ValueError("log_sum_exp_base_two: expected room for the rows' values, got null");
  weights_detail::WeightsArgs args{q, k, nullptr, &valid_lens, options, {}, nullptr};
  args.recomputed_log_sum_exp = log_sum_exp_base_two;
  args.recomputed_totals = totals;
  args.unit = std::numbers::log2e_v<float>;
  // Rows of a call with no work (no keys) keep these: the sink's score alone, or −∞.
  for (int64_t head = 0; head < q.batch * q.heads; ++head) {
    const int64_t h = head % q.heads;
    std::fill_n(log_sum_exp_base_two + head * q.rows, q.rows,
                options.sinks != nullptr ? options.sinks[h] * args.unit
                                         : -std::numeric_limits<float>::infinity());
    if (totals != nullptr)
      std::fill_n(totals + head * q.rows, q.rows, options.sinks != nullptr ? 1.0F : 0.0F);
  }
  compute_weights(args);
}

void additive_attention_row_totals(ConstHeadsView projected_queries, ConstHeadsView projected_keys,
                                   std::span<const float> w_v, const float* log_sum_exp,
                                   const ValidLengths& valid_lens,
                                   const FlashAttentionOptions& options, float* totals) {
  require_additive_arguments(w_v, options, projected_queries, projected_keys);
  FlashAttentionOptions additive = options;
  additive.scale = 1.0F;
  weights_detail::WeightsArgs args{
      projected_queries,
      projected_keys,
      log_sum_exp,
      &valid_lens,
      additive,
      {},
      w_v.data(),
      additive_score_form(projected_queries, projected_keys, w_v, options.additive_input_bound)};
  args.row_totals = totals;
  compute_weights(args);
}

void additive_attention_weights(ConstHeadsView projected_queries, ConstHeadsView projected_keys,
                                std::span<const float> w_v, const float* log_sum_exp,
                                const ValidLengths& valid_lens,
                                const FlashAttentionOptions& options, HeadsView weights) {
  require_additive_arguments(w_v, options, projected_queries, projected_keys);
  FlashAttentionOptions additive = options;
  additive.scale = 1.0F;
  compute_weights(
      {projected_queries, projected_keys, log_sum_exp, &valid_lens, additive, weights, w_v.data(),
       additive_score_form(projected_queries, projected_keys, w_v, options.additive_input_bound)});
}

}  // namespace attn
#endif  // HWY_ONCE
