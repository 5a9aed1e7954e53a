// Fused scaled dot-product attention on the CPU (FlashAttention-2's algorithm): query tiles × key
// tiles with an online softmax, never materialising the n × m score matrix; forward, backward, and
// the weights recomputed on request. SIMD through Highway, chosen at run time for the machine;
// threads through OpenMP. The additive family is in additive_attention.hpp.
#pragma once

#include <cmath>
#include <cstdint>

#include "attn/core/half.hpp"
#include "attn/core/valid_lengths.hpp"
#include "attn/kernels/fused_options.hpp"
#include "attn/kernels/heads_view.hpp"

namespace attn {

// The log-sum-exp that a pass recomputing P (the backward pass, the weights) is given.
// The backward pass computes the scores of a query tile of at most this many queries by dot
// products along the head (where a vector's lanes would each hold a query), larger tiles by its
// tile products: the sums run in other orders, so the two give other last bits.
inline constexpr int64_t kBackwardFewQueries = 4;

enum class LogSumExpKind {
  kForward,            // the forward pass's, natural: P = exp(S − lse)
  kRecomputedBaseTwo,  // flash_attention_recomputed_log_sum_exp's: P = 2^(S·log2 e − lse)
};

// out[b, h] = softmax(S) V for every batch element b and query head h, where
// S_ij = scale · q_i·k_j, then soft-capped, plus ALiBi, plus a float mask, as `options` say, and
// query i sees only the keys that its valid length (valid_lens.length(b, i), the same for every
// head), the causal and window bounds and a bool mask leave; a query that sees no key gets a zero
// output. Grouped-query attention: k and v have H_kv heads dividing q's H heads, and query head h
// reads key/value head h / (H / H_kv); K and V are never copied per query head.
// Layouts: q (B·H: n × d), k (B·H_kv: m × d), v (B·H_kv: m × dv), out (B·H: n × dv), all strided
// (see HeadsView).
// `log_sum_exp`, when not null, receives B·H·n values (batch, head, query order): the natural log
// of each row's softmax denominator (sinks included), −∞ for a row that sees no key and has no
// sink, for the backward pass. Throws ShapeError/ValueError for inconsistent shapes or lengths.
// Key tiles that no query of a query tile sees (causal, window, lengths, an all-false bool mask
// tile) are skipped: a window of w keys costs O(n·w), not O(n·m).
// Accuracy: within a few float32 ulps of the plain path per accumulated term (tests use 1e-5
// relative to the output's magnitude). Extra memory: per thread, a packed copy of one head's keys
// and values, m·(d + dv) floats, plus tiles of a few tens of kilobytes.
//
// `read`, when not null, receives the largest magnitude of the query rows and of the key and value
// rows the pass read — every query row, and the keys of the ranges its query tiles reach (lengths,
// causal bounds, windows and key ranges narrow them; a key a bool mask hides may still be read) —
// with NaN or +∞ where one of them is not finite: a caller may check the inputs after the pass
// from these, instead of scanning every element before it (a second read of the inputs, which
// cost 5% of a pass at n = 1024 and 12% of a 256-key window at n = 4096 on Zen 5).
struct ReadMagnitudes {
  float query = 0.0F, key = 0.0F, value = 0.0F;
};
void flash_attention_forward(ConstHeadsView q, ConstHeadsView k, ConstHeadsView v,
                             const ValidLengths& valid_lens, const FlashAttentionOptions& options,
                             HeadsView out, float* log_sum_exp = nullptr,
                             ReadMagnitudes* read = nullptr);

// The same pass over half-precision q, k, v (all of `type`), written to `out` in `type`, as
// PyTorch's bf16/fp16 attention: scores, softmax and the output accumulate in fp32, and the output
// is rounded once (to nearest even). bf16 inputs run on bf16 products where they are faster than
// fp32 FMAs — AMX tiles, or the CPU's bf16 dot products (vdpbf16ps) on AMD's cores; see
// flash_attention_bfloat16_native(d) — and the probabilities then enter P·V as
// bf16_probabilities() says (bfloat16_probabilities.hpp): by default in two bf16 parts on AMX
// tiles, which adds at most 2⁻¹⁶·Σ_j P_ij·|v_j| to an output, and rounded to bf16 on vdpbf16ps,
// as PyTorch's and FlashAttention's bf16 kernels round them, at most 2⁻⁸·Σ_j P_ij·|v_j|. Elsewhere,
// and for fp16, the kernel widens each row to fp32 as it packs it and computes exactly as the fp32
// pass does on the widened values. `read` as the fp32 pass's, in the floats the inputs widen to.
// `out_residual`, when its data is not null (shaped as `out`), receives each output element's
// rounding residual, (o − rounded o) · output_residual_scale(type) rounded to `type` (0 where the
// rounded output is not finite): for the backward pass, whose D = rowsum(dO ∘ O) from the rounded
// output alone carries that rounding into every dS = P ⊙ (dP − D), which is small where one key
// dominates a row (fp16 dQ off by 1e-2–1 of its largest at scores of a few hundred; 1e-6–1e-3
// with the residual).
void flash_attention_forward(HalfType type, ConstHalfHeadsView q, ConstHalfHeadsView k,
                             ConstHalfHeadsView v, const ValidLengths& valid_lens,
                             const FlashAttentionOptions& options, HalfHeadsView out,
                             float* log_sum_exp = nullptr, ReadMagnitudes* read = nullptr,
                             HalfHeadsView out_residual = {});

// The factor an output's rounding residual is stored scaled by: 2^8 for bf16, 2^11 for fp16
// (whose residuals of outputs below 2^-3 would otherwise fall among its subnormals). A normal
// element's residual is at most half an ulp of it, so the scaled one is at most its magnitude.
constexpr float output_residual_scale(HalfType type) {
  return type == HalfType::kFloat16 ? 2048.0F : 256.0F;
}
// The residual of an output `exact` that was rounded to `rounded` (its bits): (exact − rounded) ·
// output_residual_scale(type), rounded to `type`; 0 where the rounded value is not finite.
inline uint16_t output_residual(HalfType type, float exact, uint16_t rounded) {
  const float kept = half_bits_to_float(type, rounded);
  return float_to_half_bits(
      type, std::isfinite(kept) ? (exact - kept) * output_residual_scale(type) : 0.0F);
}
// The output before its rounding, from the rounded bits and their residual: within the residual's
// own rounding (2⁻¹⁷ of the output in bf16, 2⁻²² in fp16, where normal).
inline float output_with_residual(HalfType type, uint16_t rounded, uint16_t residual) {
  return half_bits_to_float(type, rounded) +
         half_bits_to_float(type, residual) * (1.0F / output_residual_scale(type));
}

// True when the bf16 forward pass on heads of `depth` (q, k) runs its products on bf16 pairs under
// the SIMD target dispatch picks: on AMX tiles where they are in use (amx_tiles_in_use(); a depth
// off their 32 columns is padded with zeros), on vdpbf16ps where bf16_dot_in_use() (AVX512-BF16
// where it outpaces fp32 FMAs: AMD's Zen 4 and later; bfloat16_dot.hpp). Elsewhere bf16 widens to
// fp32. Every depth is answered alike today; the argument stays for the backward's like question.
bool flash_attention_bfloat16_native(int64_t depth);

// True when the fp32 (and fp16) forward pass with dot-product scores and no dropout runs its
// products on AMX tiles, each operand as three bf16 parts (fp32_on_amx() in amx.hpp): under the
// AVX-512 targets with AVX512-BF16 where amx_tiles_in_use() (hardware, or the tile model).
bool flash_attention_float_on_tiles();

// True when the bf16 backward pass on heads of `depth` (q, k) and `value_depth` (v) runs its
// products on bf16 pairs: where the forward's products are on AMX tiles (amx_tiles_in_use():
// hardware where amx_available(), or the tile model), on AMX tiles for every whole tile of 64 keys
// and 64 queries (vdpbf16ps for the rest), at any depth (padded with zeros to the tiles' 32
// columns); without tiles, on vdpbf16ps where bf16_dot_in_use(). On Intel's cores vdpbf16ps makes
// half the fp32 FMAs' products per cycle (the bf16 backward on it ran at 0.55–0.73× the fp32
// backward's speed on the Xeon of docs/benchmarks.md), so there without tiles bf16 widens to fp32
// as fp16 does (the gradients then the float pass's on the widened inputs, rounded once).
bool flash_attention_bfloat16_backward_native(int64_t depth, int64_t value_depth);

// FlashAttention-2's backward pass: gradients of sum(out ⊙ grad_out) with respect to q, k, v,
// recomputing the probabilities tile by tile from the forward pass's `log_sum_exp` instead of
// storing them. `out` and `log_sum_exp` must come from flash_attention_forward with the same
// inputs, lengths and options. Layouts as the forward pass; grad_q, grad_k, grad_v are
// overwritten (grad_k and grad_v sum over the query heads that share a key/value head).
// `grad_mask` (floats addressed by its strides as options.mask's entries are, which must be a float
// mask) has the gradient with respect to the float mask, dS, ADDED into it (broadcast axes sum);
// `grad_sinks` (H values) has the gradient with respect to the sinks, summed over the batch, added.
// Either may be left empty / null. Work is split over (batch, key/value head) pairs. Extra memory:
// about 6·(n + m)·d floats per thread, plus one copy of the mask per thread when grad_mask
// broadcasts over batch elements or key/value heads.
// `kind` kRecomputedBaseTwo: `log_sum_exp` is flash_attention_recomputed_log_sum_exp's, and the
// pass computes its scores as that function does (FMA products, none on AMX tiles), so that its P
// agrees with that log-sum-exp bit for bit: for rows whose forward log-sum-exp is too large to be
// exact in a float (|lse| beyond a few hundred), and for rows of heads of at most
// kBackwardFewQueries queries at scores far from 0 (their forward summed each score in another
// order than this pass's dot products along the head).
// `read`, when not null, receives the largest magnitudes of the rows the pass read, as the
// forward's `read` (NaN or +∞ where one is not finite): every row of q, out and grad_out, and the
// key and value rows of the whole 64-key tiles some query's range reaches.
struct BackwardReadMagnitudes {
  float query = 0.0F, key = 0.0F, value = 0.0F, output = 0.0F, grad_output = 0.0F;
};
void flash_attention_backward(ConstHeadsView q, ConstHeadsView k, ConstHeadsView v,
                              ConstHeadsView out, ConstHeadsView grad_out, const float* log_sum_exp,
                              const ValidLengths& valid_lens, const FlashAttentionOptions& options,
                              HeadsView grad_q, HeadsView grad_k, HeadsView grad_v,
                              ScoreMaskGradient grad_mask = {}, float* grad_sinks = nullptr,
                              BackwardReadMagnitudes* read = nullptr,
                              LogSumExpKind kind = LogSumExpKind::kForward);

// The same backward pass over half-precision q, k, v, out and grad_out (all of `type`), with the
// gradients grad_q, grad_k, grad_v rounded once to `type` (nearest even); every sum accumulates
// in fp32. fp16, and bf16 where flash_attention_bfloat16_backward_native(d, dv) is false: the
// inputs are widened exactly as each row is packed, so the gradients are the float pass's on the
// widened inputs, rounded. bf16 where it is true: all five products run on vdpbf16ps, the scores
// and dP from exact products of the inputs (the scores equal the bf16 forward's), dV, dK and dQ
// with P ⊙ Z and dS in bf16 as bf16_probabilities() gives the forward's P to P·V: in two parts
// (by default on AMX tiles), each gradient element within 2⁻¹⁶ of the sum of its terms'
// magnitudes, or rounded (on vdpbf16ps, as FlashAttention's bf16 kernels round them), 2⁻⁸. `read` as the float pass's, of
// the floats the inputs widen to. `out_residual`, when its data is not null, is the forward's
// (shaped as `out`): D = rowsum(dO ∘ O) then takes O as out + out_residual / output_residual_scale.
void flash_attention_backward(HalfType type, ConstHalfHeadsView q, ConstHalfHeadsView k,
                              ConstHalfHeadsView v, ConstHalfHeadsView out,
                              ConstHalfHeadsView grad_out, const float* log_sum_exp,
                              const ValidLengths& valid_lens, const FlashAttentionOptions& options,
                              HalfHeadsView grad_q, HalfHeadsView grad_k, HalfHeadsView grad_v,
                              ScoreMaskGradient grad_mask = {}, float* grad_sinks = nullptr,
                              BackwardReadMagnitudes* read = nullptr,
                              ConstHalfHeadsView out_residual = {});

// The attention weights of a forward pass, P_ij = exp(S_ij − log_sum_exp_i) (before dropout),
// recomputed tile by tile exactly as the backward pass does, into `weights` (B·H: n × m,
// strided): what a materialising implementation would have returned, computed only on request.
// With kRecomputedBaseTwo, `log_sum_exp` is flash_attention_recomputed_log_sum_exp's and P_ij =
// 2^(S_ij·log2 e − log_sum_exp_i).
void flash_attention_weights(ConstHeadsView q, ConstHeadsView k, const float* log_sum_exp,
                             const ValidLengths& valid_lens, const FlashAttentionOptions& options,
                             HeadsView weights, LogSumExpKind kind = LogSumExpKind::kForward);

// Each row's log-sum-exp in base 2, log2(Σ_j 2^(S_ij·log2 e) + 2^(sink·log2 e)), into
// `log_sum_exp_base_two` (B·H·n; −∞ for a row that sees nothing), from scores computed bit for bit
// as the fp32 backward pass and flash_attention_weights compute them when given it
// (kRecomputedBaseTwo). For rows whose forward log-sum-exp is too large for a float to carry
// log(sum) (|lse| beyond a few hundred: scores near −1e9 from a mask, or beyond ±1e4): a P
// recomputed from the forward's value is then the true one times 2^δ, δ a few ulps of the scores,
// which overflows or vanishes at large magnitudes; from this one, a row's largest score gets
// exactly 1, and the row's P total, written to `totals` (B·H·n, optional; 0 for a row that sees
// nothing), lies between 1 and the number of its keys (ties at 1e9 lose log(count) to rounding):
// a pass dividing its row of grad_output by it is exact.
void flash_attention_recomputed_log_sum_exp(ConstHeadsView q, ConstHeadsView k,
                                            const ValidLengths& valid_lens,
                                            const FlashAttentionOptions& options,
                                            float* log_sum_exp_base_two, float* totals = nullptr);

}  // namespace attn
