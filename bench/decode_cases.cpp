// The decode cases: a KV cache filled with seeded random tokens, and one decode step (n new queries
// of every sequence against everything cached) through attn::scaled_dot_product_attention.
#include "bench/decode_cases.hpp"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "attn/core/half.hpp"
#include "attn/core/random.hpp"
#include "attn/core/tensor.hpp"
#include "attn/functional/attention_options.hpp"
#include "attn/kernels/half_conversion.hpp"
#include "bench/ceilings.hpp"

namespace attn::bench {

namespace {

Tensor random_tensor(const Shape& shape, Rng& rng) {
  Tensor tensor(shape);
  for (float& x : tensor.span()) x = rng.uniform(-1.0F, 1.0F);
  return tensor;
}

}  // namespace

const std::vector<DecodeCase>& decode_cases() {
  static const std::vector<DecodeCase> cases = {
      {"decode-float32", CacheDType::kFloat32, "float32"},
      {"decode-float16", CacheDType::kFloat16, "float16"},
      {"decode-bfloat16", CacheDType::kBFloat16, "bfloat16"},
      {"decode-int8", CacheDType::kInt8, "int8"},
  };
  return cases;
}

const DecodeCase* find_decode_case(const std::string& name) {
  for (const DecodeCase& entry : decode_cases()) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

std::shared_ptr<const KVCache> make_decode_cache(const DecodeShape& shape, CacheDType dtype,
                                                 uint64_t seed) {
  auto cache =
      std::make_shared<KVCache>(shape.batch, shape.kv_heads, shape.head_dim, shape.length, dtype);
  Rng rng(seed);
  const int64_t chunk = std::min<int64_t>(shape.length, 1024);
  const Shape tokens{shape.batch, shape.kv_heads, chunk, shape.head_dim};
  const Tensor keys = random_tensor(tokens, rng), values = random_tensor(tokens, rng);
  for (int64_t filled = 0; filled < shape.length; filled += chunk) {
    const int64_t take = std::min(chunk, shape.length - filled);
    std::vector<int64_t> counts(static_cast<size_t>(shape.batch), take);
    cache->append(keys, values, counts);
  }
  return cache;
}

PreparedDecode prepare_decode(std::shared_ptr<const KVCache> cache, int64_t heads, int64_t queries,
                              uint64_t seed, DecodeQueryDType query_dtype) {
  struct State {
    std::shared_ptr<const KVCache> cache;
    Tensor query;
    std::optional<HalfType> half;  // a bf16 or fp16 model's queries, passed in their dtype
    std::vector<uint16_t> bits;    // their bits
    AttentionOptions options;
  };
  auto state = std::make_shared<State>();
  Rng rng(seed ^ 0x5deece66dULL);
  state->cache = std::move(cache);
  state->query =
      random_tensor(Shape{state->cache->batch(), heads, queries, state->cache->head_dim()}, rng);
  // A model whose cache holds bf16 or fp16 computes its queries in that dtype too: by default the
  // queries are of it, passed as a bf16 or fp16 call passes them (the half overload: a bf16
  // cache's many-row decoding takes both products on vdpbf16ps only for bf16 queries).
  if (query_dtype == DecodeQueryDType::kCache) {
    const CacheDType dtype = state->cache->dtype();
    query_dtype = dtype == CacheDType::kBFloat16  ? DecodeQueryDType::kBFloat16
                  : dtype == CacheDType::kFloat16 ? DecodeQueryDType::kFloat16
                                                  : DecodeQueryDType::kFloat32;
  }
  if (query_dtype == DecodeQueryDType::kBFloat16) state->half = HalfType::kBFloat16;
  if (query_dtype == DecodeQueryDType::kFloat16) state->half = HalfType::kFloat16;
  if (state->half) {
    state->bits.resize(static_cast<size_t>(state->query.numel()));
    narrow_to_half(*state->half, state->query.data(), state->bits.data(), state->bits.size());
  }
  state->options.causal = true;
  state->options.enable_gqa = true;
  PreparedDecode prepared;
  for (const int64_t length : state->cache->lengths()) {
    prepared.bytes_read +=
        static_cast<double>(length) * static_cast<double>(state->cache->bytes_per_token());
  }
  prepared.run = [state] {
    if (state->half) {
      scaled_dot_product_attention(
          *state->half, StridedView<const uint16_t>(state->bits.data(), state->query.shape()),
          *state->cache, state->options);
    } else {
      scaled_dot_product_attention(state->query, *state->cache, state->options);
    }
  };
  return prepared;
}

CacheEvictor::CacheEvictor() {
  const int64_t l3 = l3_cache_bytes() > 0 ? l3_cache_bytes() : int64_t{32} << 20;
  buffer_.assign(static_cast<size_t>(2 * l3) / sizeof(uint64_t), 1);
}

void CacheEvictor::evict() {
  uint64_t sum = 0;
  for (const uint64_t word : buffer_) sum += word;
  // Through a volatile, so the loop is not optimised away.
  volatile uint64_t sink = sum;
  (void)sink;
}

}  // namespace attn::bench
