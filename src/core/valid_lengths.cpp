// ValidLengths: construction from (B) or (B, n) integers, range checks and per-head repetition.
#include "attn/core/valid_lengths.hpp"

#include <algorithm>

#include "attn/core/error.hpp"

namespace attn {

ValidLengths ValidLengths::per_batch(std::vector<int64_t> lengths) {
  ValidLengths result;
  result.kind_ = Kind::kPerBatch;
  result.batch_ = static_cast<int64_t>(lengths.size());
  result.queries_ = 1;
  result.lengths_ = std::move(lengths);
  return result;
}

ValidLengths ValidLengths::per_query(std::vector<int64_t> lengths, int64_t batch, int64_t queries) {
  if (batch < 0 || queries < 0) {
    throw ShapeError("valid_lens: expected a shape (batch, queries) of sizes ≥ 0, got (" +
                     std::to_string(batch) + ", " + std::to_string(queries) + ")");
  }
  if (static_cast<int64_t>(lengths.size()) != batch * queries) {
    throw ShapeError("valid_lens: shape (" + std::to_string(batch) + ", " +
                     std::to_string(queries) + ") needs " + std::to_string(batch * queries) +
                     " lengths, got " + std::to_string(lengths.size()));
  }
  ValidLengths result;
  result.kind_ = Kind::kPerQuery;
  result.batch_ = batch;
  result.queries_ = queries;
  result.lengths_ = std::move(lengths);
  return result;
}

namespace {
template <class Int>
ValidLengths from_integers(std::span<const Int> lengths, const Shape& shape) {
  if (static_cast<int64_t>(lengths.size()) != shape.numel()) {
    throw ShapeError("valid_lens: shape " + shape.str() + " needs " +
                     std::to_string(shape.numel()) + " lengths, got " +
                     std::to_string(lengths.size()));
  }
  std::vector<int64_t> widened(lengths.begin(), lengths.end());
  if (shape.rank() == 1) return ValidLengths::per_batch(std::move(widened));
  if (shape.rank() == 2) return ValidLengths::per_query(std::move(widened), shape[0], shape[1]);
  throw ShapeError("valid_lens: expected shape (B,) or (B, n), got shape " + shape.str());
}
}  // namespace

ValidLengths ValidLengths::from_shape(std::span<const int64_t> lengths, const Shape& shape) {
  return from_integers(lengths, shape);
}

ValidLengths ValidLengths::from_shape(std::span<const int32_t> lengths, const Shape& shape) {
  return from_integers(lengths, shape);
}

Shape ValidLengths::shape() const {
  switch (kind_) {
    case Kind::kAll:
      return Shape{};
    case Kind::kPerBatch:
      return Shape{batch_};
    case Kind::kPerQuery:
      return Shape{batch_, queries_};
  }
  return Shape{};
}

void ValidLengths::check(std::string_view name, int64_t batch, int64_t queries,
                         int64_t keys) const {
  const std::string label(name);
  if (kind_ == Kind::kAll) return;
  if (batch_ != batch || (kind_ == Kind::kPerQuery && queries_ != queries)) {
    const std::string expected = kind_ == Kind::kPerBatch ? "(" + std::to_string(batch) + ",)"
                                                          : "(" + std::to_string(batch) + ", " +
                                                                std::to_string(queries) + ")";
    throw ShapeError(label + ": expected shape " + expected + " to match scores of shape (" +
                     std::to_string(batch) + ", " + std::to_string(queries) + ", " +
                     std::to_string(keys) + "), got shape " + shape().str());
  }
  for (size_t index = 0; index < lengths_.size(); ++index) {
    const int64_t value = lengths_[index];
    if (value < 0 || value > keys) {
      std::string where = "[" + std::to_string(index) + "]";
      if (kind_ == Kind::kPerQuery && queries_ > 0) {
        where = "[" + std::to_string(static_cast<int64_t>(index) / queries_) + ", " +
                std::to_string(static_cast<int64_t>(index) % queries_) + "]";
      }
      throw ValueError(label + where + ": expected a valid length in [0, " + std::to_string(keys) +
                       "] (the number of keys), got " + std::to_string(value));
    }
  }
}

ValidLengths ValidLengths::with_causal_mask(int64_t batch, int64_t queries, int64_t keys) const {
  check("valid_lens", batch, queries, keys);
  std::vector<int64_t> lengths(static_cast<size_t>(batch * queries));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < queries; ++i) {
      lengths[static_cast<size_t>(b * queries + i)] = causal_length(b, i, queries, keys);
    }
  }
  return per_query(std::move(lengths), batch, queries);
}

ValidLengths ValidLengths::repeat_interleave(int64_t times) const {
  if (kind_ == Kind::kAll) return *this;
  const int64_t row = kind_ == Kind::kPerBatch ? 1 : queries_;
  std::vector<int64_t> repeated;
  repeated.reserve(lengths_.size() * static_cast<size_t>(times));
  for (int64_t b = 0; b < batch_; ++b) {
    for (int64_t t = 0; t < times; ++t) {
      repeated.insert(repeated.end(), lengths_.begin() + b * row, lengths_.begin() + (b + 1) * row);
    }
  }
  if (kind_ == Kind::kPerBatch) return per_batch(std::move(repeated));
  return per_query(std::move(repeated), batch_ * times, queries_);
}

}  // namespace attn
