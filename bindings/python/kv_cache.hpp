// attn.KVCache: attn::KVCache behind a reader/writer lock for Python, and attention of new queries
// against one (what scaled_dot_product_attention runs when its key is a KVCache).
#pragma once

#include <nanobind/nanobind.h>

#include <functional>
#include <mutex>
#include <shared_mutex>
#include <utility>

#include "attn/functional/attention_options.hpp"
#include "attn/functional/kv_cache.hpp"

namespace attn::python {

namespace nb = nanobind;

// Calls release the GIL while attn works, so two Python threads may reach one cache at once:
// appends, reserve and clear take the lock exclusively, attention and reads share it. The lock is
// taken only with the GIL released (or for quick reads that never wait for the GIL inside), so
// the two cannot deadlock.
class BoundCache {
 public:
  explicit BoundCache(KVCache cache) : cache_(std::move(cache)) {}
  BoundCache(const BoundCache&) = delete;
  BoundCache& operator=(const BoundCache&) = delete;

  template <class Action>
  decltype(auto) write(Action&& action) {
    std::unique_lock lock(mutex_);
    return std::invoke(action, cache_);
  }
  template <class Action>
  decltype(auto) read(Action&& action) const {
    std::shared_lock lock(mutex_);
    return std::invoke(action, std::as_const(cache_));
  }

 private:
  mutable std::shared_mutex mutex_;
  KVCache cache_;
};

// The cache when `object` is an attn.KVCache, else null.
BoundCache* as_kv_cache(nb::handle object);

// attn::scaled_dot_product_attention(query, cache, options) on a Python query (B, H_q, n, E),
// the GIL released; returns the output as the query's kind (NumPy array or torch.Tensor) and, for
// a float16 or bfloat16 query (widened exactly), in its dtype.
nb::object attend_to_cache(nb::handle query, BoundCache& cache, const AttentionOptions& options);

}  // namespace attn::python
