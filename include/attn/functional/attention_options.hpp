// AttentionOptions: everything the functional attention API (scaled_dot_product_attention,
// additive_attention) takes besides its tensors — PyTorch's SDPA arguments (attn_mask, is_causal,
// scale, enable_gqa, dropout) plus valid lengths, sliding windows, ALiBi, soft-capping and sinks.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "attn/core/half.hpp"
#include "attn/core/shape.hpp"
#include "attn/core/strided_view.hpp"
#include "attn/core/valid_lengths.hpp"
#include "attn/kernels/fused_options.hpp"

namespace attn {

// A boolean or float attention mask (float32, bfloat16 or float16 entries), broadcastable
// (PyTorch's rules, aligned from the last axis) to the scores' shape (..., H_q, L, S). Bool: true
// (nonzero byte) = the key takes part, as PyTorch's bool attn_mask; float: added to the scaled
// scores, −∞ hiding the key. Views only: the caller keeps the entries alive during the call.
class AttentionMask {
 public:
  AttentionMask() = default;  // no mask
  static AttentionMask boolean(StridedView<const uint8_t> mask) {
    AttentionMask result;
    result.kind_ = MaskKind::kBool;
    result.bools_ = mask;
    return result;
  }
  static AttentionMask additive(StridedView<const float> mask) {
    AttentionMask result;
    result.kind_ = MaskKind::kFloat;
    result.floats_ = mask;
    return result;
  }
  // A float mask in half precision, `type`'s bits (PyTorch's float masks come in the inputs'
  // dtype): read in place, each entry widened exactly to float, so the same values as float32
  // give the same result.
  static AttentionMask additive(HalfType type, StridedView<const uint16_t> mask) {
    AttentionMask result;
    result.kind_ = MaskKind::kFloat;
    result.entries_ = type == HalfType::kBFloat16 ? MaskEntries::kBFloat16 : MaskEntries::kFloat16;
    result.halves_ = mask;
    return result;
  }

  MaskKind kind() const { return kind_; }
  bool has_value() const { return kind_ != MaskKind::kNone; }
  const StridedView<const uint8_t>& bools() const { return bools_; }
  // A float mask's entries: float32 (floats) or half bits (halves, of half_type()).
  MaskEntries entries() const { return entries_; }
  bool holds_halves() const {
    return kind_ == MaskKind::kFloat && entries_ != MaskEntries::kFloat32;
  }
  const StridedView<const float>& floats() const { return floats_; }
  const StridedView<const uint16_t>& halves() const { return halves_; }
  HalfType half_type() const {
    return entries_ == MaskEntries::kFloat16 ? HalfType::kFloat16 : HalfType::kBFloat16;
  }
  // The mask's shape and strides, whichever its kind.
  const Shape& shape() const {
    return kind_ == MaskKind::kBool ? bools_.shape()
           : holds_halves()         ? halves_.shape()
                                    : floats_.shape();
  }
  std::span<const int64_t> strides() const {
    return kind_ == MaskKind::kBool ? bools_.strides()
           : holds_halves()         ? halves_.strides()
                                    : floats_.strides();
  }
  const void* data() const {
    return kind_ == MaskKind::kBool ? static_cast<const void*>(bools_.data())
           : holds_halves()         ? static_cast<const void*>(halves_.data())
                                    : static_cast<const void*>(floats_.data());
  }

 private:
  MaskKind kind_ = MaskKind::kNone;
  MaskEntries entries_ = MaskEntries::kFloat32;
  StridedView<const uint8_t> bools_;
  StridedView<const float> floats_;
  StridedView<const uint16_t> halves_;
};

// A sliding window around each query's diagonal key c (see `alignment`): keys j with
// c − left ≤ j ≤ c + right; −1 leaves a side unbounded (FlashAttention's window_size).
// A side of Shape::kMaxElements (2^61 − 1) keys or more reaches past the keys of any tensor, so
// it is read as −1 (`bounded()`): the diagonal plus such a side would overflow int64.
struct SlidingWindow {
  int64_t left = -1;
  int64_t right = -1;

  // The window as the kernels take it: sides past any tensor's reach as −1.
  SlidingWindow bounded() const {
    const auto side = [](int64_t keys) { return keys >= Shape::kMaxElements ? -1 : keys; };
    return {side(left), side(right)};
  }
};

struct AttentionOptions {
  // Valid lengths (the book's): one per batch element (B) or per query (B, L), B the queries'
  // first axis; keys past a query's length take no part, in every head.
  ValidLengths valid_lens;
  // PyTorch's is_causal: query i sees keys j ≤ its diagonal key (see `alignment`).
  bool causal = false;
  // The diagonal of `causal`, `window` and ALiBi: top-left (key i, PyTorch's is_causal),
  // bottom-right (key i + S − L: FlashAttention-2's, decoding's) or kOffset (below).
  DiagonalAlignment alignment = DiagonalAlignment::kTopLeft;
  // With alignment kOffset: query i's diagonal key is i + diagonal_offset (queries and keys that
  // are blocks of one longer sequence: the first query's position minus the first key's).
  // Within ±(Shape::kMaxElements − 1), past any tensor's keys either way; beyond, a ValueError.
  int64_t diagonal_offset = 0;
  std::optional<SlidingWindow> window;
  AttentionMask attn_mask;
  // Scores are scale · qᵀk; default 1/√E (E the queries' last axis), as PyTorch.
  std::optional<float> scale;
  // Grouped-query attention: keys and values may have H_kv heads dividing the queries' H_q; query
  // head h reads key/value head h / (H_q / H_kv), without copies (PyTorch's enable_gqa).
  bool enable_gqa = false;
  // ALiBi: one slope per query head; the score of query i and key j gets −slope·|c_i − j|.
  std::span<const float> alibi_slopes;
  // Logit soft-capping (Gemma 2): scaled scores s become softcap · tanh(s / softcap); > 0.
  std::optional<float> softcap;
  // Attention sinks (gpt-oss): one logit per query head joining every row's softmax denominator,
  // with no value: rows may then weigh their keys less than 1 in total.
  std::span<const float> sinks;
  // Dropout on the attention weights, p in [0, 1), from a counter-based generator keyed by `seed`:
  // the backward pass regenerates the same multipliers.
  float dropout = 0.0F;
  uint64_t seed = 0;
  // For the backward pass: the log_sum_exp given is the whole row's over more keys than this call
  // sees (ring attention's block pairs, FlashAttention-2's decomposition over key blocks). The
  // backward then takes it as given; otherwise, where a row's |log-sum-exp| passes 256 and float
  // rounding moved it, or a call of at most 16 queries has scores far from 0 (|lse| beyond
  // 8 + log of the keys), the backward recounts the rows' weights from its own scores (over this
  // call's keys only, which would be wrong for a block).
  bool log_sum_exp_spans_more_keys = false;
  // For the float backward pass: the log_sum_exp given is in base 2, from
  // scaled_dot_product_attention_log_sum_exp_base_two (merged over a row's key blocks by the
  // caller), and the caller has divided each row of grad_output by that row's total. The backward
  // then takes P = 2^(S·log2 e − lse) with its scores computed bit for bit as that function's, so
  // that P stays exact where |lse| passes 256 and the forward's float log-sum-exp would not be
  // (ring attention's block pairs at large scores). Taken as given, as log_sum_exp_spans_more_keys.
  bool log_sum_exp_recomputed_base_two = false;
};

// ValueError naming alibi_slopes and the index of the first slope the kernels' base-2 scores cannot
// hold: a magnitude past float's largest over log2 e (2.36e38; the slope times log2 e overflowed,
// and ∞ times the diagonal's distance 0 gave NaN), or a negative slope whose term reaches +∞ at
// `longest_distance` positions from the diagonal (L + S). The functional calls check their own;
// ring attention checks the whole sequence's, which no block pair sees.
void check_alibi_slope_range(std::span<const float> slopes, int64_t longest_distance);

}  // namespace attn
