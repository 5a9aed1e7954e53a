// What the fused backward passes share, per SIMD target (a Highway "-inl.h" header): the query side
// of a head prepared once, then the softmax steps on transposed tiles (keys × Br queries, the
// queries along the lanes): Pᵀ from the scores and the forward pass's log-sum-exp, the dropout
// multipliers regenerated, and dSᵀ from dPᵀ.

#if defined(ATTN_KERNELS_BACKWARD_TILES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_BACKWARD_TILES_INL_H_
#undef ATTN_KERNELS_BACKWARD_TILES_INL_H_
#else
#define ATTN_KERNELS_BACKWARD_TILES_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>

#include "attn/core/valid_lengths.hpp"
#include "attn/kernels/flash_attention.hpp"
#include "kernels/dropout_hash.hpp"
#include "kernels/fast_math-inl.h"
#include "kernels/scratch_memory.hpp"
#include "kernels/tile_gemm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The buffers every backward pass keeps per thread: a head's query side (PrepareQueryTiles) and
// one key tile's softmax steps. Each kernel's scratch derives from it and adds its own buffers.
struct BackwardTileBuffers {
  float* grad_out_rows;        // n × dv_padded
  float* grad_out_transposed;  // tiles × dv × Br
  float* probabilities;        // Bc × Br: Pᵀ
  float* grad_scores;          // Bc × Br: dPᵀ, then dSᵀ
  float* dropped;              // Bc × Br: (P ⊙ Z)ᵀ with Z the dropout multipliers
  float* delta;                // tiles × Br: D
  float* lse;                  // tiles × Br
  int32_t* lengths;            // tiles × Br
  int32_t* tile_most;          // tiles: the longest length in each query tile
  uint32_t* row_keys;          // tiles × Br: dropout_hash::row_key of each query

  // Takes these buffers from carve_scratch's `take`: n queries in tiles of br, key tiles of bc,
  // values of size dv (rows padded to dv_padded).
  template <class Take>
  void take_tile_buffers(const Take& take, size_t n, size_t br, size_t bc, size_t dv,
                         size_t dv_padded) {
    const size_t tiles = (n + br - 1) / br, n_padded = tiles * br;
    grad_out_rows = take(n * dv_padded);
    grad_out_transposed = take(n_padded * dv);
    probabilities = take(bc * br);
    grad_scores = take(bc * br);
    dropped = take(bc * br);
    delta = take(n_padded);
    lse = take(n_padded);
    lengths = as_int32(take(n_padded));
    tile_most = as_int32(take(tiles));
    row_keys = as_uint32(take(n_padded));
  }
};

// The query side of head (b, h), once per head: dO rows padded to dv_padded (grad_out_rows), dOᵀ
// per query tile of br (grad_out_transposed, tiles × dv × br), D_i = dO_i · O_i (delta), the
// log-sum-exp (lse; rows that see no key get 0 instead of −∞: they are fully masked, so any finite
// stand-in will do), visible lengths, dropout row keys and each tile's longest length (tile_most)
// in `s`, padding rows zero. `head_lse` holds the head's n forward values. Returns the head's
// longest length.
inline int32_t PrepareQueryTiles(const ConstHeadsView& out, const ConstHeadsView& grad_out,
                                 const float* head_lse, const ValidLengths& valid_lens,
                                 const FlashAttentionOptions& options, int64_t keys, int64_t b,
                                 int64_t h, size_t br, size_t dv_padded, BackwardTileBuffers& s) {
  const auto n = static_cast<size_t>(out.rows), dv = static_cast<size_t>(out.cols);
  const float* grad_out_head = grad_out.matrix(b, h);
  const float* out_head = out.matrix(b, h);
  for (size_t i = 0; i < n; ++i) {
    float* row = s.grad_out_rows + i * dv_padded;
    std::copy_n(grad_out_head + static_cast<int64_t>(i) * grad_out.row_stride, dv, row);
    std::fill(row + dv, row + dv_padded, 0.0F);
  }
  int32_t most = 0;
  for (size_t tile = 0; tile * br < n; ++tile) {
    float* grad_out_transposed = s.grad_out_transposed + tile * dv * br;
    int32_t tile_most = 0;
    for (size_t r = 0; r < br; ++r) {
      const size_t i = tile * br + r;
      const bool real = i < n;
      const float* grad_out_row = s.grad_out_rows + i * dv_padded;
      for (size_t t = 0; t < dv; ++t)
        grad_out_transposed[t * br + r] = real ? grad_out_row[t] : 0.0F;
      float delta = 0.0F;
      if (real) {
        const float* out_row = out_head + static_cast<int64_t>(i) * out.row_stride;
        for (size_t t = 0; t < dv; ++t) delta += out_row[t] * grad_out_row[t];
      }
      const auto query = static_cast<int64_t>(i);
      const int32_t length = real ? static_cast<int32_t>(valid_lens.visible_length(
                                        b, query, out.rows, keys, options.causal))
                                  : 0;
      s.delta[i] = delta;
      s.lse[i] = length > 0 ? head_lse[i] : 0.0F;
      s.lengths[i] = length;
      s.row_keys[i] = dropout_hash::row_key(options.seed, b * out.heads + h, query);
      tile_most = std::max(tile_most, length);
    }
    s.tile_most[tile] = tile_most;
    most = std::max(most, tile_most);
  }
  return most;
}

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
