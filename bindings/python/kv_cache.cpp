// attn.KVCache over attn::KVCache: construction from a dtype name, appends of NumPy arrays or
// DLPack tensors (B, H_kv, T, d) read in place (float16 and bfloat16 widened), with the GIL
// released, the lengths and widened copies of the stored entries; and attention of new queries
// (float32, or half with a half output) against a cache.
#include "kv_cache.hpp"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"

namespace attn::python {
namespace {

using namespace nb::literals;

constexpr std::array<std::pair<const char*, CacheDType>, 4> kDTypes{{
    {"float32", CacheDType::kFloat32},
    {"float16", CacheDType::kFloat16},
    {"bfloat16", CacheDType::kBFloat16},
    {"int8", CacheDType::kInt8},
}};

CacheDType to_cache_dtype(const std::string& name) {
  for (const auto& [text, dtype] : kDTypes) {
    if (name == text) return dtype;
  }
  throw nb::value_error(
      ("dtype: expected \"float32\", \"float16\", \"bfloat16\" or \"int8\", got \"" + name + "\"")
          .c_str());
}

const char* dtype_name(CacheDType dtype) {
  for (const auto& [text, value] : kDTypes) {
    if (value == dtype) return text;
  }
  return "unknown";
}

// A new NumPy int64 array holding `values`, (size,).
nb::object int64_array(std::vector<int64_t> values) {
  auto owned = std::make_unique<std::vector<int64_t>>(std::move(values));
  const size_t size = owned->size();
  int64_t* data = owned->data();
  nb::capsule owner(owned.get(), [](void* pointer) noexcept {
    std::unique_ptr<std::vector<int64_t>>(static_cast<std::vector<int64_t>*>(pointer)).reset();
  });
  owned.release();
  return nb::ndarray<nb::numpy, int64_t>(data, 1, &size, owner).cast();
}

// append's counts: None (every sequence takes all T tokens), a list of ints, or a 1-d integer
// array or tensor.
std::vector<int64_t> to_counts(nb::handle counts) {
  if (counts.is_none()) return {};
  const ValidLengths lengths = to_valid_lengths(counts, "counts");
  if (lengths.kind() != ValidLengths::Kind::kPerBatch) {
    throw nb::value_error(
        ("counts: expected one count per sequence, shape (B,), got shape " + lengths.shape().str())
            .c_str());
  }
  return lengths.values();
}

std::string repr_of(const KVCache& cache) {
  std::string text = "KVCache(batch=" + std::to_string(cache.batch()) +
                     ", kv_heads=" + std::to_string(cache.kv_heads()) +
                     ", head_dim=" + std::to_string(cache.head_dim()) +
                     ", capacity=" + std::to_string(cache.capacity()) + ", dtype='" +
                     dtype_name(cache.dtype()) + "'";
  if (cache.value_dim() != cache.head_dim())
    text += ", value_dim=" + std::to_string(cache.value_dim());
  text += ", lengths=[";
  // A long batch would flood the prompt; its lengths are one attribute away.
  const size_t shown = std::min<size_t>(cache.lengths().size(), 8);
  for (size_t b = 0; b < shown; ++b)
    text += (b > 0 ? ", " : "") + std::to_string(cache.lengths()[b]);
  if (shown < cache.lengths().size()) text += ", ...";
  return text + "])";
}

}  // namespace

BoundCache* as_kv_cache(nb::handle object) {
  BoundCache* cache = nullptr;
  if (!nb::try_cast(object, cache, /*convert=*/false)) return nullptr;
  return cache;
}

nb::object attend_to_cache(nb::handle query, BoundCache& cache, const AttentionOptions& options) {
  // float16 and bfloat16 queries (a half model's): the half overload, whose output is their dtype.
  const StridedInput q(query, "query", 4, 4, HalfInputs::kAccept);
  if (const std::optional<HalfType> half = q.half_type()) {
    HalfAttentionForward forward;
    {
      nb::gil_scoped_release release;
      const ThreadSettingScope thread_setting;
      forward = cache.read([&](const KVCache& kv) {
        return scaled_dot_product_attention(*half, q.half_view(), kv, options);
      });
    }
    return to_python(std::move(forward.output), q.framework());
  }
  AttentionForward forward;
  {
    nb::gil_scoped_release release;
    const ThreadSettingScope thread_setting;
    forward = cache.read(
        [&](const KVCache& kv) { return scaled_dot_product_attention(q.view(), kv, options); });
  }
  return to_python(std::move(forward.output), q.framework());
}

void bind_kv_cache(nb::module_& module) {
  nb::class_<BoundCache> cls(
      module, "KVCache",
      "The keys and values of a batch of sequences being decoded, one layer's worth, stored in\n"
      "float32, float16, bfloat16 or int8 (a scale per row and head: max|x|/127) and read in that\n"
      "precision by scaled_dot_product_attention(query, cache, ...). Keys (B, H_kv, capacity,\n"
      "head_dim), values (B, H_kv, capacity, value_dim); appending within the capacity does not\n"
      "reallocate, past it the storage doubles.");
  cls.def(
      "__init__",
      [](BoundCache* self, nb::handle batch_value, nb::handle kv_heads_value,
         nb::handle head_dim_value, nb::handle capacity_value, nb::handle dtype_value,
         nb::handle value_dim_value) {
        constexpr std::string_view kName = "KVCache";
        const auto batch = scalar_argument<int64_t>(batch_value, kName, "batch", "int");
        const auto kv_heads = scalar_argument<int64_t>(kv_heads_value, kName, "kv_heads", "int");
        const auto head_dim = scalar_argument<int64_t>(head_dim_value, kName, "head_dim", "int");
        const auto capacity = scalar_argument<int64_t>(capacity_value, kName, "capacity", "int");
        const auto dtype = scalar_argument<std::string>(dtype_value, kName, "dtype", "str");
        const auto value_dim =
            optional_scalar_argument<int64_t>(value_dim_value, kName, "value_dim", "int or None");
        new (self) BoundCache(
            KVCache(batch, kv_heads, head_dim, capacity, to_cache_dtype(dtype), value_dim));
      },
      nb::sig("def __init__(self, batch: int, kv_heads: int, head_dim: int, capacity: int, "
              "dtype: str = 'float32', value_dim: int | None = None) -> None"),
      "batch"_a.none(), "kv_heads"_a.none(), "head_dim"_a.none(), "capacity"_a.none(),
      "dtype"_a.none() = "float32", "value_dim"_a.none() = nb::none(),
      "An empty cache of `batch` sequences, room for `capacity` tokens each (0 is allowed).\n"
      "dtype: \"float32\", \"float16\", \"bfloat16\" or \"int8\"; value_dim defaults to head_dim.");
  cls.def(
      "append",
      [](BoundCache& bound, nb::handle keys, nb::handle values, nb::handle counts) {
        refuse_recording_tensor(keys, "keys", "attn.KVCache.append", "");
        refuse_recording_tensor(values, "values", "attn.KVCache.append", "");
        const StridedInput k(keys, "keys", 4, 4, HalfInputs::kAccept);
        const StridedInput v(values, "values", 4, 4, HalfInputs::kAccept);
        if (k.half_type() != v.half_type()) {
          throw nb::type_error(
              ("values: expected the dtype of keys (" + k.dtype() + "), got " + v.dtype()).c_str());
        }
        const std::vector<int64_t> taken = to_counts(counts);
        nb::gil_scoped_release release;
        bound.write([&](KVCache& cache) {
          if (const std::optional<HalfType> half = k.half_type()) {
            cache.append(*half, k.half_view(), v.half_view(), taken);
          } else {
            cache.append(k.view(), v.view(), taken);
          }
        });
      },
      "keys"_a.none(), "values"_a.none(), "counts"_a.none() = nb::none(),
      "Appends T tokens to every sequence: keys (B, H_kv, T, head_dim) and values (B, H_kv, T,\n"
      "value_dim), NumPy arrays or tensors of one dtype (float32 with a contiguous last axis read\n"
      "in place, float64 copied, float16 and bfloat16 - a half model's - widened exactly),\n"
      "converted to the cache's dtype (a bfloat16 cache keeps bfloat16 entries bit for bit).\n"
      "counts (B ints <= T, a list or an integer array): sequence b takes only its first\n"
      "counts[b] tokens (ragged batches). A bad shape, count or non-finite entry raises and\n"
      "appends nothing (the storage may have grown). A tensor that requires grad is refused\n"
      "while grad mode is on (no gradient flows through the cache): pass its .detach().");
  cls.def(
      "reserve",
      [](BoundCache& bound, nb::handle capacity_value) {
        // Converted as the constructor converts its sizes: a wrong type names the argument (it
        // got nanobind's list of the whole signature).
        const auto capacity =
            scalar_argument<int64_t>(capacity_value, "KVCache.reserve", "capacity", "int");
        nb::gil_scoped_release release;
        bound.write([&](KVCache& cache) { cache.reserve(capacity); });
      },
      nb::sig("def reserve(self, capacity: int) -> None"), "capacity"_a.none(),
      "Makes room for `capacity` tokens per sequence now (never shrinks).");
  cls.def(
      "clear", [](BoundCache& bound) { bound.write([](KVCache& cache) { cache.clear(); }); },
      "Empties every sequence; the storage stays.");
  cls.def(
      "keys",
      [](const BoundCache& bound) {
        Tensor keys;
        {
          nb::gil_scoped_release release;
          keys = bound.read([](const KVCache& cache) { return cache.keys(); });
        }
        return to_python(std::move(keys), Framework::kNumpy);
      },
      "The stored keys widened to float32, a new NumPy array (B, H_kv, max(lengths), head_dim),\n"
      "zero past each sequence's length: exactly what attention reads.");
  cls.def(
      "values",
      [](const BoundCache& bound) {
        Tensor values;
        {
          nb::gil_scoped_release release;
          values = bound.read([](const KVCache& cache) { return cache.values(); });
        }
        return to_python(std::move(values), Framework::kNumpy);
      },
      "The stored values widened to float32, a new NumPy array (B, H_kv, max(lengths),\n"
      "value_dim), zero past each sequence's length.");
  cls.def_prop_ro(
      "lengths",
      [](const BoundCache& bound) {
        return int64_array(bound.read([](const KVCache& cache) { return cache.lengths(); }));
      },
      "Tokens held per sequence, a new NumPy int64 array (B,).");
  cls.def_prop_ro(
      "capacity", [](const BoundCache& bound) { return bound.read(&KVCache::capacity); },
      "Tokens per sequence the storage holds before it grows.");
  cls.def_prop_ro(
      "dtype",
      [](const BoundCache& bound) { return std::string(dtype_name(bound.read(&KVCache::dtype))); },
      "The storage type: \"float32\", \"float16\", \"bfloat16\" or \"int8\".");
  cls.def_prop_ro(
      "batch", [](const BoundCache& bound) { return bound.read(&KVCache::batch); }, "Sequences B.");
  cls.def_prop_ro(
      "kv_heads", [](const BoundCache& bound) { return bound.read(&KVCache::kv_heads); },
      "Key/value heads H_kv.");
  cls.def_prop_ro(
      "head_dim", [](const BoundCache& bound) { return bound.read(&KVCache::head_dim); },
      "Size of a key (and of a query).");
  cls.def_prop_ro(
      "value_dim", [](const BoundCache& bound) { return bound.read(&KVCache::value_dim); },
      "Size of a value.");
  cls.def_prop_ro(
      "bytes_per_token",
      [](const BoundCache& bound) { return bound.read(&KVCache::bytes_per_token); },
      "Bytes of keys and values one cached token takes per sequence, int8 scales included: what\n"
      "attention reads per token.");
  cls.def("__repr__", [](const BoundCache& bound) {
    return bound.read([](const KVCache& c) { return repr_of(c); });
  });
}

}  // namespace attn::python
