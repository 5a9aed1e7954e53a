// KVCache: the keys and values of a batch of sequences being decoded, one layer's worth — stored
// in fp32, fp16, bf16 or int8 (a scale per row and head), appended token by token without
// reallocating within the capacity — and attention of new queries against it
// (attn::scaled_dot_product_attention with a cache, through the decode kernel).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "attn/core/huge_page_allocator.hpp"
#include "attn/core/strided_view.hpp"
#include "attn/core/tensor.hpp"
#include "attn/functional/attention_options.hpp"
#include "attn/functional/scaled_dot_product_attention.hpp"
#include "attn/kernels/decode_attention.hpp"

namespace attn {

class KVCache {
 public:
  // Keys (batch, kv_heads, capacity, head_dim) and values (…, value_dim, default head_dim) of
  // `dtype`, every sequence empty. ValueError for a non-positive size or a negative capacity.
  KVCache(int64_t batch, int64_t kv_heads, int64_t head_dim, int64_t capacity,
          CacheDType dtype = CacheDType::kFloat32, std::optional<int64_t> value_dim = {});

  // Appends tokens to every sequence: keys (B, H_kv, T, head_dim) and values (B, H_kv, T,
  // value_dim), any strides with a contiguous last axis, converted to the cache's dtype (int8:
  // each row scaled by max|x|/127 and rounded). With `counts` (B values ≤ T), sequence b takes only
  // its first counts[b] tokens (ragged batches). Past the capacity, the storage grows (doubling),
  // copying what it holds. ShapeError/ValueError naming the argument; nothing is appended then
  // (the storage may have grown).
  void append(ConstStridedView keys, ConstStridedView values, std::span<const int64_t> counts = {});
  // The same for a half model's keys and values (`type`'s bits, any strides with a contiguous last
  // axis or not): widened exactly, then stored as float ones would be (a bf16 cache keeps bf16
  // entries bit for bit).
  void append(HalfType type, StridedView<const uint16_t> keys, StridedView<const uint16_t> values,
              std::span<const int64_t> counts = {});
  // Makes room for `capacity` tokens per sequence now (never shrinks); ValueError for a negative
  // capacity.
  void reserve(int64_t capacity);
  // Empties every sequence (the storage stays).
  void clear();

  int64_t batch() const { return batch_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t value_dim() const { return value_dim_; }
  int64_t capacity() const { return capacity_; }
  CacheDType dtype() const { return dtype_; }
  // Tokens held per sequence.
  const std::vector<int64_t>& lengths() const { return lengths_; }
  // Bytes of keys and values a pass over sequence b's cached tokens reads (scales included).
  int64_t bytes_per_token() const;

  // What the decode kernel reads.
  CacheTensorView keys_view() const { return view(keys_, key_scales_, head_dim_); }
  CacheTensorView values_view() const { return view(values_, value_scales_, value_dim_); }
  // The stored entries widened to fp32, (B, H_kv, longest length, dim), zero past each length.
  Tensor keys() const { return widen(keys_view()); }
  Tensor values() const { return widen(values_view()); }

 private:
  // Keys and values on transparent huge pages where the kernel allows them: a decode step reads
  // them from memory front to back, and 4 KiB pages stopped one core's prefetchers at every page.
  using Storage = std::vector<std::byte, HugePageAllocator<std::byte>>;

  CacheTensorView view(const Storage& data, const std::vector<float>& scales, int64_t cols) const;
  Tensor widen(const CacheTensorView& tensor) const;
  void store_rows(Storage& data, std::vector<float>& scales, int64_t cols,
                  const ConstStridedView& source, std::span<const int64_t> counts);
  // ValueError naming `name` when its largest magnitude rounds to ±∞ in this cache's dtype.
  void require_storable(std::string_view name, float largest) const;

  int64_t batch_, kv_heads_, head_dim_, value_dim_, capacity_;
  CacheDType dtype_;
  Storage keys_, values_;
  std::vector<float> key_scales_, value_scales_;  // int8 only: one per (b, h, row)
  std::vector<int64_t> lengths_;
};

// Attention of n new queries (B, H_q, n, E) — the last n tokens of each sequence, already appended
// to `cache` — against everything the cache holds: query i of sequence b sits at position
// lengths[b] − n + i, and `options.causal` and `options.window` refer to that position (bottom-
// right per sequence, whatever options.alignment says). Options taken: scale, causal, window,
// softcap, sinks, alibi_slopes (−slope·|position − j|, from that position; sequences of at most
// 2^24 keys on the decode kernel), enable_gqa (needed when H_q ≠ H_kv, as PyTorch's); attn_mask,
// valid_lens (the cache's lengths are the valid lengths) and dropout are refused, naming them.
// Up to 64 / (H_q / H_kv) new queries per sequence run the decode kernel, reading the cache in its
// own precision once; more (prefill against a cache) run the prefill kernel on fp32 copies of each
// sequence's cached rows. Output (B, H_q, n, Ev); log-sum-exp as for the other overload. A
// sequence holding fewer than n tokens (a ragged append) puts its first queries at negative
// positions, which see no key when causal; those rows, and every row of an empty sequence, get a
// zero output, as rows that see no key do in the other overload.
AttentionForward scaled_dot_product_attention(ConstStridedView query, const KVCache& cache,
                                              const AttentionOptions& options = {});
// The same for a half model's queries (`type`'s bits): widened exactly, the output rounded once to
// `type` (to nearest even), as PyTorch returns the query's dtype; the log-sum-exp in float.
HalfAttentionForward scaled_dot_product_attention(HalfType type, StridedView<const uint16_t> query,
                                                  const KVCache& cache,
                                                  const AttentionOptions& options = {});

}  // namespace attn
