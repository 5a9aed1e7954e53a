// Decoding-shaped calls of the functional API on plain tensors — a few queries per sequence
// against many keys, as transformers' generation loop and PyTorch's SDPA users make them — run on
// the decode kernel (kernels/decode_attention.hpp) instead of the prefill kernels, whose query
// tiles of 16–32 rows per head compute mostly padding for one query and re-read each key/value
// head once per query head of its group.
#pragma once

#include <cstdint>
#include <span>

#include "attn/core/half.hpp"
#include "attn/core/strided_view.hpp"
#include "attn/functional/attention_options.hpp"

namespace attn::functional_detail {

// At most this many queries per sequence go to the decode kernel (single-token decoding,
// speculative and chunked decoding); more are a prefill.
inline constexpr int64_t kMaxDecodeQueries = 16;

// Decoding-shaped calls (the conditions are decode_route's, in decode_route.cpp: at most
// kMaxDecodeQueries queries, no ALiBi or dropout, masks of intervals, diagonals on the last key;
// bf16 calls of 8 or more queries take the prefill where its products are on AMX tiles)
// of the float and half-precision calls (scaled_dot_product_attention's overloads) on the decode
// kernel without first scanning the keys and values for NaN and ±∞ — a read of the whole cache as
// long as the kernel's own. The kernel checks the rows it reads instead: it reports a query that
// is not finite, non-finite scores (a key that is not finite), and outputs that are not (a value
// that is not finite makes them so: p·∞ is ±∞ or, for p = 0, NaN). Rows it never reads (hidden
// from every query by lengths, a window or the mask, beyond every tile it reads) are not checked.
// Returns true when the call is done; false, with nothing written but zeros, when it is not such
// a call or something non-finite came in or out: the caller then takes the
// prefill path, whose scans name the input (or whose scaling keeps the sums of huge finite values
// in range).
bool decode_without_scans(ConstStridedView query, ConstStridedView key, ConstStridedView value,
                          const AttentionOptions& options, MutableStridedView output,
                          std::span<float> log_sum_exp);
// `output_residual` as the half scaled_dot_product_attention's.
bool decode_without_scans(HalfType type, StridedView<const uint16_t> query,
                          StridedView<const uint16_t> key, StridedView<const uint16_t> value,
                          const AttentionOptions& options, StridedView<uint16_t> output,
                          std::span<float> log_sum_exp, StridedView<uint16_t> output_residual = {});

}  // namespace attn::functional_detail
