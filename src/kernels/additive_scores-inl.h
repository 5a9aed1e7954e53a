// Additive (Bahdanau) score tiles for the fused kernels, per SIMD target (a Highway "-inl.h"
// header, included once per target from a foreach_target translation unit): forward and backward.

#if defined(ATTN_KERNELS_ADDITIVE_SCORES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_ADDITIVE_SCORES_INL_H_
#undef ATTN_KERNELS_ADDITIVE_SCORES_INL_H_
#else
#define ATTN_KERNELS_ADDITIVE_SCORES_INL_H_
#endif

#include <hwy/highway.h>

#include "kernels/fast_math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Sᵀ (MR keys × NR query vectors) of additive attention: Sᵀ[j, i] = Σ_t w_t tanh(qᵀ[t, i] + k[j,
// t]), with the projected queries transposed (queries along the lanes) and the projected keys'
// elements broadcast. Each loaded query vector and broadcast key element is shared by the whole
// tile. The tanh dominates: h evaluations per score, never stored.
template <size_t MR, size_t NR, class D>
HWY_INLINE void AdditiveScoreRows(D d, const float* HWY_RESTRICT keys, size_t key_stride,
                                  const float* HWY_RESTRICT q_transposed, size_t br, size_t depth,
                                  const float* HWY_RESTRICT weights, float* HWY_RESTRICT scores) {
  using V = hn::Vec<D>;
  const size_t lanes = hn::Lanes(d);
  V acc[MR][NR];
  for (size_t r = 0; r < MR; ++r)
    for (size_t v = 0; v < NR; ++v) acc[r][v] = hn::Zero(d);
  for (size_t t = 0; t < depth; ++t) {
    const V weight = hn::Set(d, weights[t]);
    V queries[NR];
    for (size_t v = 0; v < NR; ++v) queries[v] = hn::Load(d, q_transposed + t * br + v * lanes);
    for (size_t r = 0; r < MR; ++r) {
      const V key = hn::Set(d, keys[r * key_stride + t]);
      for (size_t v = 0; v < NR; ++v) {
        acc[r][v] = hn::MulAdd(weight, AdditiveTanh(d, hn::Add(queries[v], key)), acc[r][v]);
      }
    }
  }
  for (size_t r = 0; r < MR; ++r)
    for (size_t v = 0; v < NR; ++v) hn::Store(acc[r][v], d, scores + r * br + v * lanes);
}

// Sᵀ (bc × Br, Br = NR vectors of queries, rows br floats apart) for one key tile. The forward and
// backward kernels both call this, so the backward pass recomputes the forward pass's scores with
// the same arithmetic, and its probabilities agree with the forward pass's log-sum-exp.
template <size_t NR, class D>
void AdditiveScores(D d, size_t bc, const float* keys, size_t key_stride, const float* q_transposed,
                    size_t br, size_t depth, const float* weights, float* scores) {
  constexpr size_t kRows = 2;  // tanh needs registers of its own: fewer rows than the GEMM tile
  size_t j = 0;
  for (; j + kRows <= bc; j += kRows) {
    AdditiveScoreRows<kRows, NR>(d, keys + j * key_stride, key_stride, q_transposed, br, depth,
                                 weights, scores + j * br);
  }
  if (j < bc)
    AdditiveScoreRows<1, NR>(d, keys + j * key_stride, key_stride, q_transposed, br, depth, weights,
                             scores + j * br);
}

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_ADDITIVE_SCORES_INL_H_
