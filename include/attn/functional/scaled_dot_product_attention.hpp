// attn::scaled_dot_product_attention: PyTorch's torch.nn.functional.scaled_dot_product_attention
// on the CPU, forward and backward, through the fused kernels — with valid lengths, sliding
// windows, ALiBi, soft-capping and sinks beside PyTorch's masks, causal flag and grouped heads.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "attn/core/half.hpp"
#include "attn/core/strided_view.hpp"
#include "attn/core/tensor.hpp"
#include "attn/functional/attention_options.hpp"

namespace attn {

// Shapes, as PyTorch's: query (..., H_q, L, E), key (..., H_kv, S, E), value (..., H_kv, S, Ev),
// output (..., H_q, L, Ev), with the same leading axes "..." (any number, rank 2 to 8); H_kv = H_q
// unless options.enable_gqa. A rank-3 input (B, L, E) is B batch elements of one head (the book's
// layout), or, with enable_gqa and B differing between query and key, B heads (PyTorch's rule
// that axis −3 holds the heads). Any strides; the last axis of query, key, value and output must
// be contiguous (stride 1), or the input is copied once. Nothing is ever copied per head.
//
// Semantics, in order: S = scale · Q Kᵀ; soft-capping; ALiBi; a float attn_mask added (a bool
// one, valid lengths, causal and window hide keys); softmax over the visible keys, sinks joining
// the denominator; dropout; times V. A query that sees no key gets a zero output and zero
// gradients (PyTorch ≥ 2.5). Errors (ShapeError, ValueError) name the argument, or both options
// of an invalid combination.
//
// Kernels, picked by shape: decoding shapes — at most 16 queries per sequence against at least as
// many keys, no dropout, valid lengths the same for a sequence's queries, causal, window or ALiBi
// diagonals (if any) on the last key with every key valid (ALiBi without a mask), and an
// attn_mask (if any) whose
// every row is one interval of keys (padding, a static cache's empty slots, causal and window
// patterns) — run on the decode kernel (kernels/decode_attention.hpp: keys split across threads,
// each key/value row read once per group of query heads); everything else on the prefill
// kernels. Both give the result within float rounding of exact, their log-sum-exp too. The decode
// kernel checks the query, key and value rows it reads for NaN and ±∞ (the queries, its scores
// and its output) instead of scanning the inputs first (one read of the cache instead of two);
// when it finds one, the call is redone on the scanned path, which names the input. Two
// differences remain: rows the decode kernel never reads (hidden from every query) are not
// checked, and the prefill path refuses inputs whose score bound |scale|·E·max|q|·max|k| reaches
// 1e37, where the decode kernel, checking the scores themselves, answers when every one of them
// is finite. The prefill kernels
// likewise report the largest magnitude of the rows they read, and the call is checked from those
// after the pass (inputs with a contiguous last axis): rows no query tile reads are not checked
// there either; a failed check zeroes the output and redoes the call on the scanned path. The
// float backward pass checks the rows its kernel reads the same way (the half backward scans).

// What a forward pass leaves for its backward pass besides the inputs: the output and one
// log-sum-exp per query row (natural log of its softmax denominator, sinks included; −∞ for a
// row that sees nothing), in an order of attn's choosing: pass it back unchanged.
struct AttentionForward {
  Tensor output;
  std::vector<float> log_sum_exp;
};

// The number of log-sum-exp values a forward pass over `query` writes: one per query row.
int64_t log_sum_exp_size(const Shape& query);

// Forward pass into `output` (shaped as above, any strides with a contiguous last axis);
// `log_sum_exp`, when not empty, must hold log_sum_exp_size(query) floats.
void scaled_dot_product_attention(ConstStridedView query, ConstStridedView key,
                                  ConstStridedView value, const AttentionOptions& options,
                                  MutableStridedView output, std::span<float> log_sum_exp = {});
// The same into new storage.
AttentionForward scaled_dot_product_attention(ConstStridedView query, ConstStridedView key,
                                              ConstStridedView value,
                                              const AttentionOptions& options = {});

// Gradients of sum(output ⊙ grad_output), shaped as their inputs: query, key, value, and, when
// asked for, the float attn_mask (its shape, broadcast axes summed) and the sinks (H_q values).
struct AttentionBackward {
  Tensor query;
  Tensor key;
  Tensor value;
  Tensor attn_mask;  // empty unless asked for
  Tensor sinks;      // empty unless asked for
};

// The backward pass: `output` and `log_sum_exp` must be the forward pass's for the same inputs
// and options. Recomputes the probabilities tile by tile (FlashAttention-2); never builds L × S.
// `mask_gradient` needs a float attn_mask, `sinks_gradient` sinks.
AttentionBackward scaled_dot_product_attention_backward(
    ConstStridedView query, ConstStridedView key, ConstStridedView value, ConstStridedView output,
    ConstStridedView grad_output, std::span<const float> log_sum_exp,
    const AttentionOptions& options, bool mask_gradient = false, bool sinks_gradient = false);

// The same into caller-provided gradients shaped as query, key and value (any strides with a
// contiguous last axis, e.g. heads inside a (B, L, H·E) projection); `grad_mask` (a contiguous
// tensor of the float attn_mask's shape) and `grad_sinks` (H_q values) when not empty. Every
// gradient given is overwritten.
void scaled_dot_product_attention_backward(
    ConstStridedView query, ConstStridedView key, ConstStridedView value, ConstStridedView output,
    ConstStridedView grad_output, std::span<const float> log_sum_exp,
    const AttentionOptions& options, MutableStridedView grad_query, MutableStridedView grad_key,
    MutableStridedView grad_value, MutableStridedView grad_mask = {},
    std::span<float> grad_sinks = {});

// Whether some row's forward log-sum-exp is finite and beyond 256 in magnitude, where its float
// rounding (half an ulp, 2^−24·|lse|) moves P by more than 1.5e−5: the backward pass then takes a
// base-2 log-sum-exp recomputed from its own scores (a row masked to −1e9, or scores beyond ±1e4).
bool log_sum_exp_beyond_float_precision(std::span<const float> log_sum_exp);

// For callers that split each row's keys into blocks (ring attention) and meet scores too large
// for the forward's float log-sum-exp (log_sum_exp_beyond_float_precision): each query row's
// log-sum-exp in base 2 over
// this call's keys, log2 Σ_j 2^(S_ij·log2 e) (sinks joining as in the forward; −∞ for a row that
// sees no key), from scores computed bit for bit as the backward pass computes them under
// options.log_sum_exp_recomputed_base_two, and the row's total Σ_j 2^(S_ij·log2 e − lse) at the
// float lse written (between 1 and the row's key count; 0 for a row that sees no key). Both spans
// hold log_sum_exp_size(query) floats, in the forward's order.
void scaled_dot_product_attention_log_sum_exp_base_two(ConstStridedView query, ConstStridedView key,
                                                       ConstStridedView value,
                                                       const AttentionOptions& options,
                                                       std::span<float> log_sum_exp_base_two,
                                                       std::span<float> totals);

// Half precision, as PyTorch's fp16 and bf16 attention: query, key, value (and output, grad_output
// and the gradients of query, key and value) hold `type`'s bits; everything else (masks, slopes,
// sinks, log_sum_exp, the mask's and the sinks' gradients) stays float. Shapes, options, checks
// and errors are the float overloads'. The forward pass runs the half kernel
// (flash_attention_forward in attn/kernels/flash_attention.hpp), reading the inputs in place when
// their last axis is contiguous: scores, softmax and sums in fp32, the output rounded once to
// `type` (to nearest even). fp16, and bf16 where bf16 products are not faster than fp32 FMAs,
// give exactly the float overload's result on the widened inputs, rounded once; where they are
// (flash_attention_bfloat16_native(d)), bf16 rounds the probabilities to bf16 before P·V, as
// PyTorch does, adding at most 2⁻⁸·Σ_j P_ij·|v_j| to an output. Values so large that the float
// path scales them down (bf16 near float's maximum) are computed by the float overload on the
// widened inputs, then rounded.
// `output_residual`, when its data is not null (output's shape, its last axis contiguous as the
// output's, apart from the inputs and the output), receives each output element's rounding residual
// (flash_attention_forward's out_residual): a training call passes it to the backward pass, whose
// gradients then lose no accuracy to the output's rounding where one key dominates a row.
void scaled_dot_product_attention(HalfType type, StridedView<const uint16_t> query,
                                  StridedView<const uint16_t> key,
                                  StridedView<const uint16_t> value,
                                  const AttentionOptions& options, StridedView<uint16_t> output,
                                  std::span<float> log_sum_exp = {},
                                  StridedView<uint16_t> output_residual = {});
// A half-precision tensor: `type`'s bits, contiguous, of `shape`. Its storage, as Tensor's, is
// 64-byte aligned and leaves new elements unwritten (TensorAllocator): a forward pass's output is
// first touched by the kernel's threads that write it.
struct HalfTensor {
  using Storage = std::vector<uint16_t, TensorAllocator<uint16_t>>;
  HalfType type = HalfType::kBFloat16;
  Shape shape;
  Storage bits;
};
// A half-precision forward pass's output (in `type`), log-sum-exp (float, as the float
// overload's), and the output's rounding residuals where asked for (else empty).
struct HalfAttentionForward {
  HalfTensor output;
  std::vector<float> log_sum_exp;
  HalfTensor output_residual;
};
// The same into new storage; `output_residual`: whether to compute the residuals.
HalfAttentionForward scaled_dot_product_attention(HalfType type, StridedView<const uint16_t> query,
                                                  StridedView<const uint16_t> key,
                                                  StridedView<const uint16_t> value,
                                                  const AttentionOptions& options = {},
                                                  bool output_residual = false);
// The backward pass in half precision, read in place, each gradient of query, key and value
// rounded once to `type` (grad_query, grad_key and grad_value shaped as their inputs, any
// strides); grad_mask and grad_sinks as the float overload's. fp16, and bf16 where bf16 products
// are not faster than fp32 FMAs (CPUs without bf16 dot products, Intel's without AMX tiles),
// give exactly the float overload's
// gradients on the widened inputs,
// rounded once; elsewhere (flash_attention_bfloat16_backward_native(d, dv): vdpbf16ps, or AMX
// tiles for whole 64 × 64 tiles), every product runs on bf16 pairs and the
// probabilities and score gradients enter dV, dK and dQ rounded to bf16, as FlashAttention's bf16
// kernels round them: each gradient element may move by 2⁻⁸ times the sum of its terms'
// magnitudes. Values so large that the float path scales them take the float overload on widened
// copies, as the forward pass does.
// `output_residual` (data not null): the forward pass's residuals of this output, which D =
// rowsum(dO ∘ O) then adds back; without them D carries the output's rounding, which where one
// key dominates a row (dP − D cancelling) moves dQ and dK by up to its size (fp16 at scores of a
// few hundred), as PyTorch's half backward, which reads the rounded output alike.
void scaled_dot_product_attention_backward(
    HalfType type, StridedView<const uint16_t> query, StridedView<const uint16_t> key,
    StridedView<const uint16_t> value, StridedView<const uint16_t> output,
    StridedView<const uint16_t> grad_output, std::span<const float> log_sum_exp,
    const AttentionOptions& options, StridedView<uint16_t> grad_query,
    StridedView<uint16_t> grad_key, StridedView<uint16_t> grad_value,
    MutableStridedView grad_mask = {}, std::span<float> grad_sinks = {},
    StridedView<const uint16_t> output_residual = {});

// The half-precision pass's gradients: query, key and value in `type`, the float attn_mask's and
// the sinks' in float (empty unless asked for).
struct HalfAttentionBackward {
  HalfTensor query;
  HalfTensor key;
  HalfTensor value;
  Tensor attn_mask;
  Tensor sinks;
};
// The same into new storage.
HalfAttentionBackward scaled_dot_product_attention_backward(
    HalfType type, StridedView<const uint16_t> query, StridedView<const uint16_t> key,
    StridedView<const uint16_t> value, StridedView<const uint16_t> output,
    StridedView<const uint16_t> grad_output, std::span<const float> log_sum_exp,
    const AttentionOptions& options, bool mask_gradient = false, bool sinks_gradient = false,
    StridedView<const uint16_t> output_residual = {});
// The attention weights (float) of a half-precision forward pass, from its log-sum-exp: those of
// the widened query and key.
Tensor attention_weights(HalfType type, StridedView<const uint16_t> query,
                         StridedView<const uint16_t> key, std::span<const float> log_sum_exp,
                         const AttentionOptions& options);

// The attention weights of the forward pass (before dropout), (..., H_q, L, S): computed only on
// this request, from the forward pass's log-sum-exp.
Tensor attention_weights(ConstStridedView query, ConstStridedView key,
                         std::span<const float> log_sum_exp, const AttentionOptions& options);

// The dropout multipliers (0 or 1/(1 − p)) a forward pass with these options and shapes applied,
// (..., H_q, L, S); all ones without dropout.
Tensor attention_dropout_mask(const Shape& query, const Shape& key,
                              const AttentionOptions& options);

}  // namespace attn
