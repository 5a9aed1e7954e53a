// decode_route: when a functional call on plain tensors runs on the decode kernel, and with what.
#include "functional/decode_route.hpp"

#include <algorithm>

namespace attn::functional_detail {

std::optional<DecodeRoute> decode_route(const PreparedAttention& prepared) {
  const HeadsLayout& q = prepared.query_layout();
  const HeadsLayout& k = prepared.key_layout();
  const int64_t n = q.rows, m = k.rows;
  if (n < 1 || n > kMaxDecodeQueries || n > m || k.heads < 1) return std::nullopt;
  // Empty rows (E or Ev of 0) have no data for the kernel to address: the prefill path's.
  if (q.cols < 1 || prepared.value_layout().cols < 1) return std::nullopt;
  if ((q.heads / k.heads) * n > kMaxDecodeRows) return std::nullopt;
  // Every slice has the same options but for its mask and dropout seed, neither of which may be.
  const FlashAttentionOptions options = prepared.kernel_options(0);
  if (options.mask.kind != MaskKind::kNone || options.dropout > 0.0F ||
      options.alibi_slopes != nullptr) {
    return std::nullopt;
  }
  DecodeRoute route;
  const ValidLengths& valid = prepared.valid_lens();
  switch (valid.kind()) {
    case ValidLengths::Kind::kAll:
      route.lengths.assign(static_cast<size_t>(q.batch), m);
      break;
    case ValidLengths::Kind::kPerBatch:
      route.lengths = valid.values();
      break;
    case ValidLengths::Kind::kPerQuery:
      if (n != 1) return std::nullopt;
      route.lengths = valid.values();  // (B, 1): one per sequence
      break;
  }
  const bool diagonal = options.causal || options.window_left >= 0 || options.window_right >= 0;
  if (diagonal) {
    // The decode kernel puts query i at key lengths[b] − n + i: the prefill's diagonal only when
    // every sequence has all m keys and the diagonal ends on the last one.
    const bool every_key = std::all_of(route.lengths.begin(), route.lengths.end(),
                                       [m](int64_t length) { return length == m; });
    if (!every_key || diagonal_key(options, 0, n, m) != m - n) return std::nullopt;
  }
  route.options.scale = options.scale;
  route.options.causal = options.causal;
  route.options.window_left = options.window_left;
  route.options.window_right = options.window_right;
  route.options.softcap = options.softcap;
  route.options.sinks = options.sinks;
  return route;
}

}  // namespace attn::functional_detail
