// What the fused backward passes share, per SIMD target (a Highway "-inl.h" header): the query side
// of a head prepared once, then the softmax steps on transposed tiles (keys × Br queries, the
// queries along the lanes): Pᵀ from the masked scores and the forward pass's log-sum-exp, the
// dropout multipliers regenerated, and dSᵀ from dPᵀ.

#if defined(ATTN_KERNELS_BACKWARD_TILES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_BACKWARD_TILES_INL_H_
#undef ATTN_KERNELS_BACKWARD_TILES_INL_H_
#else
#define ATTN_KERNELS_BACKWARD_TILES_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <limits>

#include "attn/core/half.hpp"
#include "attn/core/valid_lengths.hpp"
#include "attn/kernels/flash_attention.hpp"
#include "attn/kernels/fused_options.hpp"
#include "attn/kernels/heads_view.hpp"
#include "kernels/dropout_hash.hpp"
#include "kernels/fast_math-inl.h"
#include "kernels/half_rows-inl.h"
#include "kernels/rows_view.hpp"
#include "kernels/score_masks.hpp"
#include "kernels/scratch_memory.hpp"
#include "kernels/tile_gemm-inl.h"
#include "kernels/transpose_tile-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The buffers every backward pass keeps per thread: a head's query side (PrepareQueryTiles) and
// one key tile's softmax steps. Each kernel's scratch derives from it and adds its own buffers.
struct BackwardTileBuffers {
  float* grad_out_rows;        // n × dv_padded: dO's rows padded, unless read in place
  float* grad_out_transposed;  // tiles × dv × Br: dOᵀ, rows TileWidth lanes apart
  float* probabilities;        // Bc × Br: Sᵀ, then Pᵀ
  float* grad_scores;          // Bc × Br: dPᵀ, then dSᵀ
  float* dropped;              // Bc × Br: (P ⊙ Z)ᵀ with Z the dropout multipliers
  float* softcap_tanh;         // Bc × Br: tanh(s / softcap) of the raw scores
  float* delta;                // tiles × Br: D
  float* lse;                  // tiles × Br
  int32_t* first;              // tiles × Br: each query's first visible key
  int32_t* last;               // tiles × Br: one past its last
  int32_t* tile_bounds;        // tiles × 4: the query tile's TileKeyRanges
  uint32_t* row_keys;          // tiles × Br: dropout_hash::row_key of each query
  // dO's rows for the head PrepareQueryTiles prepared: in place (DenseRows) or grad_out_rows.
  RowsView grad_out;

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
    softcap_tanh = take(bc * br);
    delta = take(n_padded);
    lse = take(n_padded);
    first = as_int32(take(n_padded));
    last = as_int32(take(n_padded));
    tile_bounds = as_int32(take(tiles * 4));
    row_keys = as_uint32(take(n_padded));
  }

  // The key ranges of query tile `tile`, as PrepareQueryTiles left them.
  TileKeyRanges tile_ranges(size_t tile) const {
    const int32_t* bounds = tile_bounds + tile * 4;
    return {bounds[0], bounds[1], bounds[2], bounds[3]};
  }
};

// The lanes of a backward pass's transposed tile of `rows` queries (Br lanes at most), and the
// lane stride of its rows: the vectors that hold one of them. The steps compute no lane past them
// (the products read none), and a tile of 8 queries keeps a column of Qᵀ or dOᵀ in one cache line
// instead of four.
template <class D>
HWY_INLINE size_t TileWidth(D d, size_t rows, size_t br) {
  return VectorsHolding(d, rows, br / hn::Lanes(d)) * hn::Lanes(d);
}

// dO_i · O_i over dv floats: vectors, then the last columns one by one. (A plain loop summed in
// order, one horizontal shuffle chain per vector: 3% of the backward pass's time.)
inline float RowDot(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, size_t count) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  auto sum0 = hn::Zero(d), sum1 = hn::Zero(d);
  size_t t = 0;
  for (; t + 2 * lanes <= count; t += 2 * lanes) {
    sum0 = hn::MulAdd(hn::LoadU(d, a + t), hn::LoadU(d, b + t), sum0);
    sum1 = hn::MulAdd(hn::LoadU(d, a + t + lanes), hn::LoadU(d, b + t + lanes), sum1);
  }
  for (; t + lanes <= count; t += lanes)
    sum0 = hn::MulAdd(hn::LoadU(d, a + t), hn::LoadU(d, b + t), sum0);
  float total = hn::GetLane(hn::SumOfLanes(d, hn::Add(sum0, sum1)));
  for (; t < count; ++t) total += a[t] * b[t];
  return total;
}

// Tiles of at most this many queries compute Sᵀ and dPᵀ by FewQueryProducts rather than the Gemm.
inline constexpr auto kFewQueries = static_cast<size_t>(kBackwardFewQueries);

// Sᵀ or dPᵀ of a tile of `rows` ≤ kFewQueries queries, by dot products along the head:
// c[j·width + r] = scale · (a_j · b_r) for keys j < bc and queries r < rows, 0 in the padding lanes
// [rows, width). The Gemm's lanes run over the tile's queries — a vector of 16 lanes and d products
// per key for one query — where these run along the head: d/16 products and a horizontal sum per
// (key, query). (One query against 4 heads of 1024 keys, d = 64: the backward's S and dP products
// were 90% of its vector work.)
inline void FewQueryProducts(size_t bc, size_t rows, size_t width, const float* a, size_t a_stride,
                             const float* b, size_t b_stride, size_t depth, float scale, float* c) {
  for (size_t j = 0; j < bc; ++j) {
    float* row = c + j * width;
    const float* key_row = a + j * a_stride;
    for (size_t r = 0; r < rows; ++r) row[r] = scale * RowDot(key_row, b + r * b_stride, depth);
    std::fill(row + rows, row + width, 0.0F);
  }
}

// A backward pass's output and its gradient in half precision: PrepareQueryTiles widens their rows
// as it reads them (the float views then give shapes and strides only).
struct HalfQuerySide {
  HalfType type;
  ConstHalfHeadsView out, grad_out;
  float* out_row;  // dv floats of scratch: one widened output row
  // Data not null: the forward's rounding residuals of out (flash_attention_backward's
  // out_residual), added back to each widened row before D.
  ConstHalfHeadsView out_residual{};
};

// The query side of head (b, h), once per head: dO's rows in place (DenseRows) or padded to
// dv_padded (grad_out_rows; s.grad_out says which), dOᵀ per query tile of br (grad_out_transposed:
// tile t at t × dv × br, its rows TileWidth lanes apart), D_i = dO_i · O_i (delta), the log-sum-exp
// (lse; rows that saw nothing get 0 instead of −∞: all their scores are −∞, so any finite stand-in
// gives P = 0), each query's key range, dropout row keys and each tile's key ranges (tile_bounds)
// in `s`, padding rows zero. `head_lse` holds the head's n forward values; `half` gives
// half-precision out and grad_out; without `transposed`, dOᵀ is left out (a caller whose dP product
// reads dO otherwise); the log-sum-exp is stored times `lse_unit` (log2 e for scores in base 2).
// Returns one past the last key any query of the head sees.
inline int64_t PrepareQueryTiles(const ConstHeadsView& out, const ConstHeadsView& grad_out,
                                 const float* head_lse, const ValidLengths& valid_lens,
                                 const FlashAttentionOptions& options, int64_t keys, int64_t b,
                                 int64_t h, size_t br, size_t dv_padded, BackwardTileBuffers& s,
                                 const HalfQuerySide* half = nullptr, bool transposed = true,
                                 float lse_unit = 1.0F) {
  const auto n = static_cast<size_t>(out.rows), dv = static_cast<size_t>(out.cols);
  const hn::ScalableTag<float> d;
  if (half == nullptr && DenseRows(grad_out, hn::Lanes(d))) {
    s.grad_out = {grad_out.matrix(b, h), static_cast<size_t>(grad_out.row_stride)};
  } else {
    for (size_t i = 0; i < n; ++i) {
      float* row = s.grad_out_rows + i * dv_padded;
      const auto i_rows = static_cast<int64_t>(i);
      if (half != nullptr) {
        WidenRow(d, half->type, half->grad_out.matrix(b, h) + i_rows * half->grad_out.row_stride,
                 dv, row);
      } else {
        std::copy_n(grad_out.matrix(b, h) + i_rows * grad_out.row_stride, dv, row);
      }
      std::fill(row + dv, row + dv_padded, 0.0F);
    }
    s.grad_out = {s.grad_out_rows, dv_padded};
  }
  int64_t extent = 0;
  for (size_t tile = 0; tile * br < n; ++tile) {
    const size_t first_row = tile * br, rows = std::min(br, n - first_row);
    const TileKeyRanges ranges =
        tile_key_ranges(valid_lens, options, b, h, static_cast<int64_t>(first_row), rows, br,
                        out.rows, keys, s.first + first_row, s.last + first_row);
    int32_t* bounds = s.tile_bounds + tile * 4;
    bounds[0] = static_cast<int32_t>(ranges.begin);
    bounds[1] = static_cast<int32_t>(ranges.end);
    bounds[2] = static_cast<int32_t>(ranges.common_begin);
    bounds[3] = static_cast<int32_t>(ranges.common_end);
    extent = std::max(extent, ranges.end);
    if (transposed) {
      const size_t width = TileWidth(d, rows, br);
      TransposeScaledTile(s.grad_out.row(first_row), s.grad_out.stride, rows, dv, 1.0F, width,
                          width, s.grad_out_transposed + tile * dv * br);
    }
    const bool dropout = options.dropout > 0.0F;  // only dropout reads row_keys
    for (size_t i = first_row; i < first_row + rows; ++i) {
      const float* out_row = nullptr;
      if (half != nullptr) {
        WidenRow(d, half->type,
                 half->out.matrix(b, h) + static_cast<int64_t>(i) * half->out.row_stride, dv,
                 half->out_row);
        if (half->out_residual.data != nullptr) {
          AddResidualRow(d, half->type,
                         half->out_residual.matrix(b, h) +
                             static_cast<int64_t>(i) * half->out_residual.row_stride,
                         dv, half->out_row);
        }
        out_row = half->out_row;
      } else {
        out_row = out.matrix(b, h) + static_cast<int64_t>(i) * out.row_stride;
      }
      s.delta[i] = RowDot(out_row, s.grad_out.row(i), dv);
      s.lse[i] =
          head_lse[i] > -std::numeric_limits<float>::infinity() ? lse_unit * head_lse[i] : 0.0F;
      if (dropout) {
        s.row_keys[i] =
            dropout_hash::row_key(options.seed, b * out.heads + h, static_cast<int64_t>(i));
      }
    }
    // The padding lanes: written once per head rather than by the loop (a tile of one query
    // ran 64 of its iterations).
    std::fill(s.delta + first_row + rows, s.delta + first_row + br, 0.0F);
    std::fill(s.lse + first_row + rows, s.lse + first_row + br, 0.0F);
    if (dropout) std::fill(s.row_keys + first_row + rows, s.row_keys + first_row + br, 0U);
  }
  return extent;
}

// The steps below work on the lanes [0, width) of each key's row of a transposed tile (rows br
// apart; width a multiple of D's lanes): the vectors of the tile's queries that its products read.

// How ProbabilitiesFromScores exponentiates: e^x within about 1 ulp; e^x for probabilities that
// enter bf16 products next (P and dS = P ⊙ (dP − D)), where RoundedProbabilityExp's 5.4e−6 is far
// below their rounding; 2^x for scores and log-sum-exp in base 2 (the fp32 backward: their scale
// carries log2 e), ProbabilityExp2's 1.6e−7.
enum class ProbabilityExp { kNatural, kRoundedToBFloat16, kBaseTwo };

// Pᵀ = exp(c·Sᵀ − lse) in place for `keys` key rows, from scores the score modifiers already
// masked (−∞ gives 0); `lse` holds the tile's Br queries; c = `scale`, 1 for scores already scaled
// (c·S − lse in one rounding: with c = 1 exactly S − lse).
template <ProbabilityExp kExp = ProbabilityExp::kNatural, class D>
HWY_INLINE void ProbabilitiesFromScores(D d, size_t keys, size_t br, size_t width, const float* lse,
                                        float* probabilities, float scale = 1.0F) {
  const auto factor = hn::Set(d, scale);
  for (size_t j = 0; j < keys; ++j) {
    for (size_t r = 0; r < width; r += hn::Lanes(d)) {
      float* p = probabilities + j * br + r;
      const auto x = hn::MulSub(factor, hn::Load(d, p), hn::Load(d, lse + r));
      if constexpr (kExp == ProbabilityExp::kRoundedToBFloat16) {
        hn::Store(RoundedProbabilityExp(d, x), d, p);
      } else if constexpr (kExp == ProbabilityExp::kBaseTwo) {
        hn::Store(ProbabilityExp2(d, x), d, p);
      } else {
        hn::Store(SoftmaxExp(d, x), d, p);
      }
    }
  }
}

// (P ⊙ Z)ᵀ into `dropped`, Z the forward pass's dropout multipliers regenerated from the hash
// (`row_keys` of the tile's queries).
template <class D, class Applier>
HWY_INLINE void ApplyDropout(D d, const Applier& applier, size_t keys, size_t key0, size_t br,
                             size_t width, const uint32_t* row_keys, const float* probabilities,
                             float* dropped) {
  const hn::RebindToUnsigned<D> du;
  for (size_t j = 0; j < keys; ++j) {
    for (size_t r = 0; r < width; r += hn::Lanes(d)) {
      const auto p = hn::Load(d, probabilities + j * br + r);
      hn::Store(applier.Apply(d, hn::Load(du, row_keys + r), static_cast<uint32_t>(key0 + j), p), d,
                dropped + j * br + r);
    }
  }
}

// dSᵀ = Pᵀ ⊙ (Zᵀ ⊙ dPᵀ − D) = (P ⊙ Z)ᵀ ⊙ dPᵀ − Pᵀ ⊙ D in place of dPᵀ, with `used` = (P ⊙ Z)ᵀ (Pᵀ
// without dropout) and D the tile's rowsum(dO ⊙ O).
template <class D>
HWY_INLINE void GradScoresFromGradProbabilities(D d, size_t keys, size_t br, size_t width,
                                                const float* probabilities, const float* used,
                                                const float* delta, float* grad_scores) {
  for (size_t j = 0; j < keys; ++j) {
    for (size_t r = 0; r < width; r += hn::Lanes(d)) {
      float* ds = grad_scores + j * br + r;
      const auto p = hn::Load(d, probabilities + j * br + r);
      const auto p_used = hn::Load(d, used + j * br + r);
      hn::Store(hn::NegMulAdd(p, hn::Load(d, delta + r), hn::Mul(p_used, hn::Load(d, ds))), d, ds);
    }
  }
}

// dSᵀ ⊙ (1 − t²) in place, t = tanh(s / softcap) of the raw scores: the gradient through the soft
// cap s → softcap · tanh(s / softcap).
template <class D>
HWY_INLINE void SoftcapBackward(D d, size_t keys, size_t br, size_t width,
                                const float* softcap_tanh, float* grad_scores) {
  for (size_t j = 0; j < keys; ++j) {
    for (size_t r = 0; r < width; r += hn::Lanes(d)) {
      float* ds = grad_scores + j * br + r;
      const auto t = hn::Load(d, softcap_tanh + j * br + r);
      const auto grad = hn::Load(d, ds);
      hn::Store(hn::NegMulAdd(hn::Mul(grad, t), t, grad), d, ds);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_BACKWARD_TILES_INL_H_
