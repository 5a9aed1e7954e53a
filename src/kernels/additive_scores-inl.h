// Additive (Bahdanau) score tiles for the fused kernels, per SIMD target (a Highway "-inl.h"
// header, included once per target from a foreach_target translation unit): forward and backward.
//
// Two forms of the same scores. The direct one evaluates tanh(q + k) per (query, key, hidden
// unit). The exponential one uses tanh(q + k) = 1 − 2 / (e^{2q}·e^{2k} + 1): with E = e^{2q} and
// F = e^{2k} computed once per query and key (O((n + m)·h) exponentials), the score is
// Σ_t w_t − 2 Σ_t w_t / (E_t F_t + 1), and two terms share one reciprocal estimate and its Newton
// step (AccumulateReciprocalPair): about a quarter of the tanh's instructions per term. On the
// Xeons' ports the reciprocal estimate is 3 micro-ops, 2 on the port every multiply-add shares;
// sharing it raised the static bound (tools/port_model.py) from 26.6% to 33.4% of the FMA peak.
// Where inputs are smaller still, four or eight terms share one (AccumulateScaledTerms: 19
// operations per four terms, 35 per eight, against the pairs' 22 per four, none a register copy).
// It needs e^{2(q + k)}, and the product of the terms' denominators, far from float's overflow and
// subnormals, so the kernels take it only when every projected query and key lies within
// ±kAdditiveExponentialLimit and every weight within ±kAdditiveExponentialWeightLimit, and four or
// eight terms a reciprocal within narrower limits (kernel_arguments.hpp); past that, the direct
// form.
// Error: a relative error δ of E·F moves tanh by at most δ/2 (its derivative in log(E·F) is
// 2EF/(EF + 1)² ≤ 1/2); E and F are within 1 ulp, the products and the reciprocal after its
// Newton step within a few more, so each term is within ~3e−7 of tanh, as AdditiveTanh is.

#if defined(ATTN_KERNELS_ADDITIVE_SCORES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_ADDITIVE_SCORES_INL_H_
#undef ATTN_KERNELS_ADDITIVE_SCORES_INL_H_
#else
#define ATTN_KERNELS_ADDITIVE_SCORES_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <numeric>

#include "kernels/fast_math-inl.h"
#include "kernels/transpose_tile-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// data[i] = e^{2·data[i]} for `count` floats, each lane on its own (a tail through a padded
// vector), so that an element's result never depends on where it sits: the forward, backward and
// weights kernels lay the same inputs out differently and must compute the same scores.
template <class D>
HWY_INLINE void DoubledExponentialsInPlace(D d, float* data, size_t count) {
  const size_t lanes = hn::Lanes(d);
  const auto two = hn::Set(d, 2.0F);
  size_t i = 0;
  for (; i + lanes <= count; i += lanes)
    hn::StoreU(SoftmaxExp(d, hn::Mul(two, hn::LoadU(d, data + i))), d, data + i);
  if (i < count) {
    HWY_ALIGN float tail[HWY_MAX_BYTES / sizeof(float)] = {};
    std::copy(data + i, data + count, tail);
    hn::Store(SoftmaxExp(d, hn::Mul(two, hn::Load(d, tail))), d, tail);
    std::copy(tail, tail + (count - i), data + i);
  }
}

// e^{2x} of `count` rows of `cols` floats (row stride `stride`) into `destination`, rows packed
// `cols` apart: a key tile as the exponential form's scores read it.
template <class D>
HWY_INLINE void DoubledExponentialRows(D d, const float* rows, size_t stride, size_t count,
                                       size_t cols, float* destination) {
  for (size_t j = 0; j < count; ++j) std::copy_n(rows + j * stride, cols, destination + j * cols);
  DoubledExponentialsInPlace(d, destination, count * cols);
}

// 1 / x for the exponential form's denominators (normal, positive, far from overflow): the
// hardware's reciprocal estimate and one Newton step.
template <class D>
HWY_INLINE hn::Vec<D> NewtonReciprocal(D d, hn::Vec<D> x) {
  const auto estimate = hn::ApproximateReciprocal(x);
  return hn::Mul(estimate, hn::NegMulAdd(x, estimate, hn::Set(d, 2.0F)));
}

// 1 / (e·f + 1) for the exponential form. e·f + 1 ≥ 1 and ≤ e^42 + 1, so neither the estimate nor
// the step meets a subnormal or ∞.
template <class D>
HWY_INLINE hn::Vec<D> ReciprocalOfProductPlusOne(D d, hn::Vec<D> e, hn::Vec<D> f) {
  return NewtonReciprocal(d, hn::MulAdd(e, f, hn::Set(d, 1.0F)));
}

// acc + w0 / (e0·f0 + 1) + w1 / (e1·f1 + 1), the two terms as one quotient (w0·a1 + w1·a0) /
// (a0·a1) with a = e·f + 1: one reciprocal (estimate and Newton step) for two terms. a0·a1 ≤
// (e^42 + 1)² stays normal (kAdditiveExponentialLimit), the numerator below 2^126
// (kAdditiveExponentialWeightLimit), and the numerator's rounding error over a0·a1 is within an
// ulp of |w0|/a0 + |w1|/a1, as the two terms' own roundings are.
template <class D>
HWY_INLINE hn::Vec<D> AccumulateReciprocalPair(D d, hn::Vec<D> e0, hn::Vec<D> f0, hn::Vec<D> e1,
                                               hn::Vec<D> f1, hn::Vec<D> w0, hn::Vec<D> w1,
                                               hn::Vec<D> acc) {
  const auto one = hn::Set(d, 1.0F);
  const auto a0 = hn::MulAdd(e0, f0, one), a1 = hn::MulAdd(e1, f1, one);
  const auto numerator = hn::MulAdd(w1, a0, hn::Mul(w0, a1));
  return hn::MulAdd(numerator, NewtonReciprocal(d, hn::Mul(a0, a1)), acc);
}

// acc + Σ_{t<kTerms} w̃_t / ã_t with ã_t = f_t + g_t (f = e^{2k}, read from `keys`; g = e^{−2q})
// and w̃_t = w_t·g_t: the terms w_t / (e_t·f_t + 1) with numerator and denominator divided by e_t.
// As one quotient, built as a tree: each pair's N = w̃0·ã1 + w̃1·ã0 over D = ã0·ã1, then each two
// quotients' N = N0·D1 + N1·D0 over D0·D1, to one reciprocal for kTerms (4 or 8) terms. Each ã is a
// sum of longer-lived values into a new register, so no register is copied for a destructive
// multiply-add (the form e·f + 1 copied e or 1 for each). Every ã lies in [2e^−2L, 2e^2L] for
// inputs within ±L, and each |w̃_t| ≤ |w_t|·ã_t, so the numerator is at most kTerms·max|w| times
// the denominator: kernel_arguments.hpp's limits keep the denominator within [2^−89, 2^101] and the
// numerator below 2^124 (the quads' L = 8, max|w| 2^24; the eights' L = 4, 2^20). Its rounding
// error over the denominator is within a few ulps of Σ |w_t| / (e_t·f_t + 1), as the pairs'.
// Written step by step, the denominators first: so ordered, GCC 12 allocates the loop without a
// register copy (the nested form of the same operations made it copy three per four terms).
template <size_t kTerms, class D>
HWY_INLINE hn::Vec<D> AccumulateScaledTerms(D d, const float* HWY_RESTRICT key_exponentials,
                                            const hn::Vec<D> (&g)[kTerms],
                                            const hn::Vec<D> (&wg)[kTerms], hn::Vec<D> acc) {
  static_assert(kTerms == 4 || kTerms == 8);
  using V = hn::Vec<D>;
  V a[kTerms], numerators[kTerms / 2], denominators[kTerms / 2];
  for (size_t t = 0; t < kTerms; ++t) a[t] = hn::Add(hn::Set(d, key_exponentials[t]), g[t]);
  for (size_t p = 0; p < kTerms / 2; ++p) denominators[p] = hn::Mul(a[2 * p], a[2 * p + 1]);
  for (size_t p = 0; p < kTerms / 2; ++p) {
    numerators[p] = hn::Mul(wg[2 * p], a[2 * p + 1]);
    numerators[p] = hn::MulAdd(wg[2 * p + 1], a[2 * p], numerators[p]);
  }
  for (size_t width = kTerms / 2; width > 1; width /= 2) {
    for (size_t p = 0; p < width / 2; ++p) {
      V numerator = hn::Mul(numerators[2 * p], denominators[2 * p + 1]);
      numerators[p] = hn::MulAdd(numerators[2 * p + 1], denominators[2 * p], numerator);
      denominators[p] = hn::Mul(denominators[2 * p], denominators[2 * p + 1]);
    }
  }
  return hn::MulAdd(numerators[0], NewtonReciprocal(d, denominators[0]), acc);
}

// Sᵀ (MR keys × NR query vectors) of additive attention: Sᵀ[j, i] = Σ_t w_t tanh(qᵀ[t, i] + k[j,
// t]), with the projected queries transposed (queries along the lanes) and the projected keys'
// elements broadcast. Each loaded query vector and broadcast key element is shared by the whole
// tile; u is evaluated h times per score, never stored. In the exponential form `keys` hold e^{2k},
// `q_transposed` e^{2q}, and the sums are Σ_t w_t − 2 Σ_t w_t R_t (`weight_sum` = Σ_t w_t).
template <size_t MR, size_t NR, bool kExponential, class D>
HWY_INLINE void AdditiveScoreRows(D d, const float* HWY_RESTRICT keys, size_t key_stride,
                                  const float* HWY_RESTRICT q_transposed, size_t br, size_t depth,
                                  const float* HWY_RESTRICT weights, float weight_sum,
                                  float* HWY_RESTRICT scores) {
  using V = hn::Vec<D>;
  const size_t lanes = hn::Lanes(d);
  V acc[MR][NR];
  for (size_t r = 0; r < MR; ++r)
    for (size_t v = 0; v < NR; ++v) acc[r][v] = hn::Zero(d);
  size_t t = 0;
  if constexpr (kExponential) {
    for (; t + 2 <= depth; t += 2) {
      const V w0 = hn::Set(d, weights[t]), w1 = hn::Set(d, weights[t + 1]);
      V q0[NR], q1[NR];
      for (size_t v = 0; v < NR; ++v) {
        q0[v] = hn::Load(d, q_transposed + t * br + v * lanes);
        q1[v] = hn::Load(d, q_transposed + (t + 1) * br + v * lanes);
      }
      for (size_t r = 0; r < MR; ++r) {
        const V k0 = hn::Set(d, keys[r * key_stride + t]);
        const V k1 = hn::Set(d, keys[r * key_stride + t + 1]);
        for (size_t v = 0; v < NR; ++v)
          acc[r][v] = AccumulateReciprocalPair(d, q0[v], k0, q1[v], k1, w0, w1, acc[r][v]);
      }
    }
  }
  for (; t < depth; ++t) {
    const V weight = hn::Set(d, weights[t]);
    V queries[NR];
    for (size_t v = 0; v < NR; ++v) queries[v] = hn::Load(d, q_transposed + t * br + v * lanes);
    for (size_t r = 0; r < MR; ++r) {
      const V key = hn::Set(d, keys[r * key_stride + t]);
      for (size_t v = 0; v < NR; ++v) {
        const V term = kExponential ? ReciprocalOfProductPlusOne(d, queries[v], key)
                                    : AdditiveTanh(d, hn::Add(queries[v], key));
        acc[r][v] = hn::MulAdd(weight, term, acc[r][v]);
      }
    }
  }
  const V sum = hn::Set(d, weight_sum), two = hn::Set(d, 2.0F);
  for (size_t r = 0; r < MR; ++r) {
    for (size_t v = 0; v < NR; ++v) {
      hn::Store(kExponential ? hn::NegMulAdd(two, acc[r][v], sum) : acc[r][v], d,
                scores + r * br + v * lanes);
    }
  }
}

// A vector of the `count` (≤ lanes) floats at `data`, zeros past them: a row's last, partial
// vector.
template <class D>
HWY_INLINE hn::Vec<D> LoadPadded(D d, const float* data, size_t count) {
  HWY_ALIGN float padded[HWY_MAX_BYTES / sizeof(float)] = {};
  std::copy_n(data, count, padded);
  return hn::Load(d, padded);
}

// The term w_t·tanh(q_t + k_t), or in the exponential form w_t / (e^{2q_t}·e^{2k_t} + 1), added to
// `acc`, for the lanes of one vector of hidden units.
template <bool kExponential, class D>
HWY_INLINE hn::Vec<D> AccumulateOneQueryTerm(D d, hn::Vec<D> query, hn::Vec<D> key,
                                             hn::Vec<D> weight, hn::Vec<D> acc) {
  const auto term = kExponential ? ReciprocalOfProductPlusOne(d, query, key)
                                 : AdditiveTanh(d, hn::Add(query, key));
  return hn::MulAdd(weight, term, acc);
}

// Sᵀ of a tile of one query (PrepareAdditiveQueries' row) against bc keys: each key's score in
// lane 0 of its row of Sᵀ, zeros in the rest of that row's first vector. A term per hidden unit,
// each with its own reciprocal (or tanh): the shared reciprocals of the forms with several terms
// pay off across query lanes, which this tile does not have. Padding units (zero query, key and
// weight) add w·term = 0.
template <bool kExponential, class D>
HWY_NOINLINE void OneQueryAdditiveScores(D d, size_t bc, const float* HWY_RESTRICT keys,
                                         size_t key_stride, const float* HWY_RESTRICT query,
                                         size_t br, size_t depth, const float* HWY_RESTRICT weights,
                                         float* HWY_RESTRICT scores) {
  using V = hn::Vec<D>;
  const size_t lanes = hn::Lanes(d);
  const float weight_sum = kExponential ? std::accumulate(weights, weights + depth, 0.0F) : 0.0F;
  const size_t whole = depth / lanes * lanes;
  for (size_t j = 0; j < bc; ++j) {
    const float* key = keys + j * key_stride;
    // Two sums, so that consecutive vectors' multiply-adds do not wait on each other.
    V acc[2] = {hn::Zero(d), hn::Zero(d)};
    for (size_t t = 0; t < whole; t += lanes) {
      V& sum = acc[(t / lanes) % 2];
      sum = AccumulateOneQueryTerm<kExponential>(d, hn::LoadU(d, query + t), hn::LoadU(d, key + t),
                                                 hn::LoadU(d, weights + t), sum);
    }
    if (whole < depth) {
      const size_t left = depth - whole;
      acc[0] = AccumulateOneQueryTerm<kExponential>(d, LoadPadded(d, query + whole, left),
                                                    LoadPadded(d, key + whole, left),
                                                    LoadPadded(d, weights + whole, left), acc[0]);
    }
    const float sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(acc[0], acc[1])));
    float* row = scores + j * br;
    hn::StoreU(hn::Zero(d), d, row);
    row[0] = kExponential ? std::fma(-2.0F, sum, weight_sum) : sum;
  }
}

// Sᵀ (bc × Br, Br = NR vectors of queries, rows br floats apart) for one key tile. The forward and
// backward kernels both call this, so the backward pass recomputes the forward pass's scores with
// the same arithmetic, and its probabilities agree with the forward pass's log-sum-exp.
// In the exponential form (kExponential) `keys` hold e^{2k} and `q_transposed` e^{2q}.
// Out of line (HWY_NOINLINE): inlined into the forward kernel, its register demands changed how the
// compiler laid out the dot-product path beside it, 2% slower on Zen 4 for code it never runs.
template <size_t NR, bool kExponential, class D>
HWY_NOINLINE void AdditiveScores(D d, size_t bc, const float* keys, size_t key_stride,
                                 const float* q_transposed, size_t br, size_t depth,
                                 const float* weights, float* scores) {
  // The tanh needs registers of its own: 2 rows of 4 accumulators. The exponential form's term
  // needs fewer: 32 registers take 4 × 4 accumulators beside the step's vectors, 16 take 2 × 4.
  constexpr size_t kRows = kExponential && HWY_MAX_BYTES >= 64 ? 4 : 2;
  const float weight_sum = kExponential ? std::accumulate(weights, weights + depth, 0.0F) : 0.0F;
  size_t j = 0;
  for (; j + kRows <= bc; j += kRows) {
    AdditiveScoreRows<kRows, NR, kExponential>(d, keys + j * key_stride, key_stride, q_transposed,
                                               br, depth, weights, weight_sum, scores + j * br);
  }
  for (; j < bc; ++j) {
    AdditiveScoreRows<1, NR, kExponential>(d, keys + j * key_stride, key_stride, q_transposed, br,
                                           depth, weights, weight_sum, scores + j * br);
  }
}

// The query vectors of a tile with `queries` real queries (of kVectors) that hold one of them: 1,
// 2 or all kVectors (3 take 4, to keep the instantiations few).
template <size_t kVectors, class D>
HWY_INLINE size_t AdditiveScoreVectors(D d, size_t queries) {
  const size_t needed = (queries + hn::Lanes(d) - 1) / hn::Lanes(d);
  return needed <= 1 ? 1 : needed <= 2 && kVectors > 2 ? 2 : kVectors;
}

// Qᵀ's rows (depth of them, br floats apart) turned into e^{2q} for the exponential form, over the
// first `vectors` query vectors of each row: those AdditiveScoresOfQueries reads.
template <class D>
HWY_INLINE void DoubledExponentialsOfVectors(D d, float* q_transposed, size_t depth, size_t br,
                                             size_t vectors) {
  const size_t width = vectors * hn::Lanes(d);
  if (width == br) {
    DoubledExponentialsInPlace(d, q_transposed, depth * br);
    return;
  }
  for (size_t t = 0; t < depth; ++t) DoubledExponentialsInPlace(d, q_transposed + t * br, width);
}

// The query tile as the additive kernels' scores and gradients read it: Qᵀ scaled (`depth` rows br
// floats apart, zeros in the padding lanes of the query vectors read), or, for a tile of one query,
// its row scaled as it is (`depth` contiguous floats): a Bahdanau decoder step has one query per
// call, and vectors over its hidden units (OneQueryAdditiveScores) do whole vectors of work where
// Qᵀ's vectors held one query in one lane (the book's step, B = 64, 10 keys, 256 units: the scores
// and the query's e^{2q} were 8× the work on AVX2). e^{2q} in the exponential form: each element
// is computed as in Qᵀ (DoubledExponentialsInPlace), so either layout gives the same values.
template <size_t kVectors, class D>
HWY_INLINE void PrepareAdditiveQueries(D d, const float* rows, size_t row_stride, size_t queries,
                                       size_t depth, float scale, size_t br, bool exponential,
                                       float* q_transposed) {
  if (queries == 1) {
    for (size_t t = 0; t < depth; ++t) q_transposed[t] = rows[t] * scale;
    if (exponential) DoubledExponentialsInPlace(d, q_transposed, depth);
    return;
  }
  const size_t vectors = AdditiveScoreVectors<kVectors>(d, queries);
  TransposeScaledTile(rows, row_stride, queries, depth, scale, br, vectors * hn::Lanes(d),
                      q_transposed);
  if (exponential) DoubledExponentialsOfVectors(d, q_transposed, depth, br, vectors);
}

// The sums of AdditiveScoresShared over hidden units [t, t + kUnits·k), the most whole steps of
// kUnits from t that fit in `depth`, accumulated in `scores`; returns the first unit left.
template <size_t kUnits, size_t NR, class D>
HWY_INLINE size_t AccumulateSharedSteps(D d, size_t t, size_t bc, const float* HWY_RESTRICT keys,
                                        size_t key_stride, const float* HWY_RESTRICT q_transposed,
                                        size_t br, size_t depth, const float* HWY_RESTRICT weights,
                                        float* HWY_RESTRICT scores) {
  using V = hn::Vec<D>;
  const size_t lanes = hn::Lanes(d);
  for (; t + kUnits <= depth; t += kUnits) {
    for (size_t v = 0; v < NR; ++v) {
      V g[kUnits], wg[kUnits];
      for (size_t i = 0; i < kUnits; ++i) {
        g[i] = NewtonReciprocal(d, hn::Load(d, q_transposed + (t + i) * br + v * lanes));
        wg[i] = hn::Mul(hn::Set(d, weights[t + i]), g[i]);
      }
      for (size_t j = 0; j < bc; ++j) {
        float* sums = scores + j * br + v * lanes;
        hn::Store(
            AccumulateScaledTerms<kUnits>(d, keys + j * key_stride + t, g, wg, hn::Load(d, sums)),
            d, sums);
      }
    }
  }
  return t;
}

// AdditiveScores' exponential form with kTerms (4 or 8) terms a reciprocal (AccumulateScaledTerms),
// for the bc keys of a tile against NR query vectors. For each kTerms hidden units and query
// vector, g = e^{−2q} (the reciprocal of Qᵀ's e^{2q}: within 2 ulps) and w̃ = w·g are formed once
// and serve every key; the sums accumulate in `scores` (a load and a store per key and kTerms
// units, beside some twenty to forty vector operations). Hidden units past a multiple of kTerms
// take four a reciprocal where kTerms is 8, then one term each.
template <size_t kTerms, size_t NR, class D>
HWY_NOINLINE void AdditiveScoresShared(D d, size_t bc, const float* HWY_RESTRICT keys,
                                       size_t key_stride, const float* HWY_RESTRICT q_transposed,
                                       size_t br, size_t depth, const float* HWY_RESTRICT weights,
                                       float* HWY_RESTRICT scores) {
  using V = hn::Vec<D>;
  const size_t lanes = hn::Lanes(d);
  for (size_t j = 0; j < bc; ++j)
    for (size_t v = 0; v < NR; ++v) hn::Store(hn::Zero(d), d, scores + j * br + v * lanes);
  size_t t = AccumulateSharedSteps<kTerms, NR>(d, 0, bc, keys, key_stride, q_transposed, br, depth,
                                               weights, scores);
  if constexpr (kTerms == 8) {
    t = AccumulateSharedSteps<4, NR>(d, t, bc, keys, key_stride, q_transposed, br, depth, weights,
                                     scores);
  }
  const V sum = hn::Set(d, std::accumulate(weights, weights + depth, 0.0F));
  const V two = hn::Set(d, 2.0F);
  for (size_t j = 0; j < bc; ++j) {
    for (size_t v = 0; v < NR; ++v) {
      float* sums = scores + j * br + v * lanes;
      V acc = hn::Load(d, sums);
      for (size_t u = t; u < depth; ++u) {
        const V term = ReciprocalOfProductPlusOne(d, hn::Load(d, q_transposed + u * br + v * lanes),
                                                  hn::Set(d, keys[j * key_stride + u]));
        acc = hn::MulAdd(hn::Set(d, weights[u]), term, acc);
      }
      hn::Store(hn::NegMulAdd(two, acc, sum), d, sums);
    }
  }
}

// AdditiveScores<NR> in the form asked: `terms` (2, 4 or 8, kernel_arguments.hpp's
// terms_per_reciprocal) terms a reciprocal in the exponential form, else the direct tanh. Eight
// only with 32 vector registers (AVX-512): with AVX2's 16 the step's 16 vectors of g and w̃ spill,
// and eight ran 1.00–1.09× the pairs against four's 1.14–1.20× (Xeon dev, 2026-12-07), so there
// eight take four's form (whose limits contain eight's).
template <size_t NR, bool kExponential, class D>
HWY_INLINE void AdditiveScoresInForm(D d, size_t terms, size_t bc, const float* keys,
                                     size_t key_stride, const float* q_transposed, size_t br,
                                     size_t depth, const float* weights, float* scores) {
  if constexpr (kExponential) {
    if constexpr (HWY_MAX_BYTES >= 64) {
      if (terms == 8) {
        return AdditiveScoresShared<8, NR>(d, bc, keys, key_stride, q_transposed, br, depth,
                                           weights, scores);
      }
    }
    if (terms >= 4) {
      return AdditiveScoresShared<4, NR>(d, bc, keys, key_stride, q_transposed, br, depth, weights,
                                         scores);
    }
  }
  AdditiveScores<NR, kExponential>(d, bc, keys, key_stride, q_transposed, br, depth, weights,
                                   scores);
}

// AdditiveScores<kVectors> for a tile of `queries` real queries: the products of the query vectors
// that hold one (AdditiveScoreVectors), zeros in the others. A padding lane's score is never read,
// so this changes no result. A tile of one query (the book's Bahdanau decoder, a query per step)
// holds its row (PrepareAdditiveQueries) and takes OneQueryAdditiveScores. `terms`: terms a
// reciprocal (the exponential form's).
template <size_t kVectors, bool kExponential, class D>
HWY_INLINE void AdditiveScoresOfQueries(D d, size_t queries, size_t bc, const float* keys,
                                        size_t key_stride, const float* q_transposed, size_t br,
                                        size_t depth, const float* weights, float* scores,
                                        size_t terms) {
  const size_t vectors = AdditiveScoreVectors<kVectors>(d, queries);
  if (queries == 1) {
    OneQueryAdditiveScores<kExponential>(d, bc, keys, key_stride, q_transposed, br, depth, weights,
                                         scores);
  } else if (vectors == 1) {
    AdditiveScoresInForm<1, kExponential>(d, terms, bc, keys, key_stride, q_transposed, br, depth,
                                          weights, scores);
  } else if (vectors == 2) {
    AdditiveScoresInForm<2, kExponential>(d, terms, bc, keys, key_stride, q_transposed, br, depth,
                                          weights, scores);
  } else {
    AdditiveScoresInForm<kVectors, kExponential>(d, terms, bc, keys, key_stride, q_transposed, br,
                                                 depth, weights, scores);
    return;
  }
  const size_t lanes = hn::Lanes(d);
  for (size_t j = 0; j < bc; ++j)
    std::fill(scores + j * br + vectors * lanes, scores + (j + 1) * br, 0.0F);
}

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_ADDITIVE_SCORES_INL_H_
