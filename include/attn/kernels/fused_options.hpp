// What every fused attention kernel applies to its scores, resolved to the kernels' (batch, head,
// query, key) indexing: scale, causal and sliding-window bounds, soft-capping, ALiBi, an attention
// mask, sinks, and dropout. The functional API (attn/functional) builds these from user options.
#pragma once

#include <cstdint>

#include "attn/core/tensor.hpp"

namespace attn {

// Which diagonal "causal", sliding windows and ALiBi distances refer to, for n queries and m keys:
// query i's diagonal key is i (top-left: PyTorch's is_causal), i + m − n (bottom-right:
// FlashAttention-2's, where the last query sits on the last key, as in decoding), or i + a given
// offset (kOffset: a block of queries against a block of keys of one longer sequence, as ring
// attention and chunked prefill see them — offset = first query's position − first key's).
enum class DiagonalAlignment { kTopLeft, kBottomRight, kOffset };

enum class MaskKind { kNone, kBool, kFloat };

// How a kFloat mask's entries are stored: float32, or the bits of bfloat16 or float16 — PyTorch's
// float masks come in the inputs' dtype, and the kernels read them in place, widened exactly.
enum class MaskEntries : uint8_t { kFloat32, kBFloat16, kFloat16 };

// An attention mask over (batch, head, query, key), addressed by strides in elements: a stride 0
// repeats one entry along that axis (PyTorch's broadcasting). kBool: bytes, nonzero = the key
// takes part (PyTorch's bool attn_mask); kFloat: floats added to the scores, −∞ hiding the key.
template <class T>
struct BasicScoreMask {
  MaskKind kind = MaskKind::kNone;
  T* data = nullptr;  // uint8_t entries for kBool; float (or halves: `entries`) for kFloat
  int64_t batch_stride = 0;
  int64_t head_stride = 0;
  int64_t row_stride = 0;
  int64_t col_stride = 0;
  MaskEntries entries = MaskEntries::kFloat32;  // kFloat: the entries' format

  int64_t offset(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return b * batch_stride + h * head_stride + i * row_stride + j * col_stride;
  }
};
using ScoreMask = BasicScoreMask<const void>;

// Where a backward pass accumulates the gradient of a float mask: floats laid out as the mask
// (same strides), so broadcast axes sum their gradient, as autograd does. The kernel overwrites
// every element the mask addresses.
using ScoreMaskGradient = BasicScoreMask<float>;

struct FlashAttentionOptions {
  float scale = 1.0F;  // raw scores are scale · qᵀk
  // Query i sees keys j ≤ diagonal_key(i) only (combined with the valid lengths by minimum).
  bool causal = false;
  DiagonalAlignment alignment = DiagonalAlignment::kBottomRight;
  int64_t diagonal_offset = 0;  // with kOffset: query i's diagonal key is i + diagonal_offset
  // Sliding window around the diagonal key c_i: keys j with c_i − window_left ≤ j ≤
  // c_i + window_right (FlashAttention's window_size); −1 leaves that side unbounded.
  int64_t window_left = -1;
  int64_t window_right = -1;
  // Logit soft-capping (Gemma 2): raw score s becomes softcap · tanh(s / softcap); 0 = none.
  float softcap = 0.0F;
  // ALiBi: adds −alibi_slopes[h] · |c_i − j| for query head h; null = none.
  const float* alibi_slopes = nullptr;
  // Attention sinks (gpt-oss): one logit per query head that joins every row's softmax
  // denominator and carries no value; null = none.
  const float* sinks = nullptr;
  // Dropout on the attention weights (inverted: kept weights are scaled by 1/(1−p)), decided per
  // (seed, batch·head, query, key) by a counter-based hash, so forward and backward agree without
  // storing a mask. p in [0, 1).
  float dropout = 0.0F;
  uint64_t seed = 0;
  // Each query row's own keys [first, last), intersected with the bounds above: two values per
  // (batch, head, query) row, for `key_range_heads` heads (the call's query heads) of the call's
  // n queries each; null = none. The functional API gives a mask whose every row is one interval
  // of keys (causal, padding and window patterns, as transformers passes them) this way instead
  // of as `mask`: the kernels then skip tiles by the ranges and read no mask.
  const int64_t* key_ranges = nullptr;
  int64_t key_range_heads = 0;
  // The additive kernels only: a bound the caller has already established on |element| of the
  // projected queries and keys (finite, ≥ every element's magnitude: the functional API's own
  // finiteness scan), from which the kernels choose their score form instead of scanning both
  // again; negative (the default): they scan. An understated bound can take a form past its range
  // (kernel_arguments.hpp), so give one only from a scan of these very tensors.
  float additive_input_bound = -1.0F;
  // Added (kFloat) or applied (kBool) after soft-capping and ALiBi. Last, so that designated
  // initialisers of the fields above may leave it out.
  ScoreMask mask;
};

// The diagonal key of query `query` of `queries`, for `keys` keys.
inline int64_t diagonal_key(const FlashAttentionOptions& options, int64_t query, int64_t queries,
                            int64_t keys) {
  switch (options.alignment) {
    case DiagonalAlignment::kTopLeft:
      return query;
    case DiagonalAlignment::kBottomRight:
      return query + keys - queries;
    case DiagonalAlignment::kOffset:
      return query + options.diagonal_offset;
  }
  return query;
}

// The multipliers (0 or 1/(1−p)) that the kernels apply for these options, materialised as
// (batch·heads, n, m) for inspection and tests.
Tensor flash_attention_dropout_mask(const FlashAttentionOptions& options, int64_t batch_heads,
                                    int64_t queries, int64_t keys);

}  // namespace attn
