// Decoding attention (FlashDecoding on the CPU): per task (batch b, key/value head g, split of the
// keys) the G·n query rows of head group g — G query heads sharing g, n new queries each — are
// scored against each key tile together, so every K and V row is read from the cache once per
// step whatever G is; partial (max, sum, output) per split merge by log-sum-exp afterwards (an
// unsplit call's tasks write their rows themselves).
// Layout and semantics: include/attn/kernels/decode_attention.hpp.
//
// Tiles keep the rows along the SIMD lanes, as the prefill kernel keeps its queries: Sᵀ (Bc keys ×
// R rows), so each row's running max and sum are lane-wise. Few rows (one query, G ≤ 4) use
// 4-lane vectors instead of wasting three quarters of an AVX-512 register. K and V rows in fp16,
// bf16 or int8 are converted to fp32 in registers as they are loaded (ScoreKeys,
// AccumulateColumns), each load shared by four rows (a key/value head with one row alone,
// multi-head attention's one new token, has steps of its own: ScoreFourKeysOneRow,
// AccumulateOneRow); the rows of the tile four ahead are prefetched while one runs, line by line
// as each pass reads its own stream when the tile is memory-bound (TilePrefetch). On AVX-512 more
// than 8 rows score with the rows along the lanes, each key element broadcast (BroadcastScoreTile),
// and bf16 rows of bf16 queries multiply both products on vdpbf16ps where the CPU has it
// (ScoresOnPairs, ValuesOnPairs).
#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/core/half.hpp"
#include "attn/kernels/bfloat16_dot.hpp"
#include "attn/kernels/bfloat16_probabilities.hpp"
#include "attn/kernels/decode_attention.hpp"
#include "attn/kernels/flash_attention.hpp"
#include "attn/kernels/half_conversion.hpp"
#include "core/magnitude_scan.hpp"
#include "kernels/cache_sizes.hpp"
#include "kernels/kernel_arguments.hpp"
#include "kernels/parallel_tasks.hpp"
#include "kernels/prefetch.hpp"
#include "kernels/score_masks.hpp"
#include "kernels/scratch_memory.hpp"
#include "kernels/static_count.hpp"

#ifndef ATTN_DECODE_ATTENTION_SHARED
#define ATTN_DECODE_ATTENTION_SHARED
namespace attn::decode_detail {

// A half call's queries and outputs: their bits in `type`.
struct HalfRows {
  HalfType type;
  ConstHalfHeadsView q;
  HalfHeadsView out;
  HalfHeadsView residual;  // data not null: the outputs' rounding residuals
};

struct DecodeArgs {
  ConstHeadsView q;
  CacheTensorView keys, values;
  const int64_t* lengths;
  DecodeOptions options;
  int64_t splits;     // key splits per (batch, key/value head)
  int64_t split_len;  // keys per split (a multiple of kKeyTile)
  // Per task (b, g, split) and row: max, sum, then dv unnormalised output floats; null with one
  // split, whose tasks write their rows into `out` and `log_sum_exp` themselves.
  float* partial;
  int64_t partial_row;  // floats per row: 2 + dv
  // Set when a task read a query element, computed a score (before the modifiers and masks) or
  // wrote an output element that is NaN or ±∞.
  std::atomic<bool>* non_finite;
  int threads;  // at most, for the tasks (useful_threads)
  HeadsView out;
  float* log_sum_exp;  // may be null
  // Half-precision queries and outputs (the half overload; null otherwise): q and out then give
  // their shapes only. Each task widens its rows' queries (exactly) and rounds its output rows
  // once, where the functional call copied them on one thread before and after the kernel's (a
  // serial fifth of a fp16 8 × 8 × 16 × 16 call, d = 64).
  const HalfRows* half = nullptr;
};

// Row `row` of matrix (b, h) of a cache tensor on: its address, the bytes between rows, and its
// int8 scales from that row on (null for the other dtypes).
struct CacheRows {
  const char* data;
  size_t stride;
  const float* scales;
};

inline CacheRows rows_of(const CacheTensorView& t, int64_t b, int64_t h, int64_t row) {
  const int64_t element = cache_dtype_size(t.dtype);
  return {static_cast<const char*>(t.data) +
              (b * t.batch_stride + h * t.head_stride + row * t.row_stride) * element,
          static_cast<size_t>(t.row_stride * element),
          t.scales != nullptr ? t.scales + (b * t.heads + h) * t.capacity + row : nullptr};
}

constexpr size_t kKeyTile = 64;
constexpr int64_t kPrefetchTiles = 4;  // how far ahead TilePrefetch requests rows
constexpr PrefetchInto kPrefetchLevel = PrefetchInto::kL2;  // prefetcht1

// One query row's output and log-sum-exp from its splits' partial results — split k's running
// maximum max_of(k), sum sum_of(k) and unnormalised output values_of(k) (dv floats) — merged by
// log-sum-exp, the sink (null: none) joining the denominator once with no value; a row that saw
// nothing gets zeros and the sink's score or −∞. The tasks of an unsplit call write their rows
// with it, the call merges split rows with it after its tasks: either way the same operations, so
// the same bits. Returns the largest magnitude bits written (core/magnitude_scan.hpp: NaN and ±∞
// from kFirstNonFinite).
template <class MaxOf, class SumOf, class ValuesOf>
uint32_t MergeRow(int64_t splits, const MaxOf& max_of, const SumOf& sum_of,
                  const ValuesOf& values_of, const float* sink, int64_t dv, float* destination,
                  float* log_sum_exp) {
  float top = -std::numeric_limits<float>::infinity();  // the splits' largest maximum
  for (int64_t split = 0; split < splits; ++split) top = std::max(top, max_of(split));
  const float sink_score = sink != nullptr ? *sink : -std::numeric_limits<float>::infinity();
  if (top == -std::numeric_limits<float>::infinity()) {
    std::fill_n(destination, dv, 0.0F);
    if (log_sum_exp != nullptr) *log_sum_exp = sink_score;
    return 0;
  }
  // The split that holds the maximum (the only one, unsplit) weighs exactly e⁰ = 1.
  const auto weight = [&](int64_t split) {
    return max_of(split) == top ? 1.0F : std::exp(max_of(split) - top);
  };
  // A sink above every score shifts the sum instead, and the scores keep `share` = e^(top − sink)
  // of it in double: weighed against the sink in float, their exponentials fell under float's
  // range 88 below it and the row's outputs (then under 1e−33 of the values) came out up to a
  // fifth off.
  const double shift = std::max(static_cast<double>(top), static_cast<double>(sink_score));
  const double share = std::exp(static_cast<double>(top) - shift);
  double sum = sink != nullptr ? std::exp(static_cast<double>(sink_score) - shift) : 0.0;
  for (int64_t split = 0; split < splits; ++split) {
    if (sum_of(split) != 0.0F) sum += static_cast<double>(sum_of(split)) * weight(split) * share;
  }
  const float inverse = sum > 0.0 ? static_cast<float>(1.0 / sum) : 0.0F;
  // O = Σ (weight / sum) · O_split in one pass over the row: unsplit, O_split · (1 / sum).
  bool written = false;
  for (int64_t split = 0; split < splits; ++split) {
    if (sum_of(split) == 0.0F) continue;
    const float* values = values_of(split);
    if (share < 1.0) {  // in double, each output rounded once, as float's subnormals hold them
      const double factor = static_cast<double>(weight(split)) * share / sum;
      for (int64_t t = 0; t < dv; ++t) {
        const double term = factor * static_cast<double>(values[t]);
        destination[t] =
            static_cast<float>(written ? static_cast<double>(destination[t]) + term : term);
      }
    } else {
      const float factor = weight(split) * inverse;
      if (written) {
        for (int64_t t = 0; t < dv; ++t) destination[t] += factor * values[t];
      } else {
        for (int64_t t = 0; t < dv; ++t) destination[t] = factor * values[t];
      }
    }
    written = true;
  }
  if (!written) std::fill_n(destination, dv, 0.0F);
  if (log_sum_exp != nullptr) {
    *log_sum_exp = sum > 0.0 ? static_cast<float>(shift) + static_cast<float>(std::log(sum))
                             : -std::numeric_limits<float>::infinity();
  }
  uint32_t largest = 0;
  for (int64_t t = 0; t < dv; ++t)
    largest =
        std::max(largest, std::bit_cast<uint32_t>(destination[t]) & core_detail::kMagnitudeBits);
  return largest;
}

}  // namespace attn::decode_detail
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/decode_attention.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// Highway's headers must follow foreach_target.h.
#include <hwy/highway.h>

#include "kernels/fast_math-inl.h"
#include "kernels/half_rows-inl.h"
#include "kernels/magnitude_bits-inl.h"
#include "kernels/score_modifiers-inl.h"
#include "kernels/tile_gemm_bf16-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using decode_detail::CacheRows;
using decode_detail::DecodeArgs;
using decode_detail::kKeyTile;
using decode_detail::kPrefetchLevel;
using decode_detail::kPrefetchTiles;

// Per-thread buffers, sized for the widest vectors this target has.
struct DecodeScratch {
  ScratchMemory memory;
  float* q_rows;          // R × d: the rows' queries, scaled
  float* scores;          // Bc × R: Sᵀ, then Pᵀ
  float* probabilities;   // Bc: one row's P, dense (DecodeSoftmaxStepOneRow)
  float* output;          // rows × dv_padded
  float* row_max;         // R
  float* row_sum;         // R
  float* row_rescale;     // R
  int32_t* first;         // R: each row's first visible key
  int32_t* last;          // R: one past its last
  float* alibi_slope;     // R: each row's ALiBi slope (0 on the rows past the real ones)
  float* alibi_position;  // R: each row's query position, as a float
  float* widened_rows;  // Bc × max(d, dv_padded): a tile's K, then V, rows as floats (WidensTiles)
  float* q_columns;     // d × R: Qᵀ, the rows' scaled queries along lanes (BroadcastsScores)
  uint32_t* q_pairs;    // d/2 × R: Qᵀ as bf16 pairs of adjacent dimensions (ScoresOnPairs)
  // ValuesOnPairs: Pᵀ as bf16 pairs of adjacent keys (Bc/2 × R), and the tile's value rows as
  // pairs of two adjacent keys' entries in one column (Bc/2 × dv_padded)
  uint32_t* probability_pairs;
  uint32_t* value_pairs;
  // With split_probabilities, P's rounding remainders (Bc × R) and their pairs, Bc/2 × R words
  // after P's in probability_pairs; `ones` (R) rescales O by nothing for their pass.
  bool split_probabilities;
  float* remainders;
  float* ones;
  float* half_queries;  // R × d: a half call's rows' queries, widened (WidenQueries)
  float* output_row;    // dv_padded: a half call's output row before its rounding

  DecodeScratch(size_t max_rows, size_t depth, size_t dv_padded, size_t lanes, bool half,
                bool split = false)
      : split_probabilities(split) {
    memory = carve_scratch(lanes, [&](const auto& take) {
      q_rows = take(depth * max_rows);
      scores = take(kKeyTile * max_rows);
      probabilities = take(kKeyTile);
      output = take(max_rows * dv_padded);
      row_max = take(max_rows);
      row_sum = take(max_rows);
      row_rescale = take(max_rows);
      first = as_int32(take(max_rows));
      last = as_int32(take(max_rows));
      alibi_slope = take(max_rows);
      alibi_position = take(max_rows);
      widened_rows = take(kKeyTile * std::max(depth, dv_padded));
      q_columns = take(depth * max_rows);
      q_pairs = as_uint32(take((depth + 1) / 2 * max_rows));
      probability_pairs = as_uint32(take((split ? 2 : 1) * kKeyTile / 2 * max_rows));
      remainders = take(split ? kKeyTile * max_rows : 0);
      ones = take(split ? max_rows : 0);
      value_pairs = as_uint32(take(kKeyTile / 2 * dv_padded));
      half_queries = take(half ? depth * max_rows : 0);
      output_row = take(half ? dv_padded : 0);
    });
    if (split) std::fill_n(ones, max_rows, 1.0F);
  }
};

// Software prefetch into L2 (prefetcht1, kPrefetchLevel) of the rows kPrefetchTiles tiles
// ahead: at d = 128, 4 tiles of K and V rows are 64–256 KiB, more than an L1 holds (32 KiB on Zen
// 4, 48 on Zen 5 and recent Xeons) and within every L2. Into L1 (prefetcht0) the requested lines
// were evicted before use on Zen 4: L2 made its decode 1.5× (fp32) and 1.96× (fp16/bf16) faster on
// one thread at m = 32768 and 1.2–1.8× on two, int8 1.0–1.2× (interleaved, docs/benchmarks.md).
// The Zen 5 figures below were measured with prefetcht0 and are yet to be re-taken. Memory-bound
// tiles (one group of four rows) request them line by line as each pass reads the same line of the
// current tile: the score pass K's lines, the value pass V's, so that each stream's requests go out
// at the rate it is read. Measured on one Zen 5 core (a model loop, 4 FMAs per line): 35 GB/s thus,
// 30 GB/s with both streams requested from the score pass, 28 GB/s with each row's lines requested
// at once (the decode kernel: fp16 caches 4.8 → 4.1 ms at m = 32768); every line must be requested
// (every other line: 1.5× slower) — the hardware prefetchers, which stop at page boundaries, leave
// a single core stalling on memory. Compute-bound tiles (more rows) request whole K and V rows from
// the score pass, outside its inner loop. Rows outside the split are not requested.
struct TilePrefetch {
  const char* keys = nullptr;    // row 0 of the tile to request
  const char* values = nullptr;  // likewise
  size_t key_stride = 0, value_stride = 0, key_bytes = 0, value_bytes = 0;
  size_t rows = 0;       // rows of this tile whose later row is in the split
  bool by_line = false;  // each pass requests its own stream's lines

  HWY_INLINE const char* KeyRow(size_t j) const {
    return j < rows ? keys + j * key_stride : nullptr;
  }
  HWY_INLINE const char* ValueRow(size_t j) const {
    return j < rows ? values + j * value_stride : nullptr;
  }
  // Row j of K and of V, whole.
  HWY_INLINE void BothRows(size_t j) const {
    if (j >= rows) return;
    const char* k = keys + j * key_stride;
    PrefetchLines<kPrefetchLevel>(k, static_cast<int64_t>(key_bytes));
    const char* v = values + j * value_stride;
    PrefetchLines<kPrefetchLevel>(v, static_cast<int64_t>(value_bytes));
  }
};

// Requests the line at byte `offset` of `row` (null: nothing) when a pass reading vectors of
// kElement-byte entries starts a new line there.
template <size_t kElement>
HWY_INLINE void PrefetchOnNewLine(const char* row, size_t element_index) {
  const size_t offset = element_index * kElement;
  if (row != nullptr && offset % 64 == 0) PrefetchLine<kPrefetchLevel>(row + offset);
}

// Calls f(std::integral_constant<CacheDType, dtype>()), so that one call site instantiates a
// routine per cache dtype and picks the one `dtype` names at run time.
template <class F>
HWY_INLINE void WithCacheType(CacheDType dtype, const F& f) {
  switch (dtype) {
    case CacheDType::kFloat32:
      f(std::integral_constant<CacheDType, CacheDType::kFloat32>());
      break;
    case CacheDType::kFloat16:
      f(std::integral_constant<CacheDType, CacheDType::kFloat16>());
      break;
    case CacheDType::kBFloat16:
      f(std::integral_constant<CacheDType, CacheDType::kBFloat16>());
      break;
    case CacheDType::kInt8:
      f(std::integral_constant<CacheDType, CacheDType::kInt8>());
      break;
  }
}

// Element t of a cache row in fp32 (before an int8 row's scale), for depth tails.
template <CacheDType kType>
HWY_INLINE float CacheElement(const void* row, size_t t) {
  if constexpr (kType == CacheDType::kFloat32) return static_cast<const float*>(row)[t];
  if constexpr (kType == CacheDType::kFloat16)
    return half_to_float(static_cast<const uint16_t*>(row)[t]);
  if constexpr (kType == CacheDType::kBFloat16)
    return bfloat16_to_float(static_cast<const uint16_t*>(row)[t]);
  return static_cast<float>(static_cast<const int8_t*>(row)[t]);
}

// A vector of a cache row from element t on, converted to fp32 in registers.
template <CacheDType kType, class D>
HWY_INLINE hn::Vec<D> LoadCacheVector(D d, const void* row, size_t t) {
  if constexpr (kType == CacheDType::kFloat32) {
    return hn::LoadU(d, static_cast<const float*>(row) + t);
  } else if constexpr (kType == CacheDType::kFloat16) {
    const hn::Rebind<hwy::float16_t, D> dh;
    return hn::PromoteTo(d, hn::LoadU(dh, static_cast<const hwy::float16_t*>(row) + t));
  } else if constexpr (kType == CacheDType::kBFloat16) {
    const hn::Rebind<hwy::bfloat16_t, D> dbf;
    return hn::PromoteTo(d, hn::LoadU(dbf, static_cast<const hwy::bfloat16_t*>(row) + t));
  } else {
    const hn::Rebind<int8_t, D> d8;
    const hn::RebindToSigned<D> di;
    return hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(d8, static_cast<const int8_t*>(row) + t)));
  }
}

#if HWY_TARGET != HWY_SCALAR
// The lanes of each 128-bit block combined across blocks by `op` (hn::Add or hn::Max as a
// lambda of two vectors): 4 lanes.
template <class D, class Op>
HWY_INLINE hn::Vec<hn::CappedTag<float, 4>> FoldBlocks(D d, hn::Vec<D> v, const Op& op) {
  if constexpr (hn::MaxLanes(D()) <= 4) {
    (void)d;
    return v;
  } else {
    const hn::Half<D> dh;
    return FoldBlocks(dh, op(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)), op);
  }
}

constexpr auto kVectorSum = [](auto a, auto b) { return hn::Add(a, b); };
constexpr auto kVectorMax = [](auto a, auto b) { return hn::Max(a, b); };

// (Σa, Σb, Σc, Σd) in 4 lanes: two interleaving steps within each 128-bit block, then the blocks
// added — 3 shuffles per sum instead of a horizontal reduction each.
template <class D>
HWY_INLINE hn::Vec<hn::CappedTag<float, 4>> SumFour(D d, hn::Vec<D> a, hn::Vec<D> b, hn::Vec<D> c,
                                                    hn::Vec<D> e) {
  const hn::Repartition<uint64_t, D> d64;
  // Per block: (a0 + a2, b0 + b2, a1 + a3, b1 + b3), and the same of c and e.
  const auto ab = hn::Add(hn::InterleaveLower(d, a, b), hn::InterleaveUpper(d, a, b));
  const auto ce = hn::Add(hn::InterleaveLower(d, c, e), hn::InterleaveUpper(d, c, e));
  const auto ab64 = hn::BitCast(d64, ab), ce64 = hn::BitCast(d64, ce);
  const auto sums = hn::Add(hn::BitCast(d, hn::InterleaveLower(d64, ab64, ce64)),
                            hn::BitCast(d, hn::InterleaveUpper(d64, ab64, ce64)));
  return FoldBlocks(d, sums, kVectorSum);
}
#endif

// Whether ScoreKeys holds its query vectors in registers (KeepInRegisters, tile_gemm-inl.h): GCC 12
// otherwise reloads each query vector from memory for every key it multiplies, and on Zen 1, whose
// 256-bit loads take both load slots of a cycle, ScoreKeys' ten loads for eight multiply-adds (two
// keys) bound its loop above the multiply-adds' eight cycles. Pinned for fp32 rows on AVX2, where
// it made fp32 decoding 1.04–1.31x faster on Zen 1 (one thread; one and four queries, 4096 and
// 32768 keys, 32 query heads over 8 of 128), and on AVX-512, where GCC 12 reloads them as well: Zen
// 4, one thread, one and two queries of those heads, 1.03–1.17x faster with the cache in L2 or L3
// (m = 512 and 2048), 0.92–1.24x from memory on a noisy host, mostly faster. Half-precision and
// int8 rows need registers for their conversions: on AVX2 it measured 2.5–4% slower there (four
// queries).
template <CacheDType kType>
constexpr bool kKeepQueriesInRegisters = HWY_MAX_BYTES >= 32 && kType == CacheDType::kFloat32;

// Sᵀ[j, r] = q_r · k_j (times the key row's int8 scale) for kKeys keys, read from the cache in
// its own dtype and converted in registers: each key vector is loaded once for four query rows,
// each query vector once for the kKeys keys (4·kKeys FMA chains), and four sums leave in one
// vector. Query rows rows … rows rounded up to 4 must be zero (their scores are masked anyway).
template <CacheDType kType, size_t kKeys, bool kByLine, class D>
HWY_INLINE void ScoreKeys(D d, const char* key_row, size_t key_stride, const float* scales,
                          const float* HWY_RESTRICT q_rows, size_t row_groups, size_t depth,
                          float* HWY_RESTRICT scores, size_t row_lanes,
                          const char* const* prefetch_rows) {
#if HWY_TARGET == HWY_SCALAR  // plain dot products
  (void)d;
  for (size_t k = 0; k < kKeys && kByLine; ++k) {
    for (size_t t = 0; t < depth; ++t)
      PrefetchOnNewLine<cache_dtype_size(kType)>(prefetch_rows[k], t);
  }
  for (size_t k = 0; k < kKeys; ++k) {
    for (size_t r = 0; r < row_groups * 4; ++r) {
      float dot = 0.0F;
      for (size_t t = 0; t < depth; ++t)
        dot += q_rows[r * depth + t] * CacheElement<kType>(key_row + k * key_stride, t);
      if constexpr (kType == CacheDType::kInt8) dot *= scales[k];
      scores[k * row_lanes + r] = dot;
    }
  }
#else
  using V = hn::Vec<D>;
  const hn::CappedTag<float, 4> d4;
  const size_t lanes = hn::Lanes(d), vectors_end = depth / lanes * lanes;
  static_assert(kKeys == 1 || kKeys == 2 || kKeys == 4);
  for (size_t group = 0; group < row_groups; ++group) {
    const float* q = q_rows + group * 4 * depth;
    // Named accumulators, not an array: GCC 12 kept a V[2][4] array on the stack and stored all
    // eight vectors back in every iteration, which halved this loop's speed.
    V a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
    V b0 = hn::Zero(d), b1 = hn::Zero(d), b2 = hn::Zero(d), b3 = hn::Zero(d);
    V c0 = hn::Zero(d), c1 = hn::Zero(d), c2 = hn::Zero(d), c3 = hn::Zero(d);
    V e0 = hn::Zero(d), e1 = hn::Zero(d), e2 = hn::Zero(d), e3 = hn::Zero(d);
    for (size_t t = 0; t < vectors_end; t += lanes) {
      if constexpr (kByLine) {  // one group of rows
        for (size_t k = 0; k < kKeys; ++k)
          PrefetchOnNewLine<cache_dtype_size(kType)>(prefetch_rows[k], t);
      }
      V q0 = hn::LoadU(d, q + t), q1 = hn::LoadU(d, q + depth + t),
        q2 = hn::LoadU(d, q + 2 * depth + t), q3 = hn::LoadU(d, q + 3 * depth + t);
      if constexpr (kKeepQueriesInRegisters<kType> && kKeys >= 2) KeepInRegisters(q0, q1, q2, q3);
      const V key0 = LoadCacheVector<kType>(d, key_row, t);
      a0 = hn::MulAdd(q0, key0, a0);
      a1 = hn::MulAdd(q1, key0, a1);
      a2 = hn::MulAdd(q2, key0, a2);
      a3 = hn::MulAdd(q3, key0, a3);
      if constexpr (kKeys >= 2) {
        const V key1 = LoadCacheVector<kType>(d, key_row + key_stride, t);
        b0 = hn::MulAdd(q0, key1, b0);
        b1 = hn::MulAdd(q1, key1, b1);
        b2 = hn::MulAdd(q2, key1, b2);
        b3 = hn::MulAdd(q3, key1, b3);
      }
      if constexpr (kKeys == 4) {
        const V key2 = LoadCacheVector<kType>(d, key_row + 2 * key_stride, t);
        c0 = hn::MulAdd(q0, key2, c0);
        c1 = hn::MulAdd(q1, key2, c1);
        c2 = hn::MulAdd(q2, key2, c2);
        c3 = hn::MulAdd(q3, key2, c3);
        const V key3 = LoadCacheVector<kType>(d, key_row + 3 * key_stride, t);
        e0 = hn::MulAdd(q0, key3, e0);
        e1 = hn::MulAdd(q1, key3, e1);
        e2 = hn::MulAdd(q2, key3, e2);
        e3 = hn::MulAdd(q3, key3, e3);
      }
    }
    for (size_t k = 0; k < kKeys; ++k) {
      auto sums = k == 0   ? SumFour(d, a0, a1, a2, a3)
                  : k == 1 ? SumFour(d, b0, b1, b2, b3)
                  : k == 2 ? SumFour(d, c0, c1, c2, c3)
                           : SumFour(d, e0, e1, e2, e3);
      if (vectors_end < depth) {
        HWY_ALIGN float tail[4] = {0.0F, 0.0F, 0.0F, 0.0F};
        for (size_t i = 0; i < 4; ++i)
          for (size_t t = vectors_end; t < depth; ++t)
            tail[i] += q[i * depth + t] * CacheElement<kType>(key_row + k * key_stride, t);
        sums = hn::Add(sums, hn::Load(d4, tail));
      }
      if constexpr (kType == CacheDType::kInt8) sums = hn::Mul(sums, hn::Set(d4, scales[k]));
      hn::StoreU(sums, d4, scores + k * row_lanes + group * 4);
    }
  }
#endif
}

#if HWY_TARGET != HWY_SCALAR
// The one-row score steps' last part: kKeys dot products in the first lanes of `sums` (whole
// vectors of depth), each plus its key's depth tail past vectors_end and times its int8 scale,
// stored as Sᵀ[k, 0], with Sᵀ[k, 1 … 3] = 0 (the padding rows' scores, as the four-row form
// leaves them).
template <CacheDType kType, size_t kKeys, class D4>
HWY_INLINE void StoreOneRowScores(D4 d4, hn::Vec<D4> sums, const char* key_row, size_t key_stride,
                                  const float* scales, const float* HWY_RESTRICT q,
                                  size_t vectors_end, size_t depth, float* HWY_RESTRICT scores) {
  static_assert(kKeys == 4 || kType != CacheDType::kInt8, "int8 scales are read four at a time");
  if (vectors_end < depth) {
    HWY_ALIGN float tail[4] = {0.0F, 0.0F, 0.0F, 0.0F};
    for (size_t k = 0; k < kKeys; ++k)
      for (size_t e = vectors_end; e < depth; ++e)
        tail[k] += q[e] * CacheElement<kType>(key_row + k * key_stride, e);
    sums = hn::Add(sums, hn::Load(d4, tail));
  }
  if constexpr (kType == CacheDType::kInt8) sums = hn::Mul(sums, hn::LoadU(d4, scales));
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if constexpr (kKeys == 4) {
    // The four keys' rows of Sᵀ in one store, each sum expanded into lane 0 of its row.
    _mm512_storeu_ps(scores, _mm512_maskz_expand_ps(0x1111, _mm512_castps128_ps512(sums.raw)));
    return;
  }
#endif
  HWY_ALIGN float key_sums[4];
  hn::Store(sums, d4, key_sums);
  for (size_t k = 0; k < kKeys; ++k) {
    hn::Store(hn::Zero(d4), d4, scores + 4 * k);
    scores[4 * k] = key_sums[k];
  }
}

// ScoreKeys for one query row (G·n = 1: multi-head attention's one new token) and four keys: the
// four-row form multiplies three zero rows too, which made that decode compute-bound at 30 GB/s
// in the cache on Zen 4 for any G ≤ 4. Each key's dot product in two sums (even and odd vectors:
// 8 multiply-add chains, as the FMA units' latency needs), then StoreOneRowScores.
template <CacheDType kType, bool kByLine, class D>
HWY_INLINE void ScoreFourKeysOneRow(D d, const char* key_row, size_t key_stride,
                                    const float* scales, const float* HWY_RESTRICT q, size_t depth,
                                    float* HWY_RESTRICT scores, const char* const* prefetch_rows) {
  using V = hn::Vec<D>;
  const hn::CappedTag<float, 4> d4;
  const size_t lanes = hn::Lanes(d), vectors_end = depth / lanes * lanes;
  const char* row1 = key_row + key_stride;
  const char* row2 = row1 + key_stride;
  const char* row3 = row2 + key_stride;
  V a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  V b0 = hn::Zero(d), b1 = hn::Zero(d), b2 = hn::Zero(d), b3 = hn::Zero(d);
  size_t t = 0;
  for (; t + 2 * lanes <= vectors_end; t += 2 * lanes) {
    if constexpr (kByLine) {
      for (size_t k = 0; k < 4; ++k) {
        PrefetchOnNewLine<cache_dtype_size(kType)>(prefetch_rows[k], t);
        PrefetchOnNewLine<cache_dtype_size(kType)>(prefetch_rows[k], t + lanes);
      }
    }
    const V q0 = hn::LoadU(d, q + t), q1 = hn::LoadU(d, q + t + lanes);
    a0 = hn::MulAdd(q0, LoadCacheVector<kType>(d, key_row, t), a0);
    a1 = hn::MulAdd(q0, LoadCacheVector<kType>(d, row1, t), a1);
    a2 = hn::MulAdd(q0, LoadCacheVector<kType>(d, row2, t), a2);
    a3 = hn::MulAdd(q0, LoadCacheVector<kType>(d, row3, t), a3);
    b0 = hn::MulAdd(q1, LoadCacheVector<kType>(d, key_row, t + lanes), b0);
    b1 = hn::MulAdd(q1, LoadCacheVector<kType>(d, row1, t + lanes), b1);
    b2 = hn::MulAdd(q1, LoadCacheVector<kType>(d, row2, t + lanes), b2);
    b3 = hn::MulAdd(q1, LoadCacheVector<kType>(d, row3, t + lanes), b3);
  }
  if (t < vectors_end) {  // an odd number of whole vectors
    if constexpr (kByLine) {
      for (size_t k = 0; k < 4; ++k)
        PrefetchOnNewLine<cache_dtype_size(kType)>(prefetch_rows[k], t);
    }
    const V q0 = hn::LoadU(d, q + t);
    a0 = hn::MulAdd(q0, LoadCacheVector<kType>(d, key_row, t), a0);
    a1 = hn::MulAdd(q0, LoadCacheVector<kType>(d, row1, t), a1);
    a2 = hn::MulAdd(q0, LoadCacheVector<kType>(d, row2, t), a2);
    a3 = hn::MulAdd(q0, LoadCacheVector<kType>(d, row3, t), a3);
  }
  StoreOneRowScores<kType, 4>(
      d4, SumFour(d, hn::Add(a0, b0), hn::Add(a1, b1), hn::Add(a2, b2), hn::Add(a3, b3)), key_row,
      key_stride, scales, q, vectors_end, depth, scores);
}
#endif

#if HWY_TARGET != HWY_SCALAR
// ScoreFourKeysOneRow for fp32 rows, two keys at a time, each dot product in four sums (vectors t
// mod 4): as fast from the cache, and from memory four keys at a time were 4–15% slower (Zen 4, d =
// 64 and 128), as ScoreTile's four-row steps found.
template <bool kByLine, class D>
HWY_INLINE void ScoreTwoKeysOneRow(D d, const char* key_row, size_t key_stride,
                                   const float* HWY_RESTRICT q, size_t depth,
                                   float* HWY_RESTRICT scores, const char* const* prefetch_rows) {
  constexpr CacheDType kType = CacheDType::kFloat32;
  using V = hn::Vec<D>;
  const hn::CappedTag<float, 4> d4;
  const size_t lanes = hn::Lanes(d), vectors_end = depth / lanes * lanes;
  const char* row1 = key_row + key_stride;
  V a0 = hn::Zero(d), a1 = hn::Zero(d), b0 = hn::Zero(d), b1 = hn::Zero(d);
  V c0 = hn::Zero(d), c1 = hn::Zero(d), e0 = hn::Zero(d), e1 = hn::Zero(d);
  size_t t = 0;
  for (; t + 4 * lanes <= vectors_end; t += 4 * lanes) {
    if constexpr (kByLine) {
      for (size_t k = 0; k < 2; ++k) {
        for (size_t v = 0; v < 4; ++v)
          PrefetchOnNewLine<cache_dtype_size(kType)>(prefetch_rows[k], t + v * lanes);
      }
    }
    const V q0 = hn::LoadU(d, q + t), q1 = hn::LoadU(d, q + t + lanes),
            q2 = hn::LoadU(d, q + t + 2 * lanes), q3 = hn::LoadU(d, q + t + 3 * lanes);
    a0 = hn::MulAdd(q0, LoadCacheVector<kType>(d, key_row, t), a0);
    b0 = hn::MulAdd(q1, LoadCacheVector<kType>(d, key_row, t + lanes), b0);
    c0 = hn::MulAdd(q2, LoadCacheVector<kType>(d, key_row, t + 2 * lanes), c0);
    e0 = hn::MulAdd(q3, LoadCacheVector<kType>(d, key_row, t + 3 * lanes), e0);
    a1 = hn::MulAdd(q0, LoadCacheVector<kType>(d, row1, t), a1);
    b1 = hn::MulAdd(q1, LoadCacheVector<kType>(d, row1, t + lanes), b1);
    c1 = hn::MulAdd(q2, LoadCacheVector<kType>(d, row1, t + 2 * lanes), c1);
    e1 = hn::MulAdd(q3, LoadCacheVector<kType>(d, row1, t + 3 * lanes), e1);
  }
  for (; t < vectors_end; t += lanes) {  // 1 to 3 whole vectors left
    if constexpr (kByLine) {
      for (size_t k = 0; k < 2; ++k)
        PrefetchOnNewLine<cache_dtype_size(kType)>(prefetch_rows[k], t);
    }
    const V q0 = hn::LoadU(d, q + t);
    a0 = hn::MulAdd(q0, LoadCacheVector<kType>(d, key_row, t), a0);
    a1 = hn::MulAdd(q0, LoadCacheVector<kType>(d, row1, t), a1);
  }
  StoreOneRowScores<kType, 2>(
      d4,
      SumFour(d, hn::Add(hn::Add(a0, b0), hn::Add(c0, e0)),
              hn::Add(hn::Add(a1, b1), hn::Add(c1, e1)), hn::Zero(d), hn::Zero(d)),
      key_row, key_stride, nullptr, q, vectors_end, depth, scores);
}
#endif

// Keys j … j + kKeys − 1 of a tile (ScoreKeys) with their prefetch requests. A function, not a
// lambda: GCC 12 compiled the lambda out of line and called it per step (the fp32 step at d = 64
// took 10.4 instead of 8.5 ns per key in the cache).
template <CacheDType kType, size_t kKeys, class D>
HWY_INLINE void ScoreStep(D d, const char* key_rows, size_t key_stride, const float* scales,
                          const float* HWY_RESTRICT q_rows, size_t row_groups, size_t depth,
                          float* HWY_RESTRICT scores, size_t row_lanes,
                          const TilePrefetch& prefetch, size_t j) {
  const char* first = key_rows + j * key_stride;
  float* step_scores = scores + j * row_lanes;
  if (prefetch.by_line) {
    const char* later[kKeys];
    for (size_t k = 0; k < kKeys; ++k) later[k] = prefetch.KeyRow(j + k);
    ScoreKeys<kType, kKeys, true>(d, first, key_stride, scales, q_rows, row_groups, depth,
                                  step_scores, row_lanes, later);
  } else {
    for (size_t k = 0; k < kKeys; ++k) prefetch.BothRows(j + k);
    ScoreKeys<kType, kKeys, false>(d, first, key_stride, scales, q_rows, row_groups, depth,
                                   step_scores, row_lanes, nullptr);
  }
}

// ScoreStep as a function of its own, called per step: the memory-bound fp32 tile with whole value
// rows (AVX-512, dv = 128) decodes 8% faster so (m = 32768, one thread: 7.9 against 8.6 ms,
// interleaved on Zen 5), though its step computes slower in the cache; fp32 rows of 64 were 20%
// slower so. Why the call helps is not known (code placement; see ScoreTileOutOfLine).
template <CacheDType kType, size_t kKeys, class D>
HWY_NOINLINE void ScoreStepOutOfLine(D d, const char* key_rows, size_t key_stride,
                                     const float* scales, const float* HWY_RESTRICT q_rows,
                                     size_t row_groups, size_t depth, float* HWY_RESTRICT scores,
                                     size_t row_lanes, const TilePrefetch& prefetch, size_t j) {
  ScoreStep<kType, kKeys>(d, key_rows, key_stride, scales, q_rows, row_groups, depth, scores,
                          row_lanes, prefetch, j);
}

template <CacheDType kType, class D>
HWY_INLINE void ScoreTile(D d, size_t bc, const CacheRows& keys, const float* HWY_RESTRICT q_rows,
                          size_t rows, size_t depth, float* HWY_RESTRICT scores, size_t row_lanes,
                          const TilePrefetch& prefetch, [[maybe_unused]] bool one_row_steps,
                          bool steps_out_of_line = false) {
  const char* key_rows = keys.data;
  const size_t key_stride = keys.stride;
  const float* scales = keys.scales;
  const size_t row_groups = (rows + 3) / 4;
  // Only int8 rows have scales (null otherwise: no offset may be applied to it).
  const auto scales_from = [&](size_t j) { return scales != nullptr ? scales + j : nullptr; };
  // Four keys per step where 32 registers hold the 16 accumulators (one query load serves four
  // keys: int8 8%, fp16/bf16 2–8% faster, measured), except fp32 rows (measured 8% slower from
  // memory); two otherwise.
  constexpr size_t kStep = HWY_MAX_BYTES >= 64 && kType != CacheDType::kFloat32 ? 4 : 2;
  size_t j = 0;
#if HWY_TARGET != HWY_SCALAR
  if (one_row_steps) {  // rows is 1, row_lanes 4
    if constexpr (kType == CacheDType::kFloat32) {
      for (; j + 2 <= bc; j += 2) {
        const char* first = key_rows + j * key_stride;
        if (prefetch.by_line) {
          const char* later[2] = {prefetch.KeyRow(j), prefetch.KeyRow(j + 1)};
          ScoreTwoKeysOneRow<true>(d, first, key_stride, q_rows, depth, scores + j * row_lanes,
                                   later);
        } else {
          prefetch.BothRows(j);
          prefetch.BothRows(j + 1);
          ScoreTwoKeysOneRow<false>(d, first, key_stride, q_rows, depth, scores + j * row_lanes,
                                    nullptr);
        }
      }
    } else {
      for (; j + 4 <= bc; j += 4) {
        const char* first = key_rows + j * key_stride;
        if (prefetch.by_line) {
          const char* later[4] = {prefetch.KeyRow(j), prefetch.KeyRow(j + 1),
                                  prefetch.KeyRow(j + 2), prefetch.KeyRow(j + 3)};
          ScoreFourKeysOneRow<kType, true>(d, first, key_stride, scales_from(j), q_rows, depth,
                                           scores + j * row_lanes, later);
        } else {
          for (size_t k = 0; k < 4; ++k) prefetch.BothRows(j + k);
          ScoreFourKeysOneRow<kType, false>(d, first, key_stride, scales_from(j), q_rows, depth,
                                            scores + j * row_lanes, nullptr);
        }
      }
    }
  }
#endif
  if (steps_out_of_line) {
    for (; j + kStep <= bc; j += kStep) {
      ScoreStepOutOfLine<kType, kStep>(d, key_rows, key_stride, scales_from(j), q_rows, row_groups,
                                       depth, scores, row_lanes, prefetch, j);
    }
  }
  for (; j + kStep <= bc; j += kStep) {
    ScoreStep<kType, kStep>(d, key_rows, key_stride, scales_from(j), q_rows, row_groups, depth,
                            scores, row_lanes, prefetch, j);
  }
  for (; j < bc; ++j) {
    ScoreStep<kType, 1>(d, key_rows, key_stride, scales_from(j), q_rows, row_groups, depth, scores,
                        row_lanes, prefetch, j);
  }
}

// ScoreTile as a function of its own. Measured interleaved on Zen 5 (m = 32768, one thread): fp16
// and bf16 caches decode 8–9% faster with the score pass out of line, int8 5%, fp32 11% slower,
// reproducibly over rebuilds (-falign-loops=64 applies either way); what code placement changes
// in the memory-bound loop is not known. The fp32 pass stays inline.
template <CacheDType kType, class D>
HWY_NOINLINE void ScoreTileOutOfLine(D d, size_t bc, const CacheRows& keys,
                                     const float* HWY_RESTRICT q_rows, size_t rows, size_t depth,
                                     float* HWY_RESTRICT scores, size_t row_lanes,
                                     const TilePrefetch& prefetch) {
  ScoreTile<kType>(d, bc, keys, q_rows, rows, depth, scores, row_lanes, prefetch, rows == 1);
}

// Eight named vectors (accumulators) to out, out + stride, …, out + 7·stride.
template <class D, class V>
HWY_INLINE void StoreEight(D d, float* HWY_RESTRICT out, size_t stride, V x0, V x1, V x2, V x3,
                           V x4, V x5, V x6, V x7) {
  hn::Store(x0, d, out);
  hn::Store(x1, d, out + stride);
  hn::Store(x2, d, out + 2 * stride);
  hn::Store(x3, d, out + 3 * stride);
  hn::Store(x4, d, out + 4 * stride);
  hn::Store(x5, d, out + 5 * stride);
  hn::Store(x6, d, out + 6 * stride);
  hn::Store(x7, d, out + 7 * stride);
}

// Sᵀ[j, r] = Σ_t K[j, t] · Qᵀ[t, r] for kKeys keys (1 or 8) and the vector of rows r0 … r0 +
// lanes: each key element is broadcast and multiplied into its key's accumulator, rows along the
// lanes as in the prefill's Q·Kᵀ tile, so no sum crosses lanes (ScoreKeys' four-row dot products
// end in a horizontal sum per key). K as fp32 rows `key_stride` floats apart; Qᵀ (q_columns) with
// rows row_lanes apart, zero past the real rows. Eight accumulators: the multiply-add chains
// the FMA units' latency needs, and one Qᵀ load per eight broadcast multiply-adds.
template <size_t kKeys, class D>
HWY_INLINE void BroadcastScoreKeys(D d, const float* HWY_RESTRICT keys, size_t key_stride,
                                   const float* HWY_RESTRICT q_columns, size_t row_lanes, size_t r0,
                                   size_t depth, float* HWY_RESTRICT scores,
                                   const TilePrefetch* prefetch, size_t j) {
  static_assert(kKeys == 1 || kKeys == 8);
  using V = hn::Vec<D>;
  // Key k's row; unused ones point at row 0 (one key alone must not address past its tile).
  const auto row = [&](size_t k) { return kKeys == 8 ? keys + k * key_stride : keys; };
  const float *k0 = row(0), *k1 = row(1), *k2 = row(2), *k3 = row(3), *k4 = row(4), *k5 = row(5),
              *k6 = row(6), *k7 = row(7);
  V a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  V a4 = hn::Zero(d), a5 = hn::Zero(d), a6 = hn::Zero(d), a7 = hn::Zero(d);
  // The later tile's rows of these keys (prefetch: the first vector of rows only) requested one
  // key per kKeys-th of the depth, spread over the pass: the eight keys' rows requested at once,
  // before the pass, left 16-row fp32 decoding at 0.75-1.04x the ScoreKeys path where spread it
  // runs 1.17-1.30x (Zen 4).
  size_t t = 0;
  for (size_t chunk = 0; chunk < kKeys; ++chunk) {
    if (prefetch != nullptr) prefetch->BothRows(j + chunk);
    for (const size_t chunk_end = (chunk + 1) * depth / kKeys; t < chunk_end; ++t) {
      const V q = hn::Load(d, q_columns + t * row_lanes + r0);
      a0 = hn::MulAdd(hn::Set(d, k0[t]), q, a0);
      if constexpr (kKeys == 8) {
        a1 = hn::MulAdd(hn::Set(d, k1[t]), q, a1);
        a2 = hn::MulAdd(hn::Set(d, k2[t]), q, a2);
        a3 = hn::MulAdd(hn::Set(d, k3[t]), q, a3);
        a4 = hn::MulAdd(hn::Set(d, k4[t]), q, a4);
        a5 = hn::MulAdd(hn::Set(d, k5[t]), q, a5);
        a6 = hn::MulAdd(hn::Set(d, k6[t]), q, a6);
        a7 = hn::MulAdd(hn::Set(d, k7[t]), q, a7);
      }
    }
  }
  if constexpr (kKeys == 8) {
    StoreEight(d, scores + r0, row_lanes, a0, a1, a2, a3, a4, a5, a6, a7);
  } else {
    hn::Store(a0, d, scores + r0);
  }
}

// Sᵀ of a tile's bc keys for every vector of rows (BroadcastScoreKeys) from fp32 key rows — the
// cache's own, or a half-precision tile widened once (WidenTileRows) — requesting the later
// tile's whole K and V rows key by key (spread over each block's first pass), as the
// compute-bound ScoreStep does; `on_tiles` (ProductsOnTiles): by the prefill's Gemm instead, six
// keys at a time, their later rows requested before each six.
template <class D>
HWY_NOINLINE void BroadcastScoreTile(D d, size_t bc, const CacheRows& keys,
                                     const float* HWY_RESTRICT q_columns, size_t row_lanes,
                                     size_t depth, float* HWY_RESTRICT scores,
                                     const TilePrefetch& prefetch, bool on_tiles) {
  const auto* key_rows = reinterpret_cast<const float*>(keys.data);
  const size_t key_stride = keys.stride / sizeof(float), lanes = hn::Lanes(d);
  if (on_tiles) {
    for (size_t j = 0; j < bc; j += kMaxRows) {
      const size_t count = std::min(kMaxRows, bc - j);
      for (size_t k = 0; k < count; ++k) prefetch.BothRows(j + k);
      Gemm<false>(d, count, row_lanes / lanes, key_rows + j * key_stride, key_stride, 1, q_columns,
                  row_lanes, depth, scores + j * row_lanes, row_lanes);
    }
    return;
  }
  size_t j = 0;
  for (; j + 8 <= bc; j += 8) {
    for (size_t r0 = 0; r0 < row_lanes; r0 += lanes) {
      BroadcastScoreKeys<8>(d, key_rows + j * key_stride, key_stride, q_columns, row_lanes, r0,
                            depth, scores + j * row_lanes, r0 == 0 ? &prefetch : nullptr, j);
    }
  }
  for (; j < bc; ++j) {
    for (size_t r0 = 0; r0 < row_lanes; r0 += lanes) {
      BroadcastScoreKeys<1>(d, key_rows + j * key_stride, key_stride, q_columns, row_lanes, r0,
                            depth, scores + j * row_lanes, r0 == 0 ? &prefetch : nullptr, j);
    }
  }
}

// The fewest rows a key/value head that take the bf16 pairs (DecodeTask): one or two rows keep the
// fp32 products, whose softmax runs on dense keys or on 4 lanes half used, where the pairs' P
// layout needs all 4 lanes; on the pairs they read 0.80–1.00× from memory (Zen 4, one thread, 8 and
// 16 query heads over 8 of 128).
constexpr size_t kMinPairRows = 3;

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr bool kScoresOnPairs = true;

// Sᵀ of a tile's bc bf16 keys on vdpbf16ps (GemmBF16): each key row read in place as d/2 pairs of
// adjacent dimensions, broadcast against Qᵀ's pairs (q_pairs, rows row_lanes apart), the sums
// times `scale` as they are stored: half the instructions of BroadcastScoreTile's fp32
// multiply-adds, and no widened K tile. The later tile's K and V rows are requested key by key,
// one block of GemmBF16's rows at a time.
ATTN_BF16_TARGET HWY_NOINLINE void ScoresOnPairs(size_t bc, const CacheRows& keys,
                                                 const uint32_t* HWY_RESTRICT q_pairs,
                                                 size_t row_lanes, size_t depth_pairs, float scale,
                                                 float* HWY_RESTRICT scores,
                                                 const TilePrefetch& prefetch) {
  const auto* key_pairs = reinterpret_cast<const uint32_t*>(keys.data);
  const size_t key_stride = keys.stride / sizeof(uint32_t), vectors = row_lanes / 16;
  for (size_t j = 0; j < bc; j += kMaxRows) {
    const size_t count = std::min(kMaxRows, bc - j);
    for (size_t k = 0; k < count; ++k) prefetch.BothRows(j + k);
    GemmBF16<false>(count, vectors, key_pairs + j * key_stride, key_stride, 1, q_pairs, row_lanes,
                    depth_pairs, scores + j * row_lanes, row_lanes, nullptr, scale);
  }
}

// Sᵀ for kKeys keys (8 or 1) of at most 8 rows on 256-bit vdpbf16ps: one vector of Qᵀ's pairs
// (rows 0–7 of q_pairs' rows of row_lanes) per pair of dimensions, each key's pair broadcast into
// its accumulator; where row_lanes is 16 (a target whose rows take full vectors), rows 8–15 of each
// key's Sᵀ row are stored as zeros (the softmax reads them).
template <size_t kKeys>
ATTN_BF16_TARGET HWY_INLINE void EightRowScoreKeys(const uint32_t* HWY_RESTRICT key_pairs,
                                                   size_t key_stride,
                                                   const uint32_t* HWY_RESTRICT q_pairs,
                                                   size_t row_lanes, size_t depth_pairs,
                                                   __m256 scale, float* HWY_RESTRICT scores) {
  __m256 acc[kKeys];
  for (size_t k = 0; k < kKeys; ++k) acc[k] = _mm256_setzero_ps();
  for (size_t p = 0; p < depth_pairs; ++p) {
    const auto q = reinterpret_cast<__m256bh>(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q_pairs + p * row_lanes)));
    for (size_t k = 0; k < kKeys; ++k) {
      const auto key = reinterpret_cast<__m256bh>(
          _mm256_set1_epi32(static_cast<int>(key_pairs[k * key_stride + p])));
      acc[k] = _mm256_dpbf16_ps(acc[k], key, q);
    }
  }
  for (size_t k = 0; k < kKeys; ++k) {
    _mm256_storeu_ps(scores + k * row_lanes, _mm256_mul_ps(acc[k], scale));
    if (row_lanes > 8) _mm256_storeu_ps(scores + k * row_lanes + 8, _mm256_setzero_ps());
  }
}

// ScoresOnPairs for 5 to 8 rows (row_lanes 8): on 256-bit vectors, eight keys at a time.
ATTN_BF16_TARGET HWY_NOINLINE void EightRowScoresOnPairs(size_t bc, const CacheRows& keys,
                                                         const uint32_t* HWY_RESTRICT q_pairs,
                                                         size_t row_lanes, size_t depth_pairs,
                                                         float scale, float* HWY_RESTRICT scores,
                                                         const TilePrefetch& prefetch) {
  const auto* key_pairs = reinterpret_cast<const uint32_t*>(keys.data);
  const size_t key_stride = keys.stride / sizeof(uint32_t);
  const __m256 factor = _mm256_set1_ps(scale);
  size_t j = 0;
  for (; j + 8 <= bc; j += 8) {
    for (size_t k = 0; k < 8; ++k) prefetch.BothRows(j + k);
    EightRowScoreKeys<8>(key_pairs + j * key_stride, key_stride, q_pairs, row_lanes, depth_pairs,
                         factor, scores + j * row_lanes);
  }
  for (; j < bc; ++j) {
    prefetch.BothRows(j);
    EightRowScoreKeys<1>(key_pairs + j * key_stride, key_stride, q_pairs, row_lanes, depth_pairs,
                         factor, scores + j * row_lanes);
  }
}

// Sᵀ[k, r] for kKeys keys (4 or 1) and kRows rows (3 or 4) of bf16 queries on 512-bit vdpbf16ps in
// the dot-product form: each key row read in place as d/2 pairs, 16 pairs a vector, against each
// row's own pairs (q_rows: row r's bf16 query at r·depth_pairs words, which are its pairs of
// adjacent dimensions), kRows·kKeys chains of 32 products an instruction; the pairs past
// depth_pairs masked to zero. The rows' sums leave by SumFour as ScoreKeys' do, times `scale`;
// rows kRows … 3 of each key's Sᵀ row are stored as zeros (the softmax reads them). Each key's
// lines of the tile kPrefetchTiles ahead are requested as its own are read (prefetch_keys).
template <size_t kRows, size_t kKeys>
ATTN_BF16_TARGET HWY_INLINE void FourRowScoreKeys(
    const uint32_t* HWY_RESTRICT key_pairs, size_t key_stride, const uint32_t* HWY_RESTRICT q_rows,
    size_t depth_pairs, float scale, float* HWY_RESTRICT scores, const char* const* prefetch_keys) {
  static_assert(kRows >= kMinPairRows && kRows <= 4 && (kKeys == 1 || kKeys == 4));
  // Four rows of accumulators, those past kRows left zero (their scores).
  __m512 acc[4][kKeys];
  for (size_t r = 0; r < 4; ++r)
    for (size_t k = 0; k < kKeys; ++k) acc[r][k] = _mm512_setzero_ps();
  for (size_t p = 0; p < depth_pairs; p += 16) {
    const size_t left = depth_pairs - p;
    const auto mask = static_cast<__mmask16>(left >= 16 ? 0xFFFFU : (1U << left) - 1U);
    __m512bh key[kKeys];
    for (size_t k = 0; k < kKeys; ++k) {
      if (prefetch_keys[k] != nullptr) PrefetchLine<kPrefetchLevel>(prefetch_keys[k] + p * 4);
      key[k] = reinterpret_cast<__m512bh>(
          _mm512_maskz_loadu_epi32(mask, key_pairs + k * key_stride + p));
    }
    for (size_t r = 0; r < kRows; ++r) {
      const auto q =
          reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi32(mask, q_rows + r * depth_pairs + p));
      for (size_t k = 0; k < kKeys; ++k) acc[r][k] = _mm512_dpbf16_ps(acc[r][k], q, key[k]);
    }
  }
  const hn::ScalableTag<float> df;
  const hn::CappedTag<float, 4> d4;
  using V = hn::Vec<decltype(df)>;
  const auto factor = hn::Set(d4, scale);
  for (size_t k = 0; k < kKeys; ++k) {
    const auto sums = SumFour(df, V{acc[0][k]}, V{acc[1][k]}, V{acc[2][k]}, V{acc[3][k]});
    hn::StoreU(hn::Mul(sums, factor), d4, scores + 4 * k);
  }
}

// Sᵀ of a tile's bc bf16 keys for 3–4 rows (row_lanes 4) on vdpbf16ps (FourRowScoreKeys),
// four keys a step; the later tile's key rows requested line by line as these are read (the value
// pass requests its own).
template <size_t kRows>
ATTN_BF16_TARGET HWY_NOINLINE void FourRowScoresOnPairs(size_t bc, const CacheRows& keys,
                                                        const uint32_t* HWY_RESTRICT q_rows,
                                                        size_t depth_pairs, float scale,
                                                        float* HWY_RESTRICT scores,
                                                        const TilePrefetch& prefetch) {
  const auto* key_pairs = reinterpret_cast<const uint32_t*>(keys.data);
  const size_t key_stride = keys.stride / sizeof(uint32_t);
  size_t j = 0;
  for (; j + 4 <= bc; j += 4) {
    const char* const later_keys[4] = {prefetch.KeyRow(j), prefetch.KeyRow(j + 1),
                                       prefetch.KeyRow(j + 2), prefetch.KeyRow(j + 3)};
    FourRowScoreKeys<kRows, 4>(key_pairs + j * key_stride, key_stride, q_rows, depth_pairs, scale,
                               scores + 4 * j, later_keys);
  }
  for (; j < bc; ++j) {
    const char* const later_keys[1] = {prefetch.KeyRow(j)};
    FourRowScoreKeys<kRows, 1>(key_pairs + j * key_stride, key_stride, q_rows, depth_pairs, scale,
                               scores + 4 * j, later_keys);
  }
}

// Pᵀ of 8 rows a key (bc × 8 floats, back to back) as bf16 pairs of adjacent keys (⌈bc/2⌉ × 8),
// rounded to nearest even as PackProbabilityPairs does: four keys a step, a key past bc 0.
ATTN_BF16_TARGET HWY_INLINE void PackEightRowProbabilityPairs(const float* HWY_RESTRICT p,
                                                              size_t bc,
                                                              uint32_t* HWY_RESTRICT pairs) {
  // Words 0–31 hold keys j … j + 3 (8 rows each); word 2r + k of the first 8 pairs is key j + k's
  // row r, of the next 8 key j + 2 + k's.
  alignas(64) static constexpr uint16_t kFourKeys[32] = {0,  8,  1,  9,  2,  10, 3,  11, 4,  12, 5,
                                                         13, 6,  14, 7,  15, 16, 24, 17, 25, 18, 26,
                                                         19, 27, 20, 28, 21, 29, 22, 30, 23, 31};
  const __m512i order = _mm512_load_si512(kFourKeys);
  for (size_t j = 0; j < bc; j += 4) {
    const size_t left = std::min<size_t>(4, bc - j) * 8;  // floats of real keys in this step
    const auto low_mask = static_cast<__mmask16>(left >= 16 ? 0xFFFFU : (1U << left) - 1U);
    const auto high_mask = static_cast<__mmask16>(left <= 16 ? 0U : (1U << (left - 16)) - 1U);
    const __m512 low = _mm512_maskz_loadu_ps(low_mask, p + j * 8);
    const __m512 high = _mm512_maskz_loadu_ps(high_mask, p + j * 8 + 16);
    const auto both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(high, low));
    const __m512i interleaved = _mm512_permutexvar_epi16(order, both);
    if (left > 16) {
      _mm512_storeu_si512(pairs + j / 2 * 8, interleaved);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pairs + j / 2 * 8),
                          _mm512_castsi512_si256(interleaved));
    }
  }
}

// Pᵀ of up to 4 rows a key (bc × 4 floats, back to back) as bf16 pairs of adjacent keys (⌈bc/2⌉ × 4
// words), rounded to nearest even as PackProbabilityPairs does: four keys a step, a key past bc 0.
ATTN_BF16_TARGET HWY_INLINE void PackFourRowProbabilityPairs(const float* HWY_RESTRICT p, size_t bc,
                                                             uint32_t* HWY_RESTRICT pairs) {
  // Words 0–15 hold keys j … j + 3 (4 rows each); word 2r + k of the first 4 pairs is key j + k's
  // row r, of the next 4 key j + 2 + k's.
  alignas(32) static constexpr uint16_t kFourKeys[16] = {0, 4,  1, 5,  2,  6,  3,  7,
                                                         8, 12, 9, 13, 10, 14, 11, 15};
  const __m256i order = _mm256_load_si256(reinterpret_cast<const __m256i*>(kFourKeys));
  for (size_t j = 0; j < bc; j += 4) {
    const size_t left = std::min<size_t>(4, bc - j) * 4;  // floats of real keys in this step
    const auto mask = static_cast<__mmask16>(left >= 16 ? 0xFFFFU : (1U << left) - 1U);
    const auto rounded =
        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, p + j * 4)));
    const __m256i interleaved = _mm256_permutexvar_epi16(order, rounded);
    if (left > 8) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pairs + j / 2 * 4), interleaved);
    } else {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(pairs + j / 2 * 4),
                       _mm256_castsi256_si128(interleaved));
    }
  }
}

// One pair of keys (p) for InterleavedValueColumns: its two value rows' 32-column chunks (first,
// second) interleaved into NR vectors of pairs, multiplied into every row's accumulators. A
// function of its own, not a lambda: clang does not give a lambda its enclosing function's target
// attribute.
template <size_t MR, size_t NR, size_t kStride>
ATTN_BF16_TARGET HWY_INLINE void InterleavedValuePair(const uint32_t* HWY_RESTRICT p_pairs,
                                                      size_t p,
                                                      const __m512i (&first)[(NR + 1) / 2],
                                                      const __m512i (&second)[(NR + 1) / 2],
                                                      __m512i low_half, __m512i high_half,
                                                      __m512 (&acc)[MR][NR]) {
  __m512bh b[NR];
  for (size_t v = 0; v < NR; ++v) {
    b[v] = reinterpret_cast<__m512bh>(
        _mm512_permutex2var_epi16(first[v / 2], v % 2 == 0 ? low_half : high_half, second[v / 2]));
  }
  for (size_t r = 0; r < MR; ++r) {
    const auto w =
        reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(p_pairs[p * kStride + r])));
    for (size_t v = 0; v < NR; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], w, b[v]);
  }
}

// Columns [c0, c0 + 16·NR) of O = O · rescale + P V for MR rows over a tile's bc bf16 value rows:
// each pair of value rows' 32-column chunks interleaved into pairs in registers as they are loaded
// (vpermt2w, two per 32 columns and pair of keys) and used at once by every row, instead of
// written to s.value_pairs and read back (ValuesOnPairs' interleave took a seventh of an 8-row
// decode step, Zen 4). P's pairs are p_pairs (key pair p's at p·kStride + row); columns past dv
// read as 0. With `later`, the same lines of the later tile's value rows are requested as these
// are read.
template <size_t MR, size_t NR, size_t kStride>
ATTN_BF16_TARGET HWY_INLINE void InterleavedValueColumns(
    size_t bc, const char* value_rows, size_t value_stride, size_t c0, size_t dv,
    const uint32_t* HWY_RESTRICT p_pairs, float* HWY_RESTRICT output, size_t dv_padded,
    const float* HWY_RESTRICT rescale, const TilePrefetch* later) {
  constexpr size_t kChunks = (NR + 1) / 2;  // of 32 columns, one 64-byte line each
  const __m512i low_half = _mm512_load_si512(kRowInterleave);
  const __m512i high_half = _mm512_add_epi16(low_half, _mm512_set1_epi16(16));
  __mmask32 mask[kChunks];
  for (size_t c = 0; c < kChunks; ++c) {
    const size_t begin = c0 + 32 * c;
    const size_t columns = begin >= dv ? 0 : std::min<size_t>(dv - begin, 32);
    mask[c] = columns == 32 ? 0xFFFFFFFFU : (1U << columns) - 1U;
  }
  __m512 acc[MR][NR];
  for (size_t r = 0; r < MR; ++r) {
    for (size_t v = 0; v < NR; ++v) {
      acc[r][v] = _mm512_mul_ps(_mm512_loadu_ps(output + r * dv_padded + c0 + v * 16),
                                _mm512_set1_ps(rescale[r]));
    }
  }
  const char* row = value_rows + c0 * sizeof(uint16_t);
  const auto request = [later, c0](size_t key) {
    if (later == nullptr) return;
    if (const char* line = later->ValueRow(key)) {
      for (size_t c = 0; c < kChunks; ++c) PrefetchLine<kPrefetchLevel>(line + (c0 + 32 * c) * 2);
    }
  };
  __m512i first[kChunks], second[kChunks];
  size_t p = 0;
  for (; 2 * p + 2 <= bc; ++p, row += 2 * value_stride) {
    request(2 * p);
    request(2 * p + 1);
    for (size_t c = 0; c < kChunks; ++c) {
      first[c] = _mm512_maskz_loadu_epi16(mask[c], row + 64 * c);
      second[c] = _mm512_maskz_loadu_epi16(mask[c], row + value_stride + 64 * c);
    }
    InterleavedValuePair<MR, NR, kStride>(p_pairs, p, first, second, low_half, high_half, acc);
  }
  // An odd last key pairs with zeros (the row past it may hold anything, NaN included).
  if (2 * p < bc) {
    request(2 * p);
    for (size_t c = 0; c < kChunks; ++c) {
      first[c] = _mm512_maskz_loadu_epi16(mask[c], row + 64 * c);
      second[c] = _mm512_setzero_si512();
    }
    InterleavedValuePair<MR, NR, kStride>(p_pairs, p, first, second, low_half, high_half, acc);
  }
  for (size_t r = 0; r < MR; ++r) {
    for (size_t v = 0; v < NR; ++v)
      _mm512_storeu_ps(output + r * dv_padded + c0 + v * 16, acc[r][v]);
  }
}

// InterleavedValueColumns over every column block of dv_padded: blocks of as many columns as MR
// rows' accumulators leave registers for (one pass over the tile's rows per block: 64 columns for
// 3–4 rows, 32 for more), then blocks of 32 and 16.
template <size_t MR, size_t kStride = 8>
ATTN_BF16_TARGET HWY_INLINE void InterleavedValues(size_t bc, const CacheRows& values, size_t dv,
                                                   size_t dv_padded, const uint32_t* p_pairs,
                                                   float* output, const float* rescale,
                                                   const TilePrefetch* later = nullptr) {
  constexpr size_t kVectors = MR <= 4 ? 4 : 2;
  size_t c0 = 0;
  if constexpr (kVectors > 2) {
    for (; c0 + 16 * kVectors <= dv_padded; c0 += 16 * kVectors) {
      InterleavedValueColumns<MR, kVectors, kStride>(bc, values.data, values.stride, c0, dv,
                                                     p_pairs, output, dv_padded, rescale, later);
    }
  }
  for (; c0 + 32 <= dv_padded; c0 += 32) {
    InterleavedValueColumns<MR, 2, kStride>(bc, values.data, values.stride, c0, dv, p_pairs, output,
                                            dv_padded, rescale, later);
  }
  if (c0 < dv_padded) {
    InterleavedValueColumns<MR, 1, kStride>(bc, values.data, values.stride, c0, dv, p_pairs, output,
                                            dv_padded, rescale, later);
  }
}

// InterleavedValues for `rows` (3 to 8) rows, P's pairs `pairs` (row_lanes words a key pair: 4 for
// 3–4 rows, 8 for 5–8), O's rows rescaled by `rescale`.
ATTN_BF16_TARGET void InterleavedValuesOfRows(size_t rows, size_t bc, const CacheRows& values,
                                              size_t dv, size_t dv_padded, const uint32_t* pairs,
                                              float* output, const float* rescale,
                                              const TilePrefetch* later) {
  switch (rows) {
    case 3:
      return InterleavedValues<3, 4>(bc, values, dv, dv_padded, pairs, output, rescale, later);
    case 4:
      return InterleavedValues<4, 4>(bc, values, dv, dv_padded, pairs, output, rescale, later);
    case 5:
      return InterleavedValues<5>(bc, values, dv, dv_padded, pairs, output, rescale);
    case 6:
      return InterleavedValues<6>(bc, values, dv, dv_padded, pairs, output, rescale);
    case 7:
      return InterleavedValues<7>(bc, values, dv, dv_padded, pairs, output, rescale);
    default:
      return InterleavedValues<8>(bc, values, dv, dv_padded, pairs, output, rescale);
  }
}

// `count` floats of P less their bf16 rounding (nearest even), into `remainders` (whole vectors of
// 16 read and written: both hold kKeyTile rows of lanes): what P's second bf16 part rounds.
ATTN_BF16_TARGET HWY_INLINE void RoundingRemainders(const float* HWY_RESTRICT p, size_t count,
                                                    float* HWY_RESTRICT remainders) {
  for (size_t e = 0; e < count; e += 16) {
    const __m512 x = _mm512_loadu_ps(p + e);
    const __m512 hi = _mm512_cvtpbh_ps(_mm512_cvtneps_pbh(x));
    _mm512_storeu_ps(remainders + e, _mm512_sub_ps(x, hi));
  }
}

// O = O · rescale + P V (s.output, s.row_rescale) for rows [0, rows) over a tile's bc bf16 value
// rows on vdpbf16ps, as the prefill's bf16 path and PyTorch's CPU kernels compute it: P (Pᵀ in
// s.scores, bc × row_lanes floats) rounded to bf16 pairs of adjacent keys, each pair of value rows
// interleaved into pairs of one column's two entries (once per tile, for every row), the sums in
// fp32. Where s.split_probabilities (bfloat16_probabilities.hpp), P·V is taken again over P's
// rounding remainders, rounded to bf16 in turn: P within 2⁻¹⁶ instead of 2⁻⁸.
ATTN_BF16_TARGET HWY_NOINLINE void ValuesOnPairs(size_t bc, const CacheRows& values, size_t dv,
                                                 size_t dv_padded, size_t row_lanes, size_t rows,
                                                 DecodeScratch& s, const TilePrefetch& prefetch) {
  const bool split = s.split_probabilities;
  uint32_t* lo_pairs = s.probability_pairs + kKeyTile / 2 * row_lanes;
  if (split) RoundingRemainders(s.scores, hwy::RoundUpTo(bc * row_lanes, 16), s.remainders);
  if (row_lanes == 4 || row_lanes == 8) {
    // 3–4 rows: likewise, P's pairs 4 words a key pair; memory-bound, so this pass requests the
    // later tile's value lines as it reads its own (from the score pass instead, 0.73–0.79x, Zen
    // 4). 5 to 8 rows: the value rows interleaved in registers.
    if (row_lanes == 4) {
      PackFourRowProbabilityPairs(s.scores, bc, s.probability_pairs);
      if (split) PackFourRowProbabilityPairs(s.remainders, bc, lo_pairs);
    } else {
      PackEightRowProbabilityPairs(s.scores, bc, s.probability_pairs);
      if (split) PackEightRowProbabilityPairs(s.remainders, bc, lo_pairs);
    }
    InterleavedValuesOfRows(rows, bc, values, dv, dv_padded, s.probability_pairs, s.output,
                            s.row_rescale, &prefetch);
    if (split) {  // (the value rows from L1 again, the rescale applied already)
      InterleavedValuesOfRows(rows, bc, values, dv, dv_padded, lo_pairs, s.output, s.ones, nullptr);
    }
    return;
  }
  const size_t pairs = (bc + 1) / 2;
  for (size_t p = 0; p < pairs; ++p) {
    const char* first = values.data + 2 * p * values.stride;
    const char* second = 2 * p + 1 < bc ? first + values.stride : nullptr;
    InterleaveRowPairs(reinterpret_cast<const uint16_t*>(first),
                       reinterpret_cast<const uint16_t*>(second), dv, dv_padded,
                       s.value_pairs + p * dv_padded);
  }
  PackProbabilityPairs(s.scores, bc, row_lanes, row_lanes, s.probability_pairs);
  GemmBF16<true>(rows, dv_padded / 16, s.probability_pairs, 1, row_lanes, s.value_pairs, dv_padded,
                 pairs, s.output, dv_padded, s.row_rescale);
  if (split) {
    PackProbabilityPairs(s.remainders, bc, row_lanes, row_lanes, lo_pairs);
    GemmBF16<true>(rows, dv_padded / 16, lo_pairs, 1, row_lanes, s.value_pairs, dv_padded, pairs,
                   s.output, dv_padded, nullptr);
  }
}
#else
constexpr bool kScoresOnPairs = false;
// Never called (kScoresOnPairs is false): this target has no vdpbf16ps.
inline void ScoresOnPairs(size_t, const CacheRows&, const uint32_t*, size_t, size_t, float, float*,
                          const TilePrefetch&) {}
inline void EightRowScoresOnPairs(size_t, const CacheRows&, const uint32_t*, size_t, size_t, float,
                                  float*, const TilePrefetch&) {}
template <size_t kRows>
inline void FourRowScoresOnPairs(size_t, const CacheRows&, const uint32_t*, size_t, float, float*,
                                 const TilePrefetch&) {}
inline void ValuesOnPairs(size_t, const CacheRows&, size_t, size_t, size_t, size_t, DecodeScratch&,
                          const TilePrefetch&) {}
#endif

// The value loops below keep their accumulators and converted rows in named vectors: GCC 12 put
// arrays of vectors (V acc[4][4], V value[4]) on the stack in some instantiations and read every
// FMA's operand back from it (measured: fp16 decode 1.5× slower).

// acc_i += w_i · value for the accumulators of two or four output rows (named vectors, by
// reference: inlined, they stay in registers).
template <class V>
HWY_INLINE void MulAddRows(V value, V w0, V w1, V& acc0, V& acc1) {
  acc0 = hn::MulAdd(w0, value, acc0);
  acc1 = hn::MulAdd(w1, value, acc1);
}
template <class V>
HWY_INLINE void MulAddRows(V value, V w0, V w1, V w2, V w3, V& acc0, V& acc1, V& acc2, V& acc3) {
  MulAddRows(value, w0, w1, acc0, acc1);
  MulAddRows(value, w2, w3, acc2, acc3);
}

// Columns [c0, c0 + kVectors·lanes) of four output rows r0 … r0 + 3 (kVectors ≤ 4): O[r] =
// O[r] · rescale[r] + Σ_j P[j, r] · v_j, the accumulators in registers while the tile's value
// rows stream past, converted in registers. The rescale is applied as the accumulators load.
template <CacheDType kType, size_t kVectors, bool kByLine, class D>
HWY_INLINE void AccumulateColumns(D d, size_t bc, const char* value_rows, size_t value_stride,
                                  const float* HWY_RESTRICT p, size_t row_lanes, size_t r0,
                                  size_t c0, float* HWY_RESTRICT output, size_t dv_padded,
                                  const float* HWY_RESTRICT rescale, const TilePrefetch* prefetch) {
  static_assert(kVectors >= 1 && kVectors <= 4);
  constexpr size_t kElement = cache_dtype_size(kType);
  using V = hn::Vec<D>;
  const size_t lanes = hn::Lanes(d);
  float* out0 = output + r0 * dv_padded + c0;
  float* out1 = out0 + dv_padded;
  float* out2 = out1 + dv_padded;
  float* out3 = out2 + dv_padded;
  const V f0 = hn::Set(d, rescale[r0]), f1 = hn::Set(d, rescale[r0 + 1]),
          f2 = hn::Set(d, rescale[r0 + 2]), f3 = hn::Set(d, rescale[r0 + 3]);
  // Accumulator (row i, vector v) is named by row letter and vector digit; unused ones vanish.
  const auto start = [&](float* out, size_t v, V factor) {
    return v < kVectors ? hn::Mul(hn::Load(d, out + v * lanes), factor) : hn::Zero(d);
  };
  V a0 = start(out0, 0, f0), a1 = start(out0, 1, f0), a2 = start(out0, 2, f0),
    a3 = start(out0, 3, f0);
  V b0 = start(out1, 0, f1), b1 = start(out1, 1, f1), b2 = start(out1, 2, f1),
    b3 = start(out1, 3, f1);
  V c0v = start(out2, 0, f2), c1 = start(out2, 1, f2), c2 = start(out2, 2, f2),
    c3 = start(out2, 3, f2);
  V e0 = start(out3, 0, f3), e1 = start(out3, 1, f3), e2 = start(out3, 2, f3),
    e3 = start(out3, 3, f3);
  for (size_t j = 0; j < bc; ++j) {
    const char* row = value_rows + j * value_stride;
    const float* pj = p + j * row_lanes + r0;
    const V w0 = hn::Set(d, pj[0]), w1 = hn::Set(d, pj[1]), w2 = hn::Set(d, pj[2]),
            w3 = hn::Set(d, pj[3]);
    if constexpr (kByLine) {
      const char* later = prefetch->ValueRow(j);
      for (size_t v = 0; v < kVectors; ++v) PrefetchOnNewLine<kElement>(later, c0 + v * lanes);
    }
    MulAddRows(LoadCacheVector<kType>(d, row, c0), w0, w1, w2, w3, a0, b0, c0v, e0);
    if constexpr (kVectors >= 2)
      MulAddRows(LoadCacheVector<kType>(d, row, c0 + lanes), w0, w1, w2, w3, a1, b1, c1, e1);
    if constexpr (kVectors >= 3)
      MulAddRows(LoadCacheVector<kType>(d, row, c0 + 2 * lanes), w0, w1, w2, w3, a2, b2, c2, e2);
    if constexpr (kVectors >= 4)
      MulAddRows(LoadCacheVector<kType>(d, row, c0 + 3 * lanes), w0, w1, w2, w3, a3, b3, c3, e3);
  }
  const auto finish = [&](float* out, V x0, V x1, V x2, V x3) {
    hn::Store(x0, d, out);
    if constexpr (kVectors >= 2) hn::Store(x1, d, out + lanes);
    if constexpr (kVectors >= 3) hn::Store(x2, d, out + 2 * lanes);
    if constexpr (kVectors >= 4) hn::Store(x3, d, out + 3 * lanes);
  };
  finish(out0, a0, a1, a2, a3);
  finish(out1, b0, b1, b2, b3);
  finish(out2, c0v, c1, c2, c3);
  finish(out3, e0, e1, e2, e3);
}

// Whether a tile's value pass reads whole value rows (AccumulateRowPair): memory-bound fp32 tiles
// (one group of four rows) whose value rows are eight full-width vectors (AVX-512, dv = 128). More
// rows make the tile compute-bound, where four rows per loaded vector need fewer loads per FMA.
template <CacheDType kType>
constexpr bool ReadsWholeValueRows(size_t rows, size_t dv, size_t full_lanes) {
  return HWY_MAX_BYTES >= 64 && kType == CacheDType::kFloat32 && rows <= 4 && dv / full_lanes == 8;
}

#if HWY_TARGET != HWY_SCALAR
// Two output rows r0, r0 + 1 over whole value rows of eight vectors (AVX-512, dv = 128): the
// tile's value rows are read in order, each whole, as memory streams best — four rows × half a
// row made two strided passes over the tile (measured on one core: 21 against 32 GB/s). The
// second pair's pass finds the tile in the cache.
template <CacheDType kType, bool kByLine, class D>
HWY_INLINE void AccumulateRowPair(D d, size_t bc, const char* value_rows, size_t value_stride,
                                  const float* HWY_RESTRICT p, size_t row_lanes, size_t r0,
                                  float* HWY_RESTRICT output, size_t dv_padded,
                                  const float* HWY_RESTRICT rescale, const TilePrefetch* prefetch) {
  using V = hn::Vec<D>;
  constexpr size_t kElement = cache_dtype_size(kType);
  const size_t lanes = hn::Lanes(d);
  float* out0 = output + r0 * dv_padded;
  float* out1 = out0 + dv_padded;
  const V f0 = hn::Set(d, rescale[r0]), f1 = hn::Set(d, rescale[r0 + 1]);
  // Vector v of a row's accumulator, rescaled as it loads.
  const auto start = [&](const float* out, size_t v, V factor) {
    return hn::Mul(hn::Load(d, out + v * lanes), factor);
  };
  V a0 = start(out0, 0, f0), a1 = start(out0, 1, f0), a2 = start(out0, 2, f0),
    a3 = start(out0, 3, f0), a4 = start(out0, 4, f0), a5 = start(out0, 5, f0),
    a6 = start(out0, 6, f0), a7 = start(out0, 7, f0);
  V b0 = start(out1, 0, f1), b1 = start(out1, 1, f1), b2 = start(out1, 2, f1),
    b3 = start(out1, 3, f1), b4 = start(out1, 4, f1), b5 = start(out1, 5, f1),
    b6 = start(out1, 6, f1), b7 = start(out1, 7, f1);
  for (size_t j = 0; j < bc; ++j) {
    const char* row = value_rows + j * value_stride;
    const char* later = kByLine ? prefetch->ValueRow(j) : nullptr;
    const V w0 = hn::Set(d, p[j * row_lanes + r0]), w1 = hn::Set(d, p[j * row_lanes + r0 + 1]);
    if constexpr (kByLine) {
      PrefetchOnNewLine<kElement>(later, 0);
      PrefetchOnNewLine<kElement>(later, lanes);
      PrefetchOnNewLine<kElement>(later, 2 * lanes);
      PrefetchOnNewLine<kElement>(later, 3 * lanes);
    }
    const V v0 = LoadCacheVector<kType>(d, row, 0), v1 = LoadCacheVector<kType>(d, row, lanes),
            v2 = LoadCacheVector<kType>(d, row, 2 * lanes),
            v3 = LoadCacheVector<kType>(d, row, 3 * lanes);
    MulAddRows(v0, w0, w1, a0, b0);
    MulAddRows(v1, w0, w1, a1, b1);
    MulAddRows(v2, w0, w1, a2, b2);
    MulAddRows(v3, w0, w1, a3, b3);
    if constexpr (kByLine) {
      PrefetchOnNewLine<kElement>(later, 4 * lanes);
      PrefetchOnNewLine<kElement>(later, 5 * lanes);
      PrefetchOnNewLine<kElement>(later, 6 * lanes);
      PrefetchOnNewLine<kElement>(later, 7 * lanes);
    }
    const V v4 = LoadCacheVector<kType>(d, row, 4 * lanes),
            v5 = LoadCacheVector<kType>(d, row, 5 * lanes),
            v6 = LoadCacheVector<kType>(d, row, 6 * lanes),
            v7 = LoadCacheVector<kType>(d, row, 7 * lanes);
    MulAddRows(v4, w0, w1, a4, b4);
    MulAddRows(v5, w0, w1, a5, b5);
    MulAddRows(v6, w0, w1, a6, b6);
    MulAddRows(v7, w0, w1, a7, b7);
  }
  StoreEight(d, out0, lanes, a0, a1, a2, a3, a4, a5, a6, a7);
  StoreEight(d, out1, lanes, b0, b1, b2, b3, b4, b5, b6, b7);
}
#endif

#if HWY_TARGET != HWY_SCALAR
// Columns [c0, c0 + kVectors·lanes) of one output row (G·n = 1; kVectors ≤ 8): O = O · rescale +
// Σ_j P[j, 0] · v_j, each value row's vectors read once, in order. With kVectors ≤ 4 the even and
// odd keys sum apart (added at the end), so 8 multiply-add chains run as the FMA units' latency
// needs. The four-row form computed three padding rows besides (4× the multiply-adds).
template <CacheDType kType, size_t kVectors, bool kByLine, class D>
HWY_INLINE void AccumulateColumnsOneRow(D d, size_t bc, const char* value_rows, size_t value_stride,
                                        const float* HWY_RESTRICT p, size_t row_lanes, size_t c0,
                                        float* HWY_RESTRICT out, float rescale,
                                        const TilePrefetch* prefetch) {
  static_assert(kVectors >= 1 && kVectors <= 8);
  constexpr size_t kElement = cache_dtype_size(kType);
  constexpr bool kTwoSums = kVectors <= 4;
  using V = hn::Vec<D>;
  const size_t lanes = hn::Lanes(d);
  out += c0;
  const V factor = hn::Set(d, rescale);
  const auto start = [&](size_t v) {
    return v < kVectors ? hn::Mul(hn::Load(d, out + v * lanes), factor) : hn::Zero(d);
  };
  V a0 = start(0), a1 = start(1), a2 = start(2), a3 = start(3), a4 = start(4), a5 = start(5),
    a6 = start(6), a7 = start(7);
  V b0 = hn::Zero(d), b1 = hn::Zero(d), b2 = hn::Zero(d), b3 = hn::Zero(d);
  // acc_v += w · vector v of `row`, for the accumulators a (or b) of the row's vectors.
  const auto add_row = [&](size_t j, V& x0, V& x1, V& x2, V& x3) HWY_ATTR {
    const char* row = value_rows + j * value_stride;
    if constexpr (kByLine) {
      const char* later = prefetch->ValueRow(j);
      for (size_t v = 0; v < kVectors; ++v) PrefetchOnNewLine<kElement>(later, c0 + v * lanes);
    }
    const V w = hn::Set(d, p[j * row_lanes]);
    x0 = hn::MulAdd(w, LoadCacheVector<kType>(d, row, c0), x0);
    if constexpr (kVectors >= 2) x1 = hn::MulAdd(w, LoadCacheVector<kType>(d, row, c0 + lanes), x1);
    if constexpr (kVectors >= 3)
      x2 = hn::MulAdd(w, LoadCacheVector<kType>(d, row, c0 + 2 * lanes), x2);
    if constexpr (kVectors >= 4)
      x3 = hn::MulAdd(w, LoadCacheVector<kType>(d, row, c0 + 3 * lanes), x3);
    if constexpr (kVectors >= 5)
      a4 = hn::MulAdd(w, LoadCacheVector<kType>(d, row, c0 + 4 * lanes), a4);
    if constexpr (kVectors >= 6)
      a5 = hn::MulAdd(w, LoadCacheVector<kType>(d, row, c0 + 5 * lanes), a5);
    if constexpr (kVectors >= 7)
      a6 = hn::MulAdd(w, LoadCacheVector<kType>(d, row, c0 + 6 * lanes), a6);
    if constexpr (kVectors >= 8)
      a7 = hn::MulAdd(w, LoadCacheVector<kType>(d, row, c0 + 7 * lanes), a7);
  };
  size_t j = 0;
  if constexpr (kTwoSums) {
    for (; j + 2 <= bc; j += 2) {
      add_row(j, a0, a1, a2, a3);
      add_row(j + 1, b0, b1, b2, b3);
    }
  }
  for (; j < bc; ++j) add_row(j, a0, a1, a2, a3);
  const V sums[8] = {
      hn::Add(a0, b0), hn::Add(a1, b1), hn::Add(a2, b2), hn::Add(a3, b3), a4, a5, a6, a7};
  for (size_t v = 0; v < kVectors; ++v) hn::Store(sums[v], d, out + v * lanes);
}

// Every whole vector of columns of the one output row: AccumulateColumnsOneRow over up to 8
// vectors at a time (the value rows of dv = 128 whole on AVX-512, 64 on AVX2).
template <CacheDType kType, bool kByLine, class D>
HWY_INLINE void AccumulateOneRow(D d, size_t bc, const char* value_rows, size_t value_stride,
                                 const float* HWY_RESTRICT p, size_t row_lanes, size_t full_vectors,
                                 float* HWY_RESTRICT out, float rescale,
                                 const TilePrefetch* prefetch) {
  const size_t lanes = hn::Lanes(d);
  for (size_t v0 = 0; v0 < full_vectors; v0 += 8) {
    const size_t c0 = v0 * lanes;
    const auto run = [&](auto vectors) HWY_ATTR {
      AccumulateColumnsOneRow<kType, decltype(vectors)::value, kByLine>(
          d, bc, value_rows, value_stride, p, row_lanes, c0, out, rescale, prefetch);
    };
    WithStaticCount<8>(std::min<size_t>(8, full_vectors - v0), run);
  }
}
#endif

// AccumulateColumns with or without the first pass's prefetch requests (a function, not a lambda,
// as ScoreStep).
template <CacheDType kType, size_t kVectors, class D>
HWY_INLINE void ValueColumns(D d, size_t bc, const char* value_rows, size_t value_stride,
                             const float* HWY_RESTRICT p, size_t row_lanes, size_t r0, size_t c0,
                             float* HWY_RESTRICT output, size_t dv_padded,
                             const float* HWY_RESTRICT rescale, bool first_pass,
                             const TilePrefetch& prefetch) {
  if (first_pass) {
    AccumulateColumns<kType, kVectors, true>(d, bc, value_rows, value_stride, p, row_lanes, r0, c0,
                                             output, dv_padded, rescale, &prefetch);
  } else {
    AccumulateColumns<kType, kVectors, false>(d, bc, value_rows, value_stride, p, row_lanes, r0, c0,
                                              output, dv_padded, rescale, nullptr);
  }
}

// O[r] = O[r] · rescale[r] + Σ_j P[j, r] · v_j over the tile's bc value rows (P: Pᵀ, rows
// row_lanes apart, a multiple of 4 — or 1 for one row's dense P, whose value rows are then whole
// vectors; int8 rows' scales folded into P first), for the rows rounded
// up to 4 (the padding rows, zero queries, are computed and discarded; one row alone has its own
// loops, AccumulateOneRow, for its whole vectors of columns). A last partial vector of
// columns goes through a small buffer, so no row is read past its end.
template <CacheDType kType, class D>
HWY_INLINE void AccumulateValues(D d, size_t bc, const CacheRows& values, float* HWY_RESTRICT p,
                                 size_t row_lanes, size_t rows, size_t dv,
                                 float* HWY_RESTRICT output, size_t dv_padded,
                                 const float* HWY_RESTRICT rescale, const TilePrefetch& prefetch) {
  using V = hn::Vec<D>;
  const char* value_rows = values.data;
  const size_t value_stride = values.stride;
  const float* scales = values.scales;
  constexpr size_t kColumnVectors = HWY_MAX_BYTES >= 64 ? 4 : 2;  // 16 or 8 accumulators
  const size_t lanes = hn::Lanes(d), full_vectors = dv / lanes;
  const size_t padded_rows = hwy::RoundUpTo(rows, 4);
  if constexpr (kType == CacheDType::kInt8) {
    // The rows read below: one row's dense P (row_lanes 1) has no padding rows beside it.
    const size_t scaled_rows = row_lanes == 1 ? 1 : padded_rows;
    for (size_t j = 0; j < bc; ++j)
      for (size_t r = 0; r < scaled_rows; ++r) p[j * row_lanes + r] *= scales[j];
  }
  for (size_t r0 = 0; r0 < padded_rows; r0 += 4) {
    // The first pass over the tile's value rows requests the later tile's; the others find the
    // tile in the cache.
    const bool first_pass = prefetch.by_line && r0 == 0;
    size_t v0 = 0;
#if HWY_TARGET != HWY_SCALAR
    if (rows == 1) {
      if (first_pass) {
        AccumulateOneRow<kType, true>(d, bc, value_rows, value_stride, p, row_lanes, full_vectors,
                                      output, rescale[0], &prefetch);
      } else {
        AccumulateOneRow<kType, false>(d, bc, value_rows, value_stride, p, row_lanes, full_vectors,
                                       output, rescale[0], nullptr);
      }
      v0 = full_vectors;
    }
    if constexpr (HWY_MAX_BYTES >= 64 && kType == CacheDType::kFloat32) {
      if (rows > 1 && ReadsWholeValueRows<kType>(rows, dv, lanes)) {
        if (first_pass) {
          AccumulateRowPair<kType, true>(d, bc, value_rows, value_stride, p, row_lanes, 0, output,
                                         dv_padded, rescale, &prefetch);
        } else {
          AccumulateRowPair<kType, false>(d, bc, value_rows, value_stride, p, row_lanes, 0, output,
                                          dv_padded, rescale, nullptr);
        }
        AccumulateRowPair<kType, false>(d, bc, value_rows, value_stride, p, row_lanes, 2, output,
                                        dv_padded, rescale, nullptr);
        v0 = full_vectors;
      }
    }
#endif
    for (; v0 + kColumnVectors <= full_vectors; v0 += kColumnVectors) {
      ValueColumns<kType, kColumnVectors>(d, bc, value_rows, value_stride, p, row_lanes, r0,
                                          v0 * lanes, output, dv_padded, rescale, first_pass,
                                          prefetch);
    }
    for (; v0 < full_vectors; ++v0) {
      ValueColumns<kType, 1>(d, bc, value_rows, value_stride, p, row_lanes, r0, v0 * lanes, output,
                             dv_padded, rescale, first_pass, prefetch);
    }
    if (full_vectors * lanes < dv) {  // the last columns, fewer than a vector
      const size_t c0 = full_vectors * lanes;
      for (size_t i = 0; i < 4; ++i) {  // rescaled once, before the tile's rows add to them
        float* out = output + (r0 + i) * dv_padded + c0;
        hn::Store(hn::Mul(hn::Load(d, out), hn::Set(d, rescale[r0 + i])), d, out);
      }
      HWY_ALIGN float tail[hn::MaxLanes(D())] = {};
      for (size_t j = 0; j < bc; ++j) {
        const char* row = value_rows + j * value_stride;
        for (size_t c = 0; c < lanes; ++c)
          tail[c] = c0 + c < dv ? CacheElement<kType>(row, c0 + c) : 0.0F;
        const V value = hn::Load(d, tail);
        for (size_t i = 0; i < 4; ++i) {
          float* out = output + (r0 + i) * dv_padded + c0;
          const V weight = hn::Set(d, p[j * row_lanes + r0 + i]);
          hn::Store(hn::MulAdd(weight, value, hn::Load(d, out)), d, out);
        }
      }
    }
  }
}

// One key tile's online-softmax step on Sᵀ (bc × R, masked scores in, Pᵀ out), lane-wise over the
// rows, one vector of rows at a time: new max, rescale exp(old − new), P = exp(S − max), sums.
template <class D>
void DecodeSoftmaxStep(D d, size_t bc, size_t row_lanes, DecodeScratch& s) {
  using V = hn::Vec<D>;
  const size_t lanes = hn::Lanes(d);
  const V minus_infinity = hn::Set(d, -std::numeric_limits<float>::infinity());
  for (size_t r = 0; r < row_lanes; r += lanes) {
    V row_max = hn::Load(d, s.row_max + r);
    for (size_t j = 0; j < bc; ++j)
      row_max = hn::Max(row_max, hn::Load(d, s.scores + j * row_lanes + r));
    // A row that has seen only −∞ subtracts 0, so exp(−∞ − 0) = 0 instead of NaN.
    const V shift = hn::IfThenZeroElse(hn::Eq(row_max, minus_infinity), row_max);
    const V rescale = SoftmaxExp(d, hn::Sub(hn::Load(d, s.row_max + r), shift));
    hn::Store(rescale, d, s.row_rescale + r);
    hn::Store(row_max, d, s.row_max + r);
    V sum = hn::Zero(d);
    for (size_t j = 0; j < bc; ++j) {
      float* score = s.scores + j * row_lanes + r;
      const V p = SoftmaxExp(d, hn::Sub(hn::Load(d, score), shift));
      hn::Store(p, d, score);
      sum = hn::Add(sum, p);
    }
    hn::Store(hn::MulAdd(hn::Load(d, s.row_sum + r), rescale, sum), d, s.row_sum + r);
  }
}

#if HWY_TARGET != HWY_SCALAR
// DecodeSoftmaxStep for exactly 4 rows (one query per head of a group of 4, the commonest decode
// shape): Sᵀ's bc × 4 scores are contiguous, so full-width vectors hold 4 keys × 4 rows and the
// exponentials run at full width instead of 4 lanes; per-row max and sum fold the 128-bit blocks.
template <class D>
void DecodeSoftmaxStepFourRows(D d, size_t bc, DecodeScratch& s) {
  using V = hn::Vec<D>;
  const hn::CappedTag<float, 4> d4;
  const size_t lanes = hn::Lanes(d);
  const size_t total = bc * 4, padded = hwy::RoundUpTo(total, lanes);
  const float minus_infinity = -std::numeric_limits<float>::infinity();
  // Lanes past the tile's keys take part as −∞: no effect on the max, exp 0 in the sum.
  std::fill(s.scores + total, s.scores + padded, minus_infinity);
  V tile_max = hn::Set(d, minus_infinity);
  for (size_t i = 0; i < padded; i += lanes)
    tile_max = hn::Max(tile_max, hn::Load(d, s.scores + i));
  const auto old_max = hn::Load(d4, s.row_max);
  const auto row_max = hn::Max(old_max, FoldBlocks(d, tile_max, kVectorMax));
  // A row that has seen only −∞ subtracts 0, so exp(−∞ − 0) = 0 instead of NaN.
  const auto shift4 = hn::IfThenZeroElse(hn::Eq(row_max, hn::Set(d4, minus_infinity)), row_max);
  const auto rescale = SoftmaxExp(d4, hn::Sub(old_max, shift4));
  hn::Store(rescale, d4, s.row_rescale);
  hn::Store(row_max, d4, s.row_max);
  HWY_ALIGN float shift_block[4];
  hn::Store(shift4, d4, shift_block);
  const V shift = hn::LoadDup128(d, shift_block);
  V sum = hn::Zero(d);
  for (size_t i = 0; i < padded; i += lanes) {
    const V p = SoftmaxExp(d, hn::Sub(hn::Load(d, s.scores + i), shift));
    hn::Store(p, d, s.scores + i);
    sum = hn::Add(sum, p);
  }
  hn::Store(hn::MulAdd(hn::Load(d4, s.row_sum), rescale, FoldBlocks(d, sum, kVectorSum)), d4,
            s.row_sum);
}
#endif

// Σ x·0 over the scores ScoreTile wrote (rows [0, scored_rows) of each of bc keys, rows row_lanes
// apart): NaN where any is NaN or ±∞, else 0, folded to 4 lanes. In four independent sums over
// full vectors where the rows fill each key's lanes: one 4-lane multiply-add per key, each waiting
// on the last, took a sixth of a one-row decode step at d = 32 (Zen 5).
template <class D>
HWY_INLINE hn::Vec<hn::CappedTag<float, 4>> ProbeScores([[maybe_unused]] D d,
                                                        const float* HWY_RESTRICT scores, size_t bc,
                                                        size_t scored_rows, size_t row_lanes) {
  const hn::CappedTag<float, 4> d4;
#if HWY_TARGET != HWY_SCALAR
  if (scored_rows == row_lanes) {  // the tile's scores back to back
    const size_t lanes = hn::Lanes(d), total = bc * row_lanes;
    const auto zero = hn::Zero(d);
    auto p0 = zero, p1 = zero, p2 = zero, p3 = zero;
    size_t i = 0;
    for (; i + 4 * lanes <= total; i += 4 * lanes) {
      p0 = hn::MulAdd(hn::LoadU(d, scores + i), zero, p0);
      p1 = hn::MulAdd(hn::LoadU(d, scores + i + lanes), zero, p1);
      p2 = hn::MulAdd(hn::LoadU(d, scores + i + 2 * lanes), zero, p2);
      p3 = hn::MulAdd(hn::LoadU(d, scores + i + 3 * lanes), zero, p3);
    }
    auto tail = FoldBlocks(d, hn::Add(hn::Add(p0, p1), hn::Add(p2, p3)), kVectorSum);
    for (; i < total; i += 4) tail = hn::MulAdd(hn::LoadU(d4, scores + i), hn::Zero(d4), tail);
    return tail;
  }
#endif
  auto probe = hn::Zero(d4);
  for (size_t j = 0; j < bc; ++j) {
    for (size_t r = 0; r < scored_rows; r += hn::Lanes(d4))
      probe = hn::MulAdd(hn::LoadU(d4, scores + j * row_lanes + r), hn::Zero(d4), probe);
  }
  return probe;
}

#if HWY_TARGET != HWY_SCALAR
// DecodeSoftmaxStepFourRows for one row (multi-head attention's one new token) in the four-row
// layout's lanes r = 0: its scores gathered from every fourth float of Sᵀ into s.probabilities
// (two ConcatEven steps per four vectors), so that the exponentials run over full vectors of keys
// rather than over three padding rows besides (a fifth of a one-row decode step at d = 32, Zen 5).
// The padding rows' state is left as it was: their output is never read.
template <class D>
void DecodeSoftmaxStepOneRow(D d, size_t bc, DecodeScratch& s) {
  using V = hn::Vec<D>;
  const size_t lanes = hn::Lanes(d);
  const size_t padded = hwy::RoundUpTo(bc, lanes);
  const float minus_infinity = -std::numeric_limits<float>::infinity();
  // Keys past the tile's take part as −∞: no effect on the max, exp 0 in the sum.
  std::fill(s.scores + 4 * bc, s.scores + 4 * padded, minus_infinity);
  V tile_max = hn::Set(d, minus_infinity);
  for (size_t j = 0; j < padded; j += lanes) {
    const float* block = s.scores + 4 * j;  // keys j … j + lanes − 1, four rows each
    const V low = hn::ConcatEven(d, hn::Load(d, block + lanes), hn::Load(d, block));
    const V high =
        hn::ConcatEven(d, hn::Load(d, block + 3 * lanes), hn::Load(d, block + 2 * lanes));
    const V row = hn::ConcatEven(d, high, low);
    hn::Store(row, d, s.probabilities + j);
    tile_max = hn::Max(tile_max, row);
  }
  const float old_max = s.row_max[0];
  const float row_max = std::max(old_max, hn::GetLane(hn::MaxOfLanes(d, tile_max)));
  // A row that has seen only −∞ subtracts 0, so exp(−∞ − 0) = 0 instead of NaN.
  const float shift = row_max == minus_infinity ? 0.0F : row_max;
  const float rescale = hn::GetLane(SoftmaxExp(d, hn::Set(d, old_max - shift)));
  V sum = hn::Zero(d);
  for (size_t j = 0; j < padded; j += lanes) {
    const V p = SoftmaxExp(d, hn::Sub(hn::Load(d, s.probabilities + j), hn::Set(d, shift)));
    hn::Store(p, d, s.probabilities + j);
    sum = hn::Add(sum, p);
  }
  s.row_max[0] = row_max;
  s.row_rescale[0] = rescale;
  s.row_sum[0] = s.row_sum[0] * rescale + hn::GetLane(hn::SumOfLanes(d, sum));
}
#endif

// The mask's entries for a tile's Sᵀ (bc keys from key0 × row_lanes rows; row r < rows is query
// r % n of head first_head + r / n of sequence b), added as AddedScore says (a bool entry 0 hides
// the key). An entry at a time: a decoding tile has few rows, and the key and value rows it reads
// cost far more (n = 1, m = 4096, d = 64: the prefill kernel, which computed 16 query lanes for the
// one query, took 2.6× this kernel's time with such a mask).
template <class Entry>
void AddMaskEntriesToRows(const ScoreMask& mask, int64_t b, int64_t first_head, int64_t n,
                          size_t rows, int64_t key0, size_t bc, size_t row_lanes,
                          float* HWY_RESTRICT scores) {
  for (size_t r = 0; r < rows; ++r) {
    const int64_t h = first_head + static_cast<int64_t>(r) / n, i = static_cast<int64_t>(r) % n;
    const Entry* entries = static_cast<const Entry*>(mask.data) + mask.offset(b, h, i, key0);
    for (size_t j = 0; j < bc; ++j) {
      scores[j * row_lanes + r] += AddedScore(entries[static_cast<int64_t>(j) * mask.col_stride]);
    }
  }
}

// The mask's coverage of keys key0 … key0 + bc − 1 for all n queries of each of `heads` query
// heads from first_head on (one head where the mask broadcasts over them), as mask_coverage
// gives it for one head: kNone where it hides them from every row, kAll where a bool mask lets
// every row see them all, kSome otherwise.
inline MaskCoverage GroupMaskCoverage(const ScoreMask& mask, int64_t b, int64_t first_head,
                                      int64_t heads, int64_t n, int64_t key0, size_t bc) {
  const int64_t distinct = mask.head_stride == 0 ? 1 : heads;
  const MaskCoverage first =
      mask_coverage(mask, b, first_head, 0, static_cast<size_t>(n), key0, bc);
  for (int64_t h = first_head + 1; h < first_head + distinct; ++h) {
    if (first == MaskCoverage::kSome) break;
    if (mask_coverage(mask, b, h, 0, static_cast<size_t>(n), key0, bc) != first)
      return MaskCoverage::kSome;
  }
  return first;
}

// Whether a task widens each tile of its fp16 K and V rows to floats once (WidenTileRows) and runs
// the fp32 products on them: with more than four rows a key/value head (grouped heads times new
// queries), ScoreKeys and AccumulateColumns convert each element once per group of four rows.
// AVX2 only, fp16 only, where it was measured (Zen 1, one thread, 32 query heads over 8 of 128):
// four queries 1.12–1.13x faster, one query (four rows: not widened) level; bf16, whose widening
// is a shift, was level (0.998–1.009x) and keeps its own steps. On AVX-512 (Zen 4, 16–64 rows,
// the scores on BroadcastScoreTile) widening the V tiles of fp16 and bf16 too measured 0.94–1.02x.
inline bool WidensTiles(CacheDType dtype, size_t row_lanes) {
  return HWY_MAX_BYTES == 32 && row_lanes > 4 && dtype == CacheDType::kFloat16;
}

// Whether a task scores its tiles with the rows along the lanes (BroadcastScoreTile): on AVX-512,
// more than 8 rows a key/value head (e.g. four new queries of 4 heads a group). Measured on Zen 4
// (one thread, 32 query heads over 8 of 128, B = 1 and 8, m = 4096 and 32768, against ScoreKeys):
// 16 to 64 rows 1.04-1.36x faster for fp32, 0.99-1.14x for fp16 and 1.01-1.12x for bf16 (widened
// once); 8 rows, half of each vector's lanes padding, 0.72-1.00x. On AVX2 (the same core capped)
// 0.71-1.29x, mostly slower or within the noise: not used there. int8 rows keep ScoreKeys, which
// applies their scales per key. A task needs kBroadcastMinKeys `keys` (its split's, that any row
// sees) to repay Qᵀ, which it builds element by element: with fewer ScoreKeys ran 1.04-1.41x
// faster at 16-96 keys and 16 or 64 rows, d = 64 and 128 (the sweep's 16-query, 16-key calls had
// read 0.85-0.95x PyTorch), and 0.91-0.95x at 128 keys (Zen 4, one thread, warm).
constexpr int64_t kBroadcastMinKeys = 128;
inline bool BroadcastsScores(CacheDType dtype, size_t rows, int64_t keys) {
  return HWY_MAX_BYTES >= 64 && rows > 8 && dtype != CacheDType::kInt8 && keys >= kBroadcastMinKeys;
}

// Whether a task's fp32 scores (BroadcastScoreTile) take the prefill's register tiles (Gemm<false>:
// 6 keys × 4 vectors of rows, one broadcast per four multiply-adds) instead of
// BroadcastScoreKeys' 8 keys × 1 vector (a broadcast per multiply-add): on AVX-512, more than 48
// rows a key/value head (four vectors of rows: 16 new queries of a group of 4 heads), where the
// scores are compute-bound. Measured on Emerald Rapids (one thread, 32 query heads over 8 of 128,
// 16 queries, fp32): with 1024 keys in L3 the scores' samples fell from 53% to 36% of the call
// (the call about 17% faster); from memory (32768 keys) level to 10% faster. With 16 and 32 rows
// from memory the tiles ran 0.75–0.9× (the Gemm requests the later tile's rows six keys at once,
// where BroadcastScoreKeys spreads them over its pass), so those keep BroadcastScoreKeys. P·V on
// the tiles (Gemm<true>) measured level with AccumulateValues and is not used.
inline bool ProductsOnTiles(size_t rows) {
  return HWY_MAX_BYTES >= 64 && rows > 48;
}

// Whether a task of kMinPairRows rows or more may score bf16 keys on vdpbf16ps
// (FourRowScoresOnPairs, EightRowScoresOnPairs, ScoresOnPairs): where the target has it and
// bf16_dot_in_use() (on Intel's cores the widened keys' fp32 products ran level at 4 and 16 rows a
// key/value head and 12% faster at 64, Emerald Rapids; docs/benchmarks.md),
// d is even and every key row starts at a 4-byte boundary (the pairs are read in place). Its
// queries decide the rest (QueryPairs).
inline bool KeysReadAsPairs(const CacheTensorView& keys) {
  return kScoresOnPairs && keys.dtype == CacheDType::kBFloat16 && keys.cols % 2 == 0 &&
         reinterpret_cast<uintptr_t>(keys.data) % 4 == 0 && keys.row_stride % 2 == 0 &&
         keys.head_stride % 2 == 0 && keys.batch_stride % 2 == 0 && bf16_dot_in_use();
}

// Row r of task (b, g)'s rows (head g·G + r / n, query r % n): the caller's floats, or a half
// call's, widened at the task's start (DecodeTask).
inline const float* QueryRow(const DecodeArgs& args, const DecodeScratch& s, int64_t b, int64_t g,
                             size_t r) {
  if (args.half != nullptr) return s.half_queries + r * static_cast<size_t>(args.q.cols);
  const int64_t group = args.q.heads / args.keys.heads, n = args.q.rows;
  const int64_t h = g * group + static_cast<int64_t>(r) / n, i = static_cast<int64_t>(r) % n;
  return args.q.matrix(b, h) + i * args.q.row_stride;
}

// Task (b, g)'s queries as bf16 pairs of adjacent dimensions, unscaled (the products scale the
// sums): pair p of row r at q_pairs[r·row_step + p·pair_step] — Qᵀ (row_step 1, pair_step
// row_lanes; GemmBF16 and the 8-lane steps) or row after row (row_step d/2, pair_step 1; each
// row's dot products, FourRowScoresOnPairs) — rows [rows, padded_rows) zero. False where a query
// is not a bf16 value (the pairs are then of no use): a bf16 call's queries, widened, are;
// rounding an fp32 query beside a bf16 cache would change its scores, so those keep the fp32
// products. The products are exact, as the fp32 path's; the sums differ in rounding order only.
inline bool QueryPairs(const DecodeArgs& args, const DecodeScratch& s, int64_t b, int64_t g,
                       size_t rows, size_t padded_rows, size_t row_step, size_t pair_step,
                       uint32_t* HWY_RESTRICT q_pairs) {
  const auto depth_pairs = static_cast<size_t>(args.q.cols / 2);
  uint32_t dropped_bits = 0;  // the low halves of the queries' floats, or-ed
  for (size_t r = 0; r < padded_rows; ++r) {
    uint32_t* row = q_pairs + r * row_step;
    if (r >= rows) {
      for (size_t p = 0; p < depth_pairs; ++p) row[p * pair_step] = 0;
      continue;
    }
    const float* q = QueryRow(args, s, b, g, r);
    for (size_t p = 0; p < depth_pairs; ++p) {
      const auto even = std::bit_cast<uint32_t>(q[2 * p]),
                 odd = std::bit_cast<uint32_t>(q[2 * p + 1]);
      dropped_bits |= (even | odd) & 0xFFFFU;
      row[p * pair_step] = (even >> 16) | (odd & 0xFFFF0000U);
    }
  }
  return dropped_bits == 0;
}

// Rows [0, count) of a half-precision cache's `rows`, `cols` elements each, as floats into `out`
// (rows `cols` apart: a dense fp32 cache's layout, which the fp32 steps read). Exact: every fp16
// and bf16 value is a float. WidensTiles asks it for fp16 K and V rows (AVX2), BroadcastsScores
// for fp16 and bf16 K rows (AVX-512). Returns the widened rows, as the fp32 steps take them.
template <class D>
HWY_INLINE CacheRows WidenTileRows(D d, CacheDType dtype, const CacheRows& rows, size_t count,
                                   size_t cols, float* HWY_RESTRICT out) {
  WithCacheType(dtype, [&](auto type) {
    constexpr CacheDType kType = decltype(type)::value;
    if constexpr (kType == CacheDType::kFloat16 || kType == CacheDType::kBFloat16) {
      const size_t lanes = hn::Lanes(d), vectors_end = cols / lanes * lanes;
      for (size_t j = 0; j < count; ++j) {
        const char* row = rows.data + j * rows.stride;
        float* to = out + j * cols;
        for (size_t t = 0; t < vectors_end; t += lanes)
          hn::StoreU(LoadCacheVector<kType>(d, row, t), d, to + t);
        for (size_t t = vectors_end; t < cols; ++t) to[t] = CacheElement<kType>(row, t);
      }
    }
  });
  return {reinterpret_cast<const char*>(out), cols * sizeof(float), nullptr};
}

// Task (b, g, split) with the rows along vectors of `d` (row_lanes = rows rounded up to them);
// `df` is the full-width tag for the P·V product over the value columns.
template <class D>
void DecodeTask(D d, const DecodeArgs& args, int64_t b, int64_t g, int64_t split,
                DecodeScratch& s) {
  const hn::ScalableTag<float> df;
  const size_t lanes = hn::Lanes(d), full_lanes = hn::Lanes(df);
  const int64_t group = args.q.heads / args.keys.heads, n = args.q.rows;
  const auto rows = static_cast<size_t>(group * n);
  // Whole groups of 4 rows (ScoreKeys), whole vectors of `d`.
  const size_t row_lanes = hwy::RoundUpTo(rows, std::max<size_t>(lanes, 4));
  const auto depth = static_cast<size_t>(args.q.cols), dv = static_cast<size_t>(args.values.cols);
  const size_t dv_padded = hwy::RoundUpTo(dv, full_lanes);
  const int64_t length = args.lengths[b];
  const DecodeOptions& options = args.options;
  if (args.half != nullptr) {  // a half call's queries, widened exactly (QueryRow)
    const ConstHalfHeadsView& q16 = args.half->q;
    for (size_t r = 0; r < rows; ++r) {
      const int64_t h = g * group + static_cast<int64_t>(r) / n, i = static_cast<int64_t>(r) % n;
      WidenRow(df, args.half->type, q16.matrix(b, h) + i * q16.row_stride, depth,
               s.half_queries + r * depth);
    }
  }

  // bf16 keys and queries from kMinPairRows rows multiply on vdpbf16ps: 3–4 rows as dot products
  // of each row's pairs (FourRowScoresOnPairs; QueryPairs lays them out row after row), 5–8 rows
  // (8-lane Sᵀ rows) on 256-bit vectors, more as GemmBF16 tiles (ScoresOnPairs; both with Qᵀ).
  const size_t depth_pairs = static_cast<size_t>(args.q.cols / 2);
  const bool pair_scores =
      rows >= kMinPairRows && KeysReadAsPairs(args.keys) &&
      (rows <= 4 ? QueryPairs(args, s, b, g, rows, rows, depth_pairs, 1, s.q_pairs)
                 : QueryPairs(args, s, b, g, rows, row_lanes, 1, row_lanes, s.q_pairs));
  // With them, bf16 values take P·V on vdpbf16ps, P rounded to bf16 (ValuesOnPairs), for a bf16
  // call's queries, whose output is bf16: float32 queries that bf16 holds (an upcast bf16 model's)
  // keep P in fp32, as their dtype asks (P rounded there left their outputs 2.6e-4 off, against
  // 6e-7 for queries a hair away from bf16 values). Their scores on pairs are exact products.
  const bool pair_values = pair_scores && args.values.dtype == CacheDType::kBFloat16 &&
                           args.half != nullptr && args.half->type == HalfType::kBFloat16;
  // The rows' queries (row r: head g·G + r / n, query r % n), scaled (unless the pairs hold them);
  // their key ranges. Every split reads all its rows' queries: the first checks them as it does (a
  // call that skipped scanning its queries learns of a NaN or ±∞ here, also in a row that sees no
  // key).
  const bool check_queries = split == 0;
  MagnitudeBits queries;
  int64_t begin = length, end = 0, common_begin = 0, common_end = length;
  for (size_t r = 0; r < row_lanes; ++r) {
    int64_t first = 0, last = 0;
    s.alibi_slope[r] = 0.0F;
    s.alibi_position[r] = 0.0F;
    if (r < rows) {
      const int64_t h = g * group + static_cast<int64_t>(r) / n, i = static_cast<int64_t>(r) % n;
      if (options.alibi_slopes != nullptr) {
        s.alibi_slope[r] = options.alibi_slopes[h];
        s.alibi_position[r] = static_cast<float>(length - n + i);
      }
      const float* q = QueryRow(args, s, b, g, r);
      if (check_queries) queries.Add(q, depth);
      if (!pair_scores)
        for (size_t t = 0; t < depth; ++t) s.q_rows[r * depth + t] = q[t] * options.scale;
      if (options.key_ranges != nullptr) {
        const int64_t* range = options.key_ranges + 2 * ((b * args.q.heads + h) * n + i);
        first = range[0];
        last = range[1];
      } else {
        const int64_t position = length - n + i;
        last = options.causal ? std::min(length, position + 1) : length;
        if (options.window_left >= 0) first = std::max<int64_t>(0, position - options.window_left);
        if (options.window_right >= 0) last = std::min(last, position + options.window_right + 1);
      }
      last = std::max<int64_t>(last, 0);
      first = std::min(first, last);
      if (first < last) {
        begin = std::min(begin, first);
        end = std::max(end, last);
      }
      common_begin = std::max(common_begin, first);
      common_end = std::min(common_end, last);
    }
    s.first[r] = static_cast<int32_t>(first);
    s.last[r] = static_cast<int32_t>(last);
    s.row_max[r] = -std::numeric_limits<float>::infinity();
    s.row_sum[r] = 0.0F;
  }
  if (queries.Largest() >= core_detail::kFirstNonFinite)
    args.non_finite->store(true, std::memory_order_relaxed);
  std::fill(s.output, s.output + hwy::RoundUpTo(rows, 4) * dv_padded, 0.0F);
  // Query rows up to a multiple of 4 are zero: ScoreKeys works on four rows at a time.
  if (!pair_scores)
    std::fill(s.q_rows + rows * depth, s.q_rows + hwy::RoundUpTo(rows, 4) * depth, 0.0F);
  // This split's keys, within what any row sees.
  const int64_t split_begin = std::max(begin, split * args.split_len);
  const int64_t split_end = std::min(end, (split + 1) * args.split_len);
  const bool broadcast_scores = BroadcastsScores(args.keys.dtype, rows, split_end - split_begin);
  if (broadcast_scores && !pair_scores) {  // Qᵀ, zero past the real rows
    for (size_t t = 0; t < depth; ++t)
      for (size_t r = 0; r < row_lanes; ++r)
        s.q_columns[t * row_lanes + r] = r < rows ? s.q_rows[r * depth + t] : 0.0F;
  }
  // fp32 keys of one row take the one-row score steps where the split's key rows fit the L2, as a
  // cache read from L2 or L3 is (Zen 4, one thread: 1.5–1.9× at m = 128–1024); streamed from
  // memory the four-row steps were 5–9% faster at d = 64 (B = 8, m = 32768).
  const bool one_row_fp32_scores =
      rows == 1 &&
      static_cast<size_t>(std::max<int64_t>(split_end - split_begin, 0)) * depth * sizeof(float) <=
          l2_cache_bytes();

  // One row whose value rows are whole vectors (AccumulateValues reads its P with any stride
  // there, and a column tail would read four rows): its softmax on dense keys.
  [[maybe_unused]] const bool dense_one_row = rows == 1 && row_lanes == 4 && dv % full_lanes == 0;
  // Keys and values of one dtype (the cache's): their tiles widened once where that pays.
  const bool widens_tiles =
      args.keys.dtype == args.values.dtype && WidensTiles(args.keys.dtype, row_lanes);
  // Many rows: the scores on the prefill's register tiles (ProductsOnTiles).
  const bool products_on_tiles = ProductsOnTiles(rows);

  FlashAttentionOptions modifiers;  // soft-capping and the key ranges only
  modifiers.softcap = options.softcap;
  const QueryTile tile{b,       g,      0,
                       rows,    n,      length,
                       s.first, s.last, TileKeyRanges{begin, end, common_begin, common_end}};
  const int64_t kv_head = g;
  // NaN while any score of the split is NaN or ±∞ (a key that is not finite, or a product past
  // float's range): x·0 is 0 for finite x only. The scores are probed before the modifiers, whose
  // masks write −∞, and only where ScoreTile wrote them: the rows rounded up to 4 of each key (the
  // lanes past them hold whatever an earlier tile left).
  const hn::CappedTag<float, 4> d4;
  const size_t scored_rows = hwy::RoundUpTo(rows, 4);
  auto score_probe = hn::Zero(d4);
  for (int64_t key0 = split_begin; key0 < split_end; key0 += static_cast<int64_t>(kKeyTile)) {
    const auto bc =
        static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(kKeyTile), split_end - key0));
    // As the prefill kernels: a tile the mask hides from every row is skipped, neither its keys
    // nor its values read (attention sinks beside a window read those keys alone), and a bool
    // mask's entries are added only where they differ.
    const MaskCoverage coverage =
        options.mask.kind == MaskKind::kNone
            ? MaskCoverage::kAll
            : GroupMaskCoverage(options.mask, b, g * group, group, n, key0, bc);
    if (coverage == MaskCoverage::kNone) continue;
    // Sᵀ = K Qᵀ, K read in its cache dtype.
    TilePrefetch prefetch;
    const int64_t ahead = key0 + kPrefetchTiles * static_cast<int64_t>(kKeyTile);
    if (ahead < split_end) {
      const CacheRows later_keys = decode_detail::rows_of(args.keys, b, kv_head, ahead);
      const CacheRows later_values = decode_detail::rows_of(args.values, b, kv_head, ahead);
      prefetch = TilePrefetch{
          later_keys.data, later_values.data, later_keys.stride, later_values.stride,
          static_cast<size_t>(args.keys.cols * cache_dtype_size(args.keys.dtype)),
          static_cast<size_t>(args.values.cols * cache_dtype_size(args.values.dtype)),
          static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(kKeyTile), split_end - ahead)),
          // Line by line for every dtype: int8 too since the requests go to L2 (1.00–1.05×
          // against whole rows from the score pass, Zen 4).
          row_lanes == 4};
    }
    const CacheRows key_rows = decode_detail::rows_of(args.keys, b, kv_head, key0);
    if (pair_scores && rows <= 4) {
      switch (rows) {
        case 3:
          FourRowScoresOnPairs<3>(bc, key_rows, s.q_pairs, depth_pairs, options.scale, s.scores,
                                  prefetch);
          break;
        default:
          FourRowScoresOnPairs<4>(bc, key_rows, s.q_pairs, depth_pairs, options.scale, s.scores,
                                  prefetch);
      }
    } else if (pair_scores && rows <= 8) {
      EightRowScoresOnPairs(bc, key_rows, s.q_pairs, row_lanes, depth_pairs, options.scale,
                            s.scores, prefetch);
    } else if (pair_scores) {
      ScoresOnPairs(bc, key_rows, s.q_pairs, row_lanes, depth_pairs, options.scale, s.scores,
                    prefetch);
    } else if (broadcast_scores || widens_tiles) {  // the scores from fp32 key rows
      const CacheRows fp32_keys =
          args.keys.dtype == CacheDType::kFloat32
              ? key_rows
              : WidenTileRows(df, args.keys.dtype, key_rows, bc, depth, s.widened_rows);
      if (broadcast_scores) {  // rows along the full vectors of df
        BroadcastScoreTile(df, bc, fp32_keys, s.q_columns, row_lanes, depth, s.scores, prefetch,
                           products_on_tiles);
      } else {
        ScoreTileOutOfLine<CacheDType::kFloat32>(df, bc, fp32_keys, s.q_rows, rows, depth, s.scores,
                                                 row_lanes, prefetch);
      }
    } else {
      WithCacheType(args.keys.dtype, [&](auto type) {
        constexpr CacheDType kType = decltype(type)::value;
        if (kType == CacheDType::kFloat32 && row_lanes == 4) {
          ScoreTile<kType>(df, bc, key_rows, s.q_rows, rows, depth, s.scores, row_lanes, prefetch,
                           one_row_fp32_scores, ReadsWholeValueRows<kType>(rows, dv, full_lanes));
        } else {
          ScoreTileOutOfLine<kType>(df, bc, key_rows, s.q_rows, rows, depth, s.scores, row_lanes,
                                    prefetch);
        }
      });
    }
    score_probe = hn::Add(score_probe, ProbeScores(df, s.scores, bc, scored_rows, row_lanes));
    ApplyScoreModifiers(d, modifiers, tile, key0, bc, row_lanes, row_lanes, false, s.scores);
    if (options.mask.kind == MaskKind::kBool && coverage == MaskCoverage::kSome) {
      AddMaskEntriesToRows<uint8_t>(options.mask, b, g * group, n, rows, key0, bc, row_lanes,
                                    s.scores);
    } else if (options.mask.kind == MaskKind::kFloat) {
      with_float_entries(options.mask.entries, [&](auto entry_type) HWY_ATTR {
        AddMaskEntriesToRows<decltype(entry_type)>(options.mask, b, g * group, n, rows, key0, bc,
                                                   row_lanes, s.scores);
      });
    }
    // ALiBi after the key ranges' −∞, which it keeps: −slope·|position − j| per row.
    if (options.alibi_slopes != nullptr) {
      for (size_t j = 0; j < bc; ++j) {
        const auto key = hn::Set(d, static_cast<float>(key0 + static_cast<int64_t>(j)));
        for (size_t r = 0; r < row_lanes; r += hn::Lanes(d)) {
          float* score = s.scores + j * row_lanes + r;
          const auto distance = hn::Abs(hn::Sub(hn::Load(d, s.alibi_position + r), key));
          hn::Store(hn::NegMulAdd(hn::Load(d, s.alibi_slope + r), distance, hn::Load(d, score)), d,
                    score);
        }
      }
    }
    // P in place of Sᵀ, or one row's dense in s.probabilities.
    float* probabilities = s.scores;
    size_t probability_stride = row_lanes;
#if HWY_TARGET != HWY_SCALAR
    if (dense_one_row) {
      DecodeSoftmaxStepOneRow(df, bc, s);
      probabilities = s.probabilities;
      probability_stride = 1;
    } else if (row_lanes == 4) {
      DecodeSoftmaxStepFourRows(df, bc, s);
    } else {
      DecodeSoftmaxStep(d, bc, row_lanes, s);
    }
#else
    DecodeSoftmaxStep(d, bc, row_lanes, s);
#endif
    // O = O · rescale + P V, V read in its cache dtype.
    const CacheRows value_rows = decode_detail::rows_of(args.values, b, kv_head, key0);
    if (pair_values) {
      ValuesOnPairs(bc, value_rows, dv, dv_padded, row_lanes, rows, s, prefetch);  // P: s.scores
    } else if (widens_tiles) {
      const CacheRows widened =
          WidenTileRows(df, args.values.dtype, value_rows, bc, dv, s.widened_rows);
      AccumulateValues<CacheDType::kFloat32>(df, bc, widened, probabilities, probability_stride,
                                             rows, dv, s.output, dv_padded, s.row_rescale,
                                             prefetch);
    } else {
      WithCacheType(args.values.dtype, [&](auto type) {
        AccumulateValues<decltype(type)::value>(df, bc, value_rows, probabilities,
                                                probability_stride, rows, dv, s.output, dv_padded,
                                                s.row_rescale, prefetch);
      });
    }
  }

  if (!hn::AllTrue(d4, hn::Eq(score_probe, score_probe)))
    args.non_finite->store(true, std::memory_order_relaxed);
  if (args.splits == 1) {
    // The task holds its rows' every key: their output and log-sum-exp written here, on its
    // thread, where a merge after the tasks copied them out and back (a quarter of a
    // 4 × 32/8 × 16 × 16 call, d = 128).
    uint32_t largest = 0;
    for (size_t r = 0; r < rows; ++r) {
      const int64_t h = g * group + static_cast<int64_t>(r) / n, i = static_cast<int64_t>(r) % n;
      // A half call's row goes through output_row, rounded once into its bits.
      float* destination =
          args.half != nullptr ? s.output_row : args.out.matrix(b, h) + i * args.out.row_stride;
      largest = std::max(
          largest,
          decode_detail::MergeRow(
              1, [&](int64_t) { return s.row_max[r]; }, [&](int64_t) { return s.row_sum[r]; },
              [&](int64_t) { return s.output + r * dv_padded; },
              options.sinks != nullptr ? options.sinks + h : nullptr, static_cast<int64_t>(dv),
              destination,
              args.log_sum_exp != nullptr ? args.log_sum_exp + (b * args.q.heads + h) * n + i
                                          : nullptr));
      if (args.half != nullptr) {
        const HalfHeadsView& out16 = args.half->out;
        uint16_t* rounded = out16.matrix(b, h) + i * out16.row_stride;
        NarrowRow(df, args.half->type, s.output_row, dv, rounded);
        const HalfHeadsView& residual = args.half->residual;
        if (residual.data != nullptr) {
          StoreResidualRow(df, args.half->type, s.output_row, rounded, dv,
                           residual.matrix(b, h) + i * residual.row_stride);
        }
      }
    }
    if (largest >= core_detail::kFirstNonFinite)
      args.non_finite->store(true, std::memory_order_relaxed);
    return;
  }
  // The split's partial results: max, sum, unnormalised output per row.
  const int64_t task = (b * args.keys.heads + g) * args.splits + split;
  float* partial = args.partial + task * static_cast<int64_t>(rows) * args.partial_row;
  for (size_t r = 0; r < rows; ++r) {
    float* row = partial + static_cast<int64_t>(r) * args.partial_row;
    row[0] = s.row_max[r];
    row[1] = s.row_sum[r];
    std::copy_n(s.output + r * dv_padded, dv, row + 2);
  }
}

void DecodeForward(const DecodeArgs& args) {
  const hn::ScalableTag<float> df;
  const hn::CappedTag<float, 4> d4;
  const hn::CappedTag<float, 8> d8;
  const int64_t rows = (args.q.heads / args.keys.heads) * args.q.rows;
  const size_t full_lanes = hn::Lanes(df);
  const size_t max_rows =
      hwy::RoundUpTo(static_cast<size_t>(rows), std::max<size_t>(full_lanes, 4));
  const size_t dv_padded = hwy::RoundUpTo(static_cast<size_t>(args.values.cols), full_lanes);
  const int64_t tasks = args.q.batch * args.keys.heads * args.splits;
  // A bf16 call against bf16 values takes P·V on vdpbf16ps (ValuesOnPairs), P split in two parts
  // where bf16_probabilities_split() says so for vector products.
  const bool split_probabilities = args.half != nullptr && args.half->type == HalfType::kBFloat16 &&
                                   args.values.dtype == CacheDType::kBFloat16 &&
                                   bf16_probabilities_split(false);
  run_parallel_tasks(
      tasks, "decode_attention_forward", TaskSchedule::kDynamic,
      [&] {
        return DecodeScratch(max_rows, static_cast<size_t>(args.q.cols), dv_padded, full_lanes,
                             args.half != nullptr, split_probabilities);
      },
      [&](int64_t task, DecodeScratch& scratch, int) {
        const int64_t split = task % args.splits, head = task / args.splits;
        const int64_t b = head / args.keys.heads, g = head % args.keys.heads;
        // One query per head of a small group: 4-lane rows waste no lanes; 5 to 8 rows take
        // 8 lanes where the full vectors have 16.
        if (rows <= 4) {
          DecodeTask(d4, args, b, g, split, scratch);
        } else if (rows <= 8 && full_lanes > 8) {
          DecodeTask(d8, args, b, g, split, scratch);
        } else {
          DecodeTask(df, args, b, g, split, scratch);
        }
      },
      args.threads);
}

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {

HWY_EXPORT(DecodeForward);

namespace {

void require_cache_tensor(const CacheTensorView& t, std::string_view name, const ConstHeadsView& q,
                          int64_t cols) {
  const int64_t stored = cache_dtype_size(t.dtype);
  // A cache of capacity 0 (nothing appended yet) has no storage: null data, nothing to read.
  const bool storage = t.capacity > 0;
  if ((storage && t.data == nullptr) || t.batch != q.batch || t.heads <= 0 ||
      q.heads % t.heads != 0 || t.cols != cols || t.capacity < 0 ||
      (storage && t.dtype == CacheDType::kInt8 && t.scales == nullptr) || stored <= 0) {
    throw ShapeError(std::string(name) + ": expected a cache of " + std::to_string(q.batch) +
                     " sequences, a number of heads dividing the queries' " +
                     std::to_string(q.heads) + ", rows of " + std::to_string(cols) + ", got " +
                     std::to_string(t.batch) + " × " + std::to_string(t.heads) + " heads of " +
                     std::to_string(t.capacity) + " × " + std::to_string(t.cols));
  }
}

}  // namespace

namespace {

using decode_detail::HalfRows;

// Both overloads: q and out give the shapes (and, for a float call, the data); `half` (or null)
// the bits of a half call's.
bool DecodeAttentionForward(ConstHeadsView q, const CacheTensorView& keys,
                            const CacheTensorView& values, const int64_t* lengths,
                            const DecodeOptions& options, HeadsView out, float* log_sum_exp,
                            const HalfRows* half) {
  require_cache_tensor(keys, "keys", q, q.cols);
  require_cache_tensor(values, "values", q, values.cols);
  if (values.heads != keys.heads || values.capacity != keys.capacity) {
    throw ShapeError("values: expected the keys' " + std::to_string(keys.heads) + " heads and " +
                     "capacity " + std::to_string(keys.capacity) + ", got " +
                     std::to_string(values.heads) + " and " + std::to_string(values.capacity));
  }
  if (out.batch != q.batch || out.heads != q.heads || out.rows != q.rows ||
      out.cols != values.cols) {
    throw ShapeError("out: expected " + std::to_string(q.batch) + " × " + std::to_string(q.heads) +
                     " heads of " + std::to_string(q.rows) + " × " + std::to_string(values.cols) +
                     ", got " + std::to_string(out.batch) + " × " + std::to_string(out.heads) +
                     " of " + std::to_string(out.rows) + " × " + std::to_string(out.cols));
  }
  const int64_t group = keys.heads > 0 ? q.heads / keys.heads : 1;
  if (group * q.rows > kMaxDecodeRows) {
    throw ValueError("queries: expected at most " + std::to_string(kMaxDecodeRows) +
                     " rows per key/value head for decoding (new queries × query heads per "
                     "key/value head), got " +
                     std::to_string(q.rows) + " × " + std::to_string(group));
  }
  if (keys.capacity > std::numeric_limits<int32_t>::max()) {
    throw ValueError("keys: expected at most 2^31 − 1 cached keys, got " +
                     std::to_string(keys.capacity));
  }
  if (lengths == nullptr) throw ValueError("lengths: expected one length per sequence, got none");
  int64_t longest = 0;
  for (int64_t b = 0; b < q.batch; ++b) {
    if (lengths[b] < 0 || lengths[b] > keys.capacity) {
      throw ValueError("lengths[" + std::to_string(b) + "]: expected a cached length in [0, " +
                       std::to_string(keys.capacity) + "], got " + std::to_string(lengths[b]));
    }
    longest = std::max(longest, lengths[b]);
  }
  if (options.alibi_slopes != nullptr) {
    if (options.key_ranges != nullptr) {
      throw ValueError(
          "alibi_slopes: expected no key_ranges beside them (ALiBi needs each query's position, "
          "which ranges do not give), got both");
    }
    for (int64_t h = 0; h < q.heads; ++h) {
      if (!std::isfinite(options.alibi_slopes[h])) {
        throw ValueError("alibi_slopes[" + std::to_string(h) + "]: expected a finite slope, got " +
                         std::to_string(options.alibi_slopes[h]));
      }
    }
    if (longest > (int64_t{1} << 24)) {
      throw ValueError(
          "alibi_slopes: expected sequences of at most 2^24 keys (positions counted "
          "exactly in float), got " +
          std::to_string(longest));
    }
  }
  if (options.mask.kind != MaskKind::kNone) {
    if (options.mask.data == nullptr)
      throw ValueError("mask: expected its entries, got a mask kind without data");
    if (options.alibi_slopes != nullptr) {
      throw ValueError(
          "alibi_slopes: expected no mask beside them (the decode kernel applies ALiBi alone), "
          "got both");
    }
  }
  if (options.key_ranges != nullptr) {
    if (options.causal || options.window_left >= 0 || options.window_right >= 0) {
      throw ValueError(
          "key_ranges: expected no causal mask or window beside them (the ranges are "
          "each row's keys), got causal " +
          std::to_string(options.causal) + ", window (" + std::to_string(options.window_left) +
          ", " + std::to_string(options.window_right) + ")");
    }
    for (int64_t b = 0; b < q.batch; ++b) {
      for (int64_t r = 0; r < q.heads * q.rows; ++r) {
        const int64_t* range = options.key_ranges + 2 * (b * q.heads * q.rows + r);
        if (range[0] < 0 || range[0] > range[1] || range[1] > lengths[b]) {
          throw ValueError("key_ranges[" + std::to_string(b * q.heads * q.rows + r) +
                           "]: expected 0 ≤ first ≤ last ≤ the sequence's length " +
                           std::to_string(lengths[b]) + ", got [" + std::to_string(range[0]) +
                           ", " + std::to_string(range[1]) + ")");
        }
      }
    }
  }
  if (q.batch == 0 || q.heads == 0 || q.rows == 0 || values.cols == 0) return true;

  // Splits: enough tasks to keep every thread busy several times over, each split at least a few
  // key tiles long (partials and their merge cost per split).
  // Threads as the keys and values read are worth (useful_threads), or the products, where many
  // rows share each key: 16 queries of 4 × 2 heads against 16 keys (d = 64) read 64 KiB, one
  // thread's worth, and make 5·10⁵ flops, two threads' (kFlopsPerThread, the prefill's unit).
  const double bytes_read =
      static_cast<double>(q.batch * keys.heads) * static_cast<double>(longest) *
      (static_cast<double>(keys.cols) * static_cast<double>(cache_dtype_size(keys.dtype)) +
       static_cast<double>(values.cols) * static_cast<double>(cache_dtype_size(values.dtype)));
  const double flops = 2.0 * static_cast<double>(q.batch * q.heads * q.rows) *
                       static_cast<double>(longest) * static_cast<double>(keys.cols + values.cols);
  const int threads =
      useful_threads(std::max(bytes_read / kDecodeBytesPerThread, flops / kFlopsPerThread), 1.0);
  const int64_t tile = static_cast<int64_t>(decode_detail::kKeyTile);
  const int64_t key_tiles = std::max<int64_t>(1, (longest + tile - 1) / tile);
  const int64_t wanted = (4 * threads + q.batch * keys.heads - 1) / (q.batch * keys.heads);
  const int64_t splits = std::clamp<int64_t>(wanted, 1, std::max<int64_t>(1, key_tiles / 4));
  const int64_t split_len = (key_tiles + splits - 1) / splits * tile;
  const int64_t rows = group * q.rows, dv = values.cols;
  // Every task writes all its rows' partials: no zero fill (5% of a 1 × 8 × 16 × 64 call). An
  // unsplit call's tasks write their rows themselves.
  const auto partial = splits > 1 ? std::make_unique_for_overwrite<float[]>(static_cast<size_t>(
                                        q.batch * keys.heads * splits * rows * (dv + 2)))
                                  : nullptr;
  std::atomic<bool> non_finite{false};
  const decode_detail::DecodeArgs args{q,       keys,      values,        lengths, options,
                                       splits,  split_len, partial.get(), dv + 2,  &non_finite,
                                       threads, out,       log_sum_exp,   half};
  HWY_DYNAMIC_DISPATCH(DecodeForward)(args);
  if (splits == 1) return !non_finite.load(std::memory_order_relaxed);

  // Merge the splits' partials per row by log-sum-exp (a half call's through `merged`, rounded).
  std::vector<float> merged(half != nullptr ? static_cast<size_t>(dv) : 0);
  uint32_t largest = 0;
  for (int64_t b = 0; b < q.batch; ++b) {
    for (int64_t g = 0; g < keys.heads; ++g) {
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t h = g * group + r / q.rows, i = r % q.rows;
        const auto row_of = [&](int64_t split) {
          return partial.get() + (((b * keys.heads + g) * splits + split) * rows + r) * (dv + 2);
        };
        largest = std::max(
            largest,
            decode_detail::MergeRow(
                splits, [&](int64_t split) { return row_of(split)[0]; },
                [&](int64_t split) { return row_of(split)[1]; },
                [&](int64_t split) { return row_of(split) + 2; },
                options.sinks != nullptr ? options.sinks + h : nullptr, dv,
                half != nullptr ? merged.data() : out.matrix(b, h) + i * out.row_stride,
                log_sum_exp != nullptr ? log_sum_exp + (b * q.heads + h) * q.rows + i : nullptr));
        if (half != nullptr) {
          uint16_t* rounded = half->out.matrix(b, h) + i * half->out.row_stride;
          narrow_to_half(half->type, merged.data(), rounded, static_cast<size_t>(dv));
          // The residuals of the merged row, as the unsplit tasks write theirs (they were left
          // unwritten here: a backward read whatever the buffer held).
          if (half->residual.data != nullptr) {
            uint16_t* residual = half->residual.matrix(b, h) + i * half->residual.row_stride;
            for (int64_t t = 0; t < dv; ++t)
              residual[t] = output_residual(half->type, merged[static_cast<size_t>(t)], rounded[t]);
          }
        }
      }
    }
  }
  if (largest >= core_detail::kFirstNonFinite) return false;
  return !non_finite.load(std::memory_order_relaxed);
}

}  // namespace

bool decode_attention_forward(ConstHeadsView q, const CacheTensorView& keys,
                              const CacheTensorView& values, const int64_t* lengths,
                              const DecodeOptions& options, HeadsView out, float* log_sum_exp) {
  return DecodeAttentionForward(q, keys, values, lengths, options, out, log_sum_exp, nullptr);
}

bool decode_attention_forward(HalfType type, ConstHalfHeadsView q, const CacheTensorView& keys,
                              const CacheTensorView& values, const int64_t* lengths,
                              const DecodeOptions& options, HalfHeadsView out, float* log_sum_exp,
                              HalfHeadsView out_residual) {
  if (out_residual.data != nullptr) {
    require_matrices(shape_only(ConstHalfHeadsView(out_residual)), "out_residual", out.batch,
                     out.heads, out.rows, out.cols, "as out");
  }
  const HalfRows half{type, q, out, out_residual};
  return DecodeAttentionForward(shape_only(q), keys, values, lengths, options, shape_only(out),
                                log_sum_exp, &half);
}

}  // namespace attn
#endif  // HWY_ONCE
