// The decode benchmark cases (issue 13): n new queries against a KV cache of m tokens per sequence
// in fp32, fp16, bf16 or int8, through the public API attn::scaled_dot_product_attention(query,
// cache, options) — memory-bound, so measured in bytes of the cache read per second.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "attn/functional/kv_cache.hpp"

namespace attn::bench {

struct DecodeShape {
  int64_t batch = 1;
  int64_t heads = 32;      // query heads H_q
  int64_t kv_heads = 8;    // key/value heads H_kv (dividing H_q: grouped-query attention)
  int64_t head_dim = 128;  // d, of keys, values and queries
  int64_t length = 4096;   // m: tokens cached per sequence
};

struct DecodeCase {
  std::string name;  // "decode-float32", …: what --cases selects
  CacheDType dtype;
  std::string dtype_name;  // "float32", "float16", "bfloat16", "int8"
};

// One case per cache dtype, fp32 first (the base of the others' speedups).
const std::vector<DecodeCase>& decode_cases();
// Null when `name` is not a decode case.
const DecodeCase* find_decode_case(const std::string& name);

// A cache of shape.batch sequences of shape.length tokens each, reserved to exactly that, holding
// seeded random entries (one chunk of up to 1024 random tokens appended until full: the values do
// not change the time of a memory-bound pass).
std::shared_ptr<const KVCache> make_decode_cache(const DecodeShape& shape, CacheDType dtype,
                                                 uint64_t seed);

struct PreparedDecode {
  std::function<void()> run;  // one call of attn::scaled_dot_product_attention(query, cache)
  // Bytes of keys and values the call reads: Σ lengths × bytes_per_token (int8 scales included).
  double bytes_read = 0.0;
};

// The dtype a decode case's queries are values of: "cache" (a bf16 or fp16 cache's dtype, float32
// beside float32 and int8 caches), "float32", "bfloat16" or "float16".
enum class DecodeQueryDType { kCache, kFloat32, kBFloat16, kFloat16 };

// `queries` new queries per sequence (the last tokens of each, as in generation: causal),
// `heads` query heads over the cache's key/value heads (enable_gqa); the queries are values of
// `query_dtype` (a model computes its queries in its own dtype: a bf16 model's beside an int8
// cache are bf16 values).
PreparedDecode prepare_decode(std::shared_ptr<const KVCache> cache, int64_t heads, int64_t queries,
                              uint64_t seed,
                              DecodeQueryDType query_dtype = DecodeQueryDType::kCache);

// Reads a buffer twice the L3's size (32 MiB assumed when unknown) so that the next timed pass
// finds none of the cache in the L3 — as in a model, whose other layers' caches and weights pass
// through the L3 between two reads of one layer's cache.
class CacheEvictor {
 public:
  CacheEvictor();
  void evict();
  int64_t bytes() const { return static_cast<int64_t>(buffer_.size() * sizeof(uint64_t)); }

 private:
  std::vector<uint64_t> buffer_;
};

}  // namespace attn::bench
