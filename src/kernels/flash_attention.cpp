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

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "attn/core/error.hpp"
#include "attn/kernels/additive_attention.hpp"
#include "kernels/dropout_hash.hpp"
#include "kernels/kernel_arguments.hpp"
#include "kernels/parallel_tasks.hpp"
#include "kernels/score_masks.hpp"
#include "kernels/scratch_memory.hpp"

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
};

constexpr size_t kQueryVectors = 4;  // Br = 4 · lanes: the register tile's width (kMaxVectors)
constexpr size_t kKeyTile = 64;      // Bc: Sᵀ (Bc × Br floats) stays in L1 at 16 lanes

}  // namespace attn::flash_detail
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/flash_attention.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// Highway's headers must follow foreach_target.h.
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include "kernels/additive_scores-inl.h"
#include "kernels/fast_math-inl.h"
#include "kernels/score_modifiers-inl.h"
#include "kernels/tile_gemm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using flash_detail::ForwardArgs;

// Per-thread working memory, sized once per call.
struct Scratch {
  hwy::AlignedFreeUniquePtr<float[]> memory;
  float* q_transposed;  // d × Br
  float* scores;        // Bc × Br: Sᵀ, then Pᵀ
  float* output;        // Br × dv_padded
  float* row_max;       // Br
  float* row_sum;       // Br
  float* row_rescale;   // Br
  int32_t* first;       // Br: each query's first visible key
  int32_t* last;        // Br: one past each query's last visible key
  uint32_t* row_keys;   // Br: dropout_hash::row_key of each query
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

  Scratch(size_t br, size_t depth, size_t dv_padded, size_t keys, size_t lanes) {
    const size_t bc = flash_detail::kKeyTile;
    memory = carve_scratch(lanes, [&](const auto& take) {
      q_transposed = take(depth * br);
      scores = take(bc * br);
      output = take(br * dv_padded);
      row_max = take(br);
      row_sum = take(br);
      row_rescale = take(br);
      first = as_int32(take(br));
      last = as_int32(take(br));
      row_keys = as_uint32(take(br));
      packed_keys = take(keys * depth);
      packed_values = take(keys * dv_padded);
    });
  }
};

// Makes rows [begin, end) of key/value head (b, h)'s keys and values available in s.packed_*, at
// their own row offsets. A thread's successive tiles of a head need ranges that only move forward
// (causal, windows) or stay (full attention), so packing extends the packed range; a range before
// or past it (another head, a window far ahead) starts a new one.
void PackKeysAndValues(const ForwardArgs& args, int64_t b, int64_t h, int64_t begin, int64_t end,
                       size_t dv_padded, Scratch& s) {
  const int64_t head = b * args.k.heads + h;
  if (s.packed_head != head || begin < s.packed_begin || begin > s.packed_end) {
    s.packed_head = head;
    s.packed_begin = s.packed_end = begin;
  }
  const auto depth = static_cast<size_t>(args.k.cols), dv = static_cast<size_t>(args.v.cols);
  const float* k = args.k.matrix(b, h);
  const float* v = args.v.matrix(b, h);
  for (int64_t j = s.packed_end; j < end; ++j) {
    std::copy_n(k + j * args.k.row_stride, depth, s.packed_keys + static_cast<size_t>(j) * depth);
    float* value_row = s.packed_values + static_cast<size_t>(j) * dv_padded;
    std::copy_n(v + j * args.v.row_stride, dv, value_row);
    std::fill(value_row + dv, value_row + dv_padded, 0.0F);
  }
  s.packed_end = std::max(s.packed_end, end);
}

// The rows' key ranges and dropout keys, Qᵀ with the scale folded in (zero in padding lanes), and
// the online softmax's starting state: running max −∞ and sum 0, or the head's sink logit with
// sum exp(0) = 1, so the sink joins every row's denominator.
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
  tile.ranges = tile_key_ranges(*args.valid_lens, args.options, b, first_query, tile.rows, br,
                                args.q.rows, args.k.rows, s.first, s.last);
  for (size_t r = 0; r < br; ++r) {
    s.row_keys[r] = dropout_hash::row_key(args.options.seed, b * args.q.heads + h,
                                          first_query + static_cast<int64_t>(r));
  }
  const size_t depth = static_cast<size_t>(args.q.cols);
  const float* q = args.q.matrix(b, h) + first_query * args.q.row_stride;
  const float scale = args.options.scale;
  for (size_t t = 0; t < depth; ++t) {
    float* column = s.q_transposed + t * br;
    for (size_t r = 0; r < br; ++r) {
      column[r] =
          r < tile.rows
              ? q[static_cast<int64_t>(r) * args.q.row_stride + static_cast<int64_t>(t)] * scale
              : 0.0F;
    }
  }
  const bool sink = args.options.sinks != nullptr;
  const float start_max = sink ? args.options.sinks[h] : -std::numeric_limits<float>::infinity();
  for (size_t r = 0; r < br; ++r) {
    s.row_max[r] = r < tile.rows ? start_max : -std::numeric_limits<float>::infinity();
    s.row_sum[r] = r < tile.rows && sink ? 1.0F : 0.0F;
  }
  return tile;
}

// One key tile's online-softmax step on Sᵀ (bc × Br, masked scores in, Pᵀ out), lane-wise over
// queries: new running max, rescale factors exp(old max − new max) in s.row_rescale, P = exp(S −
// max), running sum rescaled plus P's column sums. The kVectors query vectors of each key row are
// adjacent in memory and give independent dependency chains.
template <class D>
HWY_INLINE void OnlineSoftmaxStep(D d, size_t bc, size_t br, Scratch& s) {
  using V = hn::Vec<D>;
  const size_t lanes = hn::Lanes(d);
  constexpr size_t kVectors = flash_detail::kQueryVectors;
  const V minus_infinity = hn::Set(d, -std::numeric_limits<float>::infinity());
  V row_max[kVectors], shift[kVectors], sum[kVectors];
  for (size_t g = 0; g < kVectors; ++g) row_max[g] = hn::Load(d, s.row_max + g * lanes);
  for (size_t j = 0; j < bc; ++j) {
    for (size_t g = 0; g < kVectors; ++g)
      row_max[g] = hn::Max(row_max[g], hn::Load(d, s.scores + j * br + g * lanes));
  }
  for (size_t g = 0; g < kVectors; ++g) {
    // A row that has seen only −∞ subtracts 0, so exp(−∞ − 0) = 0 instead of NaN.
    shift[g] = hn::IfThenZeroElse(hn::Eq(row_max[g], minus_infinity), row_max[g]);
    hn::Store(SoftmaxExp(d, hn::Sub(hn::Load(d, s.row_max + g * lanes), shift[g])), d,
              s.row_rescale + g * lanes);
    hn::Store(row_max[g], d, s.row_max + g * lanes);
    sum[g] = hn::Zero(d);
  }
  for (size_t j = 0; j < bc; ++j) {
    for (size_t g = 0; g < kVectors; ++g) {
      float* score = s.scores + j * br + g * lanes;
      const V p = SoftmaxExp(d, hn::Sub(hn::Load(d, score), shift[g]));
      hn::Store(p, d, score);
      sum[g] = hn::Add(sum[g], p);
    }
  }
  for (size_t g = 0; g < kVectors; ++g) {
    float* row_sum = s.row_sum + g * lanes;
    hn::Store(hn::MulAdd(hn::Load(d, row_sum), hn::Load(d, s.row_rescale + g * lanes), sum[g]), d,
              row_sum);
  }
}

// Dropout after the sum: the normaliser counts every weight, the product only the kept ones.
template <class D, class Applier>
HWY_INLINE void DropWeights(D d, const Applier& applier, int64_t key0, size_t bc, size_t br,
                            Scratch& s) {
  const hn::RebindToUnsigned<D> du;
  const size_t lanes = hn::Lanes(d);
  for (size_t j = 0; j < bc; ++j) {
    const auto key = static_cast<uint32_t>(key0 + static_cast<int64_t>(j));
    for (size_t r = 0; r < br; r += lanes) {
      float* p = s.scores + j * br + r;
      hn::Store(applier.Apply(d, hn::Load(du, s.row_keys + r), key, hn::Load(d, p)), d, p);
    }
  }
}

// O / sum into `out` (a row that saw no key has sum 0 and gets a zero output), and each row's
// log-sum-exp.
void WriteOutputRows(const ForwardArgs& args, const QueryTile& tile, size_t dv_padded,
                     const Scratch& s) {
  const size_t dv = static_cast<size_t>(args.v.cols);
  float* out = args.out.matrix(tile.batch, tile.head) + tile.first_query * args.out.row_stride;
  for (size_t r = 0; r < tile.rows; ++r) {
    const float sum = s.row_sum[r];
    const float inverse = sum > 0.0F ? 1.0F / sum : 0.0F;
    const float* row = s.output + r * dv_padded;
    float* destination = out + static_cast<int64_t>(r) * args.out.row_stride;
    for (size_t t = 0; t < dv; ++t) destination[t] = row[t] * inverse;
  }
  if (args.log_sum_exp != nullptr) {
    float* lse =
        args.log_sum_exp + (tile.batch * args.q.heads + tile.head) * args.q.rows + tile.first_query;
    for (size_t r = 0; r < tile.rows; ++r) {
      lse[r] = s.row_sum[r] > 0.0F ? s.row_max[r] + std::log(s.row_sum[r])
                                   : -std::numeric_limits<float>::infinity();
    }
  }
}

// One query tile of query head (b, h): for each key tile some row sees, Sᵀ = K Qᵀ (or additive
// scores), the score modifiers and masks, the online softmax step, dropout, O = O·rescale + P V.
void FlashForwardTile(const ForwardArgs& args, int64_t b, int64_t h, int64_t first_query,
                      Scratch& s) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  const size_t br = flash_detail::kQueryVectors * lanes;
  const size_t depth = static_cast<size_t>(args.q.cols);
  const size_t dv_padded = hwy::RoundUpTo(static_cast<size_t>(args.v.cols), lanes);
  const QueryTile tile = PrepareQueryTile(args, b, h, first_query, br, s);
  std::fill(s.output, s.output + br * dv_padded, 0.0F);
  const bool dropout = args.options.dropout > 0.0F;
  const DropoutApplier<decltype(d)> dropout_applier(d, args.options.dropout);
  const bool bool_mask = args.options.mask.kind == MaskKind::kBool;

  // Grouped-query attention: this query head reads key/value head h / group.
  const int64_t kv_head = h / (args.q.heads / args.k.heads);
  PackKeysAndValues(args, b, kv_head, tile.ranges.begin, tile.ranges.end, dv_padded, s);
  const float* k = s.packed_keys;
  const float* v = s.packed_values;
  for (int64_t key0 = tile.ranges.begin; key0 < tile.ranges.end;
       key0 += static_cast<int64_t>(flash_detail::kKeyTile)) {
    const size_t bc = static_cast<size_t>(
        std::min<int64_t>(static_cast<int64_t>(flash_detail::kKeyTile), tile.ranges.end - key0));
    MaskCoverage coverage = MaskCoverage::kAll;
    if (bool_mask) {
      coverage = bool_mask_coverage(args.options.mask, b, h, first_query, tile.rows, key0, bc);
      if (coverage == MaskCoverage::kNone) continue;  // the mask hides this whole tile
    }
    // Sᵀ = K Qᵀ: K's elements are broadcast, Qᵀ's rows are vectors over the queries.
    const float* key_rows = k + static_cast<size_t>(key0) * depth;
    if (args.additive_weights != nullptr) {
      AdditiveScores<flash_detail::kQueryVectors>(d, bc, key_rows, depth, s.q_transposed, br, depth,
                                                  args.additive_weights, s.scores);
    } else {
      Gemm<false>(d, bc, flash_detail::kQueryVectors, key_rows, depth, 1, s.q_transposed, br, depth,
                  s.scores, br);
    }
    ApplyScoreModifiers(d, args.options, tile, key0, bc, br, coverage == MaskCoverage::kSome,
                        s.scores);
    OnlineSoftmaxStep(d, bc, br, s);
    if (dropout) DropWeights(d, dropout_applier, key0, bc, br, s);
    // O = O · rescale + P V.
    Gemm<true>(d, tile.rows, dv_padded / lanes, s.scores, 1, br,
               v + static_cast<size_t>(key0) * dv_padded, dv_padded, bc, s.output, dv_padded,
               s.row_rescale);
  }
  WriteOutputRows(args, tile, dv_padded, s);
}

void FlashForward(const ForwardArgs& args) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  const size_t br = flash_detail::kQueryVectors * lanes;
  const int64_t tiles_per_head =
      (args.q.rows + static_cast<int64_t>(br) - 1) / static_cast<int64_t>(br);
  const int64_t tasks = args.q.batch * args.q.heads * tiles_per_head;
  const size_t dv_padded = hwy::RoundUpTo(static_cast<size_t>(args.v.cols), lanes);
  // Dynamic scheduling: causal, windowed and padded tiles differ widely in cost.
  run_parallel_tasks(
      tasks, "flash_attention_forward", TaskSchedule::kDynamic,
      [&] {
        return Scratch(br, static_cast<size_t>(args.q.cols), dv_padded,
                       static_cast<size_t>(args.k.rows), lanes);
      },
      [&](int64_t task, Scratch& scratch, int) {
        const int64_t head_index = task / tiles_per_head;
        const int64_t tile = task % tiles_per_head;
        FlashForwardTile(args, head_index / args.q.heads, head_index % args.q.heads,
                         tile * static_cast<int64_t>(br), scratch);
      });
}

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {

HWY_EXPORT(FlashForward);

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
                             HeadsView out, float* log_sum_exp) {
  if (!check_attention_arguments(q, k, v, out, valid_lens, options)) return;
  const flash_detail::ForwardArgs args{q, k, v, out, log_sum_exp, &valid_lens, options};
  HWY_DYNAMIC_DISPATCH(FlashForward)(args);
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
  const flash_detail::ForwardArgs args{projected_queries, projected_keys, values,   out,
                                       log_sum_exp,       &valid_lens,    additive, w_v.data()};
  HWY_DYNAMIC_DISPATCH(FlashForward)(args);
}

}  // namespace attn
#endif  // HWY_ONCE
