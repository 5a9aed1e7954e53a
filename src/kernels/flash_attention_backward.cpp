// Fused scaled dot-product attention, backward (FlashAttention-2): per (batch, head), key tiles in
// the outer loop so each tile's dK and dV stay in scratch, query tiles inside, the probabilities
// recomputed from the forward pass's log-sum-exp. Layout and notation as the forward kernel.
//
// Derivation, with S = c·Q Kᵀ (c the scale), P = softmax(S) masked, O = P V:
//   dV = Pᵀ dO,   dP = dO Vᵀ,   dS = P ⊙ (dP − D) with D_i = Σ_t dO_it O_it (= Σ_j P_ij dP_ij),
//   dQ = c · dS K,   dK = c · dSᵀ Q.
// Everything runs on transposed tiles (keys × queries) so the per-query D and log-sum-exp are
// lane-wise, and every product is the tile GEMM of tile_gemm-inl.h.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "attn/core/error.hpp"
#include "attn/kernels/flash_attention.hpp"
#include "kernels/dropout_hash.hpp"
#include "kernels/scratch_memory.hpp"

#ifndef ATTN_FLASH_ATTENTION_BACKWARD_SHARED
#define ATTN_FLASH_ATTENTION_BACKWARD_SHARED
namespace attn::flash_backward_detail {

struct BackwardArgs {
  ConstHeadsView q, k, v, out, grad_out;
  const float* log_sum_exp;
  const ValidLengths* valid_lens;
  FlashAttentionOptions options;
  HeadsView grad_q, grad_k, grad_v;
};

constexpr size_t kQueryVectors = 4;
constexpr size_t kKeyTile = 64;

}  // namespace attn::flash_backward_detail
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/flash_attention_backward.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// Highway's headers must follow foreach_target.h.
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include "kernels/backward_tiles-inl.h"
#include "kernels/fast_math-inl.h"
#include "kernels/tile_gemm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using flash_backward_detail::BackwardArgs;

// Per-thread scratch for one head at a time; sized once per call.
struct BackwardScratch : BackwardTileBuffers {
  hwy::AlignedFreeUniquePtr<float[]> memory;
  float* q_rows;        // n × d_padded: Q, unscaled
  float* q_transposed;  // tiles × d × Br: c·Qᵀ per query tile
  float* k_rows;        // m × d_padded
  float* grad_q;        // n × d_padded
  float* grad_k;        // Bc × d_padded
  float* grad_v;        // Bc × dv_padded

  BackwardScratch(size_t n, size_t m, size_t d, size_t dv, size_t lanes) {
    const size_t br = flash_backward_detail::kQueryVectors * lanes,
                 bc = flash_backward_detail::kKeyTile;
    const size_t n_padded = (n + br - 1) / br * br;
    const size_t d_padded = hwy::RoundUpTo(d, lanes), dv_padded = hwy::RoundUpTo(dv, lanes);
    memory = carve_scratch(lanes, [&](const auto& take) {
      take_tile_buffers(take, n, br, bc, dv, dv_padded);
      q_rows = take(n * d_padded);
      q_transposed = take(n_padded * d);
      k_rows = take(m * d_padded);
      grad_q = take(n * d_padded);
      grad_k = take(bc * d_padded);
      grad_v = take(bc * dv_padded);
    });
  }
};

// Copies `rows` rows of `cols` floats (row stride `stride`) into a row-major buffer of `padded`
// columns, zero-filling the padding.
void PadRows(const float* source, int64_t stride, size_t rows, size_t cols, size_t padded,
             float* destination) {
  for (size_t r = 0; r < rows; ++r) {
    std::copy_n(source + static_cast<int64_t>(r) * stride, cols, destination + r * padded);
    std::fill(destination + r * padded + cols, destination + (r + 1) * padded, 0.0F);
  }
}

void FlashBackwardHead(const BackwardArgs& args, int64_t b, int64_t h, BackwardScratch& s) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  const size_t br = flash_backward_detail::kQueryVectors * lanes;
  const size_t n = static_cast<size_t>(args.q.rows), m = static_cast<size_t>(args.k.rows);
  const size_t depth = static_cast<size_t>(args.q.cols), dv = static_cast<size_t>(args.v.cols);
  const size_t d_padded = hwy::RoundUpTo(depth, lanes), dv_padded = hwy::RoundUpTo(dv, lanes);
  const size_t tiles = (n + br - 1) / br;
  const float scale = args.options.scale;
  const float* q = args.q.matrix(b, h);
  const float* k = args.k.matrix(b, h);
  const float* v = args.v.matrix(b, h);
  const float* lse = args.log_sum_exp + (b * args.q.heads + h) * args.q.rows;

  // Per head: padded and transposed copies, D, log-sum-exp and lengths per query.
  PadRows(q, args.q.row_stride, n, depth, d_padded, s.q_rows);
  PadRows(k, args.k.row_stride, m, depth, d_padded, s.k_rows);
  std::fill(s.grad_q, s.grad_q + n * d_padded, 0.0F);
  const int32_t most = PrepareQueryTiles(args.out, args.grad_out, lse, *args.valid_lens,
                                         args.options, args.k.rows, b, h, br, dv_padded, s);
  for (size_t tile = 0; tile < tiles; ++tile) {
    float* qt = s.q_transposed + tile * depth * br;
    for (size_t r = 0; r < br; ++r) {
      const size_t i = tile * br + r;
      for (size_t t = 0; t < depth; ++t)
        qt[t * br + r] = i < n ? s.q_rows[i * d_padded + t] * scale : 0.0F;
    }
  }

  const bool dropout = args.options.dropout > 0.0F;
  const DropoutApplier<decltype(d)> dropout_applier(d, args.options.dropout);
  float* grad_k_head = args.grad_k.matrix(b, h);
  float* grad_v_head = args.grad_v.matrix(b, h);
  for (size_t key0 = 0; key0 < m; key0 += flash_backward_detail::kKeyTile) {
    const size_t bc = std::min(flash_backward_detail::kKeyTile, m - key0);
    std::fill(s.grad_k, s.grad_k + bc * d_padded, 0.0F);
    std::fill(s.grad_v, s.grad_v + bc * dv_padded, 0.0F);
    for (size_t tile = 0; tile < tiles && static_cast<int64_t>(key0) < most; ++tile) {
      if (s.tile_most[tile] <= static_cast<int32_t>(key0))
        continue;  // no query here sees these keys
      const size_t first = tile * br, rows = std::min(br, n - first);
      // Sᵀ = K c·Qᵀ, then Pᵀ = exp(Sᵀ − lse), zero where masked.
      Gemm<false>(d, bc, flash_backward_detail::kQueryVectors,
                  k + static_cast<int64_t>(key0) * args.k.row_stride,
                  static_cast<size_t>(args.k.row_stride), 1, s.q_transposed + tile * depth * br, br,
                  depth, s.probabilities, br);
      ProbabilitiesFromScores(d, bc, key0, br, s.lengths + first, s.lse + first, s.probabilities);
      // With dropout, the forward pass multiplied V by P ⊙ Z: regenerate Z from the hash.
      const float* used = s.probabilities;
      if (dropout) {
        ApplyDropout(d, dropout_applier, bc, key0, br, s.row_keys + first, s.probabilities,
                     s.dropped);
        used = s.dropped;
      }
      // dV += (P ⊙ Z)ᵀ dO.
      Gemm<true>(d, bc, dv_padded / lanes, used, br, 1, s.grad_out_rows + first * dv_padded,
                 dv_padded, rows, s.grad_v, dv_padded);
      // dPᵀ = V dOᵀ, then dSᵀ = Pᵀ ⊙ (Zᵀ ⊙ dPᵀ − D) = (P ⊙ Z)ᵀ ⊙ dPᵀ − Pᵀ ⊙ D.
      Gemm<false>(d, bc, flash_backward_detail::kQueryVectors,
                  v + static_cast<int64_t>(key0) * args.v.row_stride,
                  static_cast<size_t>(args.v.row_stride), 1, s.grad_out_transposed + tile * dv * br,
                  br, dv, s.grad_scores, br);
      GradScoresFromGradProbabilities(d, bc, br, s.probabilities, used, s.delta + first,
                                      s.grad_scores);
      // dK += dSᵀ Q (scaled at the end); dQ += dS K.
      Gemm<true>(d, bc, d_padded / lanes, s.grad_scores, br, 1, s.q_rows + first * d_padded,
                 d_padded, rows, s.grad_k, d_padded);
      Gemm<true>(d, rows, d_padded / lanes, s.grad_scores, 1, br, s.k_rows + key0 * d_padded,
                 d_padded, bc, s.grad_q + first * d_padded, d_padded);
    }
    for (size_t j = 0; j < bc; ++j) {
      float* grad_k_row = grad_k_head + static_cast<int64_t>(key0 + j) * args.grad_k.row_stride;
      float* grad_v_row = grad_v_head + static_cast<int64_t>(key0 + j) * args.grad_v.row_stride;
      for (size_t t = 0; t < depth; ++t) grad_k_row[t] = s.grad_k[j * d_padded + t] * scale;
      std::copy_n(s.grad_v + j * dv_padded, dv, grad_v_row);
    }
  }
  float* grad_q_head = args.grad_q.matrix(b, h);
  for (size_t i = 0; i < n; ++i) {
    float* grad_q_row = grad_q_head + static_cast<int64_t>(i) * args.grad_q.row_stride;
    for (size_t t = 0; t < depth; ++t) grad_q_row[t] = s.grad_q[i * d_padded + t] * scale;
  }
}

void FlashBackward(const BackwardArgs& args) {
  const hn::ScalableTag<float> d;
  const int64_t heads = args.q.batch * args.q.heads;
  bool out_of_memory = false;
#pragma omp parallel
  {
    BackwardScratch scratch(static_cast<size_t>(args.q.rows), static_cast<size_t>(args.k.rows),
                            static_cast<size_t>(args.q.cols), static_cast<size_t>(args.v.cols),
                            hn::Lanes(d));
    if (scratch.memory == nullptr) {
#pragma omp atomic write
      out_of_memory = true;
    } else {
#pragma omp for schedule(dynamic, 1)
      for (int64_t head = 0; head < heads; ++head) {
        FlashBackwardHead(args, head / args.q.heads, head % args.q.heads, scratch);
      }
    }
  }
  if (out_of_memory)
    throw Error("flash_attention_backward: could not allocate per-thread scratch memory");
}

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {

HWY_EXPORT(FlashBackward);

namespace {
void require_like(const ConstHeadsView& view, std::string_view name, const ConstHeadsView& like,
                  std::string_view like_name) {
  if (view.batch != like.batch || view.heads != like.heads || view.rows != like.rows ||
      view.cols != like.cols) {
    throw ShapeError(std::string(name) + ": expected " + std::to_string(like.batch) + " × " +
                     std::to_string(like.heads) + " heads of " + std::to_string(like.rows) + " × " +
                     std::to_string(like.cols) + " (as " + std::string(like_name) + "), got " +
                     std::to_string(view.batch) + " × " + std::to_string(view.heads) + " of " +
                     std::to_string(view.rows) + " × " + std::to_string(view.cols));
  }
}
}  // namespace

void flash_attention_backward(ConstHeadsView q, ConstHeadsView k, ConstHeadsView v,
                              ConstHeadsView out, ConstHeadsView grad_out, const float* log_sum_exp,
                              const ValidLengths& valid_lens, const FlashAttentionOptions& options,
                              HeadsView grad_q, HeadsView grad_k, HeadsView grad_v) {
  if (k.batch != q.batch || k.heads != q.heads || k.cols != q.cols) {
    throw ShapeError("keys: expected " + std::to_string(q.batch) + " × " + std::to_string(q.heads) +
                     " heads of size " + std::to_string(q.cols) + " (as queries), got " +
                     std::to_string(k.batch) + " × " + std::to_string(k.heads) + " of size " +
                     std::to_string(k.cols));
  }
  if (v.batch != q.batch || v.heads != q.heads || v.rows != k.rows) {
    throw ShapeError("values: expected one row per key (" + std::to_string(k.rows) + "), got " +
                     std::to_string(v.rows));
  }
  require_like(out, "out", ConstHeadsView{nullptr, q.batch, q.heads, q.rows, v.cols, 0, 0, 0},
               "queries × values");
  require_like(grad_out, "grad_out", out, "out");
  require_like(grad_q, "grad_q", q, "queries");
  require_like(grad_k, "grad_k", k, "keys");
  require_like(grad_v, "grad_v", v, "values");
  if (log_sum_exp == nullptr)
    throw ValueError("log_sum_exp: expected the forward pass's values, got a null pointer");
  if (k.rows > std::numeric_limits<int32_t>::max()) {
    throw ValueError("keys: expected at most 2^31 − 1 keys, got " + std::to_string(k.rows));
  }
  valid_lens.check("valid_lens", q.batch, q.rows, k.rows);
  if (q.batch == 0 || q.heads == 0) return;
  const flash_backward_detail::BackwardArgs args{
      q, k, v, out, grad_out, log_sum_exp, &valid_lens, options, grad_q, grad_k, grad_v};
  HWY_DYNAMIC_DISPATCH(FlashBackward)(args);
}

}  // namespace attn
#endif  // HWY_ONCE
