// The layers: AdditiveAttention, DotProductAttention, MultiHeadAttention, GeneralAttention and
// GaussianKernelPooling with the book's constructors, forward/backward, modes, state dicts,
// gradients and safetensors.
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <charconv>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "attn/io/safetensors.hpp"
#include "attn/nn/additive_attention.hpp"
#include "attn/nn/dot_product_attention.hpp"
#include "attn/nn/gaussian_kernel_pooling.hpp"
#include "attn/nn/general_attention.hpp"
#include "attn/nn/multi_head_attention.hpp"
#include "bindings.hpp"

namespace attn::python {
namespace {

using namespace nb::literals;

// A constructor argument as Python writes it, in constructor order: shown by repr() and saved in
// safetensors metadata so that attn.load() can rebuild the layer.
using Config = std::vector<std::pair<std::string, std::string>>;

std::string python_literal(float value) {
  std::array<char, 32> buffer{};
  const auto result = std::to_chars(buffer.data(), buffer.data() + buffer.size(), value);
  std::string text(buffer.data(), result.ptr);
  // Python reads "1" as an int; keep floats floats.
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
  return text;
}
std::string python_literal(int64_t value) {
  return std::to_string(value);
}
std::string python_literal(bool value) {
  return value ? "True" : "False";
}
std::string python_literal(std::optional<float> value) {
  return value ? python_literal(*value) : "None";
}

// An attn layer behind a mutex: calls release the GIL while the layer computes, so two Python
// threads could otherwise reach the same layer at once. The mutex is always taken after the GIL
// is released (or while holding it only for quick accesses, never waiting for the GIL inside),
// so the two locks cannot deadlock.
template <class Layer>
class BoundLayer {
 public:
  BoundLayer(std::string class_name, Config config, Layer layer)
      : class_name_(std::move(class_name)), config_(std::move(config)), layer_(std::move(layer)) {}
  BoundLayer(const BoundLayer& other)
      : class_name_(other.class_name_), config_(other.config_), layer_(other.locked_copy()) {}
  BoundLayer& operator=(const BoundLayer&) = delete;

  // Runs `action(layer)` under the mutex.
  template <class Action>
  decltype(auto) with_layer(Action&& action) {
    std::lock_guard lock(mutex_);
    return action(layer_);
  }

  const std::string& class_name() const { return class_name_; }
  const Config& config() const { return config_; }
  // The framework of the last forward pass's queries, which attention_weights follow.
  Framework framework = Framework::kNumpy;

 private:
  Layer locked_copy() const {
    std::lock_guard lock(mutex_);
    return layer_;
  }

  std::string class_name_;
  Config config_;
  mutable std::mutex mutex_;
  Layer layer_;
};

template <class Layer>
constexpr bool has_parameters = requires(Layer& layer) {
  layer.parameters();
};

template <class Layer>
StateDict state_dict_of(Layer& layer) {
  if constexpr (has_parameters<Layer>) {
    return layer.state_dict();
  } else {
    return {};
  }
}

template <class Layer>
StateDict grads_of(Layer& layer) {
  StateDict grads;
  if constexpr (has_parameters<Layer>) {
    for (const NamedParameter& parameter : layer.parameters()) {
      grads.emplace(parameter.name, *parameter.grad);
    }
  }
  return grads;
}

// Copies the views into the layer's parameters, each once into its own storage (the modules of
// attn.torch load theirs at every call), with the layer's own checks where it has any; for a
// layer without parameters, what attn::load_state_views says for an unexpected tensor.
template <class Layer>
void load_state_into(Layer& layer, const StateViews& state, std::string_view layer_name) {
  if constexpr (requires { layer.load_state_views(state); }) {
    layer.load_state_views(state);
  } else if constexpr (has_parameters<Layer>) {
    attn::load_state_views(state, layer.parameters(), layer_name);
  } else {
    attn::load_state_views(state, {}, layer_name);
  }
}

std::string repr_of(const std::string& class_name, const Config& config) {
  std::string text = class_name + "(";
  for (size_t index = 0; index < config.size(); ++index) {
    if (index > 0) text += ", ";
    text += config[index].first + "=" + config[index].second;
  }
  return text + ")";
}

// Binds what every layer shares; `Bound` is BoundLayer<Layer>.
template <class Layer>
void bind_common(nb::class_<BoundLayer<Layer>>& cls) {
  using Bound = BoundLayer<Layer>;

  auto forward = [](Bound& bound, nb::handle q, nb::handle k, nb::handle v, nb::handle valid_lens,
                    bool causal) {
    const InputTensor queries(q, "queries", 3);
    const InputTensor keys(k, "keys", 3);
    const InputTensor values(v, "values", 3);
    ValidLengths lengths = to_valid_lengths(valid_lens, "valid_lens");
    Tensor output;
    {
      nb::gil_scoped_release release;
      const ThreadSettingScope thread_setting;
      if (causal) {
        lengths = lengths.with_causal_mask(queries.shape()[0], queries.shape()[1], keys.shape()[1]);
      }
      output = bound.with_layer([&](Layer& layer) {
        return layer.forward(queries.view(), keys.view(), values.view(), lengths);
      });
    }
    bound.framework = queries.framework();
    return to_python(std::move(output), queries.framework());
  };
  const char* forward_doc =
      "Runs the layer: queries (B, n, ·), keys (B, m, ·), values (B, m, ·) → (B, n, ·).\n\n"
      "valid_lens: None, (B,) or (B, n) integer lengths (array, tensor or list); causal=True also\n"
      "hides keys j > i + m − n from query i (aligned bottom-right). Returns a NumPy array, or a\n"
      "PyTorch tensor when queries is one. Keeps what backward() needs.";
  cls.def("forward", forward, "queries"_a.none(), "keys"_a.none(), "values"_a.none(),
          "valid_lens"_a = nb::none(), nb::kw_only(), "causal"_a = false, forward_doc);
  cls.def("__call__", forward, "queries"_a.none(), "keys"_a.none(), "values"_a.none(),
          "valid_lens"_a = nb::none(), nb::kw_only(), "causal"_a = false, forward_doc);

  cls.def(
      "backward",
      [](Bound& bound, nb::handle grad_output) {
        const InputTensor gradient(grad_output, "grad_output", 3);
        AttentionGradients gradients;
        {
          nb::gil_scoped_release release;
          const ThreadSettingScope thread_setting;
          gradients =
              bound.with_layer([&](Layer& layer) { return layer.backward(gradient.view()); });
        }
        nb::dict result;
        result["queries"] = to_python(std::move(gradients.queries), gradient.framework());
        result["keys"] = to_python(std::move(gradients.keys), gradient.framework());
        result["values"] = to_python(std::move(gradients.values), gradient.framework());
        return result;
      },
      "grad_output"_a.none(),
      "Gradients of sum(output * grad_output) for the last forward pass.\n\n"
      "Returns {'queries': ..., 'keys': ..., 'values': ...} shaped like the inputs, and adds the\n"
      "parameters' gradients to grads() (cleared only by zero_grad(), as in PyTorch).");

  cls.def(
      "train",
      [](nb::pointer_and_handle<Bound> self, bool mode) {
        self.p->with_layer([mode](Layer& layer) { layer.train(mode); });
        return nb::borrow(self.h);
      },
      "mode"_a = true, "Training mode (dropout on) when mode is True; returns the layer.");
  cls.def(
      "eval",
      [](nb::pointer_and_handle<Bound> self) {
        self.p->with_layer([](Layer& layer) { layer.eval(); });
        return nb::borrow(self.h);
      },
      "Evaluation mode (dropout off); returns the layer. Layers start in training mode.");
  cls.def_prop_rw(
      "training",
      [](Bound& bound) {
        return bound.with_layer([](Layer& layer) { return layer.is_training(); });
      },
      [](Bound& bound, bool mode) {
        bound.with_layer([mode](Layer& layer) { layer.train(mode); });
      },
      "True in training mode.");
  cls.def_prop_ro(
      "attention_weights",
      [](Bound& bound) -> nb::object {
        Tensor weights;
        {
          // After a fused forward pass the layer computes the weights on this first request.
          nb::gil_scoped_release release;
          const ThreadSettingScope thread_setting;
          weights = bound.with_layer([](Layer& layer) { return layer.attention_weights(); });
        }
        if (weights.rank() != 3) return nb::none();
        return to_python(std::move(weights), bound.framework);
      },
      "The attention weights of the last call, before dropout: (B, n, m), or (B·num_heads, n, m)\n"
      "for multi-head attention; None before the first call.");
  cls.def_prop_ro(
      "dropout_mask",
      [](Bound& bound) {
        return bound.with_layer(
            [&](Layer& layer) { return copy_to_python(layer.dropout_mask(), bound.framework, 3); });
      },
      "The dropout multipliers of the last call (0 or 1/(1 − p)), or None when it applied none.");
  cls.def(
      "seed_dropout",
      [](Bound& bound, uint64_t seed) {
        bound.with_layer([seed](Layer& layer) { layer.seed_dropout(seed); });
      },
      "seed"_a, "Re-seeds the generator behind dropout, so the next masks are reproducible.");

  cls.def(
      "state_dict",
      [](Bound& bound) {
        return to_python(bound.with_layer([](Layer& layer) { return state_dict_of(layer); }),
                         Framework::kNumpy);
      },
      "The parameters as {name: NumPy array} (copies) under PyTorch's names (W_q.weight, ...).");
  cls.def(
      "load_state_dict",
      [](Bound& bound, nb::handle state) {
        const StateInputs parameters(state, "state_dict");
        const std::string name = bound.class_name();
        bound.with_layer([&](Layer& layer) { load_state_into(layer, parameters.views(), name); });
      },
      "state_dict"_a,
      "Copies parameters from {name: array} (NumPy arrays, PyTorch tensors, ...), strictly as\n"
      "PyTorch does: a missing, unexpected or mis-shaped entry is a ValueError naming it.");
  cls.def(
      "grads",
      [](Bound& bound) {
        return to_python(bound.with_layer([](Layer& layer) { return grads_of(layer); }),
                         Framework::kNumpy);
      },
      "The parameters' accumulated gradients as {name: NumPy array} (copies).");
  cls.def(
      "zero_grad",
      [](Bound& bound) {
        bound.with_layer([](Layer& layer) {
          if constexpr (has_parameters<Layer>) zero_grad(layer.parameters());
        });
      },
      "Sets every parameter gradient to zero.");

  cls.def(
      "save",
      [](Bound& bound, const std::filesystem::path& path) {
        std::map<std::string, std::string> metadata{{"layer", bound.class_name()}};
        for (const auto& [key, value] : bound.config()) metadata.emplace(key, value);
        const StateDict state = bound.with_layer([](Layer& layer) { return state_dict_of(layer); });
        nb::gil_scoped_release release;
        save_safetensors(path, state, metadata);
      },
      "path"_a,
      "Writes the parameters to a safetensors file under PyTorch's names, with the constructor\n"
      "arguments as metadata so that attn.load(path) rebuilds the layer.");
  cls.def(
      "load",
      [](Bound& bound, const std::filesystem::path& path) {
        StateDict state;
        {
          nb::gil_scoped_release release;
          state = load_safetensors(path);
        }
        const std::string name = bound.class_name();
        bound.with_layer([&](Layer& layer) { load_state_into(layer, views_of(state), name); });
      },
      "path"_a,
      "Loads parameters from a safetensors file (attn's save(), or PyTorch's\n"
      "safetensors.torch.save_file(module.state_dict(), path)).");

  cls.def("__repr__", [](Bound& bound) { return repr_of(bound.class_name(), bound.config()); });
  cls.def("__copy__", [](const Bound& bound) { return Bound(bound); });
  cls.def(
      "__deepcopy__", [](const Bound& bound, nb::handle /*memo*/) { return Bound(bound); },
      "memo"_a);
}

// What a seed argument must be (uint64_t).
constexpr const char* kSeed = "an int in [0, 2**64)";

// nanobind constructs bound objects in place: `self` is uninitialised storage of the right size.
template <class Layer>
void construct(BoundLayer<Layer>* self, std::string class_name, Config config, Layer layer) {
  new (self) BoundLayer<Layer>(std::move(class_name), std::move(config), std::move(layer));
}

}  // namespace

void bind_layers(nb::module_& module) {
  using Additive = BoundLayer<AdditiveAttention>;
  nb::class_<Additive> additive(
      module, "AdditiveAttention",
      "The book's AdditiveAttention (Bahdanau): scores w_vᵀ tanh(W_q q + W_k k), masked\n"
      "softmax, dropout, weighted sum of values. Parameters W_q.weight (h, query_size),\n"
      "W_k.weight (h, key_size), w_v.weight (1, h), initialised as nn.Linear from seed.");
  additive.def(
      "__init__",
      [](Additive* self, nb::handle key_size_value, nb::handle query_size_value,
         nb::handle num_hiddens_value, nb::handle dropout_value, nb::handle seed_value) {
        constexpr std::string_view kName = "AdditiveAttention";
        const auto key_size = scalar_argument<int64_t>(key_size_value, kName, "key_size", "int");
        const auto query_size =
            scalar_argument<int64_t>(query_size_value, kName, "query_size", "int");
        const auto num_hiddens =
            scalar_argument<int64_t>(num_hiddens_value, kName, "num_hiddens", "int");
        const auto dropout = scalar_argument<float>(dropout_value, kName, "dropout", "float");
        const auto seed = scalar_argument<uint64_t>(seed_value, kName, "seed", kSeed);
        Config config{{"key_size", python_literal(key_size)},
                      {"query_size", python_literal(query_size)},
                      {"num_hiddens", python_literal(num_hiddens)},
                      {"dropout", python_literal(dropout)}};
        construct(self, "AdditiveAttention", std::move(config),
                  AdditiveAttention(key_size, query_size, num_hiddens, dropout, seed));
      },
      nb::sig("def __init__(self, key_size: int, query_size: int, num_hiddens: int, "
              "dropout: float = 0.0, *, seed: int = 0) -> None"),
      "key_size"_a.none(), "query_size"_a.none(), "num_hiddens"_a.none(), "dropout"_a.none() = 0.0F,
      nb::kw_only(), "seed"_a.none() = 0);
  bind_common(additive);
  additive.def_prop_ro("key_size", [](Additive& bound) {
    return bound.with_layer([](AdditiveAttention& layer) { return layer.key_size(); });
  });
  additive.def_prop_ro("query_size", [](Additive& bound) {
    return bound.with_layer([](AdditiveAttention& layer) { return layer.query_size(); });
  });
  additive.def_prop_ro("num_hiddens", [](Additive& bound) {
    return bound.with_layer([](AdditiveAttention& layer) { return layer.num_hiddens(); });
  });
  additive.def_prop_ro("dropout", [](Additive& bound) {
    return bound.with_layer([](AdditiveAttention& layer) { return layer.dropout(); });
  });

  using DotProduct = BoundLayer<DotProductAttention>;
  nb::class_<DotProduct> dot_product(
      module, "DotProductAttention",
      "The book's DotProductAttention: scores Q Kᵀ · scale (1/√d by default), masked softmax,\n"
      "dropout, weighted sum of values. No parameters.");
  dot_product.def(
      "__init__",
      [](DotProduct* self, nb::handle dropout_value, nb::handle scale_value,
         nb::handle seed_value) {
        constexpr std::string_view kName = "DotProductAttention";
        const auto dropout = scalar_argument<float>(dropout_value, kName, "dropout", "float");
        const auto scale =
            optional_scalar_argument<float>(scale_value, kName, "scale", "float or None");
        const auto seed = scalar_argument<uint64_t>(seed_value, kName, "seed", kSeed);
        Config config{{"dropout", python_literal(dropout)}, {"scale", python_literal(scale)}};
        construct(self, "DotProductAttention", std::move(config),
                  DotProductAttention(dropout, scale, seed));
      },
      nb::sig("def __init__(self, dropout: float = 0.0, *, scale: float | None = None, "
              "seed: int = 0) -> None"),
      "dropout"_a.none() = 0.0F, nb::kw_only(), "scale"_a.none() = nb::none(), "seed"_a.none() = 0);
  bind_common(dot_product);
  dot_product.def_prop_ro("dropout", [](DotProduct& bound) {
    return bound.with_layer([](DotProductAttention& layer) { return layer.dropout(); });
  });

  using MultiHead = BoundLayer<MultiHeadAttention>;
  nb::class_<MultiHead> multi_head(
      module, "MultiHeadAttention",
      "The book's MultiHeadAttention: W_q, W_k, W_v project to num_hiddens, scaled dot-product\n"
      "attention runs on num_heads slices, W_o projects the concatenated heads. Parameters\n"
      "W_q/W_k/W_v/W_o.weight (and .bias with bias=True), initialised as nn.Linear from seed.");
  multi_head.def(
      "__init__",
      [](MultiHead* self, nb::handle key_size_value, nb::handle query_size_value,
         nb::handle value_size_value, nb::handle num_hiddens_value, nb::handle num_heads_value,
         nb::handle dropout_value, nb::handle bias_value, nb::handle seed_value) {
        constexpr std::string_view kName = "MultiHeadAttention";
        const auto key_size = scalar_argument<int64_t>(key_size_value, kName, "key_size", "int");
        const auto query_size =
            scalar_argument<int64_t>(query_size_value, kName, "query_size", "int");
        const auto value_size =
            scalar_argument<int64_t>(value_size_value, kName, "value_size", "int");
        const auto num_hiddens =
            scalar_argument<int64_t>(num_hiddens_value, kName, "num_hiddens", "int");
        const auto num_heads = scalar_argument<int64_t>(num_heads_value, kName, "num_heads", "int");
        const auto dropout = scalar_argument<float>(dropout_value, kName, "dropout", "float");
        const auto bias = scalar_argument<bool>(bias_value, kName, "bias", "bool");
        const auto seed = scalar_argument<uint64_t>(seed_value, kName, "seed", kSeed);
        Config config{{"key_size", python_literal(key_size)},
                      {"query_size", python_literal(query_size)},
                      {"value_size", python_literal(value_size)},
                      {"num_hiddens", python_literal(num_hiddens)},
                      {"num_heads", python_literal(num_heads)},
                      {"dropout", python_literal(dropout)},
                      {"bias", python_literal(bias)}};
        construct(self, "MultiHeadAttention", std::move(config),
                  MultiHeadAttention(key_size, query_size, value_size, num_hiddens, num_heads,
                                     dropout, bias, seed));
      },
      nb::sig("def __init__(self, key_size: int, query_size: int, value_size: int, "
              "num_hiddens: int, num_heads: int, dropout: float = 0.0, bias: bool = False, *, "
              "seed: int = 0) -> None"),
      "key_size"_a.none(), "query_size"_a.none(), "value_size"_a.none(), "num_hiddens"_a.none(),
      "num_heads"_a.none(), "dropout"_a.none() = 0.0F, "bias"_a.none() = false, nb::kw_only(),
      "seed"_a.none() = 0);
  bind_common(multi_head);
  multi_head.def_prop_ro("key_size", [](MultiHead& bound) {
    return bound.with_layer([](MultiHeadAttention& layer) { return layer.key_size(); });
  });
  multi_head.def_prop_ro("query_size", [](MultiHead& bound) {
    return bound.with_layer([](MultiHeadAttention& layer) { return layer.query_size(); });
  });
  multi_head.def_prop_ro("value_size", [](MultiHead& bound) {
    return bound.with_layer([](MultiHeadAttention& layer) { return layer.value_size(); });
  });
  multi_head.def_prop_ro("num_hiddens", [](MultiHead& bound) {
    return bound.with_layer([](MultiHeadAttention& layer) { return layer.num_hiddens(); });
  });
  multi_head.def_prop_ro("num_heads", [](MultiHead& bound) {
    return bound.with_layer([](MultiHeadAttention& layer) { return layer.num_heads(); });
  });
  multi_head.def_prop_ro("bias", [](MultiHead& bound) {
    return bound.with_layer([](MultiHeadAttention& layer) { return layer.has_bias(); });
  });

  using General = BoundLayer<GeneralAttention>;
  nb::class_<General> general(
      module, "GeneralAttention",
      "Luong's general attention: scores (W q)·k for queries and keys of different sizes (the\n"
      "book's exercise), unscaled, masked softmax, dropout, weighted sum of values. Parameter\n"
      "W.weight (key_size, query_size), as nn.Linear(query_size, key_size, bias=False).");
  general.def(
      "__init__",
      [](General* self, nb::handle query_size_value, nb::handle key_size_value,
         nb::handle dropout_value, nb::handle seed_value) {
        constexpr std::string_view kName = "GeneralAttention";
        const auto query_size =
            scalar_argument<int64_t>(query_size_value, kName, "query_size", "int");
        const auto key_size = scalar_argument<int64_t>(key_size_value, kName, "key_size", "int");
        const auto dropout = scalar_argument<float>(dropout_value, kName, "dropout", "float");
        const auto seed = scalar_argument<uint64_t>(seed_value, kName, "seed", kSeed);
        Config config{{"query_size", python_literal(query_size)},
                      {"key_size", python_literal(key_size)},
                      {"dropout", python_literal(dropout)}};
        construct(self, "GeneralAttention", std::move(config),
                  GeneralAttention(query_size, key_size, dropout, seed));
      },
      nb::sig("def __init__(self, query_size: int, key_size: int, dropout: float = 0.0, *, "
              "seed: int = 0) -> None"),
      "query_size"_a.none(), "key_size"_a.none(), "dropout"_a.none() = 0.0F, nb::kw_only(),
      "seed"_a.none() = 0);
  bind_common(general);
  general.def_prop_ro("query_size", [](General& bound) {
    return bound.with_layer([](GeneralAttention& layer) { return layer.query_size(); });
  });
  general.def_prop_ro("key_size", [](General& bound) {
    return bound.with_layer([](GeneralAttention& layer) { return layer.key_size(); });
  });
  general.def_prop_ro("dropout", [](General& bound) {
    return bound.with_layer([](GeneralAttention& layer) { return layer.dropout(); });
  });

  using Gaussian = BoundLayer<GaussianKernelPooling>;
  nb::class_<Gaussian> gaussian(
      module, "GaussianKernelPooling",
      "Nadaraya–Watson kernel regression as attention pooling: scores −½‖(q − k)·w‖², masked\n"
      "softmax, dropout, weighted sum. The width w is the parameter 'w' of shape (1,), learnable\n"
      "as in the book's NWKernelRegression.");
  gaussian.def(
      "__init__",
      [](Gaussian* self, nb::handle width_value, nb::handle dropout_value, nb::handle seed_value) {
        constexpr std::string_view kName = "GaussianKernelPooling";
        const auto width = scalar_argument<float>(width_value, kName, "width", "float");
        const auto dropout = scalar_argument<float>(dropout_value, kName, "dropout", "float");
        const auto seed = scalar_argument<uint64_t>(seed_value, kName, "seed", kSeed);
        Config config{{"width", python_literal(width)}, {"dropout", python_literal(dropout)}};
        construct(self, "GaussianKernelPooling", std::move(config),
                  GaussianKernelPooling(width, dropout, seed));
      },
      nb::sig("def __init__(self, width: float = 1.0, dropout: float = 0.0, *, seed: int = 0) "
              "-> None"),
      "width"_a.none() = 1.0F, "dropout"_a.none() = 0.0F, nb::kw_only(), "seed"_a.none() = 0);
  bind_common(gaussian);
  gaussian.def_prop_ro("width", [](Gaussian& bound) {
    return bound.with_layer([](GaussianKernelPooling& layer) { return layer.width(); });
  });
  gaussian.def_prop_ro("dropout", [](Gaussian& bound) {
    return bound.with_layer([](GaussianKernelPooling& layer) { return layer.dropout(); });
  });
}

}  // namespace attn::python
