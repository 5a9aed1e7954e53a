// The softmax steps the fused backward passes share, on transposed tiles (keys × Br queries, the
// queries along the lanes), per SIMD target (a Highway "-inl.h" header): Pᵀ from the scores and the
// forward pass's log-sum-exp, the dropout multipliers regenerated, and dSᵀ from dPᵀ.

#if defined(ATTN_KERNELS_BACKWARD_TILES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_BACKWARD_TILES_INL_H_
#undef ATTN_KERNELS_BACKWARD_TILES_INL_H_
#else
#define ATTN_KERNELS_BACKWARD_TILES_INL_H_
#endif

#include <hwy/highway.h>

#include "kernels/fast_math-inl.h"
#include "kernels/tile_gemm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Pᵀ = exp(Sᵀ − lse) in place for keys key0 … key0 + keys − 1, zero where key ≥ the query's
// length; `lengths` and `lse` hold the tile's Br queries.
template <class D>
HWY_INLINE void ProbabilitiesFromScores(D d, size_t keys, size_t key0, size_t br,
                                        const int32_t* lengths, const float* lse,
                                        float* probabilities) {
  const hn::RebindToSigned<D> di;
  for (size_t j = 0; j < keys; ++j) {
    const auto key_index = hn::Set(di, static_cast<int32_t>(key0 + j));
    for (size_t r = 0; r < br; r += hn::Lanes(d)) {
      const auto visible = hn::RebindMask(d, hn::Lt(key_index, hn::Load(di, lengths + r)));
      float* p = probabilities + j * br + r;
      const auto shifted = hn::Sub(hn::Load(d, p), hn::Load(d, lse + r));
      hn::Store(hn::IfThenElseZero(visible, SoftmaxExp(d, shifted)), d, p);
    }
  }
}

// (P ⊙ Z)ᵀ into `dropped`, Z the forward pass's dropout multipliers regenerated from the hash
// (`row_keys` of the tile's queries).
template <class D, class Applier>
HWY_INLINE void ApplyDropout(D d, const Applier& applier, size_t keys, size_t key0, size_t br,
                             const uint32_t* row_keys, const float* probabilities, float* dropped) {
  const hn::RebindToUnsigned<D> du;
  for (size_t j = 0; j < keys; ++j) {
    for (size_t r = 0; r < br; r += hn::Lanes(d)) {
      const auto p = hn::Load(d, probabilities + j * br + r);
      hn::Store(applier.Apply(d, hn::Load(du, row_keys + r), static_cast<uint32_t>(key0 + j), p), d,
                dropped + j * br + r);
    }
  }
}

// dSᵀ = Pᵀ ⊙ (Zᵀ ⊙ dPᵀ − D) = (P ⊙ Z)ᵀ ⊙ dPᵀ − Pᵀ ⊙ D in place of dPᵀ, with `used` = (P ⊙ Z)ᵀ (Pᵀ
// without dropout) and D the tile's rowsum(dO ⊙ O).
template <class D>
HWY_INLINE void GradScoresFromGradProbabilities(D d, size_t keys, size_t br,
                                                const float* probabilities, const float* used,
                                                const float* delta, float* grad_scores) {
  for (size_t j = 0; j < keys; ++j) {
    for (size_t r = 0; r < br; r += hn::Lanes(d)) {
      float* ds = grad_scores + j * br + r;
      const auto p = hn::Load(d, probabilities + j * br + r);
      const auto p_used = hn::Load(d, used + j * br + r);
      hn::Store(hn::NegMulAdd(p, hn::Load(d, delta + r), hn::Mul(p_used, hn::Load(d, ds))), d, ds);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_BACKWARD_TILES_INL_H_
