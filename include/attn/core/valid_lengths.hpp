// ValidLengths: how many leading keys each query may attend to — none given (all), one per batch
// element (B), or one per query (B, n) — as the book's masked_softmax takes them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "attn/core/shape.hpp"

namespace attn {

class ValidLengths {
 public:
  enum class Kind { kAll, kPerBatch, kPerQuery };

  // No mask: every query sees every key.
  ValidLengths() = default;
  // One length per batch element: shape (B).
  static ValidLengths per_batch(std::vector<int64_t> lengths);
  // One length per query: row-major (B, n).
  static ValidLengths per_query(std::vector<int64_t> lengths, int64_t batch, int64_t queries);
  // From integers of shape (B) or (B, n), e.g. read from a .npy file; ShapeError for other ranks.
  static ValidLengths from_shape(std::span<const int64_t> lengths, const Shape& shape);
  static ValidLengths from_shape(std::span<const int32_t> lengths, const Shape& shape);

  Kind kind() const { return kind_; }
  bool is_all() const { return kind_ == Kind::kAll; }
  Shape shape() const;
  const std::vector<int64_t>& values() const { return lengths_; }

  // Throws ShapeError unless the lengths fit scores of `batch` × `queries` rows, and ValueError
  // naming the index and value of the first length outside [0, keys].
  void check(std::string_view name, int64_t batch, int64_t queries, int64_t keys) const;

  // The valid length of query `query` of batch element `batch`; `keys` when there is no mask.
  // Unchecked: call check() first.
  int64_t length(int64_t batch, int64_t query, int64_t keys) const {
    switch (kind_) {
      case Kind::kAll:
        return keys;
      case Kind::kPerBatch:
        return lengths_[static_cast<size_t>(batch)];
      case Kind::kPerQuery:
        return lengths_[static_cast<size_t>(batch * queries_ + query)];
    }
    return keys;
  }

  // Per-query lengths that also apply a causal mask aligned bottom-right, as FlashAttention-2:
  // query i of n sees keys j ≤ i + m − n, i.e. at most clamp(i + m − n + 1, 0, m) of them,
  // combined (by minimum) with these lengths. ShapeError/ValueError as check().
  ValidLengths with_causal_mask(int64_t batch, int64_t queries, int64_t keys) const;

  // length() further limited by the causal mask of with_causal_mask: clamp(i + m − n + 1, 0, m).
  int64_t causal_length(int64_t batch, int64_t query, int64_t queries, int64_t keys) const {
    const int64_t causal = std::clamp<int64_t>(query + keys - queries + 1, 0, keys);
    return std::min(causal, length(batch, query, keys));
  }
  // The keys query i sees: causal_length() when `causal`, else length().
  int64_t visible_length(int64_t batch, int64_t query, int64_t queries, int64_t keys,
                         bool causal) const {
    return causal ? causal_length(batch, query, queries, keys) : length(batch, query, keys);
  }

  // Each batch element's lengths repeated `times` times in a row, as torch.repeat_interleave(
  // valid_lens, repeats=times, dim=0) does for multi-head attention's (B·heads) batch.
  ValidLengths repeat_interleave(int64_t times) const;

 private:
  Kind kind_ = Kind::kAll;
  std::vector<int64_t> lengths_;
  int64_t batch_ = 0;
  int64_t queries_ = 0;
};

}  // namespace attn
