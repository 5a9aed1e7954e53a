// The book's functions: masked_softmax, additive_attention and gaussian_kernel_pooling over
// Python arrays through attn's functional API (no layer built per call), with the GIL released
// while the kernels run (scaled_dot_product_attention is in functional.cpp).
#include <nanobind/stl/optional.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "arrays.hpp"
#include "attn/functional/additive_attention.hpp"
#include "attn/functional/gaussian_kernel_pooling.hpp"
#include "attn/kernels/masked_softmax.hpp"
#include "bindings.hpp"

namespace attn::python {
namespace {

using namespace nb::literals;

// The output alone, or (output, weights) when the caller asked for the weights.
nb::object output_and_weights(Tensor output, Tensor weights, bool need_weights,
                              Framework framework) {
  nb::object result = to_python(std::move(output), framework);
  if (!need_weights) return result;
  return nb::make_tuple(result, to_python(std::move(weights), framework));
}

// Throws ValueError naming `name` unless `tensor` has shape (rows, columns); -1 matches any.
void require_matrix(const InputTensor& tensor, std::string_view name, int64_t rows, int64_t columns,
                    std::string_view layout) {
  const Shape& shape = tensor.shape();
  if (shape.rank() != 2 || (rows >= 0 && shape[0] != rows) ||
      (columns >= 0 && shape[1] != columns)) {
    throw nb::value_error(
        (std::string(name) + ": expected shape " + std::string(layout) + ", got " + shape.str())
            .c_str());
  }
}

}  // namespace

void bind_functions(nb::module_& module) {
  module.def(
      "masked_softmax",
      [](nb::handle X, nb::handle valid_lens) {
        refuse_recording_tensor(X, "X", "attn.masked_softmax",
                                "torch.softmax on masked scores (or "
                                "attn.torch.scaled_dot_product_attention with valid_lens)");
        const InputTensor scores(X, "X", 3);
        const ValidLengths lengths = to_valid_lengths(valid_lens, "valid_lens");
        Tensor weights;
        try {
          nb::gil_scoped_release release;
          const ThreadSettingScope thread_setting;
          weights = masked_softmax(scores.view(), lengths);
        } catch (const attn::ValueError& error) {
          // The kernel names its argument "scores"; this signature calls it X, as the book does.
          constexpr std::string_view kKernelName = "scores";
          const std::string_view message = error.what();
          if (error.argument() != kKernelName || !message.starts_with(kKernelName)) throw;
          throw attn::ValueError("X" + std::string(message.substr(kKernelName.size())), "X");
        }
        return to_python(std::move(weights), scores.framework());
      },
      "X"_a.none(), "valid_lens"_a = nb::none(),
      "Softmax over the last axis of X (B, n, m), keeping only the first valid_lens keys.\n\n"
      "valid_lens: None, (B,) one length per batch element, or (B, n) one per query (int32/int64\n"
      "array, tensor or list). Masked keys get weight exactly 0; a row of valid length 0 gets\n"
      "all-zero weights (the book's -1e6 trick would give uniform ones).");

  module.def(
      "additive_attention",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle W_q, nb::handle W_k, nb::handle w_v,
         nb::handle valid_lens, nb::handle need_weights_value) {
        const bool need_weights =
            scalar_argument<bool>(need_weights_value, "additive_attention", "need_weights", "bool");
        for (const auto& [tensor, name] :
             {std::pair{q, "queries"}, std::pair{k, "keys"}, std::pair{v, "values"},
              std::pair{W_q, "W_q"}, std::pair{W_k, "W_k"}, std::pair{w_v, "w_v"}}) {
          refuse_recording_tensor(tensor, name, "attn.additive_attention",
                                  "attn.torch.AdditiveAttention");
        }
        const InputTensor queries(q, "queries", 3);
        const InputTensor keys(k, "keys", 3);
        const InputTensor values(v, "values", 3);
        const InputTensor query_weight(W_q, "W_q", 2);
        const InputTensor key_weight(W_k, "W_k", 2);
        const InputTensor score_weight(w_v, "w_v", 2);
        const int64_t hiddens = query_weight.shape()[0];
        require_matrix(
            key_weight, "W_k", hiddens, -1,
            "(num_hiddens, key_size) with num_hiddens " + std::to_string(hiddens) + " as in W_q");
        require_matrix(score_weight, "w_v", 1, hiddens,
                       "(1, num_hiddens) = (1, " + std::to_string(hiddens) + ")");
        AttentionOptions options;
        options.valid_lens = to_valid_lengths(valid_lens, "valid_lens");
        const AdditiveParameters parameters{query_weight.view(), key_weight.view(),
                                            score_weight.view().span()};
        AttentionForward forward;
        Tensor weights;
        {
          nb::gil_scoped_release release;
          const ThreadSettingScope thread_setting;
          forward =
              additive_attention(queries.view(), keys.view(), values.view(), parameters, options);
          if (need_weights) {
            weights = additive_attention_weights(queries.view(), keys.view(), parameters,
                                                 forward.log_sum_exp, options);
          }
        }
        return output_and_weights(std::move(forward.output), std::move(weights), need_weights,
                                  queries.framework());
      },
      "queries"_a.none(), "keys"_a.none(), "values"_a.none(), "W_q"_a.none(), "W_k"_a.none(),
      "w_v"_a.none(), "valid_lens"_a = nb::none(), "need_weights"_a.none() = false,
      nb::sig("def additive_attention(queries: object | None, keys: object | None, values: "
              "object | None, W_q: object | None, W_k: object | None, w_v: object | None, "
              "valid_lens: object | None = None, need_weights: bool = False) -> object"),
      "Additive (Bahdanau) attention with given weights: scores w_vᵀ tanh(W_q q + W_k k).\n\n"
      "queries (B, n, query_size), keys (B, m, key_size), values (B, m, v); W_q (h, query_size),\n"
      "W_k (h, key_size), w_v (1, h) as nn.Linear weights. Returns (B, n, v), or (output, "
      "weights)\n"
      "with need_weights=True.");

  module.def(
      "gaussian_kernel_pooling",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle width_value, nb::handle valid_lens,
         nb::handle need_weights_value) {
        constexpr std::string_view kName = "gaussian_kernel_pooling";
        for (const auto& [tensor, name] :
             {std::pair{q, "queries"}, std::pair{k, "keys"}, std::pair{v, "values"},
              std::pair{width_value, "width"}}) {
          refuse_recording_tensor(tensor, name, "attn.gaussian_kernel_pooling",
                                  "attn.torch.GaussianKernelPooling");
        }
        const auto width = scalar_argument<float>(width_value, kName, "width", "float");
        const bool need_weights =
            scalar_argument<bool>(need_weights_value, kName, "need_weights", "bool");
        const InputTensor queries(q, "queries", 3);
        const InputTensor keys(k, "keys", 3);
        const InputTensor values(v, "values", 3);
        const ValidLengths lengths = to_valid_lengths(valid_lens, "valid_lens");
        PoolingResult result;
        {
          nb::gil_scoped_release release;
          const ThreadSettingScope thread_setting;
          result = gaussian_kernel_pooling(queries.view(), keys.view(), values.view(), width,
                                           lengths, need_weights);
        }
        return output_and_weights(std::move(result.output), std::move(result.weights), need_weights,
                                  queries.framework());
      },
      "queries"_a.none(), "keys"_a.none(), "values"_a.none(), "width"_a.none() = 1.0F,
      "valid_lens"_a = nb::none(), "need_weights"_a.none() = false,
      nb::sig("def gaussian_kernel_pooling(queries: object | None, keys: object | None, values: "
              "object | None, width: float = 1.0, valid_lens: object | None = None, "
              "need_weights: bool = False) -> object"),
      "Nadaraya–Watson kernel regression as attention pooling: weights softmax(−½‖(q − k)·w‖²).\n\n"
      "queries (B, n, d), keys (B, m, d), values (B, m, v) → (B, n, v); width is w (1 for the\n"
      "book's nonparametric model). Returns the output, or (output, weights) with\n"
      "need_weights=True.");

  module.def(
      "_data_pointer",
      [](nb::handle x, bool strided) {
        if (strided) {
          const StridedInput tensor(x, "x", 1, Shape::kMaxRank);
          return reinterpret_cast<uintptr_t>(tensor.view().data());
        }
        const InputTensor tensor(x, "x", -1);
        return reinterpret_cast<uintptr_t>(tensor.view().data());
      },
      "x"_a.none(), "strided"_a = false,
      "The address of the float32 data attn's kernels would read for x: the array's own when it\n"
      "is passed without a copy. strided=True: as scaled_dot_product_attention reads its inputs\n"
      "(any non-negative strides with a contiguous last axis) rather than as the layers do\n"
      "(C-contiguous). For tests.");
}

}  // namespace attn::python
