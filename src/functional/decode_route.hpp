// Decoding-shaped calls of the functional API on plain tensors — a few queries per sequence
// against many keys, as transformers' generation loop and PyTorch's SDPA users make them — run on
// the decode kernel (kernels/decode_attention.hpp) instead of the prefill kernels, whose query
// tiles of 16–32 rows per head compute mostly padding for one query and re-read each key/value
// head once per query head of its group.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "attn/core/half.hpp"
#include "attn/core/strided_view.hpp"
#include "attn/functional/attention_options.hpp"
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
  // Each query row's keys [first, last) from an attn_mask of intervals (empty without a mask).
  std::vector<int64_t> key_ranges;
  // `options` with key_ranges pointing into this route.
  DecodeOptions kernel_options() const;
};

// The decode kernel's arguments for a prepared dot-product call, or nullopt when the call is not
// decoding-shaped (more than kMaxDecodeQueries queries, more queries than keys, more than
// kMaxDecodeRows rows per key/value head) or asks for what that kernel does not compute: ALiBi,
// dropout, valid lengths that differ between a sequence's queries, a causal or window diagonal
// other than the last key's (the decode kernel's queries end at their sequence's last key, so
// per-batch valid lengths combine with no diagonal), or an attn_mask some row of which is not one
// interval of keys (a gap, a float bias) or which comes with causal, a window or valid lengths.
// A mask of intervals (bool, or float of 0 and −∞: key padding on either side, a static cache's
// empty slots, causal and window patterns, as transformers passes them) becomes the kernel's
// per-row key ranges, found by one read of the mask. Either kernel gives the same result within
// float rounding; this one reads each key/value row once per group of query heads.
std::optional<DecodeRoute> decode_route(const PreparedAttention& prepared);

// The float and half-precision calls (scaled_dot_product_attention's overloads) on the decode
// kernel without first scanning the keys and values for NaN and ±∞ — a read of the whole cache as
// long as the kernel's own. The kernel checks the rows it reads instead: it reports non-finite
// scores (a key that is not finite), and a value that is not finite makes the output so (p·∞ is ±∞
// or, for p = 0, NaN). Rows it never reads (hidden from every query by lengths, a window or the
// mask, beyond every tile it reads) are not checked. The query, a few rows, is scanned as the
// prefill path scans it. Returns true when the call is done; false, with nothing written but
// zeros, when it is not such a call or something non-finite came out: the caller then takes the
// scanned path, whose checks name the input (or whose scaling keeps the sums of huge finite
// values in range).
bool decode_without_scans(ConstStridedView query, ConstStridedView key, ConstStridedView value,
                          const AttentionOptions& options, MutableStridedView output,
                          std::span<float> log_sum_exp);
bool decode_without_scans(HalfType type, StridedView<const uint16_t> query,
                          StridedView<const uint16_t> key, StridedView<const uint16_t> value,
                          const AttentionOptions& options, StridedView<uint16_t> output,
                          std::span<float> log_sum_exp);

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
