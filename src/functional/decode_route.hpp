// Decoding-shaped calls of the functional API on plain tensors — a few queries per sequence
// against many keys, as transformers' generation loop and PyTorch's SDPA users make them — run on
// the decode kernel (kernels/decode_attention.hpp) instead of the prefill kernels, whose query
// tiles of 16–32 rows per head compute mostly padding for one query and re-read each key/value
// head once per query head of its group.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "attn/kernels/decode_attention.hpp"
#include "attn/kernels/heads_view.hpp"
#include "functional/prepared_attention.hpp"

namespace attn::functional_detail {

// At most this many queries per sequence go to the decode kernel (single-token decoding,
// speculative and chunked decoding); more are a prefill.
inline constexpr int64_t kMaxDecodeQueries = 16;

// What the decode kernel needs beyond the tensors: its options and one key count per sequence.
struct DecodeRoute {
  DecodeOptions options;
  std::vector<int64_t> lengths;
};

// The decode kernel's arguments for a prepared dot-product call, or nullopt when the call is not
// decoding-shaped (more than kMaxDecodeQueries queries, more queries than keys, more than
// kMaxDecodeRows rows per key/value head) or asks for what that kernel does not compute: an
// attn_mask, ALiBi, dropout, per-query valid lengths (but for one query), or a causal or window
// diagonal other than the last key's (the decode kernel's queries end at their sequence's last
// key, so per-batch valid lengths combine with no diagonal). Either kernel gives the same result
// within float rounding; this one reads each key/value row once per group of query heads.
std::optional<DecodeRoute> decode_route(const PreparedAttention& prepared);

// Slice `view` of keys or values as the decode kernel's cache tensor: every row stored, in `dtype`.
template <class T>
CacheTensorView cache_tensor(CacheDType dtype, const BasicHeadsView<const T>& view) {
  CacheTensorView tensor;
  tensor.dtype = dtype;
  tensor.data = view.data;
  tensor.batch = view.batch;
  tensor.heads = view.heads;
  tensor.capacity = view.rows;
  tensor.cols = view.cols;
  tensor.batch_stride = view.batch_stride;
  tensor.head_stride = view.head_stride;
  tensor.row_stride = view.row_stride;
  return tensor;
}

}  // namespace attn::functional_detail
