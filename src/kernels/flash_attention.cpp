// Fused attention, forward (dot-product and additive scores): FlashAttention-2's tiling with an
// online softmax, written once with Highway and compiled for every SIMD target (foreach_target),
// dispatched once per call. Layout and notation follow include/attn/kernels/flash_attention.hpp.
//
// Per task (batch b, head h, query tile of Br = 4 vectors of rows) the kernel keeps, in per-thread
// scratch: Qᵀ scaled (d × Br), the score tile transposed Sᵀ (Bc × Br) — queries along the vector
// lanes, so each row's running max and sum are lane-wise, with no horizontal reductions — and the
// output accumulator O (Br × dv). For each key tile: Sᵀ = K Qᵀ, the score modifiers and masks
// (score_modifiers-inl.h), new max, P = exp(S − max), O = O·exp(old max − new max) + P V. Key
// tiles outside every row's key range, or hidden whole by a bool mask, are never computed.
#include "attn/kernels/flash_attention.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <optional>
#include <string>
#include <type_traits>

#include "attn/core/error.hpp"
#include "attn/kernels/additive_attention.hpp"
#include "attn/kernels/amx.hpp"
#include "attn/kernels/bfloat16_dot.hpp"
#include "attn/kernels/bfloat16_probabilities.hpp"
#include "kernels/cache_sizes.hpp"
#include "kernels/cpu_features.hpp"
#include "kernels/dropout_hash.hpp"
#include "kernels/kernel_arguments.hpp"
#include "kernels/parallel_tasks.hpp"
#include "kernels/rows_view.hpp"
#include "kernels/score_masks.hpp"
#include "kernels/scratch_memory.hpp"
#include "kernels/split_parts_range.hpp"
#include "kernels/spread_prefetch.hpp"

#ifndef ATTN_FLASH_ATTENTION_SHARED
#define ATTN_FLASH_ATTENTION_SHARED
namespace attn::flash_detail {

struct ForwardArgs {
  ConstHeadsView q, k, v;
  HeadsView out;
  float* log_sum_exp;
  const ValidLengths* valid_lens;
  FlashAttentionOptions options;
  // Null for dot-product scores; otherwise w_v (q.cols values) and additive scores
  // S_ij = Σ_t w_t tanh(q_it + k_jt), with q and k the projected queries and keys.
  const float* additive_weights = nullptr;
  // How additive scores are computed (additive_scores-inl.h); in the exponential forms the packed
  // keys and Qᵀ hold e^{2k} and e^{2q}.
  AdditiveScoreForm additive_form = AdditiveScoreForm::kTanh;
  // The softmax in base 2 (FlashForward sets it for dot-product scores): Qᵀ (or the bf16 products'
  // scale) carries log2 e, so scores, the modifiers' terms, running maxima and sinks are log2 e
  // times their natural values and P = 2^(S − max) by ProbabilityExp2 (RoundedProbabilityExp2 for
  // bf16), three multiply-pipe operations fewer per score than e^x; the log-sum-exp is turned
  // back to base e as it is written. The additive scores keep base e.
  bool base_two = false;
  // What a natural score, modifier term or sink is multiplied by in this pass: log2 e in base 2.
  float score_unit() const { return base_two ? std::numbers::log2e_v<float> : 1.0F; }
  // Half-precision inputs and output: q, k, v and out above then give shapes and strides only,
  // and the elements are these (flash_attention.hpp's half-precision overload).
  bool half = false;
  HalfType half_type = HalfType::kBFloat16;
  ConstHalfHeadsView q16{}, k16{}, v16{};
  HalfHeadsView out16{};
  // Data not null: each output row's rounding residual (flash_attention_forward's out_residual).
  HalfHeadsView residual16{};
  // When not null, three running maxima (query, key, value) of the magnitude bits of the rows the
  // pass reads (flash_attention_forward's `read`; half inputs as the floats they widen to), which
  // each task raises as it ends.
  std::atomic<uint32_t>* read_magnitude_bits = nullptr;
  // fp32 output rows of whole aligned vectors, more than the threads' L2s hold (FlashForward sets
  // it): written with streaming stores (WriteOutputRows), not requested ahead for writing. The
  // requests' waits had fallen on the softmax step: the pass's samples outside the products 0.201
  // → 0.190 of the products' (means of 11 rounds each, spread ±0.012, bench/sample_shares.py at
  // n = 1024, B = 4, 8 heads of 64 on the layers' layout, Emerald Rapids; 0.150 → 0.145 at 4096).
  bool stream_output = false;
  // False: fp32 (and fp16) scores never go to the AMX tiles in three bf16 parts, as FlashForward
  // reruns a pass whose operands lay outside split_parts_in_range.
  bool parts_on_tiles = true;
};

constexpr size_t kQueryVectors = 4;   // Br = 4 · lanes: the register tile's width (kMaxVectors)
constexpr size_t kShortAmxRows = 32;  // Br on AMX tiles for heads of at most this many queries
constexpr size_t kKeyTile = 64;       // Bc: Sᵀ (Bc × Br floats) stays in L1 at 16 lanes
// Query tiles of one head that a task may take together, each key tile then serving them all
// while it is in L1/L2 (FlashForwardTiles): K and V are read from L3 or memory once per block.
// Zen 4, 2 threads, B = 1, 2 heads, n = 32768: 4 tiles a block ran 3–4% faster than 2.
constexpr size_t kMaxQueryBlock = 4;
// Bc of the bf16 path: twice the keys per tile halves P·V's per-tile load, rescale and store of O,
// which the halved product time made count (1.70x fp32 against 1.64x at 64 keys on Zen 5).
constexpr size_t kKeyTileBF16 = 128;

}  // namespace attn::flash_detail
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/flash_attention.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// Highway's headers must follow foreach_target.h.
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "kernels/additive_scores-inl.h"
#include "kernels/amx_tiles-inl.h"
#include "kernels/dropout-inl.h"
#include "kernels/fast_math-inl.h"
#include "kernels/half_rows-inl.h"
#include "kernels/magnitude_bits-inl.h"
#include "kernels/score_modifiers-inl.h"
#include "kernels/tile_gemm-inl.h"
#include "kernels/tile_gemm_bf16-inl.h"
#include "kernels/transpose_tile-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using flash_detail::ForwardArgs;

// Per-thread working memory, sized once per call.
struct Scratch {
  ScratchMemory memory;
  // The query tile's own buffers, one set per tile of a block (kMaxQueryBlock slots, UseSlot picks
  // the one these point at); Sᵀ and the rescale factors live within one key tile's step and are
  // shared.
  float* q_transposed;     // d × Br
  float* scores;           // Bc × Br: Sᵀ, then Pᵀ
  size_t scores_size = 0;  // Bc × Br
  float* output;           // Br × dv_padded
  float* row_max;          // Br
  float* row_sum;          // Br
  float* row_rescale;      // Br
  int32_t* first;          // Br: each query's first visible key
  int32_t* last;           // Br: one past each query's last visible key
  uint32_t* row_keys;      // Br: dropout_hash::row_key of each query
  // (The bf16 path's query_pairs and output_transposed below are a tile's own too.)
  struct Slot {
    float *q_transposed, *output, *row_max, *row_sum;
    int32_t *first, *last;
    uint32_t* row_keys;
    uint32_t* query_pairs;
    float* output_transposed;
  };
  Slot slots[flash_detail::kMaxQueryBlock];
  void UseSlot(size_t slot) {
    const Slot& chosen = slots[slot];
    q_transposed = chosen.q_transposed;
    output = chosen.output;
    row_max = chosen.row_max;
    row_sum = chosen.row_sum;
    first = chosen.first;
    last = chosen.last;
    row_keys = chosen.row_keys;
    query_pairs = chosen.query_pairs;
    output_transposed = chosen.output_transposed;
  }
  float* widened_row;  // max(d, dv_padded): a half-precision row in or out
  // The current head's keys (m × d) and values (m × dv_padded, zero-padded columns), packed
  // contiguously: heads addressed by stride put a head's rows kilobytes apart, and at long
  // sequences the pages they span outgrow the TLB (n = 16384 with 32 heads ran at 38% of peak
  // instead of 70%). Rows are packed as tiles first need them, once per head and thread (for a
  // sliding window, only the keys its tiles reach).
  float* packed_keys;
  float* packed_values;
  int64_t packed_head = -1;
  int64_t packed_begin = 0;  // rows [packed_begin, packed_end) of packed_head are packed
  int64_t packed_end = 0;
  // With ForwardArgs::read_magnitude_bits: the magnitudes of the query rows this thread has
  // prepared and of the key and value rows it has packed (or, read in place, checked: the packed
  // range then counts the rows checked).
  MagnitudeBits read_query, read_key, read_value;
  // The bf16 dot-product path (FlashForwardTileBF16) instead keeps pairs of bf16 in 32 bits, the
  // operand vdpbf16ps multiplies: Qᵀ as (d/2 × Br) pairs of a query's adjacent dimensions, P as
  // (Bc/2 × Br) pairs of a query's adjacent keys, each key row as d/2 pairs, and the values as
  // (m/2 × dv_padded) pairs of two adjacent keys' entries in one column. Pairs start at even keys.
  uint32_t* query_pairs = nullptr;
  uint32_t* probability_pairs = nullptr;
  uint32_t* key_pairs = nullptr;
  uint32_t* value_pairs = nullptr;
  // The same path on AMX tiles (amx_tiles-inl.h) keeps the values transposed, Vᵀ, in blocks of
  // 32 keys: block k (value_block_words apart) holds, for each of the dv_tiles (dv rounded up to
  // 32) columns, that column's 16 pairs of adjacent keys in one 64-byte row, so that a tile of Vᵀ
  // is 1 KiB in a row (rows of the whole head's keys, 2m bytes apart, put a tile's 16 rows in few
  // L1 sets). It accumulates Oᵀ (dv_tiles × Br); value_pairs stages 16 pairs of value rows. Keys
  // are packed in blocks of 32, zeros past m, and the tiles read only packed blocks.
  uint32_t* values_transposed = nullptr;
  float* output_transposed = nullptr;
  size_t value_block_words = 0;
  size_t dv_tiles = 0;
  // Pairs of dimensions a query takes in query_pairs (rows br apart) and a key row in key_pairs:
  // (d + 1) / 2; on AMX tiles rounded up to whole tiles of 16 pairs, the pairs past d zero, so that
  // heads of any depth (80, 96) take the tiles.
  size_t pair_depth = 0;
  // The fp32 forward on AMX tiles (split_parts == 3) keeps each of query_pairs, probability_pairs,
  // key_pairs, value_pairs and values_transposed three times over, the fp32 operand's bf16 parts
  // hi, mid and lo (SplitThreeBF16), each part *_part_words after the one before; split_rows
  // stages the parts of fp32 rows as bf16 rows (3 × Br query rows of d, or 6 value rows).
  size_t split_parts = 1;
  // P's bf16 parts: three (hi, mid, lo: P exactly) in the fp32 forward on tiles; in the bf16
  // forward two (hi + lo, within 2^-16 of P) where bf16_probabilities_split(), else one (P rounded
  // to bf16). probability_pairs holds each part probability_part_words after the one before.
  size_t probability_parts = 1;
  size_t query_part_words = 0, probability_part_words = 0, key_part_words = 0,
         value_pair_part_words = 0, value_part_words = 0;
  uint16_t* split_rows = nullptr;

  // Keeps the packed rows of `head` when a range starting at `begin` extends them (ranges that move
  // forward or stay); otherwise the packed range restarts, empty, at `begin`.
  void ContinuePacking(int64_t head, int64_t begin) {
    if (packed_head != head || begin < packed_begin || begin > packed_end) {
      packed_head = head;
      packed_begin = packed_end = begin;
    }
  }

  Scratch(size_t br, size_t depth, size_t dv_padded, size_t keys, size_t lanes, bool bf16_pairs,
          bool amx_tiles = false, size_t parts = 1, bool split_probabilities = false) {
    const size_t bc = bf16_pairs ? flash_detail::kKeyTileBF16 : flash_detail::kKeyTile;
    const size_t key_blocks = hwy::RoundUpTo(keys, 32);
    dv_tiles = hwy::RoundUpTo(dv_padded, 32);
    value_block_words = dv_tiles * 16;
    pair_depth = PairsOfRow(depth, amx_tiles);
    split_parts = parts;
    probability_parts = parts > 1 ? 3 : split_probabilities ? 2 : 1;
    query_part_words = bf16_pairs ? pair_depth * br : 0;
    memory = carve_scratch(lanes, [&](const auto& take) {
      for (Slot& slot : slots) {
        slot.q_transposed = take(bf16_pairs ? 0 : depth * br);
        slot.output = take(br * dv_padded);
        slot.row_max = take(br);
        slot.row_sum = take(br);
        slot.first = as_int32(take(br));
        slot.last = as_int32(take(br));
        slot.row_keys = as_uint32(take(br));
        // (Null where not used: PrepareQueryTile tells the paths apart by query_pairs.)
        slot.query_pairs = bf16_pairs ? as_uint32(take(parts * query_part_words)) : nullptr;
        slot.output_transposed = bf16_pairs && amx_tiles ? take(dv_tiles * br) : nullptr;
      }
      scores = take(bc * br);
      scores_size = bc * br;
      row_rescale = take(br);
      widened_row = take(std::max(depth, dv_padded));
      if (bf16_pairs) {
        const size_t key_pairs_count = (keys + 1) / 2;
        probability_part_words = bc / 2 * br;
        probability_pairs = as_uint32(take(probability_parts * probability_part_words));
        if (amx_tiles) {
          key_part_words = key_blocks * pair_depth;
          value_pair_part_words = 16 * dv_tiles;
          value_part_words = key_blocks / 32 * value_block_words;
          key_pairs = as_uint32(take(parts * key_part_words));
          value_pairs = as_uint32(take(parts * value_pair_part_words));
          values_transposed = as_uint32(take(parts * value_part_words));
          if (parts > 1) {  // floats' room for 2 bf16 each
            split_rows = reinterpret_cast<uint16_t*>(
                take((parts * std::max(br * depth, 2 * dv_tiles) + 1) / 2));
          }
        } else {
          key_pairs = as_uint32(take(2 * key_pairs_count * pair_depth));
          value_pairs = as_uint32(take(key_pairs_count * dv_padded));
        }
      } else {
        packed_keys = take(keys * depth);
        packed_values = take(keys * dv_padded);
      }
    });
    // The queries' pairs past d stay zero: PrepareQueryTile writes the first (d + 1) / 2 rows.
    for (const Slot& slot : slots) {
      for (size_t part = 0; part < parts && bf16_pairs; ++part) {
        uint32_t* pairs = slot.query_pairs + part * query_part_words;
        std::fill(pairs + (depth + 1) / 2 * br, pairs + pair_depth * br, 0U);
      }
    }
    UseSlot(0);
  }
};

// Makes rows [begin, end) of key/value head (b, h)'s keys and values available in s.packed_*, at
// their own row offsets (half-precision inputs widened to floats). A thread's successive tiles of
// a head need ranges that only move forward (causal, windows) or stay (full attention), so packing
// extends the packed range; a range before or past it (another head, a window far ahead) starts a
// new one.
void PackKeysAndValues(const ForwardArgs& args, int64_t b, int64_t h, int64_t begin, int64_t end,
                       size_t dv_padded, Scratch& s) {
  const int64_t head = b * args.k.heads + h;
  s.ContinuePacking(head, begin);
  const hn::ScalableTag<float> d;
  const auto depth = static_cast<size_t>(args.k.cols), dv = static_cast<size_t>(args.v.cols);
  constexpr int64_t kPrefetchRows = 16;  // PrefetchMatrixRow: rows requested this far ahead
  for (int64_t j = s.packed_end; j < end; ++j) {
    if (j + kPrefetchRows < end) {
      PrefetchMatrixRow(args.half, args.k, args.k16, b, h, j + kPrefetchRows);
      PrefetchMatrixRow(args.half, args.v, args.v16, b, h, j + kPrefetchRows);
    }
    float* key_row = s.packed_keys + static_cast<size_t>(j) * depth;
    float* value_row = s.packed_values + static_cast<size_t>(j) * dv_padded;
    if (args.half) {
      WidenRow(d, args.half_type, args.k16.matrix(b, h) + j * args.k16.row_stride, depth, key_row);
      WidenRow(d, args.half_type, args.v16.matrix(b, h) + j * args.v16.row_stride, dv, value_row);
      if (args.read_magnitude_bits != nullptr) {  // widening keeps every magnitude, NaN and ∞
        s.read_key.Add(key_row, depth);
        s.read_value.Add(value_row, dv);
      }
    } else {
      std::copy_n(args.k.matrix(b, h) + j * args.k.row_stride, depth, key_row);
      std::copy_n(args.v.matrix(b, h) + j * args.v.row_stride, dv, value_row);
      if (args.read_magnitude_bits != nullptr) {  // the copies, while they are in L1
        s.read_key.Add(key_row, depth);
        s.read_value.Add(value_row, dv);
      }
      if (exponential(args.additive_form)) DoubledExponentialsInPlace(d, key_row, depth);
    }
    std::fill(value_row + dv, value_row + dv_padded, 0.0F);
  }
  s.packed_end = std::max(s.packed_end, end);
}

// Where a tile reads key j's row and value j's (dv_padded floats): the inputs themselves or the
// thread's packed copy.
struct KeyValueRows {
  RowsView keys, values;
};

// Rows [begin, end) of key/value head (b, h): read in place when `in_place` (FlashForward decides),
// else packed (PackKeysAndValues).
KeyValueRows KeysAndValuesFor(const ForwardArgs& args, int64_t b, int64_t h, int64_t begin,
                              int64_t end, size_t dv_padded, bool in_place, Scratch& s) {
  if (in_place) {
    if (args.read_magnitude_bits != nullptr) {
      // Each row checked once per head and thread, as packing would copy it.
      s.ContinuePacking(b * args.k.heads + h, begin);
      if (s.packed_end < end) {
        const auto rows = static_cast<size_t>(end - s.packed_end);
        s.read_key.AddRows(args.k.matrix(b, h) + s.packed_end * args.k.row_stride,
                           static_cast<size_t>(args.k.row_stride), rows,
                           static_cast<size_t>(args.k.cols));
        s.read_value.AddRows(args.v.matrix(b, h) + s.packed_end * args.v.row_stride,
                             static_cast<size_t>(args.v.row_stride), rows,
                             static_cast<size_t>(args.v.cols));
        s.packed_end = end;
      }
    }
    return {{args.k.matrix(b, h), static_cast<size_t>(args.k.row_stride)},
            {args.v.matrix(b, h), static_cast<size_t>(args.v.row_stride)}};
  }
  PackKeysAndValues(args, b, h, begin, end, dv_padded, s);
  return {{s.packed_keys, static_cast<size_t>(args.k.cols)}, {s.packed_values, dv_padded}};
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// Row `row` of a key or value (or query) matrix of head (b, h) as floats: the fp32 input in place,
// or an fp16 one widened into `widened`; its magnitudes added to `read` where the call reads them
// (widening keeps every magnitude, NaN and ∞).
const float* FloatRow(const ForwardArgs& args, const ConstHeadsView& matrix,
                      const ConstHalfHeadsView& matrix16, int64_t b, int64_t h, int64_t row,
                      float* widened, MagnitudeBits& read) {
  const auto cols = static_cast<size_t>(matrix.cols);
  const float* floats = widened;
  if (args.half) {
    WidenRow(hn::ScalableTag<float>(), args.half_type,
             matrix16.matrix(b, h) + row * matrix16.row_stride, cols, widened);
  } else {
    floats = matrix.matrix(b, h) + row * matrix.row_stride;
  }
  if (args.read_magnitude_bits != nullptr) read.Add(floats, cols);
  return floats;
}

// The fp32 forward on AMX tiles (fp32 or fp16 inputs): the tile's `rows` query rows, times the
// scale in the softmax's unit as the fp32 path's Qᵀ, as Qᵀ's pairs three times over, one set per
// bf16 part (SplitThreeBF16); lanes past `rows` 0.
ATTN_BF16_TARGET void SplitQueryPairs(const ForwardArgs& args, int64_t b, int64_t h,
                                      int64_t first_query, size_t rows, size_t br, Scratch& s) {
  const auto depth = static_cast<size_t>(args.q.cols);
  const float scale = args.options.scale * args.score_unit();
  const size_t part_rows = br * depth;  // each part's rows in s.split_rows
  for (size_t r = 0; r < rows; ++r) {
    uint16_t* row = s.split_rows + r * depth;
    const float* query =
        FloatRow(args, args.q, args.q16, b, h, first_query + static_cast<int64_t>(r), s.widened_row,
                 s.read_query);
    SplitRowBF16x3(query, depth, depth, scale, row, row + part_rows, row + 2 * part_rows);
  }
  const size_t depth_pairs = (depth + 1) / 2;
  for (size_t part = 0; part < 3; ++part) {
    uint32_t* pairs = s.query_pairs + part * s.query_part_words;
    if (rows < br || depth % 2 != 0) std::fill_n(pairs, depth_pairs * br, 0U);
    TransposeRowPairs(s.split_rows + part * part_rows, depth, rows, depth, br, pairs);
  }
}
#endif

// The rows' key ranges and dropout keys, Qᵀ with the scale folded in (zero in padding lanes), and
// the online softmax's starting state: running max −∞ and sum 0. A head's sink joins the rows'
// denominators as they are written (WriteOutputRows), not here: started at the sink, a running
// maximum 88 or more above every score flushed each P = exp(S − max) under float's normal range
// and left outputs (then under 1e−33 of the values) up to a fifth off.
QueryTile PrepareQueryTile(const ForwardArgs& args, int64_t b, int64_t h, int64_t first_query,
                           size_t br, Scratch& s) {
  QueryTile tile;
  tile.batch = b;
  tile.head = h;
  tile.first_query = first_query;
  tile.rows =
      static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(br), args.q.rows - first_query));
  tile.queries = args.q.rows;
  tile.keys = args.k.rows;
  tile.first = s.first;
  tile.last = s.last;
  // Every line of the tile's query rows requested at once, before the transpose below reads them a
  // row (and, for fp32, a column) at a time.
  for (size_t r = 0; r < tile.rows; ++r)
    PrefetchMatrixRow(args.half, args.q, args.q16, b, h, first_query + static_cast<int64_t>(r));
  tile.ranges = tile_key_ranges(*args.valid_lens, args.options, b, h, first_query, tile.rows, br,
                                args.q.rows, args.k.rows, s.first, s.last);
  // The queries' dropout hash keys, only for dropout (a few % of a tile of n = 8 queries).
  for (size_t r = 0; r < br && args.options.dropout > 0.0F; ++r) {
    s.row_keys[r] = dropout_hash::row_key(args.options.seed, b * args.q.heads + h,
                                          first_query + static_cast<int64_t>(r));
  }
  const size_t depth = static_cast<size_t>(args.q.cols);
  const float scale = args.options.scale * args.score_unit();
  if (s.split_parts > 1) {  // (only where the AVX-512 targets' FlashForwardTileBF16 runs)
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    SplitQueryPairs(args, b, h, first_query, tile.rows, br, s);
#endif
  } else if (args.half && s.query_pairs != nullptr) {
    // bf16 pairs of adjacent dimensions, unscaled (the score product scales its sums).
    const uint16_t* q = args.q16.matrix(b, h) + first_query * args.q16.row_stride;
    const size_t depth_pairs = (depth + 1) / 2;
    if (tile.rows < br || depth % 2 != 0) std::fill_n(s.query_pairs, depth_pairs * br, 0U);
    TransposeRowPairs(q, static_cast<size_t>(args.q16.row_stride), tile.rows, depth, br,
                      s.query_pairs);
    // The rows again, from L1.
    for (size_t r = 0; r < tile.rows && args.read_magnitude_bits != nullptr; ++r)
      s.read_query.AddBFloat16(q + static_cast<int64_t>(r) * args.q16.row_stride, depth);
  } else if (args.half) {
    // Rows widened in vectors (a conversion per element would cost a quarter of the tile's time at
    // d = 64) into the score tile, free until the first key step, as many as it holds at a time,
    // then transposed as fp32 rows are: element by element, the transpose was 4.3% of the fp16
    // forward at n = 1024, d = 64 (perf, Zen 4).
    const hn::ScalableTag<float> d;
    // (Depths past the tile's size, a row at a time through widened_row.)
    const bool in_scores = s.scores_size >= depth;
    float* widened = in_scores ? s.scores : s.widened_row;
    // (Queries of depth 0 — PyTorch's E = 0, every score 0 — are a group of the tile's rows.)
    const size_t group = in_scores ? std::min(br, s.scores_size / std::max<size_t>(depth, 1)) : 1;
    for (size_t r0 = 0; r0 < tile.rows; r0 += group) {
      const size_t rows = std::min(group, tile.rows - r0);
      for (size_t r = 0; r < rows; ++r) {
        WidenRow(d, args.half_type,
                 args.q16.matrix(b, h) +
                     (first_query + static_cast<int64_t>(r0 + r)) * args.q16.row_stride,
                 depth, widened + r * depth);
      }
      // Widening keeps every magnitude, NaN and ∞.
      if (args.read_magnitude_bits != nullptr) s.read_query.Add(widened, rows * depth);
      TransposeScaledTile(widened, depth, rows, depth, scale, br, rows, s.q_transposed + r0);
    }
    for (size_t t = 0; t < depth && tile.rows < br; ++t)
      std::fill(s.q_transposed + t * br + tile.rows, s.q_transposed + (t + 1) * br, 0.0F);
  } else {
    // Zeros only in the query vectors the score products read.
    const hn::ScalableTag<float> d;
    const float* rows = args.q.matrix(b, h) + first_query * args.q.row_stride;
    if (args.additive_weights != nullptr) {
      PrepareAdditiveQueries<flash_detail::kQueryVectors>(
          d, rows, static_cast<size_t>(args.q.row_stride), tile.rows, depth, scale, br,
          exponential(args.additive_form), s.q_transposed);
    } else {
      TransposeScaledTile(rows, static_cast<size_t>(args.q.row_stride), tile.rows, depth, scale, br,
                          VectorsHolding(d, tile.rows, flash_detail::kQueryVectors) * hn::Lanes(d),
                          s.q_transposed);
    }
    // The rows again, from L1.
    if (args.read_magnitude_bits != nullptr)
      s.read_query.AddRows(rows, static_cast<size_t>(args.q.row_stride), tile.rows, depth);
  }
  std::fill_n(s.row_max, br, -std::numeric_limits<float>::infinity());
  std::fill_n(s.row_sum, br, 0.0F);
  return tile;
}

// On the targets that build 2ⁿ in the exponent field (AVX2 and below) the running maxima in base 2
// are kept as integers, rounded up (P ≤ 1 still; any shift at or above a row's maximum gives the
// same softmax), so that ShiftedExp2 folds their subtraction into its constants: one operation of
// some 14 per score fewer. The online rescale factors 2^(old − new) become exact powers of two.
constexpr bool kIntegerMaxima = !(HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL);

// The max half of a key tile's online-softmax step on Sᵀ (bc × Br, masked scores, times `scale`
// where the caller left them unscaled: the bf16 path on AMX tiles), lane-wise over the queries of
// its first kVectors query vectors (those holding a query; the lanes past them are left as they
// are): new running max = max(old, c·max Sᵀ) (rounding is monotonic and c > 0, so c times the
// largest score is the largest scaled one), rescale factors exp(old max − new max) in
// s.row_rescale; the shifts that P = exp(c·S − shift) subtracts into `shift` (kVectors vectors).
// kBaseTwo: scores and maxima in base 2 (ForwardArgs::base_two), factors 2^(old − new), and
// with kIntegerMaxima the new maxima rounded up to integers. Returns whether every maximum stayed
// as it was: the factors are then exactly 1 (or a row that has seen only −∞, whose O is 0), and
// O's rescale can be left out.
template <size_t kVectors = flash_detail::kQueryVectors, bool kBaseTwo = false, class D>
HWY_INLINE bool OnlineSoftmaxMax(D d, size_t bc, size_t br, Scratch& s, hn::Vec<D>* shift,
                                 float scale = 1.0F) {
  using V = hn::Vec<D>;
  const size_t lanes = hn::Lanes(d);
  const V minus_infinity = hn::Set(d, -std::numeric_limits<float>::infinity());
  V tile_max[kVectors];
  for (size_t g = 0; g < kVectors; ++g) tile_max[g] = minus_infinity;
  for (size_t j = 0; j < bc; ++j) {
    for (size_t g = 0; g < kVectors; ++g)
      tile_max[g] = hn::Max(tile_max[g], hn::Load(d, s.scores + j * br + g * lanes));
  }
  const V factor = hn::Set(d, scale);
  bool kept = true;
  for (size_t g = 0; g < kVectors; ++g) {
    const V old_max = hn::Load(d, s.row_max + g * lanes);
    V row_max = hn::Max(old_max, hn::Mul(tile_max[g], factor));
    if constexpr (kBaseTwo && kIntegerMaxima) row_max = hn::Ceil(row_max);
    kept = kept && hn::AllTrue(d, hn::Eq(row_max, old_max));
    // A row that has seen only −∞ subtracts 0, so exp(−∞ − 0) = 0 instead of NaN.
    shift[g] = hn::IfThenZeroElse(hn::Eq(row_max, minus_infinity), row_max);
    const V difference = hn::Sub(old_max, shift[g]);
    hn::Store(kBaseTwo ? SoftmaxExp2(d, difference) : SoftmaxExp(d, difference), d,
              s.row_rescale + g * lanes);
    hn::Store(row_max, d, s.row_max + g * lanes);
  }
  return kept;
}

// The running sums rescaled plus this tile's column sums of P (kVectors query vectors).
template <size_t kVectors = flash_detail::kQueryVectors, class D>
HWY_INLINE void AddToRowSums(D d, const hn::Vec<D>* sum, Scratch& s) {
  const size_t lanes = hn::Lanes(d);
  for (size_t g = 0; g < kVectors; ++g) {
    float* row_sum = s.row_sum + g * lanes;
    hn::Store(hn::MulAdd(hn::Load(d, row_sum), hn::Load(d, s.row_rescale + g * lanes), sum[g]), d,
              row_sum);
  }
}

// One key tile's online-softmax step on Sᵀ (bc × Br, masked scores in, Pᵀ out), lane-wise over
// the queries of its first kVectors query vectors: OnlineSoftmaxMax, P = exp(S − max) (2^(S − max)
// with kBaseTwo), running sum rescaled plus P's column sums. The query vectors of each key row are
// adjacent in memory and give independent dependency chains. Returns OnlineSoftmaxMax's "kept".
template <size_t kVectors = flash_detail::kQueryVectors, bool kBaseTwo = false, class D>
HWY_INLINE bool OnlineSoftmaxStep(D d, size_t bc, size_t br, Scratch& s) {
  using V = hn::Vec<D>;
  const size_t lanes = hn::Lanes(d);
  V shift[kVectors], sum[kVectors];
  const bool kept = OnlineSoftmaxMax<kVectors, kBaseTwo>(d, bc, br, s, shift);
  for (size_t g = 0; g < kVectors; ++g) sum[g] = hn::Zero(d);
#if !(HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL)
  if constexpr (kBaseTwo) {
    // The shifts are integers (kIntegerMaxima); up to 2²¹ in magnitude they fold (larger ones take
    // the loop below). A query vector at a time: its two constants and its sum stay in registers.
    bool folds = true;
    for (size_t g = 0; g < kVectors; ++g)
      folds = folds && hn::AllTrue(d, hn::Le(hn::Abs(shift[g]), hn::Set(d, kMaxFoldedShift)));
    if (folds) {
      for (size_t g = 0; g < kVectors; ++g) {
        const FoldedShift<D> folded = FoldShift(d, shift[g]);
        for (size_t j = 0; j < bc; ++j) {
          float* score = s.scores + j * br + g * lanes;
          const V p = SoftmaxShiftedExp2(d, hn::Load(d, score), folded);
          hn::Store(p, d, score);
          sum[g] = hn::Add(sum[g], p);
        }
      }
      AddToRowSums<kVectors>(d, sum, s);
      return kept;
    }
  }
#endif
  for (size_t j = 0; j < bc; ++j) {
    for (size_t g = 0; g < kVectors; ++g) {
      float* score = s.scores + j * br + g * lanes;
      const V difference = hn::Sub(hn::Load(d, score), shift[g]);
      const V p = kBaseTwo ? ProbabilityExp2(d, difference) : SoftmaxExp(d, difference);
      hn::Store(p, d, score);
      sum[g] = hn::Add(sum[g], p);
    }
  }
  AddToRowSums<kVectors>(d, sum, s);
  return kept;
}

// OnlineSoftmaxStep over the `vectors` (1 to kQueryVectors) query vectors that hold a query. A
// switch rather than WithStaticCount's lambda, which GCC compiled out of line: the steps stay in
// the key loop, where tools/port_model.py finds them.
template <bool kBaseTwo = false, class D>
HWY_INLINE bool OnlineSoftmaxStepOver(D d, size_t vectors, size_t bc, size_t br, Scratch& s) {
  constexpr size_t kAll = flash_detail::kQueryVectors;
  switch (vectors) {
    case 1:
      return OnlineSoftmaxStep<1, kBaseTwo>(d, bc, br, s);
    case 2:
      return OnlineSoftmaxStep<2, kBaseTwo>(d, bc, br, s);
    case 3:
      return OnlineSoftmaxStep<3, kBaseTwo>(d, bc, br, s);
    default:
      return OnlineSoftmaxStep<kAll, kBaseTwo>(d, bc, br, s);
  }
}

// How far a key tile's scores (base 2) may rise above a row's running maximum before a lazy step
// (below, and the bf16 path's) rescales: P ≤ 2⁸ stays far from float's range, and the sums and
// O taken with the old maximum are what the full step's would be, times 2^(max − old max).
constexpr float kLazyMaxMargin = 8.0F;
// Whether a lazy step's row sum of P = 2^(S − max) shows a score above the maximum by more than
// kLazyMaxMargin: such a P exceeds 2^margin, and so does its sum (a key tile of scores at most the
// maximum sums to at most Bc ≤ 128 < 2^margin). Read from the sums, not from a running maximum of
// the scores, which cost a vmaxps per 16 scores in the lazy steps' loops; a tile of many scores a
// little above the maximum may read as risen too, and takes the rescale or the full step, exact
// either way.
static_assert(flash_detail::kKeyTile < 256 && flash_detail::kKeyTileBF16 < 256,
              "a key tile of scores at most the maximum must sum below 2^kLazyMaxMargin");
template <class D>
HWY_INLINE hn::Mask<D> RoseAboveMargin(D d, hn::Vec<D> sum) {
  return hn::Gt(sum, hn::Set(d, std::exp2(kLazyMaxMargin)));
}

// floor(log2 x) for a positive normal x, as a float: its exponent field less the bias.
template <class D>
HWY_INLINE hn::Vec<D> BinaryExponent(D d, hn::Vec<D> x) {
  const hn::RebindToSigned<D> di;
  return hn::ConvertTo(d, hn::Sub(hn::ShiftRight<23>(hn::BitCast(di, x)), hn::Set(di, 127)));
}

// The rise above which the fp32 lazy step's P may have overflowed (2^(S − old max) ≥ 2¹²⁸) or its
// column sums may (Bc = 64 terms of 2¹²⁰ stay below 2¹²⁶): its Sᵀ is recomputed for the full step.
constexpr float kLazyRescaleLimit = 120.0F;
static_assert(flash_detail::kKeyTile <= 64, "Bc · 2^kLazyRescaleLimit must stay below 2^128");
// The fp32 lazy step on AVX-512 only, where it measured 1–2% faster than the full step (Zen 4);
// capped at AVX2 on the same core it measured level (fused 1.005×, causal 0.984× at n = 1024).
constexpr bool kLazyFloatSoftmax = HWY_MAX_BYTES >= 64;

// What a lazy step did (LazySoftmaxStep).
enum class LazyOutcome {
  kKept,       // every running maximum kept: O and the sums need no rescale
  kRaised,     // some maxima raised: O needs s.row_rescale, as after a full step
  kIntact,     // nothing done, Sᵀ intact: a row had no finite maximum yet
  kRecompute,  // a score rose past kLazyRescaleLimit: Sᵀ holds P, recompute it for the full step
};

// The fp32 forward's step in base 2 where every row already has a finite running maximum:
// P = 2^(S − max) with the maximum kept, so that O's rescale (a multiply per element of O per key
// tile) and a pass of its own over Sᵀ for the tile's maximum (OnlineSoftmaxMax) are left out. A
// row whose scores rose above its maximum by more than kLazyMaxMargin has a P above 2^margin, so
// a sum above it (RoseAboveMargin): it takes the full step's arithmetic after the pass, its
// maximum raised by the exponent of its largest P (read from P, in a pass only such rows need), its
// P and sum multiplied by 2^(old − new), the same factor in s.row_rescale for O. Over the first
// kVectors query vectors (those holding a query), as OnlineSoftmaxStep.
template <size_t kVectors, class D>
HWY_INLINE LazyOutcome LazySoftmaxStep(D d, size_t bc, size_t br, Scratch& s) {
  using V = hn::Vec<D>;
  const size_t lanes = hn::Lanes(d);
  const V minus_infinity = hn::Set(d, -std::numeric_limits<float>::infinity());
  V shift[kVectors], sum[kVectors];
  for (size_t g = 0; g < kVectors; ++g) {
    shift[g] = hn::Load(d, s.row_max + g * lanes);
    if (!hn::AllFalse(d, hn::Eq(shift[g], minus_infinity))) return LazyOutcome::kIntact;
    sum[g] = hn::Zero(d);
  }
  for (size_t j = 0; j < bc; ++j) {
    for (size_t g = 0; g < kVectors; ++g) {
      float* score = s.scores + j * br + g * lanes;
      const V p = ProbabilityExp2(d, hn::Sub(hn::Load(d, score), shift[g]));
      hn::Store(p, d, score);
      sum[g] = hn::Add(sum[g], p);
    }
  }
  bool raised = false;
  hn::Mask<D> past_margin[kVectors];
  for (size_t g = 0; g < kVectors; ++g) {
    // A P above 2^kLazyRescaleLimit (an overflow included) makes its sum larger still.
    if (!hn::AllFalse(d, hn::Gt(sum[g], hn::Set(d, std::exp2(kLazyRescaleLimit)))))
      return LazyOutcome::kRecompute;
    past_margin[g] = RoseAboveMargin(d, sum[g]);
    raised = raised || !hn::AllFalse(d, past_margin[g]);
  }
  if (!raised) {
    for (size_t g = 0; g < kVectors; ++g) {
      float* row_sum = s.row_sum + g * lanes;
      hn::Store(hn::Add(hn::Load(d, row_sum), sum[g]), d, row_sum);
    }
    return LazyOutcome::kKept;
  }
  // Rows past the margin: their largest P, 2^(tile max − old max), gives the rise's integer part,
  // its exponent e ≥ 2 (Bc ≤ 64 terms sum above 2⁸); the maximum rises by e, and the rescaled P
  // stay below 2. The other rows keep theirs (factor 2⁰ = 1 exactly; their e is not used).
  V largest[kVectors];
  for (size_t g = 0; g < kVectors; ++g) largest[g] = hn::Zero(d);
  for (size_t j = 0; j < bc; ++j) {
    for (size_t g = 0; g < kVectors; ++g)
      largest[g] = hn::Max(largest[g], hn::Load(d, s.scores + j * br + g * lanes));
  }
  V factor[kVectors];
  for (size_t g = 0; g < kVectors; ++g) {
    const V row_max =
        hn::IfThenElse(past_margin[g], hn::Add(shift[g], BinaryExponent(d, largest[g])), shift[g]);
    factor[g] = SoftmaxExp2(d, hn::Sub(shift[g], row_max));
    hn::Store(row_max, d, s.row_max + g * lanes);
    hn::Store(factor[g], d, s.row_rescale + g * lanes);
    sum[g] = hn::Zero(d);
  }
  for (size_t j = 0; j < bc; ++j) {
    for (size_t g = 0; g < kVectors; ++g) {
      float* probability = s.scores + j * br + g * lanes;
      const V p = hn::Mul(hn::Load(d, probability), factor[g]);
      hn::Store(p, d, probability);
      sum[g] = hn::Add(sum[g], p);
    }
  }
  AddToRowSums<kVectors>(d, sum, s);
  return LazyOutcome::kRaised;
}

// LazySoftmaxStep over the `vectors` (1 to kQueryVectors) query vectors that hold a query (a
// switch, as OnlineSoftmaxStepOver).
template <class D>
HWY_INLINE LazyOutcome LazySoftmaxStepOver(D d, size_t vectors, size_t bc, size_t br, Scratch& s) {
  switch (vectors) {
    case 1:
      return LazySoftmaxStep<1>(d, bc, br, s);
    case 2:
      return LazySoftmaxStep<2>(d, bc, br, s);
    case 3:
      return LazySoftmaxStep<3>(d, bc, br, s);
    default:
      return LazySoftmaxStep<flash_detail::kQueryVectors>(d, bc, br, s);
  }
}

// Dropout after the sum: the normaliser counts every weight, the product only the kept ones; over
// the lanes [0, width) of each key's row (br apart).
template <class D, class Applier>
HWY_INLINE void DropWeights(D d, const Applier& applier, int64_t key0, size_t bc, size_t br,
                            size_t width, Scratch& s) {
  const hn::RebindToUnsigned<D> du;
  const size_t lanes = hn::Lanes(d);
  for (size_t j = 0; j < bc; ++j) {
    const auto key = static_cast<uint32_t>(key0 + static_cast<int64_t>(j));
    for (size_t r = 0; r < width; r += lanes) {
      float* p = s.scores + j * br + r;
      hn::Store(applier.Apply(d, hn::Load(du, s.row_keys + r), key, hn::Load(d, p)), d, p);
    }
  }
}

// A row's normalisation with its head's sink (score `sink` in the pass's unit) joined: the factor
// that takes O (the row's scores' exponentials relative to `row_max`, summing to `row_sum` > 0) to
// the output, in double, and the log-sum-exp of the scores and the sink in base e. The sink's
// share is taken from the log-sum-exp of the scores alone, a = max + log sum, so that a sink far
// above them gives a tiny factor, not exponentials under float's range: the scores keep
// 1 / (1 + u^(sink − a)) of the weight (u = 2 or e), written from the smaller side.
struct SinkJoined {
  double factor;
  float log_sum_exp;
};
inline SinkJoined JoinSink(bool base_two, float row_max, float row_sum, float sink) {
  const auto power = [base_two](double x) { return base_two ? std::exp2(x) : std::exp(x); };
  const double scores =
      static_cast<double>(row_max) +
      (base_two ? std::log2(static_cast<double>(row_sum)) : std::log(static_cast<double>(row_sum)));
  const double above = static_cast<double>(sink) - scores;  // NaN stays NaN below
  const double share =
      above > 0.0 ? power(-above) / (1.0 + power(-above)) : 1.0 / (1.0 + power(above));
  const double top = std::max(scores, static_cast<double>(sink));
  const double joined =
      (std::isnan(above) ? above : top) +
      (base_two ? std::log2(1.0 + power(-std::abs(above))) : std::log1p(power(-std::abs(above))));
  return {share / static_cast<double>(row_sum),
          static_cast<float>(base_two ? std::numbers::ln2 * joined : joined)};
}

// A half pass's output row `query` of `tile` from its dv floats: rounded into out16, and its
// residual into residual16 where asked for.
void StoreHalfRow(const ForwardArgs& args, const QueryTile& tile, int64_t query,
                  const float* widened) {
  const size_t dv = static_cast<size_t>(args.v.cols);
  uint16_t* rounded = args.out16.matrix(tile.batch, tile.head) + query * args.out16.row_stride;
  NarrowRow(hn::ScalableTag<float>(), args.half_type, widened, dv, rounded);
  if (args.residual16.data != nullptr) {
    StoreResidualRow(
        hn::ScalableTag<float>(), args.half_type, widened, rounded, dv,
        args.residual16.matrix(tile.batch, tile.head) + query * args.residual16.row_stride);
  }
}

// O / sum into `out` (a row that saw no key has sum 0 and gets a zero output), the head's sink
// joining the denominator (JoinSink), and each row's log-sum-exp.
void WriteOutputRows(const ForwardArgs& args, const QueryTile& tile, size_t dv_padded,
                     const Scratch& s) {
  const size_t dv = static_cast<size_t>(args.v.cols);
  const bool sink = args.options.sinks != nullptr;
  const float sink_score = sink ? args.options.sinks[tile.head] * args.score_unit() : 0.0F;
  float* lse = args.log_sum_exp == nullptr
                   ? nullptr
                   : args.log_sum_exp + (tile.batch * args.q.heads + tile.head) * args.q.rows +
                         tile.first_query;
  for (size_t r = 0; r < tile.rows; ++r) {
    const float sum = s.row_sum[r];
    const float* row = s.output + r * dv_padded;
    const int64_t query = tile.first_query + static_cast<int64_t>(r);
    float inverse = 0.0F;
    // A sink up to 2^40 (e^40) times the row's largest exponential joins in float, as a term of
    // the sum (the double JoinSink cost 7–15% of a call of 128 queries and keys, 8 heads of 64).
    const float sink_above = sink_score - s.row_max[r];
    if (sink && sum > 0.0F && !(sink_above <= 40.0F)) {
      const SinkJoined joined = JoinSink(args.base_two, s.row_max[r], sum, sink_score);
      if (lse != nullptr) lse[r] = joined.log_sum_exp;
      inverse = static_cast<float>(joined.factor);
      if (!(joined.factor >= std::numeric_limits<float>::min())) {
        // Outputs near or under float's normal range (or NaN): each element's product in double,
        // rounded once, as float's subnormals hold them.
        float* destination =
            args.half ? s.widened_row
                      : args.out.matrix(tile.batch, tile.head) + query * args.out.row_stride;
        for (size_t t = 0; t < dv; ++t)
          destination[t] = static_cast<float>(static_cast<double>(row[t]) * joined.factor);
        if (args.half) StoreHalfRow(args, tile, query, s.widened_row);
        continue;
      }
    } else {
      const float total = sink && sum > 0.0F
                              ? sum + (args.base_two ? std::exp2(sink_above) : std::exp(sink_above))
                              : sum;
      inverse = total > 0.0F ? 1.0F / total : 0.0F;
      // In base 2: log2 of the total, then base e, ln 2 · (max + log2 total). A row that saw no
      // key: the sink's score alone, or −∞.
      if (lse != nullptr) {
        lse[r] = total <= 0.0F   ? (sink ? args.options.sinks[tile.head]
                                         : -std::numeric_limits<float>::infinity())
                 : args.base_two ? std::numbers::ln2_v<float> * (s.row_max[r] + std::log2(total))
                                 : s.row_max[r] + std::log(total);
      }
    }
    if (args.half) {
      const hn::ScalableTag<float> d;
      for (size_t t = 0; t < dv; t += hn::Lanes(d))
        hn::Store(hn::Mul(hn::Load(d, row + t), hn::Set(d, inverse)), d, s.widened_row + t);
      StoreHalfRow(args, tile, query, s.widened_row);
    } else {
      float* destination = args.out.matrix(tile.batch, tile.head) + query * args.out.row_stride;
      if (args.stream_output) {
        const hn::ScalableTag<float> d;
        for (size_t t = 0; t < dv; t += hn::Lanes(d))
          hn::Stream(hn::Mul(hn::Load(d, row + t), hn::Set(d, inverse)), d, destination + t);
      } else {
        for (size_t t = 0; t < dv; ++t) destination[t] = row[t] * inverse;
      }
    }
  }
}

// Of a tile's `vectors` query vectors of `lanes`, those holding one of lanes [lane_begin,
// lane_end): [first, end).
inline std::pair<size_t, size_t> VectorsOfLanes(size_t lane_begin, size_t lane_end, size_t lanes,
                                                size_t vectors) {
  return {lane_begin / lanes, std::min(vectors, (lane_end + lanes - 1) / lanes)};
}

// Sᵀ = K Qᵀ of a key tile that key ranges cross: each band of kVisibleBand keys multiplies only
// the query vectors from the first to the last that hold a query seeing one of its keys. Scores
// left out are of keys outside their lane's [first, last), which ApplyScoreModifiers then sets to
// −∞ whatever they held; the others are the whole product's, bit for bit. (The causal diagonal's
// tile: 28% of its score products skipped at AVX-512's 24-key bands.)
template <class D>
HWY_INLINE void ScoresOfVisibleLanes(D d, const QueryTile& tile, int64_t key0, size_t bc,
                                     size_t vectors, const float* key_rows, size_t key_stride,
                                     const float* q_transposed, size_t br, size_t depth,
                                     float* scores) {
  const size_t lanes = hn::Lanes(d);
  for_each_key_band(tile.first, tile.last, tile.rows, key0, bc, kVisibleBand,
                    [&](size_t j0, size_t keys, size_t lane_begin, size_t lane_end) {
                      const auto [low, high] = VectorsOfLanes(lane_begin, lane_end, lanes, vectors);
                      Gemm<false>(d, keys, high - low, key_rows + j0 * key_stride, key_stride, 1,
                                  q_transposed + low * lanes, br, depth,
                                  scores + j0 * br + low * lanes, br);
                    });
}

// O = O · rescale + P V for a key tile that key ranges cross: each band of kVisibleBand queries
// sums over the keys from the first to the last one of them sees. The keys left out have P = 0
// exactly in every row of the band (exp of −∞), so each output is the whole product's sum less
// terms of zero.
template <class D>
HWY_INLINE void ValuesOfVisibleKeys(D d, const QueryTile& tile, int64_t key0, size_t bc,
                                    const float* value_rows, size_t value_stride, size_t dv_padded,
                                    size_t br, const float* rescale, Scratch& s) {
  const size_t lanes = hn::Lanes(d);
  for_each_query_band(
      tile.first, tile.last, tile.rows, key0, bc, kVisibleBand,
      [&](size_t r0, size_t rows, KeyRange seen) {
        // A band that sees none of these keys still takes its rescale (depth 0). `rescale`: the
        // tile's factors, or null where every one is 1.
        const size_t j0 = seen.begin < seen.end ? static_cast<size_t>(seen.begin - key0) : 0;
        const size_t keys = seen.begin < seen.end ? static_cast<size_t>(seen.end - seen.begin) : 0;
        Gemm<true>(d, rows, dv_padded / lanes, s.scores + j0 * br + r0, 1, br,
                   value_rows + j0 * value_stride, value_stride, keys, s.output + r0 * dv_padded,
                   dv_padded, rescale != nullptr ? rescale + r0 : nullptr);
      });
}

// A key tile's masked scores: Sᵀ = K Qᵀ (K's elements broadcast, Qᵀ's rows vectors over the
// queries; only what each band of rows sees where key ranges cross the tile) or additive scores,
// then the score modifiers and masks (`partly_masked`: the mask hides some of the tile).
template <class D>
HWY_INLINE void KeyTileScores(D d, const ForwardArgs& args, const QueryTile& tile, int64_t key0,
                              size_t bc, size_t vectors, bool crossed, bool partly_masked,
                              const KeyValueRows& rows, Scratch& s) {
  const size_t lanes = hn::Lanes(d);
  const size_t br = flash_detail::kQueryVectors * lanes;
  const size_t depth = static_cast<size_t>(args.q.cols);
  const float* key_rows = rows.keys.row(static_cast<size_t>(key0));
  if (exponential(args.additive_form)) {
    AdditiveScoresOfQueries<flash_detail::kQueryVectors, true>(
        d, tile.rows, bc, key_rows, rows.keys.stride, s.q_transposed, br, depth,
        args.additive_weights, s.scores, terms_per_reciprocal(args.additive_form));
  } else if (args.additive_weights != nullptr) {
    AdditiveScoresOfQueries<flash_detail::kQueryVectors, false>(
        d, tile.rows, bc, key_rows, rows.keys.stride, s.q_transposed, br, depth,
        args.additive_weights, s.scores, 1);
  } else if (crossed) {
    ScoresOfVisibleLanes(d, tile, key0, bc, vectors, key_rows, rows.keys.stride, s.q_transposed, br,
                         depth, s.scores);
  } else {
    Gemm<false>(d, bc, vectors, key_rows, rows.keys.stride, 1, s.q_transposed, br, depth, s.scores,
                br);
  }
  ApplyScoreModifiers(d, args.options, tile, key0, bc, br, vectors * lanes, partly_masked, s.scores,
                      nullptr, args.score_unit());
}

// One key tile's step for the query tile whose buffers `s` points at: Sᵀ = K Qᵀ (or additive
// scores), the score modifiers and masks, the online softmax step, dropout, O = O·rescale + P V.
template <class D, class Applier>
HWY_INLINE void ForwardKeyTile(D d, const ForwardArgs& args, const QueryTile& tile, int64_t key0,
                               const KeyValueRows& rows, size_t dv_padded,
                               const Applier& dropout_applier, Scratch& s) {
  const size_t lanes = hn::Lanes(d);
  const size_t br = flash_detail::kQueryVectors * lanes;
  const size_t bc = static_cast<size_t>(
      std::min<int64_t>(static_cast<int64_t>(flash_detail::kKeyTile), tile.ranges.end - key0));
  const MaskCoverage coverage = mask_coverage(args.options.mask, tile.batch, tile.head,
                                              tile.first_query, tile.rows, key0, bc);
  if (coverage == MaskCoverage::kNone) return;  // the mask hides this whole tile
  // The steps below compute the query vectors that hold a query (a tile of n < Br queries, or the
  // last of a ragged n): the lanes past them are never read (P V reads the tile's rows only).
  const size_t vectors = VectorsHolding(d, tile.rows, flash_detail::kQueryVectors);
  // The causal diagonal, a window's edge or a valid length crosses this key tile: its products
  // take only what each band of rows sees.
  const bool crossed = crosses_key_ranges(tile.ranges, key0, key0 + static_cast<int64_t>(bc));
  const bool partly_masked = coverage == MaskCoverage::kSome;
  KeyTileScores(d, args, tile, key0, bc, vectors, crossed, partly_masked, rows, s);
  // The online softmax step: in base 2 the lazy one where it can (kKept leaves O unscaled), else
  // (or after it, where it gave way) the full one.
  const LazyOutcome lazy = args.base_two && kLazyFloatSoftmax
                               ? LazySoftmaxStepOver(d, vectors, bc, br, s)
                               : LazyOutcome::kIntact;
  if (lazy == LazyOutcome::kRecompute)
    KeyTileScores(d, args, tile, key0, bc, vectors, crossed, partly_masked, rows, s);
  // O's rescale is left out where no running maximum moved: after the first key tiles, most tiles
  // where the maxima are integers (kIntegerMaxima).
  bool maxima_kept = lazy == LazyOutcome::kKept;
  if (lazy == LazyOutcome::kIntact || lazy == LazyOutcome::kRecompute) {
    maxima_kept = args.base_two ? OnlineSoftmaxStepOver<true>(d, vectors, bc, br, s)
                                : OnlineSoftmaxStepOver(d, vectors, bc, br, s);
  }
  const float* rescale = maxima_kept ? nullptr : s.row_rescale;
  if (args.options.dropout > 0.0F)
    DropWeights(d, dropout_applier, key0, bc, br, vectors * lanes, s);
  // O = O · rescale + P V.
  const float* value_rows = rows.values.row(static_cast<size_t>(key0));
  if (crossed) {
    ValuesOfVisibleKeys(d, tile, key0, bc, value_rows, rows.values.stride, dv_padded, br, rescale,
                        s);
  } else {
    Gemm<true>(d, tile.rows, dv_padded / lanes, s.scores, 1, br, value_rows, rows.values.stride, bc,
               s.output, dv_padded, rescale);
  }
}

// Whether a sliding window's tasks (a window, or a mask of intervals that may hold one) request
// their next task's key and value rows (AddNextWindowRows): where the call's inputs and output
// outgrow half the L3, so that those rows
// come from memory. Smaller calls find them in cache, and the requests only cost: 5–9% of a
// 256-key window at n = 128–384 (B = 4, 8 heads of 64, Zen 5), against 5–11% saved at 512–4096.
inline bool PrefetchesNextWindow(const ForwardArgs& args) {
  // A window's bounds, or key ranges (a mask of intervals: transformers' sliding windows).
  if (args.options.window_left < 0 && args.options.key_ranges == nullptr) return false;
  const double element = args.half ? 2.0 : 4.0;
  const auto rows_of = [](const ConstHeadsView& view) {
    return static_cast<double>(view.batch * view.heads * view.rows * view.cols);
  };
  const double bytes =
      element *
      (rows_of(args.q) + rows_of(args.k) + rows_of(args.v) +
       static_cast<double>(args.out.batch * args.out.heads * args.out.rows * args.out.cols));
  return bytes > 0.5 * static_cast<double>(l3_cache_bytes());
}

// `count` (≤ kMaxQueryBlock) consecutive query tiles of query head (b, h), from `first_query`:
// for each key tile some row sees, ForwardKeyTile. Tiles whose keys start at the same key (full
// attention, lengths, causal masks) take each key tile in turn while it is in L1/L2, each until
// its own last key, so K and V stream from L3 or memory once per block instead of once per tile;
// each tile meets the same key tiles in the same order as alone, so the block changes no bit of
// the result. Other tiles (sliding windows) run one after another.
void FlashForwardTiles(const ForwardArgs& args, int64_t b, int64_t h, int64_t first_query,
                       size_t count, bool rows_in_place, SpreadPrefetch& prefetch, Scratch& s) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  const size_t br = flash_detail::kQueryVectors * lanes;
  const size_t dv_padded = hwy::RoundUpTo(static_cast<size_t>(args.v.cols), lanes);
  const DropoutApplier<decltype(d)> dropout_applier(d, args.options.dropout);
  const auto key_step = static_cast<int64_t>(flash_detail::kKeyTile);
  // Grouped-query attention: this query head reads key/value head h / group.
  const int64_t kv_head = h / (args.q.heads / args.k.heads);
  QueryTile tiles[flash_detail::kMaxQueryBlock];
  bool same_begin = true;
  int64_t keys_end = 0;
  for (size_t t = 0; t < count; ++t) {
    s.UseSlot(t);
    tiles[t] = PrepareQueryTile(args, b, h, first_query + static_cast<int64_t>(t * br), br, s);
    std::fill(s.output, s.output + tiles[t].rows * dv_padded, 0.0F);  // the rows P V writes
    same_begin = same_begin && tiles[t].ranges.begin == tiles[0].ranges.begin;
    keys_end = std::max(keys_end, tiles[t].ranges.end);
  }
  // The lines `prefetch` holds, requested evenly over the key tiles' steps below.
  int64_t steps = 0;
  for (size_t t = 0; t < count; ++t) {
    steps += (std::max<int64_t>(tiles[t].ranges.end - tiles[t].ranges.begin, 0) + key_step - 1) /
             key_step;
  }
  const int64_t lines_per_step = prefetch.lines_per_step(steps);
  // Tiles [first, last), whose keys start at tiles[first]'s first key, up to `end`.
  const auto run_tiles = [&](size_t first, size_t last, int64_t end) {
    const int64_t begin = tiles[first].ranges.begin;
    const KeyValueRows rows =
        KeysAndValuesFor(args, b, kv_head, begin, end, dv_padded, rows_in_place, s);
    for (int64_t key0 = begin; key0 < end; key0 += key_step) {
      for (size_t t = first; t < last; ++t) {
        if (key0 >= tiles[t].ranges.end) continue;  // past this tile's last key
        s.UseSlot(t);
        ForwardKeyTile(d, args, tiles[t], key0, rows, dv_padded, dropout_applier, s);
        prefetch.request(lines_per_step);
      }
    }
  };
  if (same_begin) {
    run_tiles(0, count, keys_end);
  } else {
    for (size_t t = 0; t < count; ++t) run_tiles(t, t + 1, tiles[t].ranges.end);
  }
  for (size_t t = 0; t < count; ++t) {
    s.UseSlot(t);
    WriteOutputRows(args, tiles[t], dv_padded, s);
  }
  s.UseSlot(0);
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// The bf16 dot-product path (tile_gemm_bf16-inl.h): AVX-512 with AVX512-BF16, checked at run time.
constexpr bool kBFloat16Path = true;

// The magnitudes of bf16 key and value rows [first, first + count) that a packing step read
// (those before m), from its head's rows k and v.
HWY_INLINE void AddPairRows(const ForwardArgs& args, const uint16_t* k, const uint16_t* v,
                            int64_t first, int64_t count, Scratch& s) {
  const int64_t end = std::min(first + count, args.k.rows);
  for (int64_t row = first; row < end; ++row) {
    s.read_key.AddBFloat16(k + row * args.k16.row_stride, static_cast<size_t>(args.k.cols));
    s.read_value.AddBFloat16(v + row * args.v16.row_stride, static_cast<size_t>(args.v.cols));
  }
}

// Rows [begin, end) of key/value head (b, h), begin even, as bf16 pairs in s.key_pairs (d/2 per
// key row, an odd d's last pair padded with 0) and s.value_pairs (rows 2p and 2p + 1 of a column
// in pair p; a key past m reads as 0). The packed range grows as PackKeysAndValues's does.
ATTN_BF16_TARGET void PackKeyValuePairs(const ForwardArgs& args, int64_t b, int64_t h,
                                        int64_t begin, int64_t end, size_t dv_padded, Scratch& s) {
  const int64_t head = b * args.k.heads + h;
  s.ContinuePacking(head, begin);
  const auto depth = static_cast<size_t>(args.k.cols), dv = static_cast<size_t>(args.v.cols);
  const size_t depth_pairs = s.pair_depth;
  const uint16_t* k = args.k16.matrix(b, h);
  const uint16_t* v = args.v16.matrix(b, h);
  const int64_t keys = args.k.rows;
  // Two adjacent bf16 of a key row already are its pair in memory (little-endian): a copy. Two
  // value rows interleave (InterleaveRowPairs).
  for (int64_t j = s.packed_end; j < end; j += 2) {
    for (int64_t row = j; row < j + 2; ++row) {
      uint32_t* pairs = s.key_pairs + static_cast<size_t>(row) * depth_pairs;
      if (depth_pairs == 0) continue;  // (depth 0, PyTorch's E = 0: no storage to copy)
      pairs[depth_pairs - 1] = 0U;     // an odd depth's padding
      if (row < keys) std::memcpy(pairs, k + row * args.k16.row_stride, depth * sizeof(uint16_t));
    }
    const uint16_t* first = v + j * args.v16.row_stride;
    InterleaveRowPairs(first, j + 1 < keys ? first + args.v16.row_stride : nullptr, dv, dv_padded,
                       s.value_pairs + static_cast<size_t>(j / 2) * dv_padded);
    if (args.read_magnitude_bits != nullptr) AddPairRows(args, k, v, j, 2, s);
  }
  s.packed_end = std::max(s.packed_end, end + end % 2);  // whole pairs
}

// PackKeyValuePairs for the AMX tiles: rows [begin, end) of key/value head (b, h) in whole blocks
// of 32 keys (zeros past m), keys as there (s.key_pairs) and values as Vᵀ's blocks
// (s.values_transposed): 16 pairs of value rows interleaved into s.value_pairs, then turned in
// 16 × 16 blocks of pairs.
ATTN_AMX_TARGET void PackKeyValueBlocks(const ForwardArgs& args, int64_t b, int64_t h,
                                        int64_t begin, int64_t end, bool keys_in_place,
                                        Scratch& s) {
  constexpr int64_t kBlock = 32;
  begin -= begin % kBlock;
  const int64_t head = b * args.k.heads + h;
  s.ContinuePacking(head, begin);
  const auto depth = static_cast<size_t>(args.k.cols), dv = static_cast<size_t>(args.v.cols);
  const size_t pair_depth = s.pair_depth, dv_tiles = s.dv_tiles;
  const uint16_t* k = args.k16.matrix(b, h);
  const uint16_t* v = args.v16.matrix(b, h);
  const int64_t keys = args.k.rows;
  for (int64_t j = s.packed_end; j < end; j += kBlock) {
    // Whole blocks of real keys read in place (FlashForwardTileBF16's keys_in_place) need no copy.
    const bool copy_keys = !keys_in_place || j + kBlock > keys;
    for (int64_t row = j; copy_keys && row < j + kBlock; ++row) {
      uint32_t* pairs = s.key_pairs + static_cast<size_t>(row) * pair_depth;
      if (row < keys) {
        CopyRowAsPairs(k + row * args.k16.row_stride, depth, pair_depth, pairs);
      } else {
        std::fill_n(pairs, pair_depth, 0U);
      }
    }
    for (int64_t pair = 0; pair < kBlock / 2; ++pair) {
      const int64_t row = j + 2 * pair;
      uint32_t* staged = s.value_pairs + static_cast<size_t>(pair) * dv_tiles;
      if (row < keys) {
        const uint16_t* first = v + row * args.v16.row_stride;
        InterleaveRowPairs(first, row + 1 < keys ? first + args.v16.row_stride : nullptr, dv,
                           dv_tiles, staged);
      } else {
        std::fill_n(staged, dv_tiles, 0U);
      }
    }
    uint32_t* block = s.values_transposed + static_cast<size_t>(j / kBlock) * s.value_block_words;
    for (size_t column = 0; column < dv_tiles; column += 16)
      TransposeWords16(s.value_pairs + column, dv_tiles, block + column * 16, 16);
    if (args.read_magnitude_bits != nullptr) AddPairRows(args, k, v, j, kBlock, s);
  }
  s.packed_end = std::max(s.packed_end, (end + kBlock - 1) / kBlock * kBlock);
}

// PackKeyValueBlocks for the fp32 forward on AMX tiles: rows [begin, end) of key/value head (b, h)
// (fp32, or fp16 widened) split into their three bf16 parts (SplitThreeBF16), each part packed as
// PackKeyValueBlocks packs bf16 rows, in its own third of s.key_pairs, s.value_pairs and
// s.values_transposed.
ATTN_AMX_TARGET void PackSplitKeyValueBlocks(const ForwardArgs& args, int64_t b, int64_t h,
                                             int64_t begin, int64_t end, Scratch& s) {
  constexpr int64_t kBlock = 32;
  begin -= begin % kBlock;
  s.ContinuePacking(b * args.k.heads + h, begin);
  const auto depth = static_cast<size_t>(args.k.cols), dv = static_cast<size_t>(args.v.cols);
  const size_t pair_depth = s.pair_depth, dv_tiles = s.dv_tiles;
  const int64_t keys = args.k.rows;
  // A value row's three parts in s.split_rows: part p of the pair's first row at p · 2·dv_tiles,
  // of its second dv_tiles after.
  uint16_t* value_parts = s.split_rows;
  // Rows requested this far ahead, K's and V's alike, as PackKeyValues requests its rows: the
  // caller's rows (a row per H·d floats in the layers' layout) stream from memory, and without the
  // requests the loads of the rows waited for each miss (9.6% of the fp32 forward on tiles at
  // n = 1024, against the products' 53%, on a Sapphire Rapids-class core).
  constexpr int64_t kPrefetchRows = 16;
  for (int64_t j = s.packed_end; j < end; j += kBlock) {
    for (int64_t row = j; row < j + kBlock; ++row) {
      if (row + kPrefetchRows < keys) {
        PrefetchMatrixRow(args.half, args.k, args.k16, b, h, row + kPrefetchRows);
        PrefetchMatrixRow(args.half, args.v, args.v16, b, h, row + kPrefetchRows);
      }
      auto* pairs =
          reinterpret_cast<uint16_t*>(s.key_pairs + static_cast<size_t>(row) * pair_depth);
      const size_t part_halves = 2 * s.key_part_words;
      if (row < keys) {
        SplitRowBF16x3(FloatRow(args, args.k, args.k16, b, h, row, s.widened_row, s.read_key),
                       depth, 2 * pair_depth, 1.0F, pairs, pairs + part_halves,
                       pairs + 2 * part_halves);
      } else {
        for (size_t part = 0; part < 3; ++part)
          std::fill_n(pairs + part * part_halves, 2 * pair_depth, uint16_t{0});
      }
    }
    for (int64_t pair = 0; pair < kBlock / 2; ++pair) {
      const int64_t row = j + 2 * pair;
      for (int64_t second = 0; second < 2 && row < keys; ++second) {
        uint16_t* out = value_parts + static_cast<size_t>(second) * dv_tiles;
        if (row + second < keys) {
          SplitRowBF16x3(
              FloatRow(args, args.v, args.v16, b, h, row + second, s.widened_row, s.read_value), dv,
              dv, 1.0F, out, out + 2 * dv_tiles, out + 4 * dv_tiles);
        }
      }
      for (size_t part = 0; part < 3; ++part) {
        uint32_t* staged =
            s.value_pairs + part * s.value_pair_part_words + static_cast<size_t>(pair) * dv_tiles;
        if (row < keys) {
          const uint16_t* first = value_parts + part * 2 * dv_tiles;
          InterleaveRowPairs(first, row + 1 < keys ? first + dv_tiles : nullptr, dv, dv_tiles,
                             staged);
        } else {
          std::fill_n(staged, dv_tiles, 0U);
        }
      }
    }
    for (size_t part = 0; part < 3; ++part) {
      uint32_t* block = s.values_transposed + part * s.value_part_words +
                        static_cast<size_t>(j / kBlock) * s.value_block_words;
      const uint32_t* staged = s.value_pairs + part * s.value_pair_part_words;
      for (size_t column = 0; column < dv_tiles; column += 16)
        TransposeWords16(staged + column, dv_tiles, block + column * 16, 16);
    }
  }
  s.packed_end = std::max(s.packed_end, (end + kBlock - 1) / kBlock * kBlock);
}

using FloatVector = hn::Vec<hn::ScalableTag<float>>;

// P = 2^y for the pairs: in one part the bf16 path's (RoundedProbabilityExp2, rounded to bf16
// next), in more fp32's (ProbabilityExp2).
template <size_t kParts>
HWY_INLINE FloatVector PairProbability(FloatVector y) {
  const hn::ScalableTag<float> d;
  return kParts > 1 ? ProbabilityExp2(d, y) : RoundedProbabilityExp2(d, y);
}

// P = 2^(c·S − shift) for a key tile's Sᵀ (bc × Br; c = `scale`, 1 where Sᵀ holds scaled
// scores; the bf16 path's softmax is in base 2, ForwardArgs::base_two), two keys at a time straight
// into bf16 pairs of adjacent keys (s.probability_pairs; a key past bc is 0), never stored as
// floats; P's column sums added to `sum`. Over the first kVectors query vectors (those holding a
// query), as the steps below.
// kParts (Scratch::probability_parts) 2 or 3: P in fp32's accuracy (ProbabilityExp2), summed as it
// is, and stored as its bf16 parts' pairs (StoreProbabilityParts), each part
// s.probability_part_words after the one before.
template <size_t kVectors, size_t kParts>
ATTN_BF16_TARGET HWY_INLINE void ExponentialsToPairs(size_t bc, size_t br, FloatVector scale,
                                                     Scratch& s, const FloatVector* shift,
                                                     FloatVector* sum) {
  const hn::ScalableTag<float> d;
  const FloatVector minus_infinity = hn::Set(d, -std::numeric_limits<float>::infinity());
  for (size_t j = 0; j < bc; j += 2) {
    for (size_t g = 0; g < kVectors; ++g) {
      const FloatVector even_score = hn::Load(d, s.scores + j * br + g * 16);
      const FloatVector odd_score =
          j + 1 < bc ? hn::Load(d, s.scores + (j + 1) * br + g * 16) : minus_infinity;
      // c·S − shift in one rounding: the multiply-add costs what the subtraction did.
      const FloatVector even = PairProbability<kParts>(hn::MulSub(scale, even_score, shift[g]));
      const FloatVector odd = PairProbability<kParts>(hn::MulSub(scale, odd_score, shift[g]));
      sum[g] = hn::Add(sum[g], hn::Add(even, odd));
      StoreProbabilityParts<kParts>(even.raw, odd.raw, s.probability_pairs + j / 2 * br + g * 16,
                                    s.probability_part_words);
    }
  }
}

// The magnitude of a running maximum (c·S, base 2) from which the steps scale Sᵀ in place first
// rather than in the exponent: c·S − shift in one rounding is c·S's exact product less the rounded
// maximum, off by up to half an ulp of c·S, which below this is at most 32 (P within 2^±32 of its
// value, consistent with the row's sum) and past 2^31 beyond float's exponents: bf16 queries of
// 4e9 on AMX tiles overflowed P and the row's sum to ∞, and the output to NaN.
constexpr float kLargeShift = 0x1p30F;

// Whether any of the first kVectors shifts has a magnitude of kLargeShift or more.
template <size_t kVectors>
HWY_INLINE bool LargeShifts(const FloatVector* shift) {
  const hn::ScalableTag<float> d;
  auto large = hn::Ge(hn::Abs(shift[0]), hn::Set(d, kLargeShift));
  for (size_t g = 1; g < kVectors; ++g)
    large = hn::Or(large, hn::Ge(hn::Abs(shift[g]), hn::Set(d, kLargeShift)));
  return !hn::AllFalse(d, large);
}

// ExponentialsToPairs, with Sᵀ scaled in place first (each c·S rounded as the maxima were, so a
// row's largest gives exactly 2⁰) where a shift is large (LargeShifts) and `scale` is not 1 (with
// c = 1 the fused form is exact already). A separate pass: written as a product and a difference
// in one expression, the compiler contracts them back into the multiply-add.
template <size_t kVectors, size_t kParts>
ATTN_BF16_TARGET HWY_INLINE void ShiftedExponentialsToPairs(size_t bc, size_t br, float scale,
                                                            Scratch& s, const FloatVector* shift,
                                                            FloatVector* sum) {
  const hn::ScalableTag<float> d;
  if (scale != 1.0F && LargeShifts<kVectors>(shift)) {
    amx::ScaleInPlace(s.scores, bc * br, scale);
    ExponentialsToPairs<kVectors, kParts>(bc, br, hn::Set(d, 1.0F), s, shift, sum);
  } else {
    ExponentialsToPairs<kVectors, kParts>(bc, br, hn::Set(d, scale), s, shift, sum);
  }
}

// OnlineSoftmaxStep for the bf16 path without dropout, P into bf16 pairs (ExponentialsToPairs), on
// Sᵀ scaled by `scale` > 0 here (1: already scaled).
template <size_t kVectors, size_t kParts>
ATTN_BF16_TARGET HWY_INLINE void OnlineSoftmaxStepToPairs(size_t bc, size_t br, float scale,
                                                          Scratch& s) {
  const hn::ScalableTag<float> d;
  FloatVector shift[kVectors], sum[kVectors];
  OnlineSoftmaxMax<kVectors, true>(d, bc, br, s, shift, scale);
  for (size_t g = 0; g < kVectors; ++g) sum[g] = hn::Zero(d);
  ShiftedExponentialsToPairs<kVectors, kParts>(bc, br, scale, s, shift, sum);
  AddToRowSums<kVectors>(d, sum, s);
}

// The bf16 path's step once every row has a finite running maximum: P = 2^(S − max) with the
// maximum kept (every rescale factor 1: the caller skips O's rescale, and s.row_rescale is not
// written), with no pass over Sᵀ for the tile's maximum (OnlineSoftmaxMax). Returns false, leaving
// nothing that the full step would not overwrite, when a row has no finite maximum yet or its
// scores rose above it by more than kLazyMaxMargin (RoseAboveMargin, read from its sum); the
// scores are intact then, and the caller takes the full step.
template <size_t kVectors, size_t kParts>
ATTN_BF16_TARGET HWY_INLINE bool LazySoftmaxStepToPairs(size_t bc, size_t br, float scale,
                                                        Scratch& s) {
  const hn::ScalableTag<float> d;
  const FloatVector minus_infinity = hn::Set(d, -std::numeric_limits<float>::infinity());
  FloatVector shift[kVectors], sum[kVectors];
  for (size_t g = 0; g < kVectors; ++g) {
    shift[g] = hn::Load(d, s.row_max + g * 16);
    if (!hn::AllFalse(d, hn::Eq(shift[g], minus_infinity))) return false;
    sum[g] = hn::Zero(d);
  }
  // Large shifts: the full step, which scales Sᵀ in place (ShiftedExponentialsToPairs); this step
  // must leave Sᵀ as it is when it gives way.
  if (scale != 1.0F && LargeShifts<kVectors>(shift)) return false;
  ExponentialsToPairs<kVectors, kParts>(bc, br, hn::Set(d, scale), s, shift, sum);
  for (size_t g = 0; g < kVectors; ++g) {
    if (!hn::AllFalse(d, RoseAboveMargin(d, sum[g]))) return false;
  }
  for (size_t g = 0; g < kVectors; ++g)
    hn::Store(hn::Add(hn::Load(d, s.row_sum + g * 16), sum[g]), d, s.row_sum + g * 16);
  return true;
}

// The bf16 path's step without dropout over the first kVectors query vectors: the lazy step, or
// the full one where it gives way. Returns whether O needs its rescale (false: every factor is 1).
template <size_t kVectors, size_t kParts>
ATTN_BF16_TARGET HWY_INLINE bool SoftmaxStepToPairs(size_t bc, size_t br, float scale, Scratch& s) {
  if (LazySoftmaxStepToPairs<kVectors, kParts>(bc, br, scale, s)) return false;
  OnlineSoftmaxStepToPairs<kVectors, kParts>(bc, br, scale, s);
  return true;
}

// SoftmaxStepToPairs over the `vectors` (1 to kQueryVectors) query vectors that hold a query. A
// switch: a lambda (WithStaticCount) does not take this function's target attributes in Clang,
// which then refuses to inline the steps into it.
template <size_t kParts>
ATTN_BF16_TARGET HWY_INLINE bool SoftmaxStepToPairsOver(size_t vectors, size_t bc, size_t br,
                                                        float scale, Scratch& s) {
  switch (vectors) {
    case 1:
      return SoftmaxStepToPairs<1, kParts>(bc, br, scale, s);
    case 2:
      return SoftmaxStepToPairs<2, kParts>(bc, br, scale, s);
    case 3:
      return SoftmaxStepToPairs<3, kParts>(bc, br, scale, s);
    default:
      return SoftmaxStepToPairs<flash_detail::kQueryVectors, kParts>(bc, br, scale, s);
  }
}

// The vdpbf16ps products of FlashForwardTileBF16 (its Tiles when AMX is not used).
struct VectorProducts {};

// Sᵀ (bc × Br) on AMX tiles, unscaled; times the scale unless `scale_in_exponent` leaves it to
// the softmax step's exponent (the vdpbf16ps path multiplies the sums as it stores them).
// The key tile at key0 reads its first `in_place` rows (whole blocks of 32) from `rows_in_place`
// (`stride` words apart), the rest from the packed pairs (s.key_pairs).
template <class Tiles>
ATTN_AMX_TARGET HWY_INLINE void ScoresOnTiles(Tiles& tiles, int64_t key0,
                                              const uint32_t* rows_in_place, size_t stride,
                                              size_t in_place, size_t depth_pairs, size_t bc,
                                              size_t br, float scale, bool scale_in_exponent,
                                              Scratch& s) {
  const size_t rows = hwy::RoundUpTo(bc, 32);
  if (s.split_parts > 1) {  // the fp32 forward: every key packed, in three parts, Q scaled
    amx::SplitProductOnTiles<false>(tiles, s.key_pairs + static_cast<size_t>(key0) * depth_pairs,
                                    depth_pairs, s.key_part_words, s.query_pairs, br,
                                    s.query_part_words, depth_pairs, s.scores, br, rows, br);
    return;  // scaled already: SplitQueryPairs scales Q's rows
  }
  if (in_place > 0) {
    amx::ScoresOnTiles(tiles, rows_in_place, depth_pairs, in_place, s.query_pairs, br, s.scores,
                       stride);
  }
  if (rows > in_place) {
    amx::ScoresOnTiles(tiles, s.key_pairs + (static_cast<size_t>(key0) + in_place) * depth_pairs,
                       depth_pairs, rows - in_place, s.query_pairs, br, s.scores + in_place * br);
  }
  if (!scale_in_exponent) amx::ScaleInPlace(s.scores, bc * br, scale);
}

// Whether the AMX path leaves Sᵀ unscaled and scales it in the softmax's exponent, c·S − max in
// one multiply-add, instead of in a pass of its own over Sᵀ (5% of the bf16 forward at n = 1024 on
// a Sapphire Rapids-class core): where the modifiers allow it and there is no dropout, whose
// softmax step works on scaled fp32 scores.
inline bool ScalesInExponent(const FlashAttentionOptions& options) {
  return ModifiersCommuteWithScale(options) && options.dropout == 0.0F;
}

// Oᵀ = Oᵀ · rescale (unless every factor is 1) + Vᵀ P on AMX tiles, for the key tile at key0
// (even: its pairs start at pair key0 / 2); Oᵀ = Vᵀ P for the tile's `first` sums, Oᵀ not read
// (nor zeroed before: a short call's 64 × 64 heads of 256 spent 4% of the pass zeroing Oᵀ and 7%
// rescaling its zeros by the first step's factors).
template <class Tiles>
ATTN_AMX_TARGET HWY_INLINE void AccumulateValuesOnTiles(Tiles& tiles, int64_t key0, size_t bc,
                                                        size_t br, bool rescale, bool first,
                                                        Scratch& s) {
  const hn::ScalableTag<float> d;
  if (rescale && !first) {
    for (size_t row = 0; row < s.dv_tiles; ++row) {
      for (size_t r = 0; r < br; r += 16) {
        float* out = s.output_transposed + row * br + r;
        hn::Store(hn::Mul(hn::Load(d, out), hn::Load(d, s.row_rescale + r)), d, out);
      }
    }
  }
  // P's pairs past the tile's last key are 0, to whole tiles of 16 pairs.
  const size_t pairs = (bc + 1) / 2, tile_pairs = hwy::RoundUpTo(pairs, amx::kPairs);
  for (size_t part = 0; part < s.probability_parts; ++part) {
    uint32_t* probabilities = s.probability_pairs + part * s.probability_part_words;
    std::fill(probabilities + pairs * br, probabilities + tile_pairs * br, 0U);
  }
  const uint32_t* value_blocks =
      s.values_transposed + static_cast<size_t>(key0 / 32) * s.value_block_words;
  if (s.split_parts > 1) {  // the fp32 forward, in three parts
    if (first) {
      amx::SplitProductOnTiles<false>(tiles, value_blocks, amx::kPairs, s.value_part_words,
                                      s.probability_pairs, br, s.probability_part_words, tile_pairs,
                                      s.output_transposed, br, s.dv_tiles, br, s.value_block_words);
    } else {
      amx::SplitProductOnTiles<true>(tiles, value_blocks, amx::kPairs, s.value_part_words,
                                     s.probability_pairs, br, s.probability_part_words, tile_pairs,
                                     s.output_transposed, br, s.dv_tiles, br, s.value_block_words);
    }
    return;
  }
  if (s.probability_parts > 1) {  // bf16: Vᵀ in one part, P in two
    const amx::SplitPartCounts values_in_one{1, s.probability_parts};
    if (first) {
      amx::SplitProductOnTiles<false>(tiles, value_blocks, amx::kPairs, 0, s.probability_pairs, br,
                                      s.probability_part_words, tile_pairs, s.output_transposed, br,
                                      s.dv_tiles, br, s.value_block_words, values_in_one);
    } else {
      amx::SplitProductOnTiles<true>(tiles, value_blocks, amx::kPairs, 0, s.probability_pairs, br,
                                     s.probability_part_words, tile_pairs, s.output_transposed, br,
                                     s.dv_tiles, br, s.value_block_words, values_in_one);
    }
    return;
  }
  if (first) {
    amx::ValuesOnTiles<false>(tiles, value_blocks, s.value_block_words, s.dv_tiles, tile_pairs,
                              s.probability_pairs, br, s.output_transposed);
  } else {
    amx::ValuesOnTiles(tiles, value_blocks, s.value_block_words, s.dv_tiles, tile_pairs,
                       s.probability_pairs, br, s.output_transposed);
  }
}

// FlashForwardTile on bf16 inputs with bf16 products: Sᵀ = K Qᵀ over pairs of dimensions, the
// score modifiers, softmax and dropout on fp32 Sᵀ as there, then O += P V with P as bf16 pairs:
// in one or two bf16 parts (Scratch::probability_parts, bfloat16_probabilities.hpp). The products
// run on vdpbf16ps (Tiles = VectorProducts) or on AMX tiles (hardware or model, amx_tiles-inl.h),
// which accumulate Oᵀ instead of O so that P's pairs, already laid out as their B operand, need no
// turning. Key tiles start at even keys (pairs never straddle two tiles; on AMX tiles, at multiples
// of 32, whole blocks of tiles): a tile that would start elsewhere starts that many keys earlier,
// which no row sees and the modifiers mask. `count` (≤ kMaxQueryBlock) consecutive query tiles from
// `first_query`, as FlashForwardTiles takes them: tiles whose first key step is the same take each
// key step in turn while its packed keys and values are in L1/L2 (the fp32 forward's three parts of
// a head's 4096 keys of 64 make 3 MiB, more than a Sapphire Rapids L2), each tile meeting the same
// steps in the same order as alone; the others one after another.
template <class Tiles>
ATTN_AMX_TARGET void FlashForwardTileBF16(const ForwardArgs& args, int64_t b, int64_t h,
                                          int64_t first_query, size_t count, size_t br,
                                          SpreadPrefetch& prefetch, Scratch& s, Tiles& tiles) {
  constexpr bool kOnTiles = !std::is_same_v<Tiles, VectorProducts>;
  const hn::ScalableTag<float> d;
  constexpr size_t kLanes = 16;
  const size_t depth_pairs = s.pair_depth;  // on AMX tiles, whole tiles' worth
  const size_t dv_padded = hwy::RoundUpTo(static_cast<size_t>(args.v.cols), kLanes);
  const int64_t alignment = kOnTiles ? 32 : 2;
  QueryTile query_tiles[flash_detail::kMaxQueryBlock];
  // Whether a tile's Oᵀ holds no sums yet (AMX tiles: AccumulateValuesOnTiles stores the first
  // ones); each tile's first key step, `alignment` keys down.
  bool output_empty[flash_detail::kMaxQueryBlock];
  int64_t tile_begin[flash_detail::kMaxQueryBlock];
  bool same_begin = true;
  for (size_t t = 0; t < count; ++t) {
    s.UseSlot(t);
    query_tiles[t] =
        PrepareQueryTile(args, b, h, first_query + static_cast<int64_t>(t * br), br, s);
    output_empty[t] = true;
    if constexpr (!kOnTiles) {
      std::fill(s.output, s.output + query_tiles[t].rows * dv_padded, 0.0F);  // the rows P V writes
    }
    tile_begin[t] = query_tiles[t].ranges.begin - query_tiles[t].ranges.begin % alignment;
    same_begin = same_begin && tile_begin[t] == tile_begin[0];
  }
  if constexpr (kOnTiles) tiles.Configure(amx::kFullTiles);
  const bool dropout = args.options.dropout > 0.0F;
  const DropoutApplier<decltype(d)> dropout_applier(d, args.options.dropout);
  const int64_t kv_head = h / (args.q.heads / args.k.heads);
  // (The fp32 forward on tiles scales Q's rows as the fp32 path's Qᵀ, so that its masks and
  // modifiers meet the same scores: split.)
  const bool split = s.split_parts > 1;
  const bool scale_in_exponent = kOnTiles && !split && ScalesInExponent(args.options);
  // Scores in base 2 (ForwardArgs::base_two, always on this path): the scale times log2 e, applied
  // by the products as they store the sums or, on AMX tiles where the modifiers allow it, by the
  // exponent's multiply-add (c of c·S − max).
  constexpr float kUnit = std::numbers::log2e_v<float>;  // the steps below exponentiate in base 2
  const float score_scale = args.options.scale * kUnit;
  const float exponent_scale = scale_in_exponent ? score_scale : 1.0F;
  const auto key_step = static_cast<int64_t>(flash_detail::kKeyTileBF16);
  // On AMX tiles, dense key rows (back to back, as PyTorch's (B, H, S, E)) of whole tiles' pairs
  // (d a multiple of 32) at 4-byte boundaries are the products' A operand as they lie: blocks of 32
  // real keys are read in place, not copied. Rows further apart stay packed: the layers' (B, S,
  // H·E) rows read in place ran the bf16 forward at 0.64× (n = 4096, 8 heads of 64), a tile's 16
  // rows 1 KiB apart.
  // (fp32 and fp16 inputs, split into three parts: never in place.)
  const uint16_t* key_rows = split ? nullptr : args.k16.matrix(b, kv_head);
  const bool keys_in_place = kOnTiles && !split && args.k.cols % 32 == 0 &&
                             args.k16.row_stride == args.k.cols &&
                             reinterpret_cast<uintptr_t>(key_rows) % 4 == 0;
  // Keys packed at a time: their K and V pairs a quarter of the L2.
  const size_t value_words = (kOnTiles ? s.dv_tiles : dv_padded) / 2;  // a key's share of V's pairs
  const auto pack_ahead = std::max<int64_t>(
      key_step, static_cast<int64_t>(l2_cache_bytes() / 4 /
                                     ((depth_pairs + value_words) * sizeof(uint32_t))));
  // The lines `prefetch` holds, requested evenly over the tiles' key steps.
  int64_t steps = 0;
  for (size_t t = 0; t < count; ++t)
    steps +=
        std::max<int64_t>((query_tiles[t].ranges.end - tile_begin[t] + key_step - 1) / key_step, 1);
  const int64_t lines_per_step = prefetch.lines_per_step(steps);
  // Tiles [group, group_end): those sharing the first key step, or each tile alone.
  for (size_t group = 0, group_end = 0; group < count; group = group_end) {
    group_end = same_begin ? count : group + 1;
    int64_t keys_end = 0;
    for (size_t t = group; t < group_end; ++t)
      keys_end = std::max(keys_end, query_tiles[t].ranges.end);
    for (int64_t key0 = tile_begin[group]; key0 < keys_end; key0 += key_step) {
      // Keys and values packed a quarter of the L2 ahead of the products (a no-op where an earlier
      // query tile of the head packed them), so that the products read them from L2: packed for
      // the tile's whole key range up front, a head's packed rows outgrew the L2 (4096 keys of 256
      // made 4 MiB) and the products read them back from the L3 (16 queries against 2 × 4096 keys
      // of 256 on AMX tiles spent 60% of the pass packing). Each step packing only its own keys
      // left the rows' reads from memory bursts between products (12% slower at d = 64).
      const int64_t step_end = std::min(keys_end, key0 + key_step);
      if (s.packed_head != b * args.k.heads + kv_head || key0 < s.packed_begin ||
          step_end > s.packed_end) {
        const int64_t pack_end = std::min(keys_end, key0 + pack_ahead);
        if constexpr (kOnTiles) {
          if (split) {
            PackSplitKeyValueBlocks(args, b, kv_head, key0, pack_end, s);
          } else {
            PackKeyValueBlocks(args, b, kv_head, key0, pack_end, keys_in_place, s);
          }
        } else {
          PackKeyValuePairs(args, b, kv_head, key0, pack_end, dv_padded, s);
        }
      }
      for (size_t t = group; t < group_end; ++t) {
        const QueryTile& tile = query_tiles[t];
        if (key0 >= tile.ranges.end) continue;  // past this tile's last key
        s.UseSlot(t);
        prefetch.request(lines_per_step);
        const size_t bc = static_cast<size_t>(std::min(key_step, tile.ranges.end - key0));
        // The query vectors the steps compute: on vdpbf16ps those holding a query (a tile of
        // n < Br queries, or a ragged n's last), whose lanes are all P·V reads; on AMX tiles,
        // whose products take whole tiles of P, all of them.
        const size_t vectors =
            kOnTiles ? br / kLanes : VectorsHolding(d, tile.rows, flash_detail::kQueryVectors);
        const size_t width = vectors * kLanes;
        const MaskCoverage coverage =
            mask_coverage(args.options.mask, b, h, tile.first_query, tile.rows, key0, bc);
        if (coverage == MaskCoverage::kNone) continue;
        const uint32_t* key_pairs = s.key_pairs + static_cast<size_t>(key0) * depth_pairs;
        const bool crossed = crosses_key_ranges(tile.ranges, key0, key0 + static_cast<int64_t>(bc));
        if constexpr (kOnTiles) {
          // Whole blocks of 32 real keys in place; a last partial block from its packed copy.
          const size_t in_place =
              keys_in_place ? std::min(hwy::RoundUpTo(bc, 32),
                                       static_cast<size_t>((args.k.rows - key0) / 32 * 32))
                            : 0;
          ScoresOnTiles(
              tiles, key0,
              split ? nullptr
                    : reinterpret_cast<const uint32_t*>(key_rows + key0 * args.k16.row_stride),
              static_cast<size_t>(args.k16.row_stride / 2), in_place, depth_pairs, bc, br,
              score_scale, scale_in_exponent, s);
        } else if (crossed) {  // as ScoresOfVisibleLanes
          for_each_key_band(
              tile.first, tile.last, tile.rows, key0, bc, kVisibleBand,
              [&](size_t j0, size_t keys, size_t lane_begin, size_t lane_end) {
                const auto [low, high] = VectorsOfLanes(lane_begin, lane_end, kLanes, vectors);
                GemmBF16<false>(keys, high - low, key_pairs + j0 * depth_pairs, depth_pairs, 1,
                                s.query_pairs + low * kLanes, br, depth_pairs,
                                s.scores + j0 * br + low * kLanes, br, nullptr, score_scale);
              });
        } else {
          GemmBF16<false>(bc, vectors, key_pairs, depth_pairs, 1, s.query_pairs, br, depth_pairs,
                          s.scores, br, nullptr, score_scale);
        }
        ApplyScoreModifiers(d, args.options, tile, key0, bc, br, width,
                            coverage == MaskCoverage::kSome, s.scores, nullptr, kUnit);
        bool rescale = true;
        if (dropout) {
          OnlineSoftmaxStepOver<true>(d, vectors, bc, br, s);
          DropWeights(d, dropout_applier, key0, bc, br, width, s);
          PackProbabilityParts(s.scores, bc, br, width, s.probability_pairs,
                               s.probability_part_words, s.probability_parts);
        } else if (s.probability_parts == 3) {
          rescale = SoftmaxStepToPairsOver<3>(vectors, bc, br, exponent_scale, s);
        } else if (s.probability_parts == 2) {
          rescale = SoftmaxStepToPairsOver<2>(vectors, bc, br, exponent_scale, s);
        } else {
          rescale = SoftmaxStepToPairsOver<1>(vectors, bc, br, exponent_scale, s);
        }
        if constexpr (kOnTiles) {
          AccumulateValuesOnTiles(tiles, key0, bc, br, rescale, output_empty[t], s);
          output_empty[t] = false;
        } else if (crossed) {
          // As ValuesOfVisibleKeys, over the pairs of keys that hold a key the band sees (key0 is
          // even: pair p holds keys key0 + 2p and key0 + 2p + 1).
          for_each_query_band(
              tile.first, tile.last, tile.rows, key0, bc, kVisibleBand,
              [&](size_t r0, size_t rows, KeyRange seen) {
                const bool any = seen.begin < seen.end;
                if (!any && !rescale) return;  // nothing to add, nothing to rescale
                const auto [p0, p1] = any ? PairsHolding(static_cast<size_t>(seen.begin - key0),
                                                         static_cast<size_t>(seen.end - key0))
                                          : std::pair<size_t, size_t>{0, 0};
                for (size_t part = 0; part < s.probability_parts; ++part) {
                  GemmBF16<true>(
                      rows, dv_padded / kLanes,
                      s.probability_pairs + part * s.probability_part_words + p0 * br + r0, 1, br,
                      s.value_pairs + (static_cast<size_t>(key0 / 2) + p0) * dv_padded, dv_padded,
                      p1 - p0, s.output + r0 * dv_padded, dv_padded,
                      rescale && part == 0 ? s.row_rescale + r0 : nullptr);
                }
              });
        } else {
          // (P in two parts: P·V once for each, the rescale with the first.)
          for (size_t part = 0; part < s.probability_parts; ++part) {
            GemmBF16<true>(tile.rows, dv_padded / kLanes,
                           s.probability_pairs + part * s.probability_part_words, 1, br,
                           s.value_pairs + static_cast<size_t>(key0 / 2) * dv_padded, dv_padded,
                           (bc + 1) / 2, s.output, dv_padded,
                           rescale && part == 0 ? s.row_rescale : nullptr);
          }
        }
      }
    }
  }
  if constexpr (kOnTiles) tiles.Release();
  for (size_t t = 0; t < count; ++t) {
    s.UseSlot(t);
    if constexpr (kOnTiles) {
      if (output_empty[t])
        std::fill(s.output_transposed, s.output_transposed + s.dv_tiles * br, 0.0F);
      for (size_t column = 0; column < dv_padded; column += 16) {
        for (size_t r = 0; r < br; r += 16) {
          TransposeWords16(reinterpret_cast<const uint32_t*>(s.output_transposed) + column * br + r,
                           br, reinterpret_cast<uint32_t*>(s.output) + r * dv_padded + column,
                           dv_padded);
        }
      }
    }
    WriteOutputRows(args, query_tiles[t], dv_padded, s);
  }
  s.UseSlot(0);
}

// Which products the bf16 forward uses: AMX tiles (hardware or model) as amx_use() says, for any
// depth (padded with zeros to whole tiles of 16 pairs: Scratch::pair_depth).
enum class TileProducts { kVector, kAmx, kAmxModel };
TileProducts ChooseTileProducts() {
  switch (amx_use()) {
    case AmxUse::kModel:
      return TileProducts::kAmxModel;
    case AmxUse::kWhereAvailable:
      return amx_available() ? TileProducts::kAmx : TileProducts::kVector;
    case AmxUse::kNever:
      break;
  }
  return TileProducts::kVector;
}

ATTN_AMX_TARGET void FlashForwardTileBF16(const ForwardArgs& args, int64_t b, int64_t h,
                                          int64_t first_query, size_t count, size_t br,
                                          SpreadPrefetch& prefetch, Scratch& s,
                                          TileProducts products) {
  if (products == TileProducts::kAmx) {
    amx::AmxHardwareTiles tiles;
    return FlashForwardTileBF16(args, b, h, first_query, count, br, prefetch, s, tiles);
  }
  if (products == TileProducts::kAmxModel) {
    amx::AmxTileModel tiles;
    return FlashForwardTileBF16(args, b, h, first_query, count, br, prefetch, s, tiles);
  }
  VectorProducts vector;
  FlashForwardTileBF16(args, b, h, first_query, count, br, prefetch, s, vector);
}
#else
constexpr bool kBFloat16Path = false;
#endif

// Whether bf16 inputs take FlashForwardTileBF16 under this target on this CPU, at any depth: on AMX
// tiles where they are in use, on vdpbf16ps where bf16_dot_in_use(); elsewhere they widen to fp32
// (vdpbf16ps makes half the fp32 FMAs' products per cycle on Intel's cores, bfloat16_dot.hpp).
bool NativeBFloat16() {
  if (!kBFloat16Path || !cpu_has_avx512_bf16()) return false;
  return amx_tiles_in_use() || bf16_dot_in_use();
}

// The fewest queries and keys per head (the shorter of the two) for which FlashForward sends fp32
// to the AMX tiles in three parts.
[[maybe_unused]] constexpr int64_t kMinRowsOnTiles = 384;  // (read by the AVX-512 targets only)

// Whether fp32 dot-product scores (no dropout) take FlashForwardTileBF16 on AMX tiles in three
// bf16 parts under this target on this CPU (flash_attention_float_on_tiles).
bool FloatOnTiles() {
  return kBFloat16Path && cpu_has_avx512_bf16() && fp32_on_amx() && amx_tiles_in_use();
}

// Query rows [first_query, first_query + rows) of query head (b, h): a task's.
struct TaskTiles {
  int64_t b, h, first_query, rows;
};

// Whether two tasks read the same key/value head.
bool SameKeyValueHead(const ForwardArgs& args, const TaskTiles& a, const TaskTiles& b) {
  const int64_t group = args.q.heads / args.k.heads;
  return a.b == b.b && a.h / group == b.h / group;
}

// The bytes of `rows` key rows and their value rows, as the inputs hold them.
double KeyValueBytes(const ForwardArgs& args, int64_t rows) {
  return static_cast<double>(rows) * (args.half ? 2.0 : 4.0) *
         static_cast<double>(args.k.cols + args.v.cols);
}

// Key and value rows [begin, end) of the key/value head that `task` reads, added to `prefetch`.
void AddKeyValueRows(const ForwardArgs& args, const TaskTiles& task, int64_t begin, int64_t end,
                     SpreadPrefetch& prefetch) {
  const int64_t kv_head = task.h / (args.q.heads / args.k.heads);
  AddMatrixRows(prefetch, args.half, args.k, args.k16, task.b, kv_head, begin, end - begin);
  AddMatrixRows(prefetch, args.half, args.v, args.v16, task.b, kv_head, begin, end - begin);
}

// The key and value rows that a sliding window's next task (`next`, this thread's) reaches past
// this task's (`current`), added to `prefetch`: this task's key steps then bring them from memory
// while they compute, instead of the next task's packing waiting on each row (the packing copy
// took 15% of a 256-key window's samples at n = 4096 on the layers' layout, Zen 5). Taken from
// the first and last query of each task, whose ranges bound the others' under a window. They come
// from memory, not L2, and a task has few key steps to spread them over: up to 512 lines a step.
void AddNextWindowRows(const ForwardArgs& args, const TaskTiles& current, const TaskTiles& next,
                       SpreadPrefetch& prefetch) {
  prefetch.raise_max_lines(16 * SpreadPrefetch::kMaxLinesPerStep);
  const int64_t queries = args.q.rows, keys = args.k.rows;
  const auto keys_of = [&](const TaskTiles& task, int64_t query) {
    return visible_keys(*args.valid_lens, args.options, task.b, task.h, query, queries, keys);
  };
  int64_t begin = keys_of(next, next.first_query).begin;
  const int64_t end = keys_of(next, next.first_query + next.rows - 1).end;
  if (SameKeyValueHead(args, current, next))
    begin = std::max(begin, keys_of(current, current.first_query + current.rows - 1).end);
  if (begin >= end) return;
  // A range that moves forward adds a tile's rows or two; one that restarts (another head, a
  // causal mask's) may add the whole head, which would only push this task's rows out of L2.
  if (KeyValueBytes(args, end - begin) > static_cast<double>(l2_cache_bytes()) / 4.0) return;
  AddKeyValueRows(args, next, begin, end, prefetch);
}

// The key and value rows of the next task's head (`next`, this thread's), a slice of them per
// block of this task (`slice` of `slices`), added to `prefetch` where that head is another one
// and its rows take at most a quarter of the L2: this task's key steps then bring them from L3 or
// memory while they compute, instead of the next task's packing waiting on each row (bf16, n =
// 1024, 8 heads of 64, Zen 4: the packing's copies took 4.4% of the samples, 1.7% with these
// requests). Larger heads stream their own rows through the L2 after the requests, which would
// evict the next head's before its packing reads them.
void AddNextHeadRows(const ForwardArgs& args, const TaskTiles& current, const TaskTiles& next,
                     int64_t slice, int64_t slices, SpreadPrefetch& prefetch) {
  if (SameKeyValueHead(args, current, next) ||
      KeyValueBytes(args, args.k.rows) > static_cast<double>(l2_cache_bytes()) / 4.0) {
    return;
  }
  const int64_t begin = args.k.rows * slice / slices, end = args.k.rows * (slice + 1) / slices;
  if (begin >= end) return;
  AddKeyValueRows(args, next, begin, end, prefetch);
  // Lines from L3 or memory, spread over the blocks: more per step than the next tile's rows.
  prefetch.raise_max_lines(4 * SpreadPrefetch::kMaxLinesPerStep);
}

// Raises the call's maxima (ForwardArgs::read_magnitude_bits) to this thread's, once per task.
void PublishReadMagnitudes(const Scratch& s, const ForwardArgs& args) {
  s.read_query.RaiseTo(args.read_magnitude_bits[0]);
  s.read_key.RaiseTo(args.read_magnitude_bits[1]);
  s.read_value.RaiseTo(args.read_magnitude_bits[2]);
}

void FlashForward(const ForwardArgs& call) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  const bool native_bf16 = call.half && call.half_type == HalfType::kBFloat16 && NativeBFloat16();
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // fp32 (and fp16) dot-product scores without dropout go to the AMX tiles too, in three bf16
  // parts each, where the tiles are in use and fp32_on_amx() (amx.hpp), for heads long enough to
  // gain: each head's keys and values are split once for all its query tiles, and the tiles
  // compute whole blocks of 32 keys where FMAs skip a causal diagonal's hidden half. On a Sapphire
  // Rapids-class core (docs/benchmarks.md, 2026-12-04) they lost at n = m ≤ 256 (0.75-0.99x) and
  // under a 256-key window (0.9x), and gained from 384 (1.06-1.17x; causal level up to 768, 1.2x
  // at 1024). One threshold for every mask, so that a mask and the option it equals (a causal
  // one) give the same bits.
  const bool split_candidate =
      call.parts_on_tiles && (!call.half || call.half_type == HalfType::kFloat16) &&
      call.additive_weights == nullptr && call.options.dropout == 0.0F &&
      call.options.window_left < 0 && call.options.window_right < 0 &&
      (amx_use() == AmxUse::kModel ||  // (tests: the model takes every length)
       std::min(call.q.rows, call.k.rows) >= kMinRowsOnTiles) &&
      FloatOnTiles();
  const TileProducts products =
      native_bf16 || split_candidate ? ChooseTileProducts() : TileProducts::kVector;
  const bool amx_tiles = products != TileProducts::kVector;
  const bool split = split_candidate && amx_tiles;
#else
  const bool amx_tiles = false;
  const bool split = false;
#endif
  // Either runs FlashForwardTileBF16 on bf16 pairs.
  const bool bf16_pairs = native_bf16 || split;
  // bf16's P in two parts for P·V (bfloat16_probabilities.hpp).
  const bool split_probabilities = native_bf16 && bf16_probabilities_split(amx_tiles);
  // Query tiles of Br rows: 4 vectors, or on AMX tiles for heads of at most 32 queries the tiles'
  // least, 32 (2 × 2 tiles of 16): the products and the softmax over a 64-row tile cost the same
  // for 17 queries as for 64.
  const size_t br = amx_tiles && call.q.rows <= static_cast<int64_t>(flash_detail::kShortAmxRows)
                        ? flash_detail::kShortAmxRows
                        : flash_detail::kQueryVectors * lanes;
  // The softmax in base 2 for dot-product scores (the modifiers scaled to match,
  // ApplyScoreModifiers' unit; FlashForwardTileBF16's steps are in base 2 throughout).
  ForwardArgs args = call;
  args.base_two = call.additive_weights == nullptr;
  const int64_t tiles_per_head =
      (args.q.rows + static_cast<int64_t>(br) - 1) / static_cast<int64_t>(br);
  const size_t dv_padded = hwy::RoundUpTo(static_cast<size_t>(args.v.cols), lanes);
  // Query tiles in blocks (FlashForwardTiles, FlashForwardTileBF16) where a head's packed K and V
  // outgrow half the L2, for dot-product scores (the additive scores are bound by their
  // arithmetic), unless a sliding window moves each tile's first key, and while enough blocks
  // remain to keep every thread busy (4 per thread). Packed as bf16 pairs they take half the
  // bytes of fp32 rows; in the fp32 forward's three bf16 parts, 1.5 times.
  const size_t fp32_head_bytes =
      static_cast<size_t>(args.k.rows) * (static_cast<size_t>(args.q.cols) + dv_padded) * 4;
  const size_t head_bytes = bf16_pairs ? fp32_head_bytes / 2 * (split ? 3 : 1) : fp32_head_bytes;
  // Threads as the call's work is worth (useful_threads): B·H·n·m pairs of 2·(d + dv) flops.
  const int threads = useful_threads(
      static_cast<double>(args.q.batch * args.q.heads) * static_cast<double>(args.q.rows) *
          static_cast<double>(args.k.rows) * 2.0 * static_cast<double>(args.q.cols + args.v.cols),
      kFlopsPerThread);
  // fp32 output rows of whole aligned vectors, more of them than the threads' L2s hold.
  const auto vectors = [&](int64_t count) { return count % static_cast<int64_t>(lanes) == 0; };
  args.stream_output = !args.half && vectors(args.out.cols) && vectors(args.out.row_stride) &&
                       vectors(args.out.head_stride) && vectors(args.out.batch_stride) &&
                       reinterpret_cast<uintptr_t>(args.out.data) % (lanes * sizeof(float)) == 0 &&
                       streams_output(4.0 * static_cast<double>(args.out.batch * args.out.heads *
                                                                args.out.rows * args.out.cols),
                                      threads);
  int64_t query_block = 1;
  if (args.additive_weights == nullptr && args.options.window_left < 0 &&
      head_bytes > l2_cache_bytes() / 2) {
    query_block = static_cast<int64_t>(flash_detail::kMaxQueryBlock);
    while (query_block > 1 &&
           args.q.batch * args.q.heads * (tiles_per_head / query_block) < 4 * threads) {
      query_block /= 2;
    }
  }
  const int64_t blocks_per_head = (tiles_per_head + query_block - 1) / query_block;
  // Keys and values read in place rather than packed per thread (the packed copy would be the
  // same memory again): fp32 rows (not the exponential form's e^{2k}), values DenseRows, keys back
  // to back too (their elements are broadcast one at a time: no whole vectors needed).
  const bool rows_in_place = !args.half && !exponential(args.additive_form) &&
                             DenseRows(args.v, lanes) && args.k.row_stride == args.k.cols;
  const int64_t heads = args.q.batch * args.q.heads;
  // A task: where keys and values are packed, blocks of one query head in a row, as many as leave
  // 4 tasks per thread for the dynamic schedule to balance (a whole head each where there are that
  // many heads). Where a head's blocks went to different threads, each of them packed the head's
  // keys and values for one block's work: on 2 threads the strided K/V copies took 4.9% of the
  // forward's samples against 2.9% on one (n = 1024, Zen 1), and heads taken whole ran 2-5%
  // faster there (fused, causal, padded, windowed; level on 1 thread and with few heads). Rows
  // read in place keep one block per task: there two threads on one head share its rows through
  // the caches, and whole heads measured level to 1% slower.
  const int64_t team = team_threads(threads);
  const int64_t blocks_per_task =
      rows_in_place ? 1
                    : std::clamp<int64_t>(heads * blocks_per_head / (4 * team), 1, blocks_per_head);
  const int64_t tasks_per_head = (blocks_per_head + blocks_per_task - 1) / blocks_per_task;
  const int64_t tasks = heads * tasks_per_head;
  // Dynamic scheduling: causal, windowed and padded tiles differ widely in cost. A causal head's
  // later query tiles see more keys: they are handed out first (heaviest first), so the tasks left
  // for the end are light and no thread idles behind a heavy last one. A thread's packed keys and
  // values then already cover each next, shorter, range of the head. Windows keep the ascending
  // order, whose ranges move forward and extend the packed rows instead of restarting them.
  const bool heaviest_first = args.options.causal && args.options.window_left < 0;
  // The `index`th block of a head's order (heaviest first, or ascending) → its query head and
  // query rows.
  const auto block_tiles = [&](int64_t head_index, int64_t index) {
    const int64_t block = heaviest_first ? blocks_per_head - 1 - index : index;
    const int64_t first_query = block * query_block * static_cast<int64_t>(br);
    return TaskTiles{head_index / args.q.heads, head_index % args.q.heads, first_query,
                     std::min(query_block * static_cast<int64_t>(br), args.q.rows - first_query)};
  };
  // Task → its query head and its blocks [first, end) in the head's order.
  struct TaskBlocks {
    int64_t head_index, first, end;
  };
  const auto task_blocks = [&](int64_t task) {
    const int64_t first = task % tasks_per_head * blocks_per_task;
    return TaskBlocks{task / tasks_per_head, first,
                      std::min(first + blocks_per_task, blocks_per_head)};
  };
  // A thread's next block after block `index` of `task`: the next of its task, or the first of the
  // task about `team` tasks on (tasks are handed out in order); none past the last task. Its query
  // rows are requested from memory while this block runs, and this block's output rows for writing.
  const auto next_block = [&](int64_t task, const TaskBlocks& blocks,
                              int64_t index) -> std::optional<TaskTiles> {
    if (index + 1 < blocks.end) return block_tiles(blocks.head_index, index + 1);
    if (task + team >= tasks) return std::nullopt;
    const TaskBlocks next_task = task_blocks(task + team);
    return block_tiles(next_task.head_index, next_task.first);
  };
  const bool next_window = PrefetchesNextWindow(args);
  // Whether a task copies its head's key and value rows (the bf16 pairs always; fp32 rows unless
  // read in place).
  const bool packs_rows = bf16_pairs || !rows_in_place;
  // On tiles in three parts, the magnitudes read are checked after the pass (split_parts_in_range,
  // at no cost where the caller asked for them); collected here where it did not.
  std::atomic<uint32_t> split_read_bits[3] = {0U, 0U, 0U};
  if (split && args.read_magnitude_bits == nullptr) args.read_magnitude_bits = split_read_bits;
  run_parallel_tasks(
      tasks, "flash_attention_forward", TaskSchedule::kDynamic,
      [&] {
        return Scratch(br, static_cast<size_t>(args.q.cols), dv_padded,
                       static_cast<size_t>(args.k.rows), lanes, bf16_pairs, amx_tiles,
                       split ? 3 : 1, split_probabilities);
      },
      [&](int64_t task, Scratch& scratch, int) {
        const TaskBlocks blocks = task_blocks(task);
        for (int64_t index = blocks.first; index < blocks.end; ++index) {
          const TaskTiles tiles = block_tiles(blocks.head_index, index);
          const std::optional<TaskTiles> next = next_block(task, blocks, index);
          SpreadPrefetch prefetch;
          if (next) {
            AddMatrixRows(prefetch, args.half, args.q, args.q16, next->b, next->h,
                          next->first_query, next->rows);
          }
          if (!args.stream_output) {
            AddMatrixRows(prefetch, args.half, args.out, args.out16, tiles.b, tiles.h,
                          tiles.first_query, tiles.rows);
          }
          if (next_window && next) {
            AddNextWindowRows(args, tiles, *next, prefetch);
          } else if (packs_rows && task + team < tasks) {
            const TaskBlocks next_task = task_blocks(task + team);
            AddNextHeadRows(args, tiles, block_tiles(next_task.head_index, next_task.first),
                            index - blocks.first, blocks.end - blocks.first, prefetch);
          }
          const auto count = static_cast<size_t>((tiles.rows + static_cast<int64_t>(br) - 1) /
                                                 static_cast<int64_t>(br));
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
          if (bf16_pairs) {
            FlashForwardTileBF16(args, tiles.b, tiles.h, tiles.first_query, count, br, prefetch,
                                 scratch, products);
            continue;
          }
#endif
          FlashForwardTiles(args, tiles.b, tiles.h, tiles.first_query, count, rows_in_place,
                            prefetch, scratch);
        }
        if (args.read_magnitude_bits != nullptr) PublishReadMagnitudes(scratch, args);
        if (args.stream_output) hwy::FlushStream();
      },
      threads);
  // fp32 values under 2^-110 lose their parts on the tiles (read as 0 below 2^-126): with q·c or
  // k past 2^64, or values under 2^-80, the output was 0.6% off (q ~ 1e-35 · k ~ 1e35) to 47% off
  // (1e-37 · 1e37). Such a pass is done again on FMAs, which overwrite every output.
  if (split) {
    const std::atomic<uint32_t>* read = args.read_magnitude_bits;
    const double scale = std::fabs(static_cast<double>(args.options.scale));
    if (!split_parts_in_range(scale * recorded_magnitude(read[0])) ||
        !split_parts_in_range(recorded_magnitude(read[1])) ||
        !split_parts_in_range(recorded_magnitude(read[2]))) {
      ForwardArgs on_fmas = call;
      on_fmas.parts_on_tiles = false;
      FlashForward(on_fmas);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {

HWY_EXPORT(FlashForward);
HWY_EXPORT(NativeBFloat16);
HWY_EXPORT(FloatOnTiles);

namespace {

// The forward pass on the dispatched target, with the magnitudes of the rows it read into `read`
// when that is not null.
void RunForward(flash_detail::ForwardArgs args, ReadMagnitudes* read) {
  std::atomic<uint32_t> read_bits[3] = {0U, 0U, 0U};
  if (read != nullptr) args.read_magnitude_bits = read_bits;
  HWY_DYNAMIC_DISPATCH(FlashForward)(args);
  if (read != nullptr) {
    *read = {std::bit_cast<float>(read_bits[0].load()), std::bit_cast<float>(read_bits[1].load()),
             std::bit_cast<float>(read_bits[2].load())};
  }
}

}  // namespace

bool flash_attention_float_on_tiles() {
  return HWY_DYNAMIC_DISPATCH(FloatOnTiles)();
}

bool flash_attention_bfloat16_native([[maybe_unused]] int64_t depth) {
  return HWY_DYNAMIC_DISPATCH(NativeBFloat16)();
}

void flash_attention_forward(HalfType type, ConstHalfHeadsView q, ConstHalfHeadsView k,
                             ConstHalfHeadsView v, const ValidLengths& valid_lens,
                             const FlashAttentionOptions& options, HalfHeadsView out,
                             float* log_sum_exp, ReadMagnitudes* read, HalfHeadsView out_residual) {
  if (read != nullptr) *read = {};
  const ConstHeadsView q_shape = shape_only(q), k_shape = shape_only(k), v_shape = shape_only(v);
  const HeadsView out_shape = shape_only(out);
  if (out_residual.data != nullptr) {
    require_matrices(shape_only(ConstHalfHeadsView(out_residual)), "out_residual", out.batch,
                     out.heads, out.rows, out.cols, "as out");
    if (out_residual.data == out.data && out.rows > 0 && out.cols > 0) {
      throw ValueError("out_residual: expected memory apart from out, got out's own data");
    }
  }
  if (!check_attention_arguments(q_shape, k_shape, v_shape, out_shape, valid_lens, options)) return;
  flash_detail::ForwardArgs args{q_shape,     k_shape,     v_shape, out_shape,
                                 log_sum_exp, &valid_lens, options};
  args.half = true;
  args.half_type = type;
  args.q16 = q;
  args.k16 = k;
  args.v16 = v;
  args.out16 = out;
  args.residual16 = out_residual;
  RunForward(args, read);
}

Tensor flash_attention_dropout_mask(const FlashAttentionOptions& options, int64_t batch_heads,
                                    int64_t queries, int64_t keys) {
  Tensor mask(Shape{batch_heads, queries, keys});
  const uint32_t threshold = dropout_hash::threshold(options.dropout);
  const float keep = options.dropout > 0.0F ? 1.0F / (1.0F - options.dropout) : 1.0F;
  for (int64_t head = 0; head < batch_heads; ++head) {
    for (int64_t i = 0; i < queries; ++i) {
      const uint32_t row = dropout_hash::row_key(options.seed, head, i);
      for (int64_t j = 0; j < keys; ++j) {
        mask(head, i, j) =
            options.dropout > 0.0F && dropout_hash::bits(row, j) < threshold ? 0.0F : keep;
      }
    }
  }
  return mask;
}

void flash_attention_forward(ConstHeadsView q, ConstHeadsView k, ConstHeadsView v,
                             const ValidLengths& valid_lens, const FlashAttentionOptions& options,
                             HeadsView out, float* log_sum_exp, ReadMagnitudes* read) {
  if (read != nullptr) *read = {};
  if (!check_attention_arguments(q, k, v, out, valid_lens, options)) return;
  RunForward({q, k, v, out, log_sum_exp, &valid_lens, options}, read);
}

void additive_attention_forward(ConstHeadsView projected_queries, ConstHeadsView projected_keys,
                                std::span<const float> w_v, ConstHeadsView values,
                                const ValidLengths& valid_lens,
                                const FlashAttentionOptions& options, HeadsView out,
                                float* log_sum_exp) {
  require_additive_arguments(w_v, options, projected_queries, projected_keys);
  FlashAttentionOptions additive = options;
  additive.scale = 1.0F;  // the queries are packed as they are; w_v carries any scale
  if (!check_attention_arguments(projected_queries, projected_keys, values, out, valid_lens,
                                 additive)) {
    return;
  }
  flash_detail::ForwardArgs args{projected_queries, projected_keys, values,   out,
                                 log_sum_exp,       &valid_lens,    additive, w_v.data()};
  args.additive_form =
      additive_score_form(projected_queries, projected_keys, w_v, options.additive_input_bound);
  HWY_DYNAMIC_DISPATCH(FlashForward)(args);
}

}  // namespace attn
#endif  // HWY_ONCE
