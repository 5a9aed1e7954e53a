// decode_route: when a functional call on plain tensors runs on the decode kernel, and with what.
#include "functional/decode_route.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "attn/kernels/amx.hpp"
#include "attn/kernels/decode_attention.hpp"
#include "attn/kernels/flash_attention.hpp"
#include "attn/kernels/heads_view.hpp"
#include "functional/attention_layout.hpp"
#include "functional/prepared_attention.hpp"

namespace attn::functional_detail {

namespace {

// What the decode kernel needs beyond the tensors: its options (with an attn_mask of intervals'
// key ranges, which PreparedAttention holds) and one key count per sequence. Another mask is read
// as entries, each slice's own (for_slice).
struct DecodeRoute {
  DecodeOptions options;
  std::vector<int64_t> lengths;
  bool mask_entries = false;

  DecodeOptions for_slice(const PreparedAttention& prepared, size_t s) const {
    DecodeOptions slice_options = options;
    if (mask_entries) slice_options.mask = prepared.kernel_options(s, true).mask;
    return slice_options;
  }
};

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

// The decode kernel's arguments for a prepared dot-product call, or nullopt when the call is not
// decoding-shaped (more than kMaxDecodeQueries queries, more queries than keys, more than
// kMaxDecodeRows rows per key/value head) or asks for what that kernel does not compute: dropout,
// valid lengths that differ between a sequence's queries, a causal, window or ALiBi diagonal
// other than the last key's (the decode kernel's queries end at their sequence's last key, so
// per-batch valid lengths combine with no diagonal) unless no query sees past it, ALiBi beside a
// mask or past 2^24 keys. A mask of intervals (bool, or float of 0 and −∞: key padding on either
// side, a static cache's empty slots, causal and window patterns, as transformers passes them)
// alone becomes the kernel's per-row key ranges, found by one read of the mask; any other mask (a
// gap in a row, a float bias, or intervals beside causal, a window or valid lengths) is read as
// entries, a float one checked first for NaN and +∞. Either kernel gives the same result within
// float rounding; this one reads each key/value row once per group of query heads, and computes one
// lane per query where the prefill kernel's tiles compute 16 or more.
std::optional<DecodeRoute> decode_route(const PreparedAttention& prepared) {
  const HeadsLayout& q = prepared.query_layout();
  const HeadsLayout& k = prepared.key_layout();
  const int64_t n = q.rows, m = k.rows;
  if (n < 1 || n > kMaxDecodeQueries || n > m || k.heads < 1) return std::nullopt;
  // No sequences or heads (an empty batch): nothing to address either; the prefill path returns
  // the empty output.
  if (q.batch < 1 || q.heads < 1) return std::nullopt;
  // Empty rows (E or Ev of 0) have no data for the kernel to address: the prefill path's.
  if (q.cols < 1 || prepared.value_layout().cols < 1) return std::nullopt;
  if ((q.heads / k.heads) * n > kMaxDecodeRows) return std::nullopt;
  // Every slice has the same options but for its mask and dropout seed, neither of which may be.
  const FlashAttentionOptions options = prepared.kernel_options(0);
  if (options.dropout > 0.0F) return std::nullopt;
  // ALiBi measures from each query's diagonal, which a mask's rows do not give the kernel; its
  // positions count exactly in float up to 2^24.
  const bool alibi = options.alibi_slopes != nullptr;
  // A mask that is not intervals comes as entries (PreparedAttention::kernel_options).
  const bool masked = options.key_ranges != nullptr || options.mask.kind != MaskKind::kNone;
  if (alibi && (masked || m > (int64_t{1} << 24))) return std::nullopt;
  DecodeRoute route;
  if (options.key_ranges != nullptr && !options.causal && options.window_left < 0 &&
      options.window_right < 0 && prepared.valid_lens().is_all()) {
    // A mask of intervals, alone: its rows' ranges are the keys.
    route.options.key_ranges = options.key_ranges;
  } else if (masked) {
    prepared.require_mask_values();
    route.mask_entries = true;
  }
  const ValidLengths& valid = prepared.valid_lens();
  switch (valid.kind()) {
    case ValidLengths::Kind::kAll:
      route.lengths.assign(static_cast<size_t>(q.batch), m);
      break;
    case ValidLengths::Kind::kPerBatch:
      route.lengths = valid.values();
      break;
    case ValidLengths::Kind::kPerQuery:
      // (B, n) lengths equal along each sequence's queries are per-sequence lengths: the same
      // kernel, the same bits, whichever way the caller wrote them.
      for (int64_t b = 0; b < q.batch; ++b) {
        const int64_t length = valid.length(b, 0, m);
        for (int64_t i = 1; i < n; ++i) {
          if (valid.length(b, i, m) != length) return std::nullopt;
        }
        route.lengths.push_back(length);
      }
      break;
  }
  const bool diagonal =
      options.causal || options.window_left >= 0 || options.window_right >= 0 || alibi;
  if (diagonal) {
    // The decode kernel puts query i at key lengths[b] − n + i: the prefill's diagonal when every
    // sequence has all m keys and the diagonal ends on the last one. A diagonal that ends on an
    // earlier key (is_causal's top-left one with n < m) is the kernel's too where no query sees
    // past its diagonal (causal, or a window with nothing on the right): the keys after the last
    // query's diagonal are hidden from every query, so lengths that end there change nothing.
    const bool every_key = std::all_of(route.lengths.begin(), route.lengths.end(),
                                       [m](int64_t length) { return length == m; });
    if (!every_key) return std::nullopt;
    const int64_t diagonal_end = diagonal_key(options, 0, n, m) + n;
    if (diagonal_end != m) {
      const bool sees_past_diagonal = !options.causal && options.window_right != 0;
      if (sees_past_diagonal || diagonal_end < n || diagonal_end > m) return std::nullopt;
      route.lengths.assign(route.lengths.size(), diagonal_end);
    }
  }
  route.options.scale = options.scale;
  route.options.causal = options.causal;
  route.options.window_left = options.window_left;
  route.options.window_right = options.window_right;
  route.options.softcap = options.softcap;
  route.options.sinks = options.sinks;
  route.options.alibi_slopes = options.alibi_slopes;
  return route;
}

// What decode_without_scans can take, told from the shapes and options alone (before the
// argument checks, which the calls it declines run once, on the scanned path).
bool may_decode_without_scans(const Shape& query, const Shape& key,
                              const AttentionOptions& options) {
  if (query.rank() < 2 || key.rank() != query.rank()) return false;
  const int64_t n = query[query.rank() - 2], m = key[key.rank() - 2];
  return n >= 1 && n <= kMaxDecodeQueries && n <= m && options.dropout == 0.0F;
}

// bf16 calls of at least this many queries per sequence run on the prefill kernel where its
// products are on AMX tiles: the decode kernel widens bf16 to fp32 FMAs, its time growing with n,
// while the prefill's 32-row query tiles cost about the same for 1 to 32 queries. On a Sapphire
// Rapids-class core (1 thread, ten shapes of 1–32 query heads, d = 64–256, m = 64–4096) the
// prefill was 1.05–1.67x faster at n = 8 but for one shape (2 heads of 256, 4096 keys: 0.69x),
// 1.04–2.6x at n = 12 and 16, and slower at n ≤ 4 (docs/benchmarks.md, "bf16 heads of 80 and 96 on
// AMX tiles"); the prefill's packing has since become 1.6x faster at that shape (16 queries; "Few
// queries against many keys").
constexpr int64_t kMinTilePrefillQueries = 8;

bool bf16_prefill_on_tiles(HalfType type, int64_t n, int64_t depth) {
  return type == HalfType::kBFloat16 && n >= kMinTilePrefillQueries && amx_tiles_in_use() &&
         flash_attention_bfloat16_native(depth);
}

}  // namespace

bool decode_without_scans(ConstStridedView query, ConstStridedView key, ConstStridedView value,
                          const AttentionOptions& options, MutableStridedView output,
                          std::span<float> log_sum_exp) {
  if (!may_decode_without_scans(query.shape(), key.shape(), options)) return false;
  const PreparedAttention shapes(query, key, value, options, PreparedAttention::kShapesOnly);
  const auto out = shapes.output_layout("output", output);
  shapes.require_log_sum_exp(log_sum_exp, true);
  const auto route = decode_route(shapes);
  if (!route) return false;
  if (!rows_contiguous(query) || !rows_contiguous(key) || !rows_contiguous(value)) {
    // A last axis with a stride, which the prefill path copies before it computes: the same
    // copies here, so that a strided call gives the contiguous call's numbers.
    Tensor query_copy, key_copy, value_copy;
    if (!rows_contiguous(query)) query = query_copy = contiguous_copy(query);
    if (!rows_contiguous(key)) key = key_copy = contiguous_copy(key);
    if (!rows_contiguous(value)) value = value_copy = contiguous_copy(value);
    return decode_without_scans(query, key, value, options, output, log_sum_exp);
  }
  // The kernel checks the queries, the key rows it reads (their scores) and the outputs it writes
  // for NaN and ±∞ (scanning the query and the output here was a fifth of a 1 × 8 × 16 × 16 call,
  // d = 128): a call that fails is redone on the scanned path, which names the input.
  bool finite = true;
  for (size_t s = 0; s < shapes.slices(); ++s) {
    finite &= decode_attention_forward(
        shapes.query(s), cache_tensor(CacheDType::kFloat32, shapes.key(s)),
        cache_tensor(CacheDType::kFloat32, shapes.value(s)), route->lengths.data(),
        route->for_slice(shapes, s), out.slice(output.data(), s),
        log_sum_exp.empty() ? nullptr : shapes.slice_log_sum_exp(log_sum_exp, s));
  }
  if (finite) return true;
  for (size_t s = 0; s < shapes.slices(); ++s) fill_heads(out.slice(output.data(), s), 0.0F);
  return false;
}

bool decode_without_scans(HalfType type, StridedView<const uint16_t> query,
                          StridedView<const uint16_t> key, StridedView<const uint16_t> value,
                          const AttentionOptions& options, StridedView<uint16_t> output,
                          std::span<float> log_sum_exp, StridedView<uint16_t> output_residual) {
  if (!may_decode_without_scans(query.shape(), key.shape(), options) || !rows_contiguous(query) ||
      !rows_contiguous(key) || !rows_contiguous(value)) {
    return false;
  }
  const Shape& query_shape = query.shape();
  if (bf16_prefill_on_tiles(type, query_shape[query_shape.rank() - 2],
                            query_shape[query_shape.rank() - 1])) {
    return false;
  }
  // The shapes as float views without data (kShapesOnly reads none): the layouts, in elements,
  // address the half bits.
  const auto shape_only = [](const auto& view) {
    return ConstStridedView(nullptr, view.shape(), view.strides());
  };
  const PreparedAttention shapes(shape_only(query), shape_only(key), shape_only(value), options,
                                 PreparedAttention::kShapesOnly);
  const auto out_layout =
      shapes.output_layout("output", MutableStridedView(nullptr, output.shape(), output.strides()));
  const bool residual = output_residual.data() != nullptr;
  const auto residual_layout =
      residual ? shapes.output_layout("output_residual",
                                      MutableStridedView(nullptr, output_residual.shape(),
                                                         output_residual.strides()))
               : out_layout;
  shapes.require_log_sum_exp(log_sum_exp, true);
  const auto route = decode_route(shapes);
  if (!route) return false;
  // The kernel widens the few query rows (exactly) and rounds the output once, as the half
  // kernels round, each task its own rows.
  const CacheDType stored =
      type == HalfType::kFloat16 ? CacheDType::kFloat16 : CacheDType::kBFloat16;
  bool finite = true;
  for (size_t s = 0; s < shapes.slices(); ++s) {
    finite &= decode_attention_forward(
        type, shapes.query_layout().slice(query.data(), s),
        cache_tensor(stored, shapes.key_layout().slice(key.data(), s)),
        cache_tensor(stored, shapes.value_layout().slice(value.data(), s)), route->lengths.data(),
        route->for_slice(shapes, s), out_layout.slice(output.data(), s),
        log_sum_exp.empty() ? nullptr : shapes.slice_log_sum_exp(log_sum_exp, s),
        residual ? residual_layout.slice(output_residual.data(), s) : HalfHeadsView{});
  }
  if (finite) return true;
  // The kernel's checks, as the float call's: the output zeroed, the scanned path names the input.
  for (size_t s = 0; s < shapes.slices(); ++s) fill_heads(out_layout.slice(output.data(), s), 0);
  return false;
}

}  // namespace attn::functional_detail
