// Fused additive (Bahdanau) attention, backward: FlashAttention-2's tiling (key tiles outer, query
// tiles inner, probabilities recomputed from the forward pass's log-sum-exp) with additive scores.
//
// Derivation, with a = projected queries, b = projected keys, u_ijt = tanh(a_it + b_jt),
// S_ij = Σ_t w_t u_ijt, P = softmax(S) masked, Z the dropout multipliers, O = (P ⊙ Z) V:
//   dV = (P ⊙ Z)ᵀ dO,   dP = Z ⊙ (dO Vᵀ),   dS = P ⊙ (dP − D) with D_i = Σ_t dO_it O_it,
//   g_ijt = dS_ij w_t (1 − u_ijt²):   da_i = Σ_j g_ij,   db_j = Σ_i g_ij,   dw_t = Σ_ij dS_ij
//   u_ijt.
// Tiles are transposed (keys × queries, queries along the lanes) as in the forward kernel, so D,
// the log-sum-exp and da accumulate lane-wise; db needs one horizontal sum per (key, t, query
// tile). u is evaluated twice per (i, j, t), once for S and once for the gradients, and never
// stored: its (n, m, h) tensor is what the fused kernels exist to avoid.
//
// Work: one task per (batch, head), or, when there are fewer heads than threads, per (head, chunk
// of key tiles); chunks write disjoint db and dV rows and partial da, summed in chunk order after
// the parallel region. dw is summed per task and reduced in task order, so results depend on the
// thread count only through the chunking and are reproducible for a fixed thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/kernels/additive_attention.hpp"
#include "kernels/dropout_hash.hpp"
#include "kernels/kernel_arguments.hpp"
#include "kernels/parallel_tasks.hpp"
#include "kernels/score_masks.hpp"
#include "kernels/scratch_memory.hpp"

#ifndef ATTN_ADDITIVE_ATTENTION_BACKWARD_SHARED
#define ATTN_ADDITIVE_ATTENTION_BACKWARD_SHARED
namespace attn::additive_backward_detail {

struct AdditiveBackwardArgs {
  ConstHeadsView queries, keys, values, out, grad_out;  // queries, keys: projected
  const float* weights;                                 // w_v: queries.cols values
  const float* log_sum_exp;
  const ValidLengths* valid_lens;
  FlashAttentionOptions options;
  HeadsView grad_queries, grad_keys, grad_values;
  float* grad_weights;  // queries.cols values
  // Scores and u in the exponential form (additive_scores-inl.h), as the forward pass chose.
  AdditiveScoreForm form = AdditiveScoreForm::kTanh;
};

constexpr size_t kQueryVectors = 4;  // Br = 4 · lanes, as the forward kernel
constexpr size_t kKeyTile = 64;      // Bc: the Bc × Br tiles of P, dP, dS stay in L1

}  // namespace attn::additive_backward_detail
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/additive_attention_backward.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// Highway's headers must follow foreach_target.h.
#include <hwy/highway.h>

#include "kernels/additive_scores-inl.h"
#include "kernels/backward_tiles-inl.h"
#include "kernels/dropout-inl.h"
#include "kernels/fast_math-inl.h"
#include "kernels/score_modifiers-inl.h"
#include "kernels/tile_gemm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using additive_backward_detail::AdditiveBackwardArgs;
using additive_backward_detail::kKeyTile;
using additive_backward_detail::kQueryVectors;

// Where AdditiveGradients leaves db_jt = Σ_i g_ij: a float per key and hidden unit, each query
// tile's lanes summed into it; or, where a task has several query tiles, a vector of lane-wise
// partial sums per key and hidden unit, whose lanes are summed once per key tile (Value) instead
// of once per query tile: a horizontal sum and a scalar read-modify-write per key, hidden unit and
// query tile were about 5% of the backward at n = 1024, d = 64 (Zen 4). One tile (a decoder step)
// keeps the floats, whose buffer is lanes times smaller to clear.
struct KeySums {
  float* sums = nullptr;   // Bc × h
  float* lanes = nullptr;  // Bc × h × lanes

  template <class D>
  void Add(D d, size_t j, size_t t, size_t depth, hn::Vec<D> values) const {
    const size_t index = j * depth + t;
    if (lanes == nullptr) {
      sums[index] += hn::GetLane(hn::SumOfLanes(d, values));
      return;
    }
    float* partial = lanes + index * hn::Lanes(d);
    hn::Store(hn::Add(hn::Load(d, partial), values), d, partial);
  }
  // values' first `count` lanes to key j's hidden units t, t + 1, …: a tile of one query, whose
  // vectors run over the units (OneQueryAdditiveGradients).
  template <class D>
  void AddUnits(D d, size_t j, size_t t, size_t count, size_t depth, hn::Vec<D> values) const {
    const size_t index = j * depth + t;
    if (lanes == nullptr && count == hn::Lanes(d)) {
      hn::StoreU(hn::Add(hn::LoadU(d, sums + index), values), d, sums + index);
      return;
    }
    HWY_ALIGN float stored[HWY_MAX_BYTES / sizeof(float)];
    hn::Store(values, d, stored);
    for (size_t l = 0; l < count; ++l) {
      if (lanes == nullptr) {
        sums[index + l] += stored[l];
      } else {
        lanes[(index + l) * hn::Lanes(d)] += stored[l];
      }
    }
  }
  template <class D>
  float Value(D d, size_t j, size_t t, size_t depth) const {
    const size_t index = j * depth + t;
    if (lanes == nullptr) return sums[index];
    return hn::GetLane(hn::SumOfLanes(d, hn::Load(d, lanes + index * hn::Lanes(d))));
  }
  template <class D>
  void Clear(D d, size_t bc, size_t depth) const {
    if (lanes == nullptr) {
      std::fill(sums, sums + bc * depth, 0.0F);
    } else {
      std::fill(lanes, lanes + bc * depth * hn::Lanes(d), 0.0F);
    }
  }
};

// Per-thread scratch for one task at a time; sized once per call.
struct AdditiveBackwardScratch : BackwardTileBuffers {
  ScratchMemory memory;
  float* queries_transposed;       // tiles × h × Br: aᵀ per query tile
  float* grad_queries_transposed;  // tiles × h × Br: daᵀ
  KeySums grad_keys;               // db (without its factor 4w_t in the exponential form)
  float* grad_values;              // Bc × dv_padded
  float* grad_weight_lanes;        // h × lanes: dw, lane-wise partial sums
  float* key_exponentials;         // Bc × h: e^{2b} of the key tile (the exponential form)

  AdditiveBackwardScratch(size_t n, size_t hidden, size_t dv, size_t lanes) {
    const size_t br = kQueryVectors * lanes, bc = kKeyTile;
    const size_t n_padded = (n + br - 1) / br * br;
    const size_t dv_padded = hwy::RoundUpTo(dv, lanes);
    memory = carve_scratch(lanes, [&](const auto& take) {
      take_tile_buffers(take, n, br, bc, dv, dv_padded);
      queries_transposed = take(n_padded * hidden);
      grad_queries_transposed = take(n_padded * hidden);
      // Lane-wise sums where a task has several query tiles (KeySums).
      grad_keys.lanes = n > br ? take(bc * hidden * lanes) : nullptr;
      grad_keys.sums = n > br ? nullptr : take(bc * hidden);
      grad_values = take(bc * dv_padded);
      grad_weight_lanes = take(hidden * lanes);
      key_exponentials = take(bc * hidden);
    });
  }
};

// For one key tile × query tile, given dSᵀ (bc × Br): recomputes u = tanh(aᵀ[t] + b[j, t]) and
// accumulates daᵀ[t] += Σ_j g_j, db[j, t] += Σ_i g_ij (`grad_keys`) and the lane-wise
// dw[t] += Σ_j dSᵀ[j] u, with g = dS · w_t · (1 − u²). One t at a time keeps aᵀ[t], daᵀ[t] and
// dw[t] in registers while the bc rows of dSᵀ stream from L1. Over the first NR query vectors:
// the others' dS is zero (AdditiveGradientsOfQueries).
//
// The exponential form has u = 1 − 2R with R = 1/(e^{2a}e^{2b} + 1), so 1 − u² = 4R(1 − R), and
// with s = dS·R: g = 4w_t (s − s·R) and dS·u = dS − 2s. The factor 4w_t leaves the sums (applied
// once per t and key), and Σ dS over the tile, the same for every t, is summed once: per pair and
// hidden unit one product s, one s − s·R and the sums beside the reciprocal, two operations fewer
// than forming dS·w and u first (the loop is bound by its operation count: 1.11× / 1.16× faster
// at n = 1024 / 256, Zen 4).
template <size_t NR, bool kExponential, class D>
HWY_NOINLINE void AdditiveGradients(D d, size_t bc, const float* HWY_RESTRICT keys,
                                    size_t key_stride, const float* HWY_RESTRICT q_transposed,
                                    size_t br, size_t depth, const float* HWY_RESTRICT weights,
                                    const float* HWY_RESTRICT grad_scores,
                                    float* HWY_RESTRICT grad_q_transposed, const KeySums& grad_keys,
                                    float* HWY_RESTRICT grad_weight_lanes) {
  using V = hn::Vec<D>;
  const size_t lanes = hn::Lanes(d);
  if constexpr (kExponential) {
    V grad_score_sum = hn::Zero(d);  // Σ_j Σ_v dSᵀ[j][v], lane-wise
    for (size_t j = 0; j < bc; ++j)
      for (size_t v = 0; v < NR; ++v)
        grad_score_sum = hn::Add(grad_score_sum, hn::Load(d, grad_scores + j * br + v * lanes));
    for (size_t t = 0; t < depth; ++t) {
      const float weight = 4.0F * weights[t];
      V queries[NR], sums[NR];
      for (size_t v = 0; v < NR; ++v) {
        queries[v] = hn::Load(d, q_transposed + t * br + v * lanes);
        sums[v] = hn::Zero(d);
      }
      V weighted_reciprocals = hn::Zero(d);  // Σ s
      for (size_t j = 0; j < bc; ++j) {
        const V key = hn::Set(d, keys[j * key_stride + t]);
        V key_sum = hn::Zero(d);
        for (size_t v = 0; v < NR; ++v) {
          const V reciprocal = ReciprocalOfProductPlusOne(d, queries[v], key);
          const V product = hn::Mul(hn::Load(d, grad_scores + j * br + v * lanes), reciprocal);
          weighted_reciprocals = hn::Add(weighted_reciprocals, product);
          const V g = hn::NegMulAdd(product, reciprocal, product);  // s (1 − R)
          sums[v] = hn::Add(sums[v], g);
          key_sum = hn::Add(key_sum, g);
        }
        grad_keys.Add(d, j, t, depth, key_sum);
      }
      const V weight_vector = hn::Set(d, weight);
      for (size_t v = 0; v < NR; ++v) {
        float* grad_queries = grad_q_transposed + t * br + v * lanes;
        hn::Store(hn::MulAdd(weight_vector, sums[v], hn::Load(d, grad_queries)), d, grad_queries);
      }
      const V grad_weight = hn::NegMulAdd(hn::Set(d, 2.0F), weighted_reciprocals, grad_score_sum);
      float* lane_sums = grad_weight_lanes + t * lanes;
      hn::Store(hn::Add(hn::Load(d, lane_sums), grad_weight), d, lane_sums);
    }
    return;
  }
  for (size_t t = 0; t < depth; ++t) {
    const V weight = hn::Set(d, weights[t]);
    V queries[NR], grad_queries[NR];
    for (size_t v = 0; v < NR; ++v) {
      queries[v] = hn::Load(d, q_transposed + t * br + v * lanes);
      grad_queries[v] = hn::Load(d, grad_q_transposed + t * br + v * lanes);
    }
    V grad_weight = hn::Load(d, grad_weight_lanes + t * lanes);
    for (size_t j = 0; j < bc; ++j) {
      const V key = hn::Set(d, keys[j * key_stride + t]);
      V grad_key = hn::Zero(d);
      for (size_t v = 0; v < NR; ++v) {
        const V grad_score = hn::Load(d, grad_scores + j * br + v * lanes);
        const V weighted = hn::Mul(grad_score, weight);
        const V u = AdditiveTanh(d, hn::Add(queries[v], key));
        const V g = hn::NegMulAdd(hn::Mul(weighted, u), u, weighted);  // dS w (1 − u²)
        grad_weight = hn::MulAdd(grad_score, u, grad_weight);
        grad_queries[v] = hn::Add(grad_queries[v], g);
        grad_key = hn::Add(grad_key, g);
      }
      grad_keys.Add(d, j, t, depth, grad_key);
    }
    for (size_t v = 0; v < NR; ++v)
      hn::Store(grad_queries[v], d, grad_q_transposed + t * br + v * lanes);
    hn::Store(grad_weight, d, grad_weight_lanes + t * lanes);
  }
}

// `values`' first `count` lanes added to data[0], data[stride], data[2·stride], …
template <class D>
HWY_INLINE void AddStrided(D d, hn::Vec<D> values, size_t count, float* data, size_t stride) {
  HWY_ALIGN float stored[HWY_MAX_BYTES / sizeof(float)];
  hn::Store(values, d, stored);
  for (size_t l = 0; l < count; ++l) data[l * stride] += stored[l];
}

// AdditiveGradients for a tile of one query, whose row PrepareAdditiveQueries left contiguous in
// `query` (e^{2a} in the exponential form): vectors over the hidden units, each key's dS (lane 0
// of its row of dSᵀ) broadcast, the same terms as AdditiveGradients' lanes. daᵀ's and dw's lanes
// (one query's column of daᵀ, lane 0 of dw's per-unit vectors) are added to where that layout
// keeps them, once per vector of units.
template <bool kExponential, class D>
HWY_NOINLINE void OneQueryAdditiveGradients(
    D d, size_t bc, const float* HWY_RESTRICT keys, size_t key_stride,
    const float* HWY_RESTRICT query, size_t br, size_t depth, const float* HWY_RESTRICT weights,
    const float* HWY_RESTRICT grad_scores, float* HWY_RESTRICT grad_q_transposed,
    const KeySums& grad_keys, float* HWY_RESTRICT grad_weight_lanes) {
  using V = hn::Vec<D>;
  const size_t lanes = hn::Lanes(d);
  float grad_score_sum = 0.0F;  // Σ_j dS_j
  for (size_t j = 0; j < bc; ++j) grad_score_sum += grad_scores[j * br];
  for (size_t t = 0; t < depth; t += lanes) {
    const size_t count = std::min(lanes, depth - t);
    const auto load = [&](const float* data) {
      return count == lanes ? hn::LoadU(d, data) : LoadPadded(d, data, count);
    };
    const V q = load(query + t), weight = load(weights + t);
    V grad_query = hn::Zero(d), grad_weight = hn::Zero(d);
    for (size_t j = 0; j < bc; ++j) {
      const V key = load(keys + j * key_stride + t);
      const V grad_score = hn::Set(d, grad_scores[j * br]);
      V g;
      if constexpr (kExponential) {
        // As AdditiveGradients: s = dS·R, g = s (1 − R) (its factor 4w_t applied below and at
        // the key rows' write-out), dS·u = dS − 2s (dw's Σ_j dS added below).
        const V reciprocal = ReciprocalOfProductPlusOne(d, q, key);
        const V product = hn::Mul(grad_score, reciprocal);
        grad_weight = hn::Add(grad_weight, product);
        g = hn::NegMulAdd(product, reciprocal, product);
      } else {
        const V weighted = hn::Mul(grad_score, weight);
        const V u = AdditiveTanh(d, hn::Add(q, key));
        g = hn::NegMulAdd(hn::Mul(weighted, u), u, weighted);  // dS w (1 − u²)
        grad_weight = hn::MulAdd(grad_score, u, grad_weight);
      }
      grad_query = hn::Add(grad_query, g);
      grad_keys.AddUnits(d, j, t, count, depth, g);
    }
    if constexpr (kExponential) {
      grad_query = hn::Mul(hn::Mul(hn::Set(d, 4.0F), weight), grad_query);
      grad_weight = hn::NegMulAdd(hn::Set(d, 2.0F), grad_weight, hn::Set(d, grad_score_sum));
    }
    AddStrided(d, grad_query, count, grad_q_transposed + t * br, br);
    AddStrided(d, grad_weight, count, grad_weight_lanes + t * lanes, lanes);
  }
}

// AdditiveGradients for a query tile of `queries` real queries, over the query vectors that hold
// one (AdditiveScoreVectors): a padding lane's dS is zero, so the others add nothing. A tile of
// one query (a Bahdanau decoder step) takes OneQueryAdditiveGradients.
template <bool kExponential, class D>
void AdditiveGradientsOfQueries(D d, size_t queries, size_t bc, const float* keys,
                                size_t key_stride, const float* q_transposed, size_t br,
                                size_t depth, const float* weights, const float* grad_scores,
                                float* grad_q_transposed, const KeySums& grad_keys,
                                float* grad_weight_lanes) {
  if (queries == 1) {
    OneQueryAdditiveGradients<kExponential>(d, bc, keys, key_stride, q_transposed, br, depth,
                                            weights, grad_scores, grad_q_transposed, grad_keys,
                                            grad_weight_lanes);
    return;
  }
  switch (AdditiveScoreVectors<kQueryVectors>(d, queries)) {
    case 1:
      AdditiveGradients<1, kExponential>(d, bc, keys, key_stride, q_transposed, br, depth, weights,
                                         grad_scores, grad_q_transposed, grad_keys,
                                         grad_weight_lanes);
      break;
    case 2:
      AdditiveGradients<2, kExponential>(d, bc, keys, key_stride, q_transposed, br, depth, weights,
                                         grad_scores, grad_q_transposed, grad_keys,
                                         grad_weight_lanes);
      break;
    default:
      AdditiveGradients<kQueryVectors, kExponential>(d, bc, keys, key_stride, q_transposed, br,
                                                     depth, weights, grad_scores, grad_q_transposed,
                                                     grad_keys, grad_weight_lanes);
  }
}

// Where a task leaves its da (n × h rows) and its dw (h values).
struct TaskOutputs {
  float* grad_queries;
  int64_t grad_queries_stride;
  float* grad_weights;
};

// One (batch b, head h) pair, key tiles [first_key_tile, last_key_tile).
void AdditiveBackwardTask(const AdditiveBackwardArgs& args, int64_t b, int64_t h,
                          size_t first_key_tile, size_t last_key_tile, const TaskOutputs& outputs,
                          AdditiveBackwardScratch& s) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  const size_t br = kQueryVectors * lanes;
  const size_t n = static_cast<size_t>(args.queries.rows), m = static_cast<size_t>(args.keys.rows);
  const size_t hidden = static_cast<size_t>(args.queries.cols);
  const size_t dv = static_cast<size_t>(args.values.cols);
  const size_t dv_padded = hwy::RoundUpTo(dv, lanes);
  const size_t tiles = (n + br - 1) / br;
  const float* a = args.queries.matrix(b, h);
  const float* keys = args.keys.matrix(b, h);
  const size_t key_stride = static_cast<size_t>(args.keys.row_stride);
  const float* values = args.values.matrix(b, h);
  const float* lse = args.log_sum_exp + (b * args.queries.heads + h) * args.queries.rows;

  // Per task: transposed copies, D, log-sum-exp, lengths and dropout keys per query.
  PrepareQueryTiles(args.out, args.grad_out, lse, *args.valid_lens, args.options, args.keys.rows, b,
                    h, br, dv_padded, s);
  if (n == 1) {
    // One query: only lane 0 of daᵀ's rows is added to and read (OneQueryAdditiveGradients);
    // clearing all br lanes was a 2 MB fill per call at the book's decoder step (B = 64 tasks).
    for (size_t t = 0; t < hidden; ++t) s.grad_queries_transposed[t * br] = 0.0F;
  } else {
    std::fill(s.grad_queries_transposed, s.grad_queries_transposed + tiles * br * hidden, 0.0F);
  }
  std::fill(s.grad_weight_lanes, s.grad_weight_lanes + hidden * lanes, 0.0F);
  for (size_t tile = 0; tile < tiles; ++tile) {
    float* at = s.queries_transposed + tile * hidden * br;
    const size_t first = tile * br, rows = std::min(br, n - first);
    PrepareAdditiveQueries<kQueryVectors>(d,
                                          a + static_cast<int64_t>(first) * args.queries.row_stride,
                                          static_cast<size_t>(args.queries.row_stride), rows,
                                          hidden, 1.0F, br, exponential(args.form), at);
  }

  const bool dropout = args.options.dropout > 0.0F;
  const DropoutApplier<decltype(d)> dropout_applier(d, args.options.dropout);
  float* grad_keys_head = args.grad_keys.matrix(b, h);
  float* grad_values_head = args.grad_values.matrix(b, h);
  for (size_t key_tile = first_key_tile; key_tile < last_key_tile; ++key_tile) {
    const size_t key0 = key_tile * kKeyTile;
    const size_t bc = std::min(kKeyTile, m - key0);
    s.grad_keys.Clear(d, bc, hidden);
    std::fill(s.grad_values, s.grad_values + bc * dv_padded, 0.0F);
    // The key tile's rows as the scores read them: b, or e^{2b} in the exponential form.
    const float* key_rows = keys + key0 * key_stride;
    size_t key_rows_stride = key_stride;
    if (exponential(args.form)) {
      DoubledExponentialRows(d, key_rows, key_stride, bc, hidden, s.key_exponentials);
      key_rows = s.key_exponentials;
      key_rows_stride = hidden;
    }
    for (size_t tile = 0; tile < tiles; ++tile) {
      const TileKeyRanges ranges = s.tile_ranges(tile);
      const auto key_begin = static_cast<int64_t>(key0);
      if (ranges.end <= key_begin || ranges.begin >= key_begin + static_cast<int64_t>(bc))
        continue;  // no query here sees these keys
      const size_t first = tile * br, rows = std::min(br, n - first);
      const MaskCoverage coverage =
          mask_coverage(args.options.mask, b, h, static_cast<int64_t>(first), rows, key_begin, bc);
      if (coverage == MaskCoverage::kNone) continue;
      // Keys past every query of this tile contribute nothing: skip their tanh work.
      const size_t active = std::min(bc, static_cast<size_t>(ranges.end - key_begin));
      const float* at = s.queries_transposed + tile * hidden * br;
      // Sᵀ as the forward pass computed it, masked, then Pᵀ = exp(Sᵀ − lse).
      if (exponential(args.form)) {
        AdditiveScoresOfQueries<kQueryVectors, true>(d, rows, active, key_rows, key_rows_stride, at,
                                                     br, hidden, args.weights, s.probabilities,
                                                     terms_per_reciprocal(args.form));
      } else {
        AdditiveScoresOfQueries<kQueryVectors, false>(d, rows, active, key_rows, key_rows_stride,
                                                      at, br, hidden, args.weights, s.probabilities,
                                                      false);
      }
      const QueryTile query_tile{b,
                                 h,
                                 static_cast<int64_t>(first),
                                 rows,
                                 args.queries.rows,
                                 args.keys.rows,
                                 s.first + first,
                                 s.last + first,
                                 ranges};
      ApplyScoreModifiers(d, args.options, query_tile, key_begin, active, br, br,
                          coverage == MaskCoverage::kSome, s.probabilities);
      ProbabilitiesFromScores(d, active, br, br, s.lse + first, s.probabilities);
      // The forward pass multiplied V by P ⊙ Z: regenerate Z from the hash.
      const float* used = s.probabilities;
      if (dropout) {
        ApplyDropout(d, dropout_applier, active, key0, br, br, s.row_keys + first, s.probabilities,
                     s.dropped);
        used = s.dropped;
      }
      // dV += (P ⊙ Z)ᵀ dO.
      Gemm<true>(d, active, dv_padded / lanes, used, br, 1, s.grad_out.row(first),
                 s.grad_out.stride, rows, s.grad_values, dv_padded);
      // dPᵀ = V dOᵀ, then dSᵀ = (P ⊙ Z)ᵀ ⊙ dPᵀ − Pᵀ ⊙ D.
      GemmZeroPaddedColumns(d, active, kQueryVectors, rows,
                            values + static_cast<int64_t>(key0) * args.values.row_stride,
                            static_cast<size_t>(args.values.row_stride), 1,
                            s.grad_out_transposed + tile * dv * br, TileWidth(d, rows, br), dv,
                            s.grad_scores, br);
      GradScoresFromGradProbabilities(d, active, br, br, s.probabilities, used, s.delta + first,
                                      s.grad_scores);
      float* grad_q_transposed = s.grad_queries_transposed + tile * hidden * br;
      if (exponential(args.form)) {
        AdditiveGradientsOfQueries<true>(d, rows, active, key_rows, key_rows_stride, at, br, hidden,
                                         args.weights, s.grad_scores, grad_q_transposed,
                                         s.grad_keys, s.grad_weight_lanes);
      } else {
        AdditiveGradientsOfQueries<false>(d, rows, active, key_rows, key_rows_stride, at, br,
                                          hidden, args.weights, s.grad_scores, grad_q_transposed,
                                          s.grad_keys, s.grad_weight_lanes);
      }
    }
    for (size_t j = 0; j < bc; ++j) {
      const auto key = static_cast<int64_t>(key0 + j);
      float* grad_key_row = grad_keys_head + key * args.grad_keys.row_stride;
      size_t t = 0;
      if (s.grad_keys.lanes == nullptr) {
        // The sums as they are, in vectors (element by element this was 1.5% of the book's
        // decoder training step, B = 64, 10 keys, 256 units, Zen 3).
        const float* sums = s.grad_keys.sums + j * hidden;
        for (; t + lanes <= hidden; t += lanes) {
          const auto weight = exponential(args.form)
                                  ? hn::Mul(hn::Set(d, 4.0F), hn::LoadU(d, args.weights + t))
                                  : hn::Set(d, 1.0F);
          hn::StoreU(hn::Mul(weight, hn::LoadU(d, sums + t)), d, grad_key_row + t);
        }
      }
      for (; t < hidden; ++t) {
        const float weight = exponential(args.form) ? 4.0F * args.weights[t] : 1.0F;
        grad_key_row[t] = weight * s.grad_keys.Value(d, j, t, hidden);
      }
      std::copy_n(s.grad_values + j * dv_padded, dv,
                  grad_values_head + key * args.grad_values.row_stride);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const float* at = s.grad_queries_transposed + (i / br) * hidden * br + i % br;
    float* row = outputs.grad_queries + static_cast<int64_t>(i) * outputs.grad_queries_stride;
    for (size_t t = 0; t < hidden; ++t) row[t] = at[t * br];
  }
  for (size_t t = 0; t < hidden; ++t)
    outputs.grad_weights[t] =
        hn::GetLane(hn::SumOfLanes(d, hn::Load(d, s.grad_weight_lanes + t * lanes)));
}

void AdditiveBackward(const AdditiveBackwardArgs& args) {
  const hn::ScalableTag<float> d;
  const int64_t heads = args.queries.batch * args.queries.heads;
  const size_t n = static_cast<size_t>(args.queries.rows);
  const size_t hidden = static_cast<size_t>(args.queries.cols);
  const size_t key_tiles = (static_cast<size_t>(args.keys.rows) + kKeyTile - 1) / kKeyTile;
  // Fewer heads than threads: split each head's key tiles into chunks so every thread has work.
  const auto threads = static_cast<int64_t>(omp_get_max_threads());
  const int64_t chunks =
      heads >= threads ? 1
                       : std::clamp<int64_t>((threads + heads - 1) / heads, 1,
                                             std::max<int64_t>(1, static_cast<int64_t>(key_tiles)));
  const std::vector<size_t> chunk_bounds =
      key_chunk_bounds(*args.valid_lens, args.options, args.queries.batch, args.queries.heads,
                       args.queries.rows, args.keys.rows, kKeyTile, static_cast<size_t>(chunks));
  const int64_t tasks = heads * chunks;
  // Partial da per task (only when heads are split) and dw per task, summed in order below.
  std::vector<float> partial_grad_queries(chunks > 1 ? static_cast<size_t>(tasks) * n * hidden : 0);
  std::vector<float> partial_grad_weights(static_cast<size_t>(tasks) * hidden);
  // Dynamic scheduling: masked and causal heads differ widely in cost.
  run_parallel_tasks(
      tasks, "additive_attention_backward", TaskSchedule::kDynamic,
      [&] {
        return AdditiveBackwardScratch(n, hidden, static_cast<size_t>(args.values.cols),
                                       hn::Lanes(d));
      },
      [&](int64_t task, AdditiveBackwardScratch& scratch, int) {
        const int64_t head = task / chunks, chunk = task % chunks;
        const int64_t b = head / args.queries.heads, h = head % args.queries.heads;
        const size_t first_tile = chunk_bounds[static_cast<size_t>(chunk)];
        const size_t last_tile = chunk_bounds[static_cast<size_t>(chunk) + 1];
        const TaskOutputs outputs =
            chunks > 1
                ? TaskOutputs{partial_grad_queries.data() + static_cast<size_t>(task) * n * hidden,
                              static_cast<int64_t>(hidden),
                              partial_grad_weights.data() + static_cast<size_t>(task) * hidden}
                : TaskOutputs{args.grad_queries.matrix(b, h), args.grad_queries.row_stride,
                              partial_grad_weights.data() + static_cast<size_t>(task) * hidden};
        AdditiveBackwardTask(args, b, h, first_tile, last_tile, outputs, scratch);
      });
  if (chunks > 1) {
    for (int64_t head = 0; head < heads; ++head) {
      float* grad_queries =
          args.grad_queries.matrix(head / args.queries.heads, head % args.queries.heads);
      for (size_t i = 0; i < n; ++i) {
        float* row = grad_queries + static_cast<int64_t>(i) * args.grad_queries.row_stride;
        for (size_t t = 0; t < hidden; ++t) {
          float sum = 0.0F;
          for (int64_t chunk = 0; chunk < chunks; ++chunk) {
            sum +=
                partial_grad_queries[(static_cast<size_t>(head * chunks + chunk) * n + i) * hidden +
                                     t];
          }
          row[t] = sum;
        }
      }
    }
  }
  for (size_t t = 0; t < hidden; ++t) {
    double sum = 0.0;
    for (int64_t task = 0; task < tasks; ++task)
      sum += partial_grad_weights[static_cast<size_t>(task) * hidden + t];
    args.grad_weights[t] = static_cast<float>(sum);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {

HWY_EXPORT(AdditiveBackward);

namespace {
void require_hidden_size(size_t size, std::string_view name, int64_t hidden) {
  if (static_cast<int64_t>(size) != hidden) {
    throw ShapeError(std::string(name) + ": expected " + std::to_string(hidden) +
                     " values (the hidden size of projected_queries), got " + std::to_string(size));
  }
}
}  // namespace

void additive_attention_backward(ConstHeadsView projected_queries, ConstHeadsView projected_keys,
                                 std::span<const float> w_v, ConstHeadsView values,
                                 ConstHeadsView out, ConstHeadsView grad_out,
                                 const float* log_sum_exp, const ValidLengths& valid_lens,
                                 const FlashAttentionOptions& options,
                                 HeadsView grad_projected_queries, HeadsView grad_projected_keys,
                                 std::span<float> grad_w_v, HeadsView grad_v) {
  const ConstHeadsView& a = projected_queries;
  const int64_t batch = a.batch, heads = a.heads, n = a.rows, hidden = a.cols;
  const int64_t m = projected_keys.rows, dv = values.cols;
  require_hidden_size(w_v.size(), "w_v", hidden);
  require_hidden_size(grad_w_v.size(), "grad_w_v", hidden);
  require_matrices(projected_keys, "projected_keys", batch, heads, m, hidden,
                   "the hidden size of projected_queries");
  require_matrices(values, "values", batch, heads, m, dv, "one row per key");
  require_matrices(out, "out", batch, heads, n, dv, "one row per query, as wide as values");
  require_matrices(grad_out, "grad_out", batch, heads, n, dv, "as out");
  require_matrices(grad_projected_queries, "grad_projected_queries", batch, heads, n, hidden,
                   "as projected_queries");
  require_matrices(grad_projected_keys, "grad_projected_keys", batch, heads, m, hidden,
                   "as projected_keys");
  require_matrices(grad_v, "grad_v", batch, heads, m, dv, "as values");
  require_log_sum_exp(log_sum_exp, batch * heads * n);
  require_additive_arguments(w_v, options, a, projected_keys);
  check_attention_arguments(a, projected_keys, values, out, valid_lens, options);
  if (batch == 0 || heads == 0) {
    std::fill(grad_w_v.begin(), grad_w_v.end(), 0.0F);
    return;
  }
  additive_backward_detail::AdditiveBackwardArgs args{a,
                                                      projected_keys,
                                                      values,
                                                      out,
                                                      grad_out,
                                                      w_v.data(),
                                                      log_sum_exp,
                                                      &valid_lens,
                                                      options,
                                                      grad_projected_queries,
                                                      grad_projected_keys,
                                                      grad_v,
                                                      grad_w_v.data()};
  args.form = additive_score_form(a, projected_keys, w_v, options.additive_input_bound);
  HWY_DYNAMIC_DISPATCH(AdditiveBackward)(args);
}

}  // namespace attn
#endif  // HWY_ONCE
