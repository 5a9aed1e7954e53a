// Attention for decoding: a few new queries per sequence against a KV cache of m keys, memory-bound
// (each cached key and value is read once per step). The keys are split across threads
// (FlashDecoding: partial maximum, sum and output per split, merged by log-sum-exp), every query
// head of a grouped-query group is computed from the same read of each K/V row, and the cache is
// read in its own precision (fp32, fp16, bf16 or int8 with a scale per row), converted in
// registers, accumulated in fp32. One exception, PyTorch's bf16 arithmetic: a bf16 cache with 3 or
// more query rows per key/value head whose queries are all bf16 values multiplies on vdpbf16ps
// where it is in use (bf16_dot_in_use(): AVX512-BF16 on AMD's cores), P rounded to bf16 before
// P·V, as PyTorch's CPU kernels and attn's prefill round it.
#pragma once

#include <cstdint>

#include "attn/core/half.hpp"
#include "attn/kernels/fused_options.hpp"
#include "attn/kernels/heads_view.hpp"

namespace attn {

// How a KV cache stores its entries.
enum class CacheDType { kFloat32, kFloat16, kBFloat16, kInt8 };

// Bytes per stored element.
constexpr int64_t cache_dtype_size(CacheDType dtype) {
  return dtype == CacheDType::kFloat32 ? 4 : dtype == CacheDType::kInt8 ? 1 : 2;
}

// One tensor of a KV cache: batch × heads matrices of (capacity rows × cols) entries of `dtype`,
// row-major with contiguous columns, matrix (b, h) at element b·batch_stride + h·head_stride. For
// kInt8, `scales` holds one float per (b, h, row) at (b·heads + h)·capacity + row, and entry e of
// a row means e·scale.
struct CacheTensorView {
  CacheDType dtype = CacheDType::kFloat32;
  const void* data = nullptr;
  const float* scales = nullptr;
  int64_t batch = 0, heads = 0, capacity = 0, cols = 0;
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0;
};

struct DecodeOptions {
  float scale = 1.0F;
  // Query i of the n new queries of sequence b sits at position lengths[b] − n + i: it sees keys
  // j ≤ that position when causal (bottom-right, per sequence), and all of its sequence's keys
  // otherwise; a window (−1: unbounded side) narrows to position − left … position + right.
  bool causal = true;
  int64_t window_left = -1, window_right = -1;
  float softcap = 0.0F;          // 0: none
  const float* sinks = nullptr;  // one per query head, or null
  // Each query row's keys as [first, last), for an attention mask whose rows are intervals:
  // key_ranges[2·((b·H + h)·n + i)] and the next, within [0, lengths[b]]; causal and the window
  // must then be off (ValueError otherwise). Null: the keys follow from lengths, causal, window.
  const int64_t* key_ranges = nullptr;
  // ALiBi: one finite slope per query head, or null; the score of query i against key j gets
  // −slope·|position − j| (the position above), after soft-capping. Not with key_ranges (whose
  // rows have no position); sequences of at most 2^24 keys, which floats count exactly.
  const float* alibi_slopes = nullptr;
  // An attention mask's entries over (b, query head h, new query i, key j), as the fused kernels
  // read them (MaskKind::kBool: an entry 0 hides the key; kFloat: the entry is added to the score,
  // after soft-capping, and must be finite or −∞), for masks that are not intervals (a gap in a
  // row, a float bias); kNone: no mask. Keys beyond a row's other bounds stay hidden. Not with
  // ALiBi.
  ScoreMask mask;
};

// out[b, h] = softmax(S) V for the n new queries (B·H: n × d) against sequence b's first
// lengths[b] cached keys (B·H_kv: capacity × d) and values (B·H_kv: capacity × dv), H_kv dividing
// H (query head h reads key/value head h / (H / H_kv)). `log_sum_exp` (B·H·n values, may be null)
// as flash_attention_forward's. n ≤ 64 / (H / H_kv) (the group's queries share one tile: at most
// 64 rows); ShapeError/ValueError otherwise. Extra memory: per task a few tiles, plus, where the
// keys are split over tasks, B·H·n·(dv + 2) floats per split for the partial results. Returns
// whether every query element, every score it computed (every query row against every key row it
// read, before soft-capping and masking) and every output element was finite: false when a query
// or a key row it read holds NaN or ±∞, a product overflowed, or an output did (a value row that
// is not finite makes its outputs so); the caller that skipped scanning its inputs for them learns
// so here. A row that sees no key (output 0, log-sum-exp −∞) is finite.
bool decode_attention_forward(ConstHeadsView q, const CacheTensorView& keys,
                              const CacheTensorView& values, const int64_t* lengths,
                              const DecodeOptions& options, HeadsView out,
                              float* log_sum_exp = nullptr);
// The same with fp16 or bf16 queries and outputs (`type`): each query widened exactly, each output
// element the float overload's rounded once to `type`; `out_residual`, when its data is not null,
// each element's rounding residual as flash_attention_forward's (output_residual in
// flash_attention.hpp).
bool decode_attention_forward(HalfType type, ConstHalfHeadsView q, const CacheTensorView& keys,
                              const CacheTensorView& values, const int64_t* lengths,
                              const DecodeOptions& options, HalfHeadsView out,
                              float* log_sum_exp = nullptr, HalfHeadsView out_residual = {});

// The largest n·(H / H_kv) decode_attention_forward takes.
constexpr int64_t kMaxDecodeRows = 64;

}  // namespace attn
