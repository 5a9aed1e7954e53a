// KVCache: storage, appending (with conversion to the cache's dtype), growth; and attention of new
// queries against a cache — the decode kernel for a few queries, the prefill kernel beyond.
#include "attn/functional/kv_cache.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <new>
#include <span>
#include <string>

#include "attn/core/error.hpp"
#include "attn/core/half.hpp"
#include "attn/kernels/half_conversion.hpp"
#include "attn/kernels/int8_quantization.hpp"
#include "core/magnitude_scan.hpp"
#include "functional/attention_layout.hpp"
#include "functional/memory_overlap.hpp"

namespace attn {

namespace {

int64_t require_size(std::string_view name, int64_t value) {
  if (value <= 0) {
    throw ValueError(std::string(name) + ": expected a positive size, got " +
                     std::to_string(value));
  }
  return value;
}

// The bytes of one (batch, heads, tokens, cols) store of `element`-byte entries, or -1 where that
// exceeds any address space (the product wrapped around int64 before: a cache of 2⁶² tokens
// allocated nothing and was written past its end).
int64_t store_bytes(int64_t batch, int64_t heads, int64_t tokens, int64_t cols, int64_t element) {
  int64_t bytes = 1;
  for (const int64_t factor : {batch, heads, tokens, cols, element}) {
    if (__builtin_mul_overflow(bytes, factor, &bytes)) return -1;
  }
  return bytes <= std::numeric_limits<std::ptrdiff_t>::max() ? bytes : -1;
}

// The flat index of (b, h, row) matrices' rows in a (B, H, capacity, ·) store.
int64_t row_index(int64_t b, int64_t h, int64_t row, int64_t heads, int64_t capacity) {
  return (b * heads + h) * capacity + row;
}

}  // namespace

KVCache::KVCache(int64_t batch, int64_t kv_heads, int64_t head_dim, int64_t capacity,
                 CacheDType dtype, std::optional<int64_t> value_dim)
    : batch_(require_size("batch", batch)),
      kv_heads_(require_size("kv_heads", kv_heads)),
      head_dim_(require_size("head_dim", head_dim)),
      value_dim_(require_size("value_dim", value_dim.value_or(head_dim))),
      capacity_(0),
      dtype_(dtype) {
  if (capacity < 0) {
    throw ValueError("capacity: expected a number of tokens ≥ 0, got " + std::to_string(capacity));
  }
  if (dtype != CacheDType::kFloat32 && dtype != CacheDType::kFloat16 &&
      dtype != CacheDType::kBFloat16 && dtype != CacheDType::kInt8) {
    throw ValueError(
        "dtype: expected CacheDType::kFloat32, kFloat16, kBFloat16 or kInt8, got the value " +
        std::to_string(static_cast<int>(dtype)));
  }
  // One token per sequence must be addressable (bytes_per_token and every row offset then are).
  if (store_bytes(batch_, kv_heads_, 1, head_dim_ + value_dim_, cache_dtype_size(dtype_)) < 0) {
    throw ValueError("batch, kv_heads, head_dim, value_dim: expected sizes whose one token (" +
                     std::to_string(batch_) + " × " + std::to_string(kv_heads_) + " × (" +
                     std::to_string(head_dim_) + " + " + std::to_string(value_dim_) +
                     ") entries) fits in memory's addresses, got more");
  }
  lengths_.assign(static_cast<size_t>(batch_), 0);
  reserve(capacity);
}

int64_t KVCache::bytes_per_token() const {
  const int64_t scales = dtype_ == CacheDType::kInt8 ? 2 * static_cast<int64_t>(sizeof(float)) : 0;
  return kv_heads_ * ((head_dim_ + value_dim_) * cache_dtype_size(dtype_) + scales);
}

void KVCache::reserve(int64_t capacity) {
  if (capacity < 0) {
    throw ValueError("capacity: expected a number of tokens ≥ 0, got " + std::to_string(capacity));
  }
  if (capacity <= capacity_) return;
  const int64_t element = cache_dtype_size(dtype_);
  const auto room = [&] {
    return std::to_string(capacity) + " tokens for each of " + std::to_string(batch_) +
           " sequence(s) × " + std::to_string(kv_heads_) + " key/value head(s)";
  };
  // Keys, values and (int8) the rows' scales, each one allocation.
  if (store_bytes(batch_, kv_heads_, capacity, head_dim_, element) < 0 ||
      store_bytes(batch_, kv_heads_, capacity, value_dim_, element) < 0 ||
      store_bytes(batch_, kv_heads_, capacity, 1, sizeof(float)) < 0) {
    throw ValueError(
        "capacity: expected a number of tokens whose storage fits in memory's "
        "addresses, got " +
        room());
  }
  const auto grow = [&](Storage& data, std::vector<float>& scales, int64_t cols) {
    Storage grown;
    std::vector<float> grown_scales;
    try {
      grown.resize(static_cast<size_t>(store_bytes(batch_, kv_heads_, capacity, cols, element)));
      if (dtype_ == CacheDType::kInt8)
        grown_scales.resize(static_cast<size_t>(batch_ * kv_heads_ * capacity));
    } catch (const std::bad_alloc&) {
      throw AllocationError(
          static_cast<size_t>(store_bytes(batch_, kv_heads_, capacity, cols, element)), "capacity",
          " for " + room());
    }
    for (int64_t b = 0; b < batch_; ++b) {
      const int64_t rows = lengths_[static_cast<size_t>(b)];
      // An empty cache has no buffer yet; memcpy may not be given its null pointer.
      if (rows == 0) continue;
      for (int64_t h = 0; h < kv_heads_; ++h) {
        const int64_t from = row_index(b, h, 0, kv_heads_, capacity_);
        const int64_t to = row_index(b, h, 0, kv_heads_, capacity);
        std::memcpy(grown.data() + to * cols * element, data.data() + from * cols * element,
                    static_cast<size_t>(rows * cols * element));
        if (!scales.empty()) std::copy_n(scales.data() + from, rows, grown_scales.data() + to);
      }
    }
    data = std::move(grown);
    scales = std::move(grown_scales);
  };
  grow(keys_, key_scales_, head_dim_);
  grow(values_, value_scales_, value_dim_);
  capacity_ = capacity;
}

void KVCache::clear() {
  std::fill(lengths_.begin(), lengths_.end(), 0);
}

void KVCache::store_rows(Storage& data, std::vector<float>& scales, int64_t cols,
                         const ConstStridedView& source, std::span<const int64_t> counts) {
  // A sequence's new rows of one head are consecutive in the cache, so each (sequence, head) is one
  // conversion call over all its rows (on the OpenMP threads from a million values on: a prompt's
  // keys); the source's rows are `row_stride` apart (cols when they are packed).
  const int64_t element = cache_dtype_size(dtype_);
  const int64_t row_stride = source.stride(2);
  const auto width = static_cast<size_t>(cols);
  for (int64_t b = 0; b < batch_; ++b) {
    const int64_t count = counts[static_cast<size_t>(b)];
    if (count == 0) continue;
    for (int64_t h = 0; h < kv_heads_; ++h) {
      const float* first = source.data() + b * source.stride(0) + h * source.stride(1);
      const int64_t index = row_index(b, h, lengths_[static_cast<size_t>(b)], kv_heads_, capacity_);
      std::byte* destination = data.data() + index * cols * element;
      // store(source, offset in the destination, values): once over all rows when they are
      // packed, else row by row.
      const auto in_runs = [&](const auto& store) {
        if (row_stride == cols || count == 1) {
          store(first, int64_t{0}, count * cols);
        } else {
          for (int64_t t = 0; t < count; ++t) store(first + t * row_stride, t * cols, cols);
        }
      };
      switch (dtype_) {
        case CacheDType::kFloat32: {
          auto* floats = reinterpret_cast<float*>(destination);
          in_runs([floats](const float* from, int64_t at, int64_t values) {
            std::copy_n(from, values, floats + at);
          });
          break;
        }
        case CacheDType::kFloat16:
        case CacheDType::kBFloat16: {
          const HalfType type =
              dtype_ == CacheDType::kFloat16 ? HalfType::kFloat16 : HalfType::kBFloat16;
          auto* halves = reinterpret_cast<uint16_t*>(destination);
          in_runs([type, halves](const float* from, int64_t at, int64_t values) {
            narrow_to_half(type, from, halves + at, static_cast<size_t>(values));
          });
          break;
        }
        case CacheDType::kInt8:
          // q8: one scale per row, max|x| / 127, entries rounded to [−127, 127].
          quantize_rows_int8(first, static_cast<size_t>(row_stride), static_cast<size_t>(count),
                             width, reinterpret_cast<int8_t*>(destination), scales.data() + index);
          break;
      }
    }
  }
}

void KVCache::require_storable(std::string_view name, float largest) const {
  // A half cache rounds each entry once: one beyond its range became ±∞, and every score or
  // output that read it NaN. The largest magnitude decides (rounding is monotonic).
  if (dtype_ != CacheDType::kFloat16 && dtype_ != CacheDType::kBFloat16) return;
  const HalfType type = dtype_ == CacheDType::kFloat16 ? HalfType::kFloat16 : HalfType::kBFloat16;
  uint16_t rounded = 0;
  narrow_to_half(type, &largest, &rounded, 1);
  float back = 0.0F;
  widen_half(type, &rounded, &back, 1);
  if (std::isfinite(back)) return;
  const char* dtype = type == HalfType::kFloat16 ? "float16" : "bfloat16";
  throw ValueError(std::string(name) + ": expected magnitudes a " + dtype + " cache holds, got " +
                   number_text(largest) + ", which rounds to infinity; scale the " +
                   std::string(name) + " down or use a float32 cache");
}

void KVCache::append(ConstStridedView keys, ConstStridedView values,
                     std::span<const int64_t> counts) {
  const auto require_tokens = [&](std::string_view name, const ConstStridedView& view,
                                  int64_t cols) {
    if (view.rank() != 4 || view.dim(0) != batch_ || view.dim(1) != kv_heads_ ||
        view.dim(3) != cols) {
      throw ShapeError(std::string(name) + ": expected shape (" + std::to_string(batch_) + ", " +
                       std::to_string(kv_heads_) + ", T, " + std::to_string(cols) +
                       ") (batch, kv_heads, tokens, dim), got " + view.shape().str());
    }
  };
  require_tokens("keys", keys, head_dim_);
  require_tokens("values", values, value_dim_);
  const int64_t tokens = keys.dim(2);
  if (values.dim(2) != tokens) {
    throw ShapeError("values: expected " + std::to_string(tokens) + " tokens (as keys), got " +
                     std::to_string(values.dim(2)));
  }
  std::vector<int64_t> appended(static_cast<size_t>(batch_), tokens);
  if (!counts.empty()) {
    if (static_cast<int64_t>(counts.size()) != batch_) {
      throw ShapeError("counts: expected one count per sequence (" + std::to_string(batch_) +
                       "), got " + std::to_string(counts.size()));
    }
    for (int64_t b = 0; b < batch_; ++b) {
      const int64_t count = counts[static_cast<size_t>(b)];
      if (count < 0 || count > tokens) {
        throw ValueError("counts[" + std::to_string(b) + "]: expected a number of tokens in [0, " +
                         std::to_string(tokens) + "], got " + std::to_string(count));
      }
      appended[static_cast<size_t>(b)] = count;
    }
  }
  // Rows of this cache's own storage (a prefix copied for another beam) are read from copies: the
  // storage may move as it grows, and the rows are stored into it.
  Tensor key_source, value_source;
  const auto in_storage = [&](const ConstStridedView& view) {
    return functional_detail::writes_over_reads(
        {functional_detail::region_of(keys_.data(), keys_.size()),
         functional_detail::region_of(values_.data(), values_.size())},
        {functional_detail::region_of(view)});
  };
  if (in_storage(keys)) keys = key_source = functional_detail::contiguous_copy(keys);
  if (in_storage(values)) values = value_source = functional_detail::contiguous_copy(values);
  // The room first: tokens no memory holds (an expanded view of 2⁴⁰ rows, stride 0) fail here at
  // once, not after a scan of every entry. The storage may grow; what it holds does not change.
  int64_t needed = 0;
  for (int64_t b = 0; b < batch_; ++b)
    needed = std::max(needed, lengths_[static_cast<size_t>(b)] + appended[static_cast<size_t>(b)]);
  // Doubling, short of int64's end (reserve then names a capacity too large for memory).
  const int64_t doubled = capacity_ <= std::numeric_limits<int64_t>::max() / 2
                              ? 2 * capacity_
                              : std::numeric_limits<int64_t>::max();
  if (needed > capacity_) reserve(std::max(needed, doubled));
  // Contiguous last axes and finite entries, checked before any entry or length changes.
  Tensor key_copy, value_copy;
  if (keys.dim(-1) > 1 && keys.stride(-1) != 1)
    keys = key_copy = functional_detail::contiguous_copy(keys);
  if (values.dim(-1) > 1 && values.stride(-1) != 1)
    values = value_copy = functional_detail::contiguous_copy(values);
  require_storable("keys", functional_detail::require_finite("keys", keys));
  require_storable("values", functional_detail::require_finite("values", values));
  store_rows(keys_, key_scales_, head_dim_, keys, appended);
  store_rows(values_, value_scales_, value_dim_, values, appended);
  for (int64_t b = 0; b < batch_; ++b)
    lengths_[static_cast<size_t>(b)] += appended[static_cast<size_t>(b)];
}

void KVCache::append(HalfType type, StridedView<const uint16_t> keys,
                     StridedView<const uint16_t> values, std::span<const int64_t> counts) {
  functional_detail::require_half_type(type);
  append(functional_detail::widened_copy(type, keys), functional_detail::widened_copy(type, values),
         counts);
}

CacheTensorView KVCache::view(const Storage& data, const std::vector<float>& scales,
                              int64_t cols) const {
  CacheTensorView view;
  view.dtype = dtype_;
  view.data = data.data();
  view.scales = scales.empty() ? nullptr : scales.data();
  view.batch = batch_;
  view.heads = kv_heads_;
  view.capacity = capacity_;
  view.cols = cols;
  view.row_stride = cols;
  view.head_stride = capacity_ * cols;
  view.batch_stride = kv_heads_ * capacity_ * cols;
  return view;
}

Tensor KVCache::widen(const CacheTensorView& tensor) const {
  const int64_t longest = *std::max_element(lengths_.begin(), lengths_.end());
  Tensor widened(Shape{batch_, kv_heads_, longest, tensor.cols});
  for (int64_t b = 0; b < batch_; ++b) {
    for (int64_t h = 0; h < kv_heads_; ++h) {
      for (int64_t row = 0; row < lengths_[static_cast<size_t>(b)]; ++row) {
        const int64_t index = row_index(b, h, row, kv_heads_, capacity_);
        for (int64_t c = 0; c < tensor.cols; ++c) {
          const int64_t e = index * tensor.cols + c;
          float value = 0.0F;
          switch (tensor.dtype) {
            case CacheDType::kFloat32:
              value = static_cast<const float*>(tensor.data)[e];
              break;
            case CacheDType::kFloat16:
              value = half_to_float(static_cast<const uint16_t*>(tensor.data)[e]);
              break;
            case CacheDType::kBFloat16:
              value = bfloat16_to_float(static_cast<const uint16_t*>(tensor.data)[e]);
              break;
            case CacheDType::kInt8:
              value = static_cast<float>(static_cast<const int8_t*>(tensor.data)[e]) *
                      tensor.scales[static_cast<size_t>(index)];
              break;
          }
          widened(b, h, row, c) = value;
        }
      }
    }
  }
  return widened;
}

namespace {

// The options a cache call refuses, and the checks of the rest that the kernels need.
void check_cache_options(const AttentionOptions& options, int64_t query_heads) {
  const char* refused = options.attn_mask.has_value()  ? "attn_mask"
                        : !options.valid_lens.is_all() ? "valid_lens"
                        : options.dropout != 0.0F      ? "dropout"
                                                       : nullptr;
  if (refused != nullptr) {
    throw ValueError(std::string(refused) +
                     ": not taken with a KV cache (the cache's lengths are the valid lengths; "
                     "masks and dropout are for the prefill call without a cache)");
  }
  if (options.scale && !std::isfinite(*options.scale))
    throw ValueError("scale: expected a finite number, got " + number_text(*options.scale));
  if (options.softcap && !(*options.softcap > 0.0F && std::isfinite(*options.softcap))) {
    throw ValueError("softcap: expected a positive finite number, got " +
                     number_text(*options.softcap));
  }
  if (options.window && (options.window->left < -1 || options.window->right < -1)) {
    throw ValueError("window: expected sizes ≥ 0 (−1 for unbounded), got (" +
                     std::to_string(options.window->left) + ", " +
                     std::to_string(options.window->right) + ")");
  }
  functional_detail::require_sinks(options.sinks, query_heads);
  // (A cache's positions are fewer than 2^25: ALiBi's decode kernel takes at most 2^24 keys.)
  functional_detail::require_alibi_slopes(options.alibi_slopes, query_heads, int64_t{1} << 25);
}

}  // namespace

namespace {

// The checks of a decode call's query shape and options against the cache, both overloads'.
void check_cache_query(const Shape& shape, const KVCache& cache, const AttentionOptions& options) {
  if (shape.rank() != 4 || shape[0] != cache.batch() || shape[3] != cache.head_dim()) {
    throw ShapeError("query: expected shape (" + std::to_string(cache.batch()) + ", H_q, n, " +
                     std::to_string(cache.head_dim()) +
                     ") (the cache's batch and head size), got " + shape.str());
  }
  const int64_t heads = shape[1];
  if (heads != cache.kv_heads()) {
    if (!options.enable_gqa) {
      throw ShapeError("query: expected " + std::to_string(cache.kv_heads()) +
                       " heads (the cache's; set enable_gqa for grouped-query attention), got " +
                       std::to_string(heads));
    }
    if (heads % cache.kv_heads() != 0) {
      throw ShapeError("enable_gqa: expected the cache's " + std::to_string(cache.kv_heads()) +
                       " key/value heads to divide the query's heads, got " +
                       std::to_string(heads));
    }
  }
  check_cache_options(options, heads);
}

// A (B, H, n, cols) query as the kernel's heads (any strides but a contiguous last axis).
template <class T>
BasicHeadsView<const T> query_heads(const StridedView<const T>& query) {
  return {query.data(), query.dim(0),    query.dim(1),    query.dim(2),
          query.dim(3), query.stride(0), query.stride(1), query.stride(2)};
}

// A new contiguous (B, H, n, cols) output at `data` as the kernel's heads.
template <class T>
BasicHeadsView<T> output_heads(T* data, int64_t batch, int64_t heads, int64_t n, int64_t cols) {
  return {data, batch, heads, n, cols, heads * n * cols, n * cols, cols};
}

// The decode kernel's options for a call's options, at `scale`.
DecodeOptions decode_options(const AttentionOptions& options, float scale) {
  DecodeOptions decode;
  decode.scale = scale;
  decode.causal = options.causal;
  if (options.window) {
    const SlidingWindow window = options.window->bounded();
    decode.window_left = window.left;
    decode.window_right = window.right;
  }
  decode.softcap = options.softcap.value_or(0.0F);
  decode.sinks = options.sinks.empty() ? nullptr : options.sinks.data();
  decode.alibi_slopes = options.alibi_slopes.empty() ? nullptr : options.alibi_slopes.data();
  return decode;
}

}  // namespace

AttentionForward scaled_dot_product_attention(ConstStridedView query, const KVCache& cache,
                                              const AttentionOptions& options) {
  check_cache_query(query.shape(), cache, options);
  const int64_t batch = query.dim(0), heads = query.dim(1), n = query.dim(2);
  Tensor query_copy;
  if (query.dim(-1) > 1 && query.stride(-1) != 1)
    query = query_copy = functional_detail::contiguous_copy(query);
  functional_detail::require_finite("query", query);
  const float scale =
      options.scale.value_or(1.0F / std::sqrt(static_cast<float>(cache.head_dim())));

  AttentionForward result;
  result.output = Tensor(Shape{batch, heads, n, cache.value_dim()});
  result.log_sum_exp.resize(static_cast<size_t>(batch * heads * n));
  const ConstHeadsView q = query_heads(query);
  const HeadsView out = output_heads(result.output.data(), batch, heads, n, cache.value_dim());
  const int64_t group = heads / cache.kv_heads();
  if (group * n <= kMaxDecodeRows) {
    decode_attention_forward(q, cache.keys_view(), cache.values_view(), cache.lengths().data(),
                             decode_options(options, scale), out, result.log_sum_exp.data());
    // The kernel's unnormalised sums reach a row's key count times max|v|: values near float's
    // maximum overflow there (3e38 gave inf), where the prefill path below scales them first, and
    // names scores that overflow instead of answering inf or NaN.
    if (core_detail::largest_magnitude_bits(result.output.data(), result.output.numel()) <
        core_detail::kFirstNonFinite) {
      return result;
    }
  }
  // Prefill against the cache: each sequence on fp32 copies of its cached rows, its queries'
  // diagonal at lengths[b] − n + i.
  const Tensor keys = cache.keys(), values = cache.values();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t length = cache.lengths()[static_cast<size_t>(b)];
    AttentionOptions prefill;
    prefill.causal = options.causal;
    prefill.alignment = DiagonalAlignment::kOffset;
    prefill.diagonal_offset = length - n;
    if (options.window) prefill.window = options.window->bounded();
    prefill.scale = scale;
    prefill.softcap = options.softcap;
    prefill.sinks = options.sinks;
    prefill.alibi_slopes = options.alibi_slopes;
    prefill.enable_gqa = options.enable_gqa;
    const auto sequence = [&](const Tensor& t, int64_t rows) {
      const int64_t strides[4] = {0, t.dim(2) * t.dim(3), t.dim(3), 1};
      return ConstStridedView(t.data() + b * t.dim(1) * t.dim(2) * t.dim(3),
                              Shape{1, t.dim(1), rows, t.dim(3)}, strides);
    };
    const int64_t query_strides[4] = {0, query.stride(1), query.stride(2), query.stride(3)};
    const ConstStridedView q_b(query.data() + b * query.stride(0), Shape{1, heads, n, query.dim(3)},
                               query_strides);
    const int64_t out_strides[4] = {0, n * cache.value_dim(), cache.value_dim(), 1};
    scaled_dot_product_attention(
        q_b, sequence(keys, length), sequence(values, length), prefill,
        MutableStridedView(result.output.data() + b * heads * n * cache.value_dim(),
                           Shape{1, heads, n, cache.value_dim()}, out_strides),
        std::span<float>(result.log_sum_exp.data() + b * heads * n,
                         static_cast<size_t>(heads * n)));
  }
  return result;
}

HalfAttentionForward scaled_dot_product_attention(HalfType type, StridedView<const uint16_t> query,
                                                  const KVCache& cache,
                                                  const AttentionOptions& options) {
  functional_detail::require_half_type(type);
  check_cache_query(query.shape(), cache, options);
  const int64_t batch = query.dim(0), heads = query.dim(1), n = query.dim(2);
  if ((heads / cache.kv_heads()) * n <= kMaxDecodeRows &&
      (query.dim(3) == 1 || query.stride(3) == 1)) {
    // Decoding: the kernel reads the half queries in place and rounds its output rows itself.
    functional_detail::require_finite("query", type, query);
    const float scale =
        options.scale.value_or(1.0F / std::sqrt(static_cast<float>(cache.head_dim())));
    HalfAttentionForward result;
    const Shape shape{batch, heads, n, cache.value_dim()};
    result.output = {type, shape, HalfTensor::Storage(static_cast<size_t>(shape.numel()))};
    result.log_sum_exp.resize(static_cast<size_t>(batch * heads * n));
    decode_attention_forward(
        type, query_heads(query), cache.keys_view(), cache.values_view(), cache.lengths().data(),
        decode_options(options, scale),
        output_heads(result.output.bits.data(), batch, heads, n, cache.value_dim()),
        result.log_sum_exp.data());
    // As the float overload: a non-finite entry (a sum that overflowed, or a value past the
    // type's range) takes the float call, which redoes overflowing sums on the prefill path.
    const uint16_t exponent = type == HalfType::kFloat16 ? 0x7C00 : 0x7F80;
    bool non_finite = false;  // one pass without an early exit, which the compiler vectorises
    for (const uint16_t x : result.output.bits) non_finite |= (x & exponent) == exponent;
    if (!non_finite) return result;
  }
  AttentionForward wide =
      scaled_dot_product_attention(functional_detail::widened_copy(type, query), cache, options);
  HalfAttentionForward result;
  result.output = HalfTensor{type, wide.output.shape(), {}};
  result.output.bits.resize(static_cast<size_t>(wide.output.numel()));
  narrow_to_half(type, wide.output.data(), result.output.bits.data(), result.output.bits.size());
  result.log_sum_exp = std::move(wide.log_sum_exp);
  return result;
}

}  // namespace attn
