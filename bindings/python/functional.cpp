// scaled_dot_product_attention over Python arrays, with PyTorch's signature and attn's additions
// (attn/functional): NumPy arrays or DLPack tensors shaped (..., H, L, E) read in place when their
// last axis is contiguous, the GIL released while attn computes. Also the forward and backward
// passes that attn.torch's custom operators call (_sdpa_forward, _sdpa_backward). With an
// attn.KVCache as key, the decode call attn::scaled_dot_product_attention(query, cache, options).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "attn/functional/attention_options.hpp"
#include "attn/functional/scaled_dot_product_attention.hpp"
#include "attn/kernels/half_conversion.hpp"
#include "bindings.hpp"
#include "kv_cache.hpp"

namespace attn::python {
namespace {

using namespace nb::literals;

std::string python_type(nb::handle object) {
  return nb::type_name(object.type()).c_str();
}

// The scalar arguments of scaled_dot_product_attention, taken as objects and converted as
// nanobind would (arrays.hpp's scalar_argument), named in PyTorch's words as attn.torch's.
constexpr std::string_view kSdpa = "scaled_dot_product_attention";
template <typename Value>
Value scalar_argument(nb::handle value, const char* name, const char* expected) {
  return python::scalar_argument<Value>(value, kSdpa, name, expected);
}
template <typename Value>
std::optional<Value> optional_scalar_argument(nb::handle value, const char* name,
                                              const char* expected) {
  return python::optional_scalar_argument<Value>(value, kSdpa, name, expected);
}

// The scalars in the binding's order, converted.
struct ScalarArguments {
  float dropout_p = 0.0F;
  bool is_causal = false;
  std::optional<float> scale;
  bool enable_gqa = false;
  std::optional<float> softcap;
  std::string alignment;
  bool alignment_given = false;  // not None: the caller chose it
  bool need_weights = false;
  std::optional<uint64_t> seed;
  bool causal = false;
  std::optional<float> dropout;

  ScalarArguments(nb::handle dropout_p_value, nb::handle is_causal_value, nb::handle scale_value,
                  nb::handle enable_gqa_value, nb::handle softcap_value, nb::handle alignment_value,
                  nb::handle need_weights_value, nb::handle seed_value, nb::handle causal_value,
                  nb::handle dropout_value)
      : dropout_p(scalar_argument<float>(dropout_p_value, "dropout_p", "float")),
        is_causal(scalar_argument<bool>(is_causal_value, "is_causal", "bool")),
        scale(optional_scalar_argument<float>(scale_value, "scale", "float or None")),
        enable_gqa(scalar_argument<bool>(enable_gqa_value, "enable_gqa", "bool")),
        softcap(optional_scalar_argument<float>(softcap_value, "softcap", "float or None")),
        alignment(alignment_value.is_none()
                      ? std::string("top-left")
                      : scalar_argument<std::string>(alignment_value, "alignment", "str or None")),
        alignment_given(!alignment_value.is_none()),
        need_weights(scalar_argument<bool>(need_weights_value, "need_weights", "bool")),
        seed(
            optional_scalar_argument<uint64_t>(seed_value, "seed", "an int in [0, 2**64) or None")),
        causal(scalar_argument<bool>(causal_value, "causal", "bool")),
        dropout(optional_scalar_argument<float>(dropout_value, "dropout", "float or None")) {}
};

// One side of `window`: None or -1 (unbounded), or a number of keys ≥ 0.
int64_t window_side(nb::handle item, const char* side) {
  if (item.is_none()) return -1;
  int64_t value = 0;
  const nb::object integer = as_python_int(item);
  if (!integer.is_valid()) {
    throw nb::type_error((std::string("window: expected (left, right) as ints or None, got ") +
                          side + " of type " + python_type(item))
                             .c_str());
  }
  if (!nb::try_cast(integer, value, /*convert=*/false)) {
    // An int past int64 (2**63): a side past any tensor's keys, which SlidingWindow::bounded
    // reads as unbounded; one below int64 is a negative size like any other.
    if (PyObject_RichCompareBool(integer.ptr(), nb::int_(0).ptr(), Py_GT) == 1) {
      return std::numeric_limits<int64_t>::max();
    }
    throw nb::value_error((std::string("window: expected ") + side +
                           " ≥ 0, or -1 / None for unbounded, got " + nb::str(integer).c_str())
                              .c_str());
  }
  if (value < -1) {
    throw nb::value_error((std::string("window: expected ") + side +
                           " ≥ 0, or -1 / None for unbounded, got " + std::to_string(value))
                              .c_str());
  }
  return value;
}

std::optional<SlidingWindow> to_window(nb::handle window) {
  if (window.is_none()) return std::nullopt;
  if (!(nb::isinstance<nb::tuple>(window) || nb::isinstance<nb::list>(window)) ||
      nb::len(window) != 2) {
    throw nb::type_error(("window: expected None or a pair (left, right) of ints (-1 or None: "
                          "unbounded), got " +
                          python_type(window))
                             .c_str());
  }
  return SlidingWindow{window_side(window[nb::int_(0)], "left"),
                       window_side(window[nb::int_(1)], "right")};
}

DiagonalAlignment to_alignment(const std::string& alignment) {
  if (alignment == "top-left") return DiagonalAlignment::kTopLeft;
  if (alignment == "bottom-right") return DiagonalAlignment::kBottomRight;
  throw nb::value_error(
      ("alignment: expected \"top-left\" or \"bottom-right\", got \"" + alignment + "\"").c_str());
}

uint64_t random_seed() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32U) ^ device();
}

// Everything one call takes besides query, key and value, converted: the options and the storage
// their views point into (mask copies, slopes, sinks).
class CallOptions {
 public:
  CallOptions(nb::handle attn_mask, float dropout_p, bool is_causal, std::optional<float> scale,
              bool enable_gqa, nb::handle window, nb::handle alibi_slopes,
              std::optional<float> softcap, nb::handle sinks, nb::handle valid_lens,
              const std::string& alignment, bool causal, std::optional<float> dropout,
              uint64_t seed)
      : mask_(attn_mask, "attn_mask"),
        alibi_slopes_(to_float_vector(alibi_slopes, "alibi_slopes")),
        sinks_(to_float_vector(sinks, "sinks")) {
    // Named as the caller gave it (the library's check names its own field, dropout).
    std::string dropout_name = "dropout_p";
    if (dropout) {
      if (dropout_p != 0.0F) {
        throw nb::value_error(
            "dropout: the book's name of dropout_p; give one of dropout_p and dropout");
      }
      dropout_p = *dropout;
      dropout_name = "dropout";
    }
    if (!(dropout_p >= 0.0F && dropout_p <= 1.0F)) {
      throw nb::value_error(
          (dropout_name + ": expected a probability in [0, 1], got " + number_text(dropout_p))
              .c_str());
    }
    // Dropout of every weight (p = 1), as PyTorch's (and nn.Dropout(1.0)): a zero output. attn's
    // kernels take p < 1 (each kept weight is scaled by 1/(1 − p)), so the pass runs without
    // dropout, checking its inputs as ever, and the caller zeroes its output (drops_all()).
    if (dropout_p == 1.0F) {
      drops_all_ = true;
      dropout_p = 0.0F;
    }
    if (causal && is_causal) {
      throw nb::value_error(
          "causal: the book's causal=True (aligned bottom-right) and is_causal=True (PyTorch's, "
          "aligned top-left) were both given; give one");
    }
    if (mask_.holds_valid_lengths()) {
      if (!valid_lens.is_none()) {
        throw nb::value_error(
            "attn_mask: integer lengths here are read as valid_lens, which was given too; pass "
            "a bool or float mask as attn_mask");
      }
      options_.valid_lens = mask_.valid_lengths();
    } else {
      options_.valid_lens = to_valid_lengths(valid_lens, "valid_lens");
      options_.attn_mask = mask_.mask();
    }
    options_.alignment = causal ? DiagonalAlignment::kBottomRight : to_alignment(alignment);
    options_.causal = causal || is_causal;
    options_.window = to_window(window);
    options_.scale = scale;
    options_.enable_gqa = enable_gqa;
    options_.alibi_slopes = alibi_slopes_;
    options_.softcap = softcap;
    options_.sinks = sinks_;
    options_.dropout = dropout_p;
    options_.seed = seed;
  }
  CallOptions(const CallOptions&) = delete;
  CallOptions& operator=(const CallOptions&) = delete;

  const AttentionOptions& options() const { return options_; }
  // Whether options().valid_lens came as attn_mask (integers there are the book's valid lengths).
  bool lengths_from_mask() const { return mask_.holds_valid_lengths(); }
  // Whether dropout of probability 1 was asked for: options() then holds none, and the output
  // (not the weights, which are those before dropout) is to be zeroed.
  bool drops_all() const { return drops_all_; }
  // ValueError where drops_all(): for the calls that have no output to zero (`why`).
  void refuse_dropping_all(std::string_view why) const {
    if (!drops_all_) return;
    throw nb::value_error(
        ("dropout_p: expected a probability in [0, 1) " + std::string(why) + ", got 1").c_str());
  }

 private:
  MaskInput mask_;
  std::vector<float> alibi_slopes_;
  std::vector<float> sinks_;
  AttentionOptions options_;
  bool drops_all_ = false;
};

// attend(), a call with `call`'s options, whose errors about valid lengths that came as attn_mask
// name attn_mask, as the caller gave them: the functional API checks them as valid_lens.
template <class F>
nb::object naming_mask_lengths(const CallOptions& call, const F& attend) {
  if (!call.lengths_from_mask()) return attend();
  const auto renamed = [](const Error& error) {
    return std::string(MaskInput::kLengthsName) + ": " + error.what();
  };
  const auto about_lengths = [](const Error& error) {
    return std::string_view(error.what()).starts_with("valid_lens");
  };
  try {
    return attend();
  } catch (const ShapeError& error) {
    if (!about_lengths(error)) throw;
    throw ShapeError(renamed(error));
  } catch (const ValueError& error) {
    if (!about_lengths(error)) throw;
    throw ValueError(renamed(error));
  }
}

// A UserWarning where integer lengths given as attn_mask look like a tokenizer's attention_mask
// ((B, S) of 0s and 1s, over more than one key): read as per-query valid lengths (the book's call)
// each query would see at most its first key, where PyTorch refuses an integer mask outright.
void warn_if_token_mask(const CallOptions& call, const Shape& key_shape) {
  if (!call.lengths_from_mask() || key_shape.rank() < 2 || key_shape[key_shape.rank() - 2] <= 1)
    return;
  const ValidLengths& lengths = call.options().valid_lens;
  if (lengths.kind() != ValidLengths::Kind::kPerQuery || lengths.values().empty()) return;
  for (const int64_t length : lengths.values()) {
    if (length != 0 && length != 1) return;
  }
  if (PyErr_WarnEx(PyExc_UserWarning,
                   "attn_mask: integers here are read as valid lengths (the book's valid_lens, a "
                   "key count per query), and these are all 0 or 1, as a tokenizer's "
                   "attention_mask is: each query would see at most one key. For a padding mask "
                   "pass attention_mask.astype(bool)[:, None, None, :] (PyTorch's masks are bool "
                   "or floating-point)",
                   1) != 0) {
    throw nb::python_error();
  }
}

// query, key and value with the ranks the functional API takes, float16 and bfloat16 kept as
// they are (attn's half overloads compute them).
struct QueryKeyValue {
  QueryKeyValue(nb::handle q, nb::handle k, nb::handle v)
      : query(q, "query", 2, Shape::kMaxRank, HalfInputs::kAccept),
        key(k, "key", 2, Shape::kMaxRank, HalfInputs::kAccept),
        value(v, "value", 2, Shape::kMaxRank, HalfInputs::kAccept) {}
  StridedInput query;
  StridedInput key;
  StridedInput value;
};

// TypeError unless `input` has the query's type where either is half precision (float32 and
// float64 mix, as before: both are computed in float32). PyTorch refuses mixed dtypes too.
void require_query_type(const StridedInput& input, std::string_view name,
                        const StridedInput& query) {
  if (input.half_type() == query.half_type()) return;
  throw nb::type_error((std::string(name) + ": expected the dtype of query (" + query.dtype() +
                        "), got " + input.dtype())
                           .c_str());
}

// The 16-bit type query, key and value share, or std::nullopt when all three are float.
std::optional<HalfType> common_half_type(const QueryKeyValue& inputs) {
  require_query_type(inputs.key, "key", inputs.query);
  require_query_type(inputs.value, "value", inputs.query);
  return inputs.query.half_type();
}

// A half-precision forward pass on the inputs' bits. Call without the GIL.
HalfAttentionForward half_forward(HalfType type, const QueryKeyValue& inputs,
                                  const AttentionOptions& options, bool output_residual = false) {
  return scaled_dot_product_attention(type, inputs.query.half_view(), inputs.key.half_view(),
                                      inputs.value.half_view(), options, output_residual);
}

// The log-sum-exp as an array shaped as the query's rows, query.shape[:-1].
nb::object log_sum_exp_to_python(std::vector<float> log_sum_exp, const Shape& query,
                                 Framework framework) {
  std::array<int64_t, Shape::kMaxRank> dims{};
  for (int axis = 0; axis + 1 < query.rank(); ++axis) dims[static_cast<size_t>(axis)] = query[axis];
  const Shape shape = Shape::from_dims(dims.data(), query.rank() - 1);
  return to_python(Tensor(shape, std::move(log_sum_exp)), framework);
}

// scaled_dot_product_attention(query, cache, None, ...): the decode call. value must be None or
// the cache itself (PyTorch-style code passes key and value alike); the options go through the
// same conversions as for arrays, and attn::scaled_dot_product_attention refuses those a cache
// does not take (attn_mask, valid_lens, dropout), naming them.
nb::object attend_to_cache_call(nb::handle q, BoundCache& cache, nb::handle v, nb::handle attn_mask,
                                float dropout_p, bool is_causal, std::optional<float> scale,
                                bool enable_gqa, nb::handle window, nb::handle alibi_slopes,
                                std::optional<float> softcap, nb::handle sinks,
                                nb::handle valid_lens, const std::string& alignment,
                                bool need_weights, bool causal, std::optional<float> dropout) {
  if (!v.is_none() && as_kv_cache(v) != &cache) {
    throw nb::type_error(
        ("value: expected None or the KVCache given as key, got " + python_type(v)).c_str());
  }
  if (need_weights) {
    throw nb::value_error(
        "need_weights: not available with a KVCache (decoding never materialises the weights)");
  }
  // The seed only matters for dropout, which a cache call refuses.
  const CallOptions call(attn_mask, dropout_p, is_causal, scale, enable_gqa, window, alibi_slopes,
                         softcap, sinks, valid_lens, alignment, causal, dropout, 0);
  if (call.drops_all() || call.options().dropout > 0.0F) {
    // The library's refusal of any dropout here (which p = 1, run as 0 and zeroed, would miss),
    // under the name the caller gave it.
    throw nb::value_error(
        (std::string(dropout.has_value() ? "dropout" : "dropout_p") +
         ": not taken with a KV cache (the cache's lengths are the valid lengths; masks and "
         "dropout are for the prefill call without a cache)")
            .c_str());
  }
  return naming_mask_lengths(call, [&] { return attend_to_cache(q, cache, call.options()); });
}

// query, key and value with their leading axes broadcast against each other, as PyTorch's
// function broadcasts them (its math path's matmuls; attn.torch expands its tensors alike): every
// axis before (L, E) / (S, E), or with enable_gqa the batch axes before the heads, aligned from
// the right, an axis of 1 or a missing one repeated by a stride of 0 (no copy). Unchanged where
// they already agree or do not broadcast: the functional API's shape error then names the
// argument.
template <class T>
std::array<StridedView<const T>, 3> broadcast_leading(
    const std::array<StridedView<const T>, 3>& views, bool enable_gqa) {
  const int kept = enable_gqa ? 3 : 2;
  int rank = 0;
  for (const auto& view : views) {
    if (view.rank() < kept) return views;
    rank = std::max(rank, view.rank());
  }
  std::array<int64_t, Shape::kMaxRank> leading{};
  const int leading_rank = rank - kept;
  for (int axis = 0; axis < leading_rank; ++axis) {
    int64_t size = 1;
    for (const auto& view : views) {
      const int own = axis - (rank - view.rank());
      if (own < 0 || view.dim(own) == 1) continue;
      if (size != 1 && size != view.dim(own)) return views;
      size = view.dim(own);
    }
    leading[static_cast<size_t>(axis)] = size;
  }
  std::array<StridedView<const T>, 3> result = views;
  for (size_t v = 0; v < views.size(); ++v) {
    const auto& view = views[v];
    std::array<int64_t, Shape::kMaxRank> dims{}, strides{};
    for (int axis = 0; axis < rank; ++axis) {
      const int own = axis - (rank - view.rank());
      const bool repeated = axis < leading_rank && (own < 0 || view.dim(own) != leading[axis]);
      dims[static_cast<size_t>(axis)] = axis < leading_rank ? leading[axis] : view.dim(own);
      strides[static_cast<size_t>(axis)] = repeated ? 0 : view.stride(own);
    }
    const Shape shape = Shape::from_dims(dims.data(), rank);
    if (shape == view.shape()) continue;
    result[v] = StridedView<const T>(
        view.data(), shape, std::span<const int64_t>(strides.data(), static_cast<size_t>(rank)));
  }
  return result;
}

// scaled_dot_product_attention on arrays: the output, and (output, weights) when need_weights.
nb::object attend_arrays(const QueryKeyValue& inputs, const CallOptions& call, bool need_weights) {
  const Framework framework = inputs.query.framework();
  const bool grouped = call.options().enable_gqa;
  if (const std::optional<HalfType> half = common_half_type(inputs)) {
    HalfAttentionForward forward;
    // The weights in the inputs' dtype, as torch.nn.MultiheadAttention returns its weights.
    HalfTensor weights{*half, Shape{0}, {}};
    {
      nb::gil_scoped_release release;
      const ThreadSettingScope thread_setting;
      const auto [query, key, value] = broadcast_leading<uint16_t>(
          {inputs.query.half_view(), inputs.key.half_view(), inputs.value.half_view()}, grouped);
      forward = scaled_dot_product_attention(*half, query, key, value, call.options());
      if (call.drops_all()) std::fill(forward.output.bits.begin(), forward.output.bits.end(), 0);
      if (need_weights) {
        const Tensor wide =
            attention_weights(*half, query, key, forward.log_sum_exp, call.options());
        weights.shape = wide.shape();
        weights.bits.resize(static_cast<size_t>(wide.numel()));
        narrow_to_half(*half, wide.data(), weights.bits.data(), weights.bits.size());
      }
    }
    nb::object output = to_python(std::move(forward.output), framework);
    if (!need_weights) return output;
    return nb::object(nb::make_tuple(output, to_python(std::move(weights), framework)));
  }
  AttentionForward forward;
  Tensor weights;
  {
    nb::gil_scoped_release release;
    const ThreadSettingScope thread_setting;
    const auto [query, key, value] = broadcast_leading<float>(
        {inputs.query.view(), inputs.key.view(), inputs.value.view()}, grouped);
    forward = scaled_dot_product_attention(query, key, value, call.options());
    if (call.drops_all()) {
      std::fill_n(forward.output.data(), forward.output.numel(), 0.0F);
    }
    // Computed on request only, from the log-sum-exp of this pass.
    if (need_weights) {
      weights = attention_weights(query, key, forward.log_sum_exp, call.options());
    }
  }
  nb::object output = to_python(std::move(forward.output), framework);
  if (!need_weights) return output;
  return nb::object(nb::make_tuple(output, to_python(std::move(weights), framework)));
}

// The arguments scaled_dot_product_attention and _sdpa_forward share, in order. Every one lets
// None through: scaled_dot_product_attention converts its scalars itself, naming the argument
// whose value it refuses (_sdpa_forward's typed ones refuse None as nanobind does).
#define ATTN_SDPA_ARGUMENTS_BEFORE_ALIGNMENT                                                       \
  "query"_a.none(), "key"_a.none(), "value"_a.none(),                                             \
      "attn_mask"_a.none() = nb::none(), "dropout_p"_a.none() = 0.0F,                             \
      "is_causal"_a.none() = false, "scale"_a.none() = nb::none(), "enable_gqa"_a.none() = false, \
      nb::kw_only(), "window"_a.none() = nb::none(), "alibi_slopes"_a.none() = nb::none(),        \
      "softcap"_a.none() = nb::none(), "sinks"_a.none() = nb::none(),                             \
      "valid_lens"_a.none() = nb::none()
#define ATTN_SDPA_ARGUMENTS ATTN_SDPA_ARGUMENTS_BEFORE_ALIGNMENT, "alignment"_a.none() = "top-left"

}  // namespace

void bind_functional(nb::module_& module) {
  module.def(
      "scaled_dot_product_attention",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle attn_mask, nb::handle dropout_p,
         nb::handle is_causal, nb::handle scale, nb::handle enable_gqa, nb::handle window,
         nb::handle alibi_slopes, nb::handle softcap, nb::handle sinks, nb::handle valid_lens,
         nb::handle alignment, nb::handle need_weights, nb::handle seed, nb::handle causal,
         nb::handle dropout) {
        const ScalarArguments scalars(dropout_p, is_causal, scale, enable_gqa, softcap, alignment,
                                      need_weights, seed, causal, dropout);
        for (const auto& [tensor, name] :
             {std::pair{q, "query"}, std::pair{k, "key"}, std::pair{v, "value"},
              std::pair{attn_mask, "attn_mask"}, std::pair{alibi_slopes, "alibi_slopes"},
              std::pair{sinks, "sinks"}}) {
          refuse_recording_tensor(tensor, name, "attn.scaled_dot_product_attention",
                                  "attn.torch.scaled_dot_product_attention");
        }
        if (BoundCache* cache = as_kv_cache(k)) {
          return attend_to_cache_call(q, *cache, v, attn_mask, scalars.dropout_p, scalars.is_causal,
                                      scalars.scale, scalars.enable_gqa, window, alibi_slopes,
                                      scalars.softcap, sinks, valid_lens, scalars.alignment,
                                      scalars.need_weights, scalars.causal, scalars.dropout);
        }
        if (as_kv_cache(v) != nullptr) {
          throw nb::type_error(
              "value: got a KVCache; pass the cache as key (value None or the same cache)");
        }
        // (Caches ignore alignment: their queries sit at their sequences' ends.)
        if (scalars.causal && scalars.alignment_given && scalars.alignment != "bottom-right") {
          throw nb::value_error(("alignment: causal=True is the book's causal, aligned "
                                 "bottom-right, got alignment=\"" +
                                 scalars.alignment +
                                 "\" beside it; for a causal mask aligned top-left pass "
                                 "is_causal=True instead")
                                    .c_str());
        }
        const QueryKeyValue inputs(q, k, v);
        // A random seed only when dropout will use it (random_device may be slow).
        const bool drops = scalars.dropout_p > 0.0F || scalars.dropout.value_or(0.0F) > 0.0F;
        const CallOptions call(attn_mask, scalars.dropout_p, scalars.is_causal, scalars.scale,
                               scalars.enable_gqa, window, alibi_slopes, scalars.softcap, sinks,
                               valid_lens, scalars.alignment, scalars.causal, scalars.dropout,
                               scalars.seed ? *scalars.seed
                               : drops      ? random_seed()
                                            : 0);
        warn_if_token_mask(call, inputs.key.shape());
        return naming_mask_lengths(
            call, [&] { return attend_arrays(inputs, call, scalars.need_weights); });
      },
      ATTN_SDPA_ARGUMENTS_BEFORE_ALIGNMENT, "alignment"_a.none() = nb::none(),
      "need_weights"_a.none() = false, "seed"_a.none() = nb::none(),
      "causal"_a.none() = false, "dropout"_a.none() = nb::none(),
      "PyTorch's scaled_dot_product_attention on the CPU, with attn's additions.\n\n"
      "query (..., H_q, L, E), key (..., H_kv, S, E), value (..., H_kv, S, Ev) -> (..., H_q, L,\n"
      "Ev), rank 2 to 8, the leading axes equal; H_kv = H_q unless enable_gqa (then H_kv divides\n"
      "H_q). A rank-3 input (B, L, E) is B batch elements of one head (the book's layout).\n"
      "NumPy arrays or DLPack tensors; a float32 array whose last axis is contiguous is read in\n"
      "place, whatever its other strides. Returns the query's kind (torch.Tensor or NumPy).\n"
      "float16 and bfloat16 query, key and value (all three alike: a mix is a TypeError) are\n"
      "read the same way and computed by attn's half kernels (fp32 scores, softmax and sums,\n"
      "the output rounded once), returning the output (and weights) in their dtype (bfloat16\n"
      "always as a torch.Tensor: NumPy has none).\n\n"
      "attn_mask: None, a bool mask (True: the key takes part) or a float one (added to the\n"
      "scores: float32, float16 or bfloat16 read as they are, float64 copied to float32),\n"
      "broadcastable to (..., H_q, L, S). PyTorch never takes an integer mask, so an\n"
      "integer array/tensor or a Python list here is read as valid_lens (the book's call\n"
      "scaled_dot_product_attention(q, k, v, valid_lens)).\n"
      "dropout_p: dropout on the weights, applied whenever > 0 (as PyTorch), seeded by seed\n"
      "(random when None); 1 drops every weight: a zero output, as PyTorch's. is_causal:\n"
      "query i sees keys j <= its diagonal key (see alignment). scale: default 1/sqrt(E).\n"
      "window=(left, right): keys within left before and right after the diagonal key\n"
      "(-1/None: unbounded). alibi_slopes (H_q floats): scores get\n"
      "-slope*|diagonal - j|. softcap: scores s become softcap*tanh(s/softcap). sinks (H_q\n"
      "floats): one logit per head joining each softmax denominator. valid_lens: None, (B,) or\n"
      "(B, L) integer lengths, B the first axis. alignment: \"top-left\" (PyTorch's is_causal;\n"
      "None: this, or with causal=True bottom-right) or \"bottom-right\" (FlashAttention's: the\n"
      "last query on the last key) for causal, window and ALiBi; causal=True beside an explicit\n"
      "\"top-left\" is a ValueError. A query that sees no key gets a zero output.\n\n"
      "The book's API keeps working: causal=True is causal aligned bottom-right; dropout= is\n"
      "dropout_p's old name; need_weights=True returns (output, weights), the weights (...,\n"
      "H_q, L, S) before dropout, computed only then.\n\n"
      "Decoding: key may be an attn.KVCache (value None or the same cache) and query (B, H_q, n,\n"
      "E) the last n tokens of each sequence, already appended: query i of sequence b sits at\n"
      "position lengths[b] - n + i, which is_causal/causal, window and ALiBi refer to (alignment\n"
      "is ignored). n may exceed a sequence's length (a ragged append, left padding): its first\n"
      "queries sit at negative positions, as FlashAttention aligns more queries than keys\n"
      "bottom-right, and see no key when causal, getting zeros, as does every query of an\n"
      "empty sequence. scale, enable_gqa, softcap, sinks and alibi_slopes are taken; attn_mask,\n"
      "valid_lens, dropout and need_weights are refused (the cache's lengths are the valid\n"
      "lengths). A float16 or bfloat16 query (a half model's) is widened exactly and its output\n"
      "comes back in its dtype.");

  module.def(
      "_sdpa_forward",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle attn_mask, float dropout_p,
         bool is_causal, std::optional<float> scale, bool enable_gqa, nb::handle window,
         nb::handle alibi_slopes, std::optional<float> softcap, nb::handle sinks,
         nb::handle valid_lens, const std::string& alignment, uint64_t seed, bool output_residual) {
        const QueryKeyValue inputs(q, k, v);
        const CallOptions call(attn_mask, dropout_p, is_causal, scale, enable_gqa, window,
                               alibi_slopes, softcap, sinks, valid_lens, alignment, false,
                               std::nullopt, seed);
        call.refuse_dropping_all("(attn.torch passes p = 1 as 0 and zeroes the result)");
        const Framework framework = inputs.query.framework();
        if (const std::optional<HalfType> half = common_half_type(inputs)) {
          HalfAttentionForward forward;
          {
            nb::gil_scoped_release release;
            const ThreadSettingScope thread_setting;
            forward = half_forward(*half, inputs, call.options(), output_residual);
          }
          nb::object output = to_python(std::move(forward.output), framework);
          nb::object log_sum_exp = log_sum_exp_to_python(std::move(forward.log_sum_exp),
                                                         inputs.query.shape(), framework);
          if (output_residual) {
            return nb::make_tuple(output, log_sum_exp,
                                  to_python(std::move(forward.output_residual), framework));
          }
          return nb::make_tuple(output, log_sum_exp);
        }
        AttentionForward forward;
        {
          nb::gil_scoped_release release;
          const ThreadSettingScope thread_setting;
          forward = scaled_dot_product_attention(inputs.query.view(), inputs.key.view(),
                                                 inputs.value.view(), call.options());
        }
        nb::object output = to_python(std::move(forward.output), framework);
        nb::object log_sum_exp =
            log_sum_exp_to_python(std::move(forward.log_sum_exp), inputs.query.shape(), framework);
        if (output_residual) return nb::make_tuple(output, log_sum_exp, nb::none());
        return nb::make_tuple(output, log_sum_exp);
      },
      ATTN_SDPA_ARGUMENTS, "seed"_a = 0, "output_residual"_a = false,
      "(output, log_sum_exp) of scaled_dot_product_attention, log_sum_exp shaped query.shape[:-1]\n"
      "(pass it back unchanged to _sdpa_backward). With output_residual, (output, log_sum_exp,\n"
      "residual): for float16 and bfloat16 inputs the output's rounding residuals (shaped as it,\n"
      "in its dtype; pass them to _sdpa_backward's output_residual), None for float32. For\n"
      "attn.torch's custom operator.");

  module.def(
      "_sdpa_backward",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle grad_o, nb::handle lse,
         nb::handle attn_mask, float dropout_p, bool is_causal, std::optional<float> scale,
         bool enable_gqa, nb::handle window, nb::handle alibi_slopes, std::optional<float> softcap,
         nb::handle sinks, nb::handle valid_lens, const std::string& alignment, uint64_t seed,
         bool mask_gradient, bool sinks_gradient, nb::handle output_residual) {
        const QueryKeyValue inputs(q, k, v);
        const StridedInput output(o, "output", 2, Shape::kMaxRank, HalfInputs::kAccept);
        // The forward's residuals: None, or an empty tensor (the operator's stand-in for none).
        std::optional<StridedInput> residual;
        if (!output_residual.is_none()) {
          residual.emplace(output_residual, "output_residual", 1, Shape::kMaxRank,
                           HalfInputs::kAccept);
          if (residual->shape().numel() == 0) residual.reset();
        }
        const StridedInput grad_output(grad_o, "grad_output", 2, Shape::kMaxRank,
                                       HalfInputs::kAccept);
        const std::optional<HalfType> half = common_half_type(inputs);
        require_query_type(output, "output", inputs.query);
        require_query_type(grad_output, "grad_output", inputs.query);
        const StridedInput log_sum_exp(lse, "log_sum_exp", 1, Shape::kMaxRank);
        const CallOptions call(attn_mask, dropout_p, is_causal, scale, enable_gqa, window,
                               alibi_slopes, softcap, sinks, valid_lens, alignment, false,
                               std::nullopt, seed);
        call.refuse_dropping_all("(attn.torch passes p = 1 as 0 and zeroes the gradients)");
        const int64_t rows = log_sum_exp_size(inputs.query.shape());
        if (log_sum_exp.shape().numel() != rows || !log_sum_exp.view().is_contiguous()) {
          throw nb::value_error(("log_sum_exp: expected the forward pass's " +
                                 std::to_string(rows) + " contiguous values, got shape " +
                                 log_sum_exp.shape().str())
                                    .c_str());
        }
        const Framework framework = inputs.query.framework();
        const std::span<const float> lse_values(log_sum_exp.view().data(),
                                                static_cast<size_t>(rows));
        const auto option_gradients = [&](Tensor mask_values, Tensor sinks_values) {
          nb::object mask_grad = nb::none();
          nb::object sinks_grad = nb::none();
          if (mask_gradient) mask_grad = to_python(std::move(mask_values), framework);
          if (sinks_gradient) sinks_grad = to_python(std::move(sinks_values), framework);
          return std::make_pair(mask_grad, sinks_grad);
        };
        if (residual) {
          require_query_type(*residual, "output_residual", inputs.query);
          if (!half) {
            throw nb::value_error(("output_residual: expected None or an empty tensor for float32 "
                                   "inputs (their output is not rounded), got shape " +
                                   residual->shape().str())
                                      .c_str());
          }
        }
        if (half) {
          HalfAttentionBackward gradients;
          {
            nb::gil_scoped_release release;
            const ThreadSettingScope thread_setting;
            gradients = scaled_dot_product_attention_backward(
                *half, inputs.query.half_view(), inputs.key.half_view(), inputs.value.half_view(),
                output.half_view(), grad_output.half_view(), lse_values, call.options(),
                mask_gradient, sinks_gradient,
                residual ? residual->half_view() : StridedView<const uint16_t>());
          }
          auto [mask_grad, sinks_grad] =
              option_gradients(std::move(gradients.attn_mask), std::move(gradients.sinks));
          return nb::make_tuple(to_python(std::move(gradients.query), framework),
                                to_python(std::move(gradients.key), framework),
                                to_python(std::move(gradients.value), framework), mask_grad,
                                sinks_grad);
        }
        AttentionBackward gradients;
        {
          nb::gil_scoped_release release;
          const ThreadSettingScope thread_setting;
          gradients = scaled_dot_product_attention_backward(
              inputs.query.view(), inputs.key.view(), inputs.value.view(), output.view(),
              grad_output.view(), lse_values, call.options(), mask_gradient, sinks_gradient);
        }
        auto [mask_grad, sinks_grad] =
            option_gradients(std::move(gradients.attn_mask), std::move(gradients.sinks));
        return nb::make_tuple(to_python(std::move(gradients.query), framework),
                              to_python(std::move(gradients.key), framework),
                              to_python(std::move(gradients.value), framework), mask_grad,
                              sinks_grad);
      },
      "query"_a.none(), "key"_a.none(), "value"_a.none(), "output"_a.none(), "grad_output"_a.none(),
      "log_sum_exp"_a.none(), "attn_mask"_a.none() = nb::none(), "dropout_p"_a = 0.0F,
      "is_causal"_a = false, "scale"_a.none() = nb::none(), "enable_gqa"_a = false, nb::kw_only(),
      "window"_a.none() = nb::none(), "alibi_slopes"_a.none() = nb::none(),
      "softcap"_a.none() = nb::none(), "sinks"_a.none() = nb::none(),
      "valid_lens"_a.none() = nb::none(), "alignment"_a = "top-left", "seed"_a = 0,
      "mask_gradient"_a = false, "sinks_gradient"_a = false,
      "output_residual"_a.none() = nb::none(),
      "(d query, d key, d value, d attn_mask or None, d sinks or None): the gradients of\n"
      "sum(output * grad_output) for _sdpa_forward's inputs and options, with D = rowsum(dO * O)\n"
      "from the output before its rounding where output_residual (_sdpa_forward's) is given.\n"
      "For attn.torch.");
}

#undef ATTN_SDPA_ARGUMENTS
#undef ATTN_SDPA_ARGUMENTS_BEFORE_ALIGNMENT

}  // namespace attn::python
