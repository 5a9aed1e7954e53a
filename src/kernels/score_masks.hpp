// Which keys each query of a fused kernel's tile may see — the interval that valid lengths, the
// causal bound and a sliding window leave — and the attention mask's scalar steps (its coverage
// of a tile, a float mask's gradient).
// Target-independent.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "attn/core/half.hpp"
#include "attn/core/valid_lengths.hpp"
#include "attn/kernels/fused_options.hpp"

namespace attn {

// The fused backward pass computes keys in tiles of this many rows, aligned at key 0: a tile's
// rows that no query sees are read (their scores masked, their gradients 0) — unlike the forward,
// which reads each query tile's key range alone. The keys a call reads are then those of the
// tiles that its queries' ranges touch (keys_read_in_tiles).
inline constexpr int64_t kBackwardKeyTile = 64;

// Keys [begin, end) of one query; empty when begin == end.
struct KeyRange {
  int64_t begin = 0;
  int64_t end = 0;
};

// The keys query `query` of head `head`, batch element `batch` sees before the attention mask:
// its valid length, its own key range (options.key_ranges), then the causal bound j ≤ c and the
// window c − left ≤ j ≤ c + right around its diagonal key c (fused_options.hpp), all intersected.
inline KeyRange visible_keys(const ValidLengths& valid_lens, const FlashAttentionOptions& options,
                             int64_t batch, int64_t head, int64_t query, int64_t queries,
                             int64_t keys) {
  int64_t begin = 0;
  int64_t end = valid_lens.length(batch, query, keys);
  if (options.key_ranges != nullptr) {
    const int64_t* range =
        options.key_ranges + 2 * ((batch * options.key_range_heads + head) * queries + query);
    begin = range[0];
    end = std::min(end, range[1]);
  }
  const int64_t diagonal = diagonal_key(options, query, queries, keys);
  if (options.causal) end = std::min(end, diagonal + 1);
  if (options.window_left >= 0) begin = std::max(begin, diagonal - options.window_left);
  if (options.window_right >= 0) end = std::min(end, diagonal + options.window_right + 1);
  end = std::clamp<int64_t>(end, 0, keys);
  begin = std::clamp<int64_t>(begin, 0, end);
  return {begin, end};
}

// The union of visible_keys over queries [0, queries) of query heads [first_head, end_head) of
// batch element `batch`: from the first key any of them sees to one past the last; {keys, 0}
// (empty) when none sees any.
inline KeyRange keys_seen(const ValidLengths& valid_lens, const FlashAttentionOptions& options,
                          int64_t batch, int64_t first_head, int64_t end_head, int64_t queries,
                          int64_t keys) {
  KeyRange seen{keys, 0};
  for (int64_t head = first_head; head < end_head; ++head) {
    for (int64_t query = 0; query < queries; ++query) {
      const KeyRange row = visible_keys(valid_lens, options, batch, head, query, queries, keys);
      if (row.begin == row.end) continue;
      seen.begin = std::min(seen.begin, row.begin);
      seen.end = std::max(seen.end, row.end);
    }
  }
  return seen;
}

// The bounds of `chunks` chunks of key tiles of `key_tile` keys (chunk c: tiles bounds[c] to
// bounds[c + 1]) holding equal shares of the visible (query, key) pairs of every (batch, query
// head), for the backward passes' split over keys: under a causal mask the first keys are seen by
// every later query, and equal tile counts gave the first of two chunks three times the second's
// work (B = H = 1, n = 4096, 2 threads: 1.20-1.38× the 1-thread time against 1.89× without the
// mask, Zen 4). Each chunk keeps at least one tile where there are `chunks` tiles; without any
// visible pair, equal tile counts.
inline std::vector<size_t> key_chunk_bounds(const ValidLengths& valid_lens,
                                            const FlashAttentionOptions& options, int64_t batch,
                                            int64_t heads, int64_t queries, int64_t keys,
                                            size_t key_tile, size_t chunks) {
  const size_t key_tiles = (static_cast<size_t>(keys) + key_tile - 1) / key_tile;
  std::vector<size_t> bounds(chunks + 1);
  for (size_t c = 0; c <= chunks; ++c) bounds[c] = c * key_tiles / chunks;
  if (chunks <= 1 || chunks > key_tiles) return bounds;
  // Queries seeing each key, as differences: +1 where a query's range begins, −1 past its end.
  std::vector<int64_t> changes(static_cast<size_t>(keys) + 1, 0);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < queries; ++i) {
        const KeyRange range = visible_keys(valid_lens, options, b, h, i, queries, keys);
        ++changes[static_cast<size_t>(range.begin)];
        --changes[static_cast<size_t>(range.end)];
      }
  std::vector<double> cumulative(key_tiles + 1, 0.0);  // pairs in tiles [0, t)
  int64_t seeing = 0;
  for (int64_t j = 0; j < keys; ++j) {
    seeing += changes[static_cast<size_t>(j)];
    cumulative[static_cast<size_t>(j) / key_tile + 1] += static_cast<double>(seeing);
  }
  for (size_t t = 1; t <= key_tiles; ++t) cumulative[t] += cumulative[t - 1];
  const double total = cumulative[key_tiles];
  if (total <= 0.0) return bounds;
  for (size_t c = 1; c < chunks; ++c) {
    const double share = total * static_cast<double>(c) / static_cast<double>(chunks);
    size_t tile = bounds[c - 1] + 1;
    while (tile < key_tiles && cumulative[tile] < share) ++tile;
    bounds[c] = std::min(tile, key_tiles - (chunks - c));
  }
  return bounds;
}

// Every key row a fused kernel reads for queries whose ranges together span `seen`: whole tiles
// of kBackwardKeyTile keys, the last cut at `keys`; nothing when `seen` is empty.
inline KeyRange keys_read_in_tiles(KeyRange seen, int64_t keys) {
  if (seen.begin >= seen.end) return {0, 0};
  return {seen.begin / kBackwardKeyTile * kBackwardKeyTile,
          std::min(keys, (seen.end + kBackwardKeyTile - 1) / kBackwardKeyTile * kBackwardKeyTile)};
}

// The key ranges of up to `br` consecutive queries (a tile's lanes), as the SIMD steps read them,
// and the keys the tile needs at all.
struct TileKeyRanges {
  int64_t begin = 0;         // first key any real row sees
  int64_t end = 0;           // one past the last; begin == end: the tile sees nothing
  int64_t common_begin = 0;  // [common_begin, common_end): keys every real row sees
  int64_t common_end = 0;
};

// Fills first[r], last[r] (one past) for the `rows` real queries from `first_query` and an empty
// range for the padding lanes up to `br`.
inline TileKeyRanges tile_key_ranges(const ValidLengths& valid_lens,
                                     const FlashAttentionOptions& options, int64_t batch,
                                     int64_t head, int64_t first_query, size_t rows, size_t br,
                                     int64_t queries, int64_t keys, int32_t* first, int32_t* last) {
  TileKeyRanges tile{keys, 0, 0, keys};
  for (size_t r = 0; r < rows; ++r) {
    const KeyRange range = visible_keys(valid_lens, options, batch, head,
                                        first_query + static_cast<int64_t>(r), queries, keys);
    tile.common_begin = std::max(tile.common_begin, range.begin);
    tile.common_end = std::min(tile.common_end, range.end);
    if (range.begin < range.end) {
      tile.begin = std::min(tile.begin, range.begin);
      tile.end = std::max(tile.end, range.end);
    }
    first[r] = static_cast<int32_t>(range.begin);
    last[r] = static_cast<int32_t>(range.end);
  }
  std::fill(first + rows, first + br, 0);
  std::fill(last + rows, last + br, 0);
  if (tile.begin >= tile.end) tile.begin = tile.end = 0;
  return tile;
}

// Whether some real query of a tile with `ranges` cannot see some key of [begin, end): the causal
// diagonal, a window's edge or a valid length crosses those keys.
inline bool crosses_key_ranges(const TileKeyRanges& ranges, int64_t begin, int64_t end) {
  return begin < ranges.common_begin || end > ranges.common_end;
}

// Lanes [begin, end) of a tile's `rows` queries (first, last: their key ranges, as
// tile_key_ranges fills them), from the first to the last that sees a key of [key_begin,
// key_end); begin ≥ end when none does.
inline std::pair<size_t, size_t> lanes_seeing(const int32_t* first, const int32_t* last,
                                              size_t rows, int64_t key_begin, int64_t key_end) {
  size_t begin = rows, end = 0;
  for (size_t r = 0; r < rows; ++r) {
    if (first[r] < key_end && last[r] > key_begin) {
      begin = std::min(begin, r);
      end = r + 1;
    }
  }
  return {begin, end};
}

// Keys [begin, end) within [key_begin, key_end), from the first to the last that one of lanes
// [lane_begin, lane_end) sees; begin ≥ end when they see none.
inline KeyRange keys_seen_by_lanes(const int32_t* first, const int32_t* last, size_t lane_begin,
                                   size_t lane_end, int64_t key_begin, int64_t key_end) {
  int64_t begin = key_end, end = key_begin;
  for (size_t r = lane_begin; r < lane_end; ++r) {
    begin = std::min<int64_t>(begin, first[r]);
    end = std::max<int64_t>(end, last[r]);
  }
  return {std::max(begin, key_begin), std::min(end, key_end)};
}

// The key tile [key0, key0 + bc) of a tile crossed by key ranges (crosses_key_ranges), in bands of
// `band` keys: f(j0, keys, lane_begin, lane_end) for each band [key0 + j0, key0 + j0 + keys) that
// some of the tile's `rows` queries see, with the lanes from the first to the last that sees one
// of its keys (lanes_seeing); bands no query sees are left out.
template <class F>
void for_each_key_band(const int32_t* first, const int32_t* last, size_t rows, int64_t key0,
                       size_t bc, size_t band, const F& f) {
  for (size_t j0 = 0; j0 < bc; j0 += band) {
    const size_t keys = std::min(band, bc - j0);
    const int64_t begin = key0 + static_cast<int64_t>(j0);
    const auto [lane_begin, lane_end] =
        lanes_seeing(first, last, rows, begin, begin + static_cast<int64_t>(keys));
    if (lane_begin < lane_end) f(j0, keys, lane_begin, lane_end);
  }
}

// The same tile's `rows` queries in bands of `band`: f(r0, queries, seen) for each band [r0, r0 +
// queries), `seen` the keys of the tile from the first to the last one of them sees
// (keys_seen_by_lanes; empty when they see none).
template <class F>
void for_each_query_band(const int32_t* first, const int32_t* last, size_t rows, int64_t key0,
                         size_t bc, size_t band, const F& f) {
  const int64_t tile_end = key0 + static_cast<int64_t>(bc);
  for (size_t r0 = 0; r0 < rows; r0 += band) {
    const size_t queries = std::min(band, rows - r0);
    f(r0, queries, keys_seen_by_lanes(first, last, r0, r0 + queries, key0, tile_end));
  }
}

// How much of a tile (rows × keys) a mask lets through.
enum class MaskCoverage { kAll, kSome, kNone };

// Scans the tile's rows, each once (a mask broadcast over the queries has one row), with a
// branch-free inner loop over contiguous bytes, and stops at the first row that settles kSome.
inline MaskCoverage bool_mask_coverage(const ScoreMask& mask, int64_t batch, int64_t head,
                                       int64_t first_query, size_t rows, int64_t key0,
                                       size_t keys) {
  const auto* bytes = static_cast<const uint8_t*>(mask.data);
  const size_t distinct_rows = mask.row_stride == 0 ? std::min<size_t>(rows, 1) : rows;
  unsigned any = 0, all = 1;
  for (size_t r = 0; r < distinct_rows; ++r) {
    const uint8_t* row =
        bytes + mask.offset(batch, head, first_query + static_cast<int64_t>(r), key0);
    if (mask.col_stride == 1) {
      for (size_t j = 0; j < keys; ++j) {
        const unsigned takes_part = row[j] != 0 ? 1U : 0U;
        any |= takes_part;
        all &= takes_part;
      }
    } else {
      for (size_t j = 0; j < keys; ++j) {
        const unsigned takes_part = row[static_cast<int64_t>(j) * mask.col_stride] != 0 ? 1U : 0U;
        any |= takes_part;
        all &= takes_part;
      }
    }
    if (any != 0 && all == 0) return MaskCoverage::kSome;
  }
  return all != 0 ? MaskCoverage::kAll : any != 0 ? MaskCoverage::kSome : MaskCoverage::kNone;
}

// A float mask's entry stored as bfloat16 or float16 bits (MaskEntries), as the mask readers
// take it: entry_value widens it exactly.
struct BFloat16Entry {
  uint16_t bits;
};
struct Float16Entry {
  uint16_t bits;
};
inline float entry_value(float entry) {
  return entry;
}
inline float entry_value(BFloat16Entry entry) {
  return bfloat16_to_float(entry.bits);
}
inline float entry_value(Float16Entry entry) {
  return half_to_float(entry.bits);
}

// f(Entry()) for the C++ type of a float mask's entries (float, BFloat16Entry or Float16Entry):
// one call site instantiates a reader per format.
template <class F>
void with_float_entries(MaskEntries entries, const F& f) {
  switch (entries) {
    case MaskEntries::kFloat32:
      f(float());
      return;
    case MaskEntries::kBFloat16:
      f(BFloat16Entry());
      return;
    case MaskEntries::kFloat16:
      f(Float16Entry());
      return;
  }
}

// Whether entries [0, count) of a mask's row (`stride` apart) all hide their key — a float mask's
// −∞, a bool mask's false — without a branch per entry (vectorised where the row is contiguous).
inline bool row_hides_all(const float* row, int64_t stride, int64_t count) {
  constexpr float kHidden = -std::numeric_limits<float>::infinity();
  unsigned hidden = 1;
  if (stride == 1) {
    for (int64_t j = 0; j < count; ++j) hidden &= row[j] == kHidden ? 1U : 0U;
  } else {
    for (int64_t j = 0; j < count; ++j) hidden &= row[j * stride] == kHidden ? 1U : 0U;
  }
  return hidden != 0;
}
// Half entries hide their key where their bits are −∞'s (the one encoding each format has).
template <class Entry>
inline bool half_row_hides_all(const Entry* row, int64_t stride, int64_t count,
                               uint16_t hidden_bits) {
  unsigned hidden = 1;
  for (int64_t j = 0; j < count; ++j) hidden &= row[j * stride].bits == hidden_bits ? 1U : 0U;
  return hidden != 0;
}
inline bool row_hides_all(const BFloat16Entry* row, int64_t stride, int64_t count) {
  return half_row_hides_all(row, stride, count, 0xff80U);
}
inline bool row_hides_all(const Float16Entry* row, int64_t stride, int64_t count) {
  return half_row_hides_all(row, stride, count, 0xfc00U);
}
inline bool row_hides_all(const uint8_t* row, int64_t stride, int64_t count) {
  unsigned any = 0;
  if (stride == 1) {
    for (int64_t j = 0; j < count; ++j) any |= row[j];
  } else {
    for (int64_t j = 0; j < count; ++j) any |= row[j * stride];
  }
  return any == 0;
}

// Whether a float mask hides the whole tile: every entry −∞, the form PyTorch's users give a
// causal, padding or window mask as a float attn_mask. Such a tile adds nothing to any row (exp(−∞)
// = 0, its dS = 0), as a bool mask's kNone tile. Row by row (row_hides_all), stopping at the
// first row with a visible entry.
inline bool float_mask_hides_tile(const ScoreMask& mask, int64_t batch, int64_t head,
                                  int64_t first_query, size_t rows, int64_t key0, size_t keys) {
  const size_t distinct_rows = mask.row_stride == 0 ? std::min<size_t>(rows, 1) : rows;
  bool hides = true;
  with_float_entries(mask.entries, [&](auto entry_type) {
    using Entry = decltype(entry_type);
    for (size_t r = 0; r < distinct_rows && hides; ++r) {
      const Entry* row = static_cast<const Entry*>(mask.data) +
                         mask.offset(batch, head, first_query + static_cast<int64_t>(r), key0);
      hides = row_hides_all(row, mask.col_stride, static_cast<int64_t>(keys));
    }
  });
  return hides;
}

// How much of a tile the attention mask lets through: a bool mask's coverage; for a float mask
// kNone where it hides the whole tile, else kSome (its entries are added); kAll without a mask.
// Callers skip kNone tiles.
inline MaskCoverage mask_coverage(const ScoreMask& mask, int64_t batch, int64_t head,
                                  int64_t first_query, size_t rows, int64_t key0, size_t keys) {
  switch (mask.kind) {
    case MaskKind::kBool:
      return bool_mask_coverage(mask, batch, head, first_query, rows, key0, keys);
    case MaskKind::kFloat:
      return float_mask_hides_tile(mask, batch, head, first_query, rows, key0, keys)
                 ? MaskCoverage::kNone
                 : MaskCoverage::kSome;
    case MaskKind::kNone:
      break;
  }
  return MaskCoverage::kAll;
}

// Adds a transposed gradient tile dSᵀ (keys × br) into a float mask's gradient, laid out as the
// mask (so broadcast axes accumulate).
inline void accumulate_mask_gradient(const ScoreMaskGradient& gradient, int64_t batch, int64_t head,
                                     int64_t first_query, size_t rows, int64_t key0, size_t keys,
                                     size_t br, const float* grad_scores) {
  for (size_t r = 0; r < rows; ++r) {
    float* entries =
        gradient.data + gradient.offset(batch, head, first_query + static_cast<int64_t>(r), key0);
    for (size_t j = 0; j < keys; ++j)
      entries[static_cast<int64_t>(j) * gradient.col_stride] += grad_scores[j * br + r];
  }
}

// Where a backward pass's tasks add a float mask's gradient into the caller's buffer (which holds
// the elements its strides address within `extent()` floats from its start). When
// the mask broadcasts over batch elements or over key/value heads, tasks that run in parallel
// would add into the same elements, so each thread gets a zeroed private copy, summed into the
// gradient in thread order afterwards (reproducible for a fixed thread count and schedule).
class MaskGradientAccumulator {
 public:
  MaskGradientAccumulator(const ScoreMaskGradient& gradient, int64_t batch, int64_t heads,
                          int64_t kv_heads, int64_t queries, int64_t keys, size_t threads)
      : gradient_(gradient) {
    if (gradient.data == nullptr || batch <= 0 || heads <= 0 || queries <= 0 || keys <= 0) return;
    extent_ = static_cast<size_t>(
        (batch - 1) * gradient.batch_stride + (heads - 1) * gradient.head_stride +
        (queries - 1) * gradient.row_stride + (keys - 1) * gradient.col_stride + 1);
    if ((gradient.batch_stride == 0 && batch > 1) || (gradient.head_stride == 0 && kv_heads > 1)) {
      threads_ = threads;
      copies_.assign(threads * extent_, 0.0F);
    }
  }

  size_t extent() const { return extent_; }
  bool private_copies() const { return threads_ > 0; }
  // The gradient thread `thread` adds into: its private copy, or the shared gradient.
  ScoreMaskGradient for_thread(size_t thread) {
    if (!private_copies()) return gradient_;
    ScoreMaskGradient copy = gradient_;
    copy.data = copies_.data() + thread * extent_;
    return copy;
  }
  void sum_private_copies() {
    for (size_t thread = 0; thread < threads_; ++thread) {
      const float* copy = copies_.data() + thread * extent_;
      for (size_t e = 0; e < extent_; ++e) gradient_.data[e] += copy[e];
    }
  }

 private:
  ScoreMaskGradient gradient_;
  size_t extent_ = 0;
  size_t threads_ = 0;
  std::vector<float> copies_;
};

}  // namespace attn
