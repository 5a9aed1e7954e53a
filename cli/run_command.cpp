// `attn run`: one evaluation-mode attention call on .npy inputs — the functional API directly for
// dot-product and additive scores (with masks, windows, causal, soft-capping, ALiBi, sinks and
// grouped heads), a layer built from its saved parameters for multi-head and general attention —
// writing the output and, on request only, the weights, a heatmap and the gradients of
// sum(output · G).
#include "run_command.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/core/half.hpp"
#include "attn/core/tensor.hpp"
#include "attn/core/valid_lengths.hpp"
#include "attn/functional/additive_attention.hpp"
#include "attn/functional/scaled_dot_product_attention.hpp"
#include "attn/io/npy.hpp"
#include "attn/io/npy_rows.hpp"
#include "attn/io/safetensors.hpp"
#include "attn/kernels/half_conversion.hpp"
#include "attn/nn/general_attention.hpp"
#include "attn/nn/multi_head_attention.hpp"
#include "attn/nn/state_dict.hpp"
#include "attn/viz/heatmap.hpp"
#include "command_support.hpp"
#include "file_name_check.hpp"
#include "number_options.hpp"
#include "progress_line.hpp"
#include "ring_run.hpp"
#include "run_arguments.hpp"

namespace attn::cli {

namespace {

const std::string kAdditive = "additive";
const std::string kDotProduct = "dot-product";
const std::string kMultiHead = "multi-head";
const std::string kGeneral = "general";

struct RunOptions {
  std::string layer;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  float scale = 0.0F;
  float softcap = 0.0F;
  std::string params;
  std::string queries;
  std::string keys;
  std::string values;
  std::string valid_lens;
  std::string mask;
  std::string window;
  std::string causal;
  std::string alignment;
  std::string alibi;
  std::string sinks;
  std::string out;
  std::string weights_out;
  std::string heatmap;
  std::string out_grad;
  std::string grads_out;
  bool ring = false;  // --ring: over MPI ranks (cli/ring_run.cpp)
  // Which optional options were given: CLI11 fills these in while parsing.
  CLI::Option* heads_option = nullptr;
  CLI::Option* kv_heads_option = nullptr;
  CLI::Option* scale_option = nullptr;
  CLI::Option* softcap_option = nullptr;
  CLI::Option* params_option = nullptr;
  CLI::Option* valid_lens_option = nullptr;
  CLI::Option* mask_option = nullptr;
  CLI::Option* window_option = nullptr;
  CLI::Option* causal_option = nullptr;
  CLI::Option* alignment_option = nullptr;
  CLI::Option* alibi_option = nullptr;
  CLI::Option* sinks_option = nullptr;
  CLI::Option* weights_out_option = nullptr;
  CLI::Option* heatmap_option = nullptr;
  CLI::Option* out_grad_option = nullptr;
  CLI::Option* grads_out_option = nullptr;
};

template <class T>
std::optional<T> given(const CLI::Option* option, const T& value) {
  return option->count() > 0 ? std::optional<T>(value) : std::nullopt;
}

RunArguments run_arguments(const RunOptions& options) {
  RunArguments arguments;
  arguments.queries = options.queries;
  arguments.keys = options.keys;
  arguments.values = options.values;
  arguments.valid_lens = given(options.valid_lens_option, options.valid_lens);
  arguments.mask = given(options.mask_option, options.mask);
  arguments.alibi = given(options.alibi_option, options.alibi);
  arguments.sinks = given(options.sinks_option, options.sinks);
  arguments.window = given(options.window_option, options.window);
  arguments.causal = given(options.causal_option, options.causal);
  arguments.alignment = given(options.alignment_option, options.alignment);
  arguments.heads = given(options.heads_option, options.heads);
  arguments.kv_heads = given(options.kv_heads_option, options.kv_heads);
  arguments.scale = given(options.scale_option, options.scale);
  arguments.softcap = given(options.softcap_option, options.softcap);
  arguments.out_grad = given(options.out_grad_option, options.out_grad);
  arguments.params = given(options.params_option, options.params);
  return arguments;
}

// What each layer takes beside the inputs, --valid-lens and the output flags, and how to say so.
struct LayerFlags {
  std::vector<std::string> flags;
  std::string description;
};

LayerFlags layer_flags(const std::string& layer) {
  if (layer == kDotProduct) {
    return {{"--heads", "--kv-heads", "--scale", "--mask", "--window", "--causal", "--alignment",
             "--softcap", "--alibi", "--sinks"},
            "every attention flag"};
  }
  if (layer == kAdditive) {
    return {{"--params", "--mask", "--window", "--causal", "--alignment"},
            "--params, --mask, --window, --causal, --alignment and --valid-lens (additive scores "
            "have no heads, scale, soft-capping, ALiBi or sinks)"};
  }
  if (layer == kMultiHead) {
    return {{"--params", "--heads"},
            "--params, --heads and --valid-lens only (the book's layer, which owns its "
            "projections, has no other option)"};
  }
  return {{"--params"},
          "--params and --valid-lens only (the layer projects the queries, then scores them "
          "unscaled, as the book's exercise)"};
}

// Combinations CLI11 cannot express: which options each layer needs or refuses.
void check_layer_options(const RunOptions& options) {
  const bool multi_head = options.layer == kMultiHead;
  const bool dot_product = options.layer == kDotProduct;
  if (multi_head && options.heads_option->count() == 0) {
    throw ValueError(
        "--heads: required for --layer multi-head (the number of heads cannot be inferred from "
        "the parameter shapes)");
  }
  if (!dot_product && options.scale_option->count() > 0) {
    throw ValueError("--scale: only --layer dot-product takes a scale, got --layer " +
                     options.layer);
  }
  if (dot_product && options.params_option->count() > 0) {
    throw ValueError("--params: --layer dot-product has no parameters, got --params '" +
                     options.params + "' (leave it out; --scale sets the scale)");
  }
  if (!dot_product && options.params_option->count() == 0) {
    throw ValueError("--params: required for --layer " + options.layer +
                     " (a safetensors file with the layer's state dict, e.g. saved from PyTorch "
                     "with safetensors.torch.save_file(layer.state_dict(), path))");
  }
  const LayerFlags taken = layer_flags(options.layer);
  for (const auto& [flag, option] : std::vector<std::pair<std::string, const CLI::Option*>>{
           {"--heads", options.heads_option},
           {"--kv-heads", options.kv_heads_option},
           {"--mask", options.mask_option},
           {"--window", options.window_option},
           {"--causal", options.causal_option},
           {"--alignment", options.alignment_option},
           {"--softcap", options.softcap_option},
           {"--alibi", options.alibi_option},
           {"--sinks", options.sinks_option}}) {
    if (option->count() == 0) continue;
    if (std::find(taken.flags.begin(), taken.flags.end(), flag) == taken.flags.end()) {
      throw ValueError(flag + ": not supported by --layer " + options.layer + ", which takes " +
                       taken.description + "; --layer dot-product takes every attention flag");
    }
  }
}

// A parameter the layer's sizes are read from; must exist and be a non-empty matrix, so that
// building the layer from its dimensions can only fail over --heads.
const Tensor& required_matrix(const StateDict& state, const std::string& name,
                              const RunOptions& options) {
  const auto found = state.find(name);
  if (found == state.end()) {
    std::string present;
    for (const auto& [present_name, tensor] : state) {
      present += (present.empty() ? "" : ", ") + present_name;
    }
    throw ShapeError("--params: " + options.params + ": missing tensor '" + name +
                     "' needed by --layer " + options.layer + " (the file holds: " +
                     (present.empty() ? std::string("no tensors") : present) + ")");
  }
  if (found->second.rank() != 2 || found->second.numel() == 0) {
    throw ShapeError("--params: " + options.params + ": tensor '" + name +
                     "' expected a non-empty matrix (rank 2), got shape " +
                     found->second.shape().str());
  }
  return found->second;
}

// The inputs of a layer's forward pass: the book's layers take (B, n, ·) tensors as they are.
// Inputs stored in one half type are widened for the layer, whose output is rounded back to it.
struct LayerInputs {
  Tensor queries;
  Tensor keys;
  Tensor values;
  ValidLengths valid_lens;
  std::optional<HalfType> stored_half;
};

LayerInputs load_layer_inputs(const RunOptions& options) {
  LayerInputs inputs;
  InputFile files[] = {
      with_context("--queries", [&] { return read_input_file(options.queries, "queries"); }),
      with_context("--keys", [&] { return read_input_file(options.keys, "keys"); }),
      with_context("--values", [&] { return read_input_file(options.values, "values"); })};
  inputs.stored_half = shared_half_type(files);
  inputs.queries = files[0].take_floats();
  inputs.keys = files[1].take_floats();
  inputs.values = files[2].take_floats();
  if (options.valid_lens_option->count() > 0) {
    inputs.valid_lens = reading_valid_lens(
        [&] { return load_npy_valid_lengths(options.valid_lens, "valid_lens"); });
  }
  return inputs;
}

const Shape& shape_of(const ResultTensor& tensor) {
  if (const auto* half = std::get_if<HalfResult>(&tensor)) return half->shape;
  return std::get<Tensor>(tensor).shape();
}

// One gradient of sum(output · G), under the name of its file in --grads-out.
struct NamedGradient {
  std::string name;
  ResultTensor gradient;
};

struct Result {
  ResultTensor output;
  // Empty unless --weights-out or --heatmap asked for them: (B, n, m) scores' worth of memory.
  Tensor weights;
  // Multi-head layer weights are (B·heads, n, m); the heatmap shows them as a B × heads grid
  // (rank-4 weights (B, H, n, m) are one already).
  int64_t heads = 1;
  // With --out-grad: the inputs' gradients, then the parameters' (or the mask's and sinks') in
  // state-dict order.
  std::vector<NamedGradient> gradients;
};

// G of --out-grad as its file holds it: a half file's bits alone, which the half dot-product run
// reads as they are (loaded as floats and rounded back, G was held three times over: 201 MB peak
// for a 176 MB float16 run at n = m = 4096, 32 heads), any other float file as float32. Each run
// takes G once, in the precision it computes in.
class GradOutput {
 public:
  explicit GradOutput(const std::string& path) : file_(read_input_file(path, "G")) {}
  const Shape& shape() const { return file_.shape; }
  // G as float32 (a half file's values widened exactly).
  Tensor take_floats() { return file_.take_floats(); }
  // G as bits of `type` (other values rounded once, as autograd hands a half output a gradient of
  // its own type).
  std::vector<uint16_t> take_half_bits(HalfType type) {
    if (file_.half == type) return std::move(file_.bits);
    const Tensor floats = file_.take_floats();
    std::vector<uint16_t> bits(static_cast<size_t>(floats.numel()));
    narrow_to_half(type, floats.data(), bits.data(), bits.size());
    return bits;
  }

 private:
  InputFile file_;
};

// G must be shaped like the output, as sum(output · G) pairs them element by element.
void check_grad_output(const RunOptions& options, const GradOutput& grad_output,
                       const Shape& output_shape) {
  if (grad_output.shape() != output_shape) {
    throw ShapeError("--out-grad: " + options.out_grad + " has shape " + grad_output.shape().str() +
                     ", expected the shape of the layer's output " + output_shape.str() +
                     " (G is the gradient of a loss with respect to it)");
  }
}

std::vector<NamedGradient> input_gradients(ResultTensor queries, ResultTensor keys,
                                           ResultTensor values) {
  std::vector<NamedGradient> named;
  named.push_back({"queries", std::move(queries)});
  named.push_back({"keys", std::move(keys)});
  named.push_back({"values", std::move(values)});
  return named;
}

// A float mask's and the sinks' gradients after the inputs', each in its file's type (float16 for
// a float16 file, as PyTorch's .grad keeps a tensor's dtype).
void append_option_gradients(const FunctionalInputs& inputs, Tensor mask, Tensor sinks,
                             std::vector<NamedGradient>& gradients) {
  if (inputs.has_float_mask()) {
    gradients.push_back({"attn_mask", in_stored_type(inputs.mask_stored_half(), std::move(mask))});
  }
  if (inputs.has_sinks()) {
    gradients.push_back({"sinks", in_stored_type(inputs.sinks_stored_half(), std::move(sinks))});
  }
}

// The backward pass of a layer with parameters: gradients start from zero (a fresh layer's, but
// backward() accumulates), then the inputs' and every parameter's under its state-dict name.
template <class Layer>
std::vector<NamedGradient> layer_gradients(Layer& layer, const Tensor& grad_output) {
  zero_grad(layer.parameters());
  AttentionGradients inputs = layer.backward(grad_output);
  std::vector<NamedGradient> named =
      input_gradients(std::move(inputs.queries), std::move(inputs.keys), std::move(inputs.values));
  for (const NamedParameter& parameter : layer.parameters()) {
    named.push_back({parameter.name, *parameter.grad});
  }
  return named;
}

// run_dot_product on float16 or bfloat16 files: PyTorch's half attention (fp32 sums, the output
// and the gradients of queries, keys and values rounded once to the inputs' type), through the
// half overloads.
Result run_dot_product_half(const RunArguments& arguments, const FunctionalInputs& inputs,
                            const RunOptions& options, GradOutput* grad_output, bool need_weights) {
  const HalfType kType = *inputs.half();
  Result result;
  const Shape output_shape = inputs.output_shape();
  std::vector<uint16_t> output(static_cast<size_t>(output_shape.numel()));
  std::vector<float> log_sum_exp(static_cast<size_t>(log_sum_exp_size(inputs.query16().shape())));
  name_sources(arguments, [&] {
    scaled_dot_product_attention(kType, inputs.query16(), inputs.key16(), inputs.value16(),
                                 inputs.options(), inputs.like_query16(output, output_shape),
                                 log_sum_exp);
  });
  if (need_weights) {
    result.weights =
        attention_weights(kType, inputs.query16(), inputs.key16(), log_sum_exp, inputs.options());
  }
  if (grad_output == nullptr) {
    result.output = HalfResult{kType, output_shape, std::move(output)};
    return result;
  }
  check_grad_output(options, *grad_output, output_shape);
  // G in the output's precision, as PyTorch's autograd hands a half output its gradient.
  std::vector<uint16_t> grad = grad_output->take_half_bits(kType);
  std::vector<uint16_t> queries(static_cast<size_t>(inputs.query_shape().numel()));
  std::vector<uint16_t> keys(static_cast<size_t>(inputs.key_shape().numel()));
  std::vector<uint16_t> values(static_cast<size_t>(inputs.value_shape().numel()));
  Tensor mask = inputs.has_float_mask() ? Tensor(inputs.options().attn_mask.shape()) : Tensor();
  Tensor sinks = inputs.has_sinks() ? Tensor(Shape{inputs.query_heads()}) : Tensor();
  name_sources(arguments, [&] {
    scaled_dot_product_attention_backward(
        kType, inputs.query16(), inputs.key16(), inputs.value16(),
        inputs.like_query16(output, output_shape), inputs.like_query16(grad, output_shape),
        log_sum_exp, inputs.options(), inputs.like_query16(queries, inputs.query_shape()),
        inputs.like_key16(keys, inputs.key_shape()),
        inputs.like_key16(values, inputs.value_shape()),
        inputs.has_float_mask() ? MutableStridedView(mask) : MutableStridedView(),
        inputs.has_sinks() ? sinks.span() : std::span<float>());
  });
  result.output = HalfResult{kType, output_shape, std::move(output)};
  result.gradients = input_gradients(HalfResult{kType, inputs.query_shape(), std::move(queries)},
                                     HalfResult{kType, inputs.key_shape(), std::move(keys)},
                                     HalfResult{kType, inputs.value_shape(), std::move(values)});
  append_option_gradients(inputs, std::move(mask), std::move(sinks), result.gradients);
  return result;
}

// Dot-product attention through attn::scaled_dot_product_attention on the files' tensors in place:
// the output, and the gradients, are written straight into tensors of the files' layouts.
Result run_dot_product(const RunOptions& options, GradOutput* grad_output, bool need_weights) {
  const RunArguments arguments = run_arguments(options);
  const FunctionalInputs inputs(arguments, ScoreFamily::kDotProduct);
  if (inputs.half()) {
    return run_dot_product_half(arguments, inputs, options, grad_output, need_weights);
  }
  Result result;
  Tensor output(inputs.output_shape());
  std::vector<float> log_sum_exp(static_cast<size_t>(log_sum_exp_size(inputs.query().shape())));
  name_sources(arguments, [&] {
    scaled_dot_product_attention(inputs.query(), inputs.key(), inputs.value(), inputs.options(),
                                 inputs.like_query(output), log_sum_exp);
  });
  if (need_weights) {
    result.weights = attention_weights(inputs.query(), inputs.key(), log_sum_exp, inputs.options());
  }
  if (grad_output != nullptr) {
    check_grad_output(options, *grad_output, output.shape());
    const Tensor grad = grad_output->take_floats();
    Tensor queries(inputs.query_shape());
    Tensor keys(inputs.key_shape());
    Tensor values(inputs.value_shape());
    // A float mask and sinks are differentiable inputs too (the mask's broadcast axes summed).
    Tensor mask = inputs.has_float_mask() ? Tensor(inputs.options().attn_mask.shape()) : Tensor();
    Tensor sinks = inputs.has_sinks() ? Tensor(Shape{inputs.query_heads()}) : Tensor();
    name_sources(arguments, [&] {
      scaled_dot_product_attention_backward(
          inputs.query(), inputs.key(), inputs.value(), inputs.like_query(output),
          inputs.like_query(grad), log_sum_exp, inputs.options(), inputs.like_query(queries),
          inputs.like_key(keys), inputs.like_key(values),
          inputs.has_float_mask() ? MutableStridedView(mask) : MutableStridedView(),
          inputs.has_sinks() ? sinks.span() : std::span<float>());
    });
    result.gradients = input_gradients(std::move(queries), std::move(keys), std::move(values));
    append_option_gradients(inputs, std::move(mask), std::move(sinks), result.gradients);
  }
  result.output = std::move(output);
  return result;
}

// The gradient of sum(output · G) with respect to an additive layer's float --mask (what
// PyTorch's autograd leaves in a float mask added to the scores): dS = P ⊙ (G·Vᵀ − rowsum(G ⊙ O))
// per (query, key), summed over the axes the mask is broadcast along. The additive kernels carry
// no mask gradient, so this one is computed from the weights (B·…, n, m), asked for with
// --grads-out only, in double; evaluation mode (no dropout), as attn run runs.
Tensor additive_mask_gradient(const Tensor& weights, ConstStridedView values, const Tensor& output,
                              const Tensor& grad_output, const Shape& mask_shape) {
  const int rank = weights.rank();
  const int64_t rows = weights.dim(rank - 2), keys = weights.dim(rank - 1);
  const int64_t depth = values.dim(values.rank() - 1);
  const int64_t slices = rows * keys == 0 ? 0 : weights.numel() / (rows * keys);
  // Each score axis's step through the mask: 0 where the mask has 1 (or no) entry along it.
  std::vector<int64_t> mask_step(static_cast<size_t>(rank), 0);
  int64_t stride = 1;
  for (int axis = mask_shape.rank() - 1; axis >= 0; --axis) {
    const int score_axis = rank - mask_shape.rank() + axis;
    if (score_axis >= 0 && mask_shape[axis] != 1)
      mask_step[static_cast<size_t>(score_axis)] = stride;
    stride *= mask_shape[axis];
  }
  std::vector<double> sums(static_cast<size_t>(mask_shape.numel()), 0.0);
  for (int64_t slice = 0; slice < slices; ++slice) {
    // This slice's values matrix and mask entries: its position along the scores' leading axes.
    int64_t value_offset = 0, mask_base = 0, rest = slice;
    for (int axis = rank - 3; axis >= 0; --axis) {
      const int value_axis = values.rank() - rank + axis;
      const int64_t position = rest % weights.dim(axis);
      rest /= weights.dim(axis);
      if (value_axis >= 0) value_offset += position * values.stride(value_axis);
      mask_base += position * mask_step[static_cast<size_t>(axis)];
    }
    for (int64_t i = 0; i < rows; ++i) {
      const float* g = grad_output.data() + (slice * rows + i) * depth;
      const float* o = output.data() + (slice * rows + i) * depth;
      double row_dot = 0.0;
      for (int64_t c = 0; c < depth; ++c) row_dot += static_cast<double>(g[c]) * o[c];
      for (int64_t j = 0; j < keys; ++j) {
        const double p = weights.data()[(slice * rows + i) * keys + j];
        if (p == 0.0) continue;
        const float* v = values.data() + value_offset + j * values.stride(values.rank() - 2);
        double dp = 0.0;
        for (int64_t c = 0; c < depth; ++c)
          dp += static_cast<double>(g[c]) * v[c * values.stride(values.rank() - 1)];
        sums[static_cast<size_t>(mask_base + i * mask_step[static_cast<size_t>(rank - 2)] +
                                 j * mask_step[static_cast<size_t>(rank - 1)])] +=
            p * (dp - row_dot);
      }
    }
  }
  Tensor gradient(mask_shape);
  for (int64_t e = 0; e < gradient.numel(); ++e)
    gradient.data()[e] = static_cast<float>(sums[static_cast<size_t>(e)]);
  return gradient;
}

// Additive attention through attn::additive_attention with the parameters read from --params.
Result run_additive(const RunOptions& options, const StateDict& state, GradOutput* grad_output,
                    bool need_weights) {
  const Tensor& W_q = required_matrix(state, "W_q.weight", options);
  const Tensor& W_k = required_matrix(state, "W_k.weight", options);
  const int64_t hidden = W_q.dim(0);
  // Strict, as the layer's load_state_dict: W_k (h, k) and w_v (1, h) against W_q's h, and no
  // other tensor; the message names what is wrong.
  Tensor W_q_shape(Shape{hidden, W_q.dim(1)}), W_k_shape(Shape{hidden, W_k.dim(1)}),
      w_v_shape(Shape{1, hidden});
  with_context("--params: " + options.params, [&] {
    check_state_dict(
        state, {{"W_q.weight", &W_q_shape}, {"W_k.weight", &W_k_shape}, {"w_v.weight", &w_v_shape}},
        "AdditiveAttention");
  });
  const Tensor& w_v = state.at("w_v.weight");
  const RunArguments arguments = run_arguments(options);
  const FunctionalInputs inputs(arguments, ScoreFamily::kAdditive);
  name_sources(arguments, [&] {
    require_dim("queries", inputs.query_shape(), -1, W_q.dim(1),
                "the query size of W_q.weight " + W_q.shape().str());
    require_dim("keys", inputs.key_shape(), -1, W_k.dim(1),
                "the key size of W_k.weight " + W_k.shape().str());
  });
  const AdditiveParameters parameters{W_q, W_k, w_v.span()};
  AttentionForward forward = name_sources(arguments, [&] {
    return additive_attention(inputs.query(), inputs.key(), inputs.value(), parameters,
                              inputs.options());
  });
  Result result;
  if (need_weights) {
    result.weights = additive_attention_weights(inputs.query(), inputs.key(), parameters,
                                                forward.log_sum_exp, inputs.options());
  }
  if (grad_output != nullptr) {
    check_grad_output(options, *grad_output, forward.output.shape());
    const Tensor grad = grad_output->take_floats();
    AdditiveGradients gradients = name_sources(arguments, [&] {
      return additive_attention_backward(inputs.query(), inputs.key(), inputs.value(), parameters,
                                         forward.output, grad, forward.log_sum_exp,
                                         inputs.options());
    });
    const std::optional<HalfType> stored = inputs.stored_half();
    result.gradients = input_gradients(in_stored_type(stored, std::move(gradients.queries)),
                                       in_stored_type(stored, std::move(gradients.keys)),
                                       in_stored_type(stored, std::move(gradients.values)));
    result.gradients.push_back({"W_q.weight", std::move(gradients.W_q)});
    result.gradients.push_back({"W_k.weight", std::move(gradients.W_k)});
    // The state dict's w_v.weight is nn.Linear's (1, h) matrix.
    gradients.w_v.reshape(Shape{1, hidden});
    result.gradients.push_back({"w_v.weight", std::move(gradients.w_v)});
    if (inputs.has_float_mask()) {
      const Tensor weights = additive_attention_weights(inputs.query(), inputs.key(), parameters,
                                                        forward.log_sum_exp, inputs.options());
      result.gradients.push_back(
          {"attn_mask",
           in_stored_type(inputs.mask_stored_half(),
                          additive_mask_gradient(weights, inputs.value(), forward.output, grad,
                                                 inputs.options().attn_mask.shape()))});
    }
  }
  result.output = in_stored_type(inputs.stored_half(), std::move(forward.output));
  return result;
}

// A layer's forward pass and, on request, its weights and backward pass.
template <class Layer>
Result run_layer(const RunOptions& options, Layer& layer, GradOutput* grad_output,
                 bool need_weights, int64_t heads) {
  const LayerInputs inputs = load_layer_inputs(options);
  layer.eval();
  const RunArguments arguments = run_arguments(options);
  Result result;
  Tensor output = name_sources(arguments, [&] {
    return layer(inputs.queries, inputs.keys, inputs.values, inputs.valid_lens);
  });
  result.heads = heads;
  // Computed from the fused pass only on this request.
  if (need_weights) result.weights = layer.attention_weights();
  if (grad_output != nullptr) {
    check_grad_output(options, *grad_output, output.shape());
    result.gradients =
        name_sources(arguments, [&] { return layer_gradients(layer, grad_output->take_floats()); });
    // The inputs' gradients in the inputs' type; the parameters' stay float32, as theirs.
    for (size_t index = 0; index < 3 && inputs.stored_half; ++index) {
      NamedGradient& gradient = result.gradients[index];
      gradient.gradient =
          in_stored_type(inputs.stored_half, std::move(std::get<Tensor>(gradient.gradient)));
    }
  }
  result.output = in_stored_type(inputs.stored_half, std::move(output));
  return result;
}

Result run_multi_head(const RunOptions& options, const StateDict& state, GradOutput* grad_output,
                      bool need_weights) {
  const Tensor& W_q = required_matrix(state, "W_q.weight", options);
  const Tensor& W_k = required_matrix(state, "W_k.weight", options);
  const Tensor& W_v = required_matrix(state, "W_v.weight", options);
  const bool bias = state.contains("W_q.bias");
  MultiHeadAttention layer = with_context("--heads " + std::to_string(options.heads), [&] {
    return MultiHeadAttention(/*key_size=*/W_k.dim(1), /*query_size=*/W_q.dim(1),
                              /*value_size=*/W_v.dim(1), /*num_hiddens=*/W_q.dim(0), options.heads,
                              /*dropout=*/0.0F, bias);
  });
  // Strict loading checks W_o, the other projections' widths and every bias.
  with_context("--params: " + options.params, [&] { layer.load_state_dict(state); });
  return run_layer(options, layer, grad_output, need_weights, options.heads);
}

Result run_general(const RunOptions& options, const StateDict& state, GradOutput* grad_output,
                   bool need_weights) {
  // W (key_size, query_size): nn.Linear(query_size, key_size, bias=False).
  const Tensor& W = required_matrix(state, "W.weight", options);
  GeneralAttention layer(/*query_size=*/W.dim(1), /*key_size=*/W.dim(0), /*dropout=*/0.0F);
  with_context("--params: " + options.params, [&] { layer.load_state_dict(state); });
  return run_layer(options, layer, grad_output, need_weights, 1);
}

void save_heatmap(const Result& result, const std::filesystem::path& path) {
  const Tensor& weights = result.weights;
  HeatmapOptions heatmap_options;
  ConstTensorView view = weights;
  if (weights.rank() == 4) {
    heatmap_options = head_grid_options(weights.dim(0), weights.dim(1));
  } else if (result.heads > 1) {
    const int64_t batch = weights.dim(0) / result.heads;
    heatmap_options = head_grid_options(batch, result.heads);
    view = view.reshaped(Shape{batch, result.heads, weights.dim(1), weights.dim(2)});
  }
  save_heatmaps(view, path, heatmap_options);
}

// --out-grad and --grads-out only make sense together: G without a place for the gradients, or
// a place without G.
void check_gradient_options(const RunOptions& options) {
  const bool grad = options.out_grad_option->count() > 0;
  const bool grads_out = options.grads_out_option->count() > 0;
  if (grad && !grads_out) {
    throw ValueError(
        "--out-grad: given without --grads-out (the directory to write the gradients "
        "of sum(output * G) to)");
  }
  if (grads_out && !grad) {
    throw ValueError(
        "--grads-out: given without --out-grad (the gradient G of the loss with "
        "respect to the output, a float .npy shaped like the output)");
  }
}

// The gradients are written in the output's format: .npy files, or .safetensors beside a
// .safetensors --out.
std::filesystem::path gradient_path(const RunOptions& options, const std::string& name) {
  const char* extension = is_safetensors_path(options.out) ? ".safetensors" : ".npy";
  return std::filesystem::path(options.grads_out) / (name + extension);
}

// Whether `path` can hold `tensor`: .npy has float32 and float16 but no bfloat16. Checked for
// every output before the first is written.
void check_format(const std::string& option, const std::filesystem::path& path,
                  const ResultTensor& tensor) {
  const auto* half = std::get_if<HalfResult>(&tensor);
  if (half != nullptr && half->type == HalfType::kBFloat16 && !is_safetensors_path(path)) {
    throw ValueError(option +
                     ": a bfloat16 result needs a .safetensors file (.npy has no "
                     "bfloat16), got '" +
                     path.string() + "'");
  }
}

// save_tensor of `path` (FILE, or FILE.safetensors:NAME) through `staged`: FILE is staged, NAME
// kept.
void stage_tensor(StagedOutputs& staged, const std::string& option, const std::string& path,
                  const ResultTensor& tensor, const std::string& name) {
  const std::optional<SafetensorsPath> split = split_safetensors_path(path);
  staged.write(option, split ? split->file : path, [&](const std::filesystem::path& temporary) {
    save_tensor(split ? temporary.string() + ":" + split->name : temporary.string(), tensor, name);
  });
}

// The tensor name of a .safetensors --out, checked before anything is computed: the format keeps
// '__metadata__' for itself, and names must be UTF-8 (what the writer would refuse at the end).
void check_output_tensor_name(const RunOptions& options) {
  const std::optional<SafetensorsPath> split = split_safetensors_path(options.out);
  if (!split || split->name.empty()) return;
  if (split->name == "__metadata__") {
    throw ValueError(
        "--out: expected a tensor name other than '__metadata__', which the safetensors format "
        "keeps for the file's metadata, got '" +
        options.out + "'");
  }
  // The writer's own rules, on a one-element tensor of that name.
  with_context("--out", [&] {
    StateDict probe;
    probe.emplace(split->name, Tensor(Shape{1}));
    serialize_safetensors(probe);
  });
}

// Every file the run reads, by the option that names it.
std::vector<CommandFile> input_files(const RunOptions& options) {
  // Files, not FILE.safetensors:NAME arguments: three tensors of one file are one input, which
  // no output may overwrite.
  std::vector<CommandFile> inputs = {{"--queries", file_of_path(options.queries)},
                                     {"--keys", file_of_path(options.keys)},
                                     {"--values", file_of_path(options.values)}};
  for (const auto& [option, flag, path] :
       std::vector<std::tuple<std::string, const CLI::Option*, std::string>>{
           {"--params", options.params_option, options.params},
           {"--valid-lens", options.valid_lens_option, options.valid_lens},
           {"--mask", options.mask_option, options.mask},
           {"--alibi", options.alibi_option, options.alibi},
           {"--sinks", options.sinks_option, options.sinks},
           {"--out-grad", options.out_grad_option, options.out_grad}}) {
    if (flag->count() > 0) inputs.push_back({option, file_of_path(path)});
  }
  return inputs;
}

// Every file the run writes; the gradients' files once their names are known (after the run).
std::vector<OutputFile> output_files(const RunOptions& options,
                                     const std::vector<NamedGradient>& gradients) {
  std::vector<OutputFile> outputs = {{"--out", file_of_path(options.out), OutputKind::kArray}};
  if (options.weights_out_option->count() > 0) {
    outputs.push_back({"--weights-out", options.weights_out, OutputKind::kNpy});
  }
  if (options.heatmap_option->count() > 0) {
    outputs.push_back({"--heatmap", options.heatmap, OutputKind::kPicture});
  }
  for (const NamedGradient& gradient : gradients) {
    outputs.push_back({"--grads-out (" + gradient.name + ")", gradient_path(options, gradient.name),
                       OutputKind::kArray});
  }
  return outputs;
}

// --ring: the same inputs and attention flags over MPI ranks; cli/ring_run.cpp refuses by name
// what it cannot take (other layers, --mask, --sinks, the weights).
RingRunRequest ring_request(const RunOptions& options) {
  RingRunRequest request;
  request.layer = options.layer;
  request.arguments = run_arguments(options);
  request.out = options.out;
  request.out_grad = given(options.out_grad_option, options.out_grad);
  request.grads_out = given(options.grads_out_option, options.grads_out);
  if (options.weights_out_option->count() > 0) request.refused_flags.push_back("--weights-out");
  if (options.heatmap_option->count() > 0) request.refused_flags.push_back("--heatmap");
  return request;
}

void run(const RunOptions& options) {
  check_layer_options(options);
  check_gradient_options(options);
  if (options.ring) {
    run_ring(ring_request(options));
    return;
  }
  // Every output is checked before the computation (so that a bad path costs no time) and again,
  // gradients included, before the first file is written.
  const std::vector<CommandFile> inputs = input_files(options);
  const bool gradients = options.grads_out_option->count() > 0;
  if (gradients) check_gradients_directory(options.grads_out);
  check_outputs(output_files(options, {}), inputs);
  check_output_tensor_name(options);
  StateDict state;
  if (options.params_option->count() > 0) {
    state = with_context("--params", [&] { return load_safetensors(options.params); });
  }
  std::optional<GradOutput> grad_output;
  if (options.out_grad_option->count() > 0)
    with_context("--out-grad", [&] { grad_output.emplace(options.out_grad); });
  GradOutput* const grad = grad_output ? &*grad_output : nullptr;
  // The weights hold B·H·n·m floats (8.6 GB at n = m = 8192 for B·H = 32): only when asked.
  const bool need_weights =
      options.weights_out_option->count() > 0 || options.heatmap_option->count() > 0;
  Result result;
  {
    // The kernels' progress on standard error while they run (from 1 s on a terminal, 10 s in a
    // log), gone before the results are written.
    const ProgressLine progress("attn run");
    if (options.layer == kAdditive) {
      result = run_additive(options, state, grad, need_weights);
    } else if (options.layer == kDotProduct) {
      result = run_dot_product(options, grad, need_weights);
    } else if (options.layer == kMultiHead) {
      result = run_multi_head(options, state, grad, need_weights);
    } else {
      result = run_general(options, state, grad, need_weights);
    }
  }

  require_finite_result(result.output, "--out");
  if (options.weights_out_option->count() > 0)
    require_finite_result(result.weights, "--weights-out");
  for (const NamedGradient& gradient : result.gradients) {
    require_finite_result(gradient.gradient, "--grads-out (" + gradient.name + ")");
  }
  check_format("--out", options.out, result.output);
  for (const NamedGradient& gradient : result.gradients) {
    check_format("--grads-out (" + gradient.name + ")", gradient_path(options, gradient.name),
                 gradient.gradient);
  }
  // The gradients' directory, when this run creates it, goes again with the files if a write
  // fails: all outputs or none.
  write_with_gradients_directory(gradients ? options.grads_out : std::string(), [&] {
    check_outputs(output_files(options, result.gradients), inputs);
    // Every output to a temporary beside it first, then all renamed over their targets: a late
    // failure (a picture too large to draw, a full disk, a folder that refuses files) leaves no
    // output written and the previous files as they were.
    StagedOutputs staged;
    if (options.heatmap_option->count() > 0) {
      staged.write("--heatmap", options.heatmap, [&](const std::filesystem::path& temporary) {
        save_heatmap(result, temporary);
      });
    }
    if (options.weights_out_option->count() > 0) {
      staged.write(
          "--weights-out", options.weights_out,
          [&](const std::filesystem::path& temporary) { save_npy(temporary, result.weights); });
    }
    for (const NamedGradient& gradient : result.gradients) {
      stage_tensor(staged, "--grads-out", gradient_path(options, gradient.name).string(),
                   gradient.gradient, gradient.name);
    }
    stage_tensor(staged, "--out", options.out, result.output, "output");
    staged.commit();
  });
  std::string summary = "attn run: " + options.layer + " attention, output " +
                        shape_of(result.output).str() + " -> " + options.out;
  if (options.weights_out_option->count() > 0) {
    summary += ", weights " + result.weights.shape().str() + " -> " + options.weights_out;
  }
  if (options.heatmap_option->count() > 0) summary += ", heatmap -> " + options.heatmap;
  if (grad_output) {
    std::string names;
    for (const NamedGradient& gradient : result.gradients) {
      names += (names.empty() ? "" : ", ") + gradient.name;
    }
    summary += ", gradients of sum(output * G) (" + names + ") -> " + options.grads_out;
  }
  std::cout << summary << "\n";
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto options = std::make_shared<RunOptions>();
  CLI::App* command = app.add_subcommand(
      "run",
      "Run one attention call (evaluation mode) on .npy or safetensors inputs, writing its output");
  command->footer(
      "dot-product and additive call attn's functional API directly; multi-head and general "
      "build the layer, whose sizes come from the shapes of its parameters in --params, stored "
      "under PyTorch's state-dict names: W_q.weight (h, query_size), W_k.weight (h, key_size) and "
      "w_v.weight (1, h) for additive; W_q, W_k, W_v, W_o .weight (and .bias if any) for "
      "multi-head; W.weight (key_size, query_size) for general. A layer saved from PyTorch with "
      "safetensors.torch.save_file(layer.state_dict(), path) runs unchanged. Inputs are rank 3 "
      "(B, n, d), split into heads by --heads, or rank 4 (N, H, L, E) as PyTorch's; the output "
      "keeps the queries' layout. Dropout is off (evaluation mode). Weights are computed only "
      "for --weights-out or --heatmap.");
  command->add_option("--layer", options->layer, "Layer type")
      ->required()
      ->check(CLI::IsMember({kAdditive, kDotProduct, kMultiHead, kGeneral}));
  options->heads_option =
      command
          ->add_option("--heads", options->heads,
                       "Number of heads: required for multi-head; for dot-product, splits the "
                       "last axis of rank-3 inputs into heads in place (head h: columns "
                       "[h*d, (h+1)*d))")
          ->transform(number_check(options->heads))
          ->default_str("");
  options->kv_heads_option =
      command
          ->add_option("--kv-heads", options->kv_heads,
                       "Key/value heads for grouped-query attention (dot-product, with --heads; "
                       "must divide --heads)")
          ->transform(number_check(options->kv_heads))
          ->default_str("--heads");
  options->params_option = command
                               ->add_option("--params", options->params,
                                            "Parameters as safetensors, F32, F64, F16 or BF16 "
                                            "(required for additive, multi-head and general; "
                                            "none for dot-product)")
                               ->type_name("FILE");
  options->scale_option =
      command->add_option("--scale", options->scale, "Score scale for dot-product")
          ->transform(number_check(options->scale, finite()))
          ->default_str("1/sqrt(query size)");
  command
      ->add_option("--queries", options->queries,
                   "Queries (B, n, query_size) or (N, H, L, E): float .npy (float32, float64 or "
                   "float16), or a safetensors tensor (F32, F64, F16 or BF16; FILE.safetensors "
                   "holding one tensor, or FILE.safetensors:NAME). float16 or bfloat16 queries, "
                   "keys and values run dot-product attention in that type; every layer writes "
                   "its output and the inputs' gradients in the inputs' type, as PyTorch, "
                   "except float64: computed and written in float32")
      ->type_name("FILE")
      ->required();
  command
      ->add_option("--keys", options->keys, "Keys (B, m, key_size) or (N, G, S, E), as --queries")
      ->type_name("FILE")
      ->required();
  command
      ->add_option("--values", options->values,
                   "Values (B, m, value_size) or (N, G, S, Ev), as --queries")
      ->type_name("FILE")
      ->required();
  options->valid_lens_option =
      command
          ->add_option("--valid-lens", options->valid_lens,
                       "Valid lengths (B) or (B, n), integer .npy (default: every key is valid)")
          ->type_name("FILE");
  options->mask_option =
      command
          ->add_option(
              "--mask", options->mask,
              "Attention mask, .npy broadcastable to the scores (B, n, m) or (B, H, n, m): "
              "bool (True: the key takes part) or float (added to the scores; -inf "
              "hides); dot-product and additive")
          ->type_name("FILE");
  options->window_option =
      command
          ->add_option("--window", options->window,
                       "Sliding window L,R: keys from L before to R after each query's diagonal "
                       "key (-1: unbounded); dot-product and additive")
          ->type_name("L,R");
  options->causal_option =
      command
          ->add_option("--causal", options->causal,
                       "Causal mask aligned top-left (PyTorch's is_causal: query i sees keys "
                       "j <= i) or bottom-right (j <= i + m - n: the book's layers', "
                       "FlashAttention's); a bare --causal is bottom-right. Also places --window "
                       "and --alibi; dot-product and additive")
          ->expected(0, 1)
          ->default_str("bottom-right")
          ->type_name("top-left|bottom-right");
  options->alignment_option =
      command
          ->add_option("--alignment", options->alignment,
                       "Where query i's diagonal key sits for --window and --alibi: top-left "
                       "(key i, PyTorch's; the default without --causal) or bottom-right (key "
                       "i + m - n, FlashAttention's). --causal's alignment, when given, must "
                       "agree; dot-product and additive")
          ->type_name("top-left|bottom-right");
  options->softcap_option =
      command
          ->add_option("--softcap", options->softcap,
                       "Soft-capping: scores s become X*tanh(s/X) (Gemma 2); dot-product")
          ->transform(number_check(options->softcap, positive()))
          ->type_name("X")
          ->default_str("");
  options->alibi_option = command
                              ->add_option("--alibi", options->alibi,
                                           "ALiBi slopes, float .npy (H): one per query head; "
                                           "dot-product")
                              ->type_name("FILE");
  options->sinks_option = command
                              ->add_option("--sinks", options->sinks,
                                           "Attention sink logits, float .npy (H): one per query "
                                           "head, joining each softmax's denominator; dot-product")
                              ->type_name("FILE");
  command
      ->add_option("--out", options->out,
                   "Where to write the output, .npy or .safetensors (tensor 'output', or NAME with "
                   "FILE.safetensors:NAME; needed for bfloat16, which .npy cannot hold), in the "
                   "queries' layout: (B, n, value_size), "
                   "(B, n, H*dv) with --heads, (N, H, L, Ev), or (B, n, h) for multi-head")
      ->type_name("FILE")
      ->required();
  options->weights_out_option =
      command
          ->add_option("--weights-out", options->weights_out,
                       "Where to write the attention weights as .npy: (B, n, m); (B, H, n, m) "
                       "with heads; (B*heads, n, m) for multi-head")
          ->type_name("FILE");
  options->heatmap_option =
      command
          ->add_option("--heatmap", options->heatmap,
                       "Where to draw the attention weights as heatmaps (.png, .svg or .pdf)")
          ->type_name("FILE");
  options->out_grad_option =
      command
          ->add_option(
              "--out-grad", options->out_grad,
              "G, shaped like the output, as --queries (.npy or a safetensors tensor): run "
              "the backward pass for the gradients of sum(output * G) (with --grads-out)")
          ->type_name("FILE");
  options->grads_out_option =
      command
          ->add_option("--grads-out", options->grads_out,
                       "Directory for the gradients (with --out-grad): queries.npy, keys.npy, "
                       "values.npy, one <state-dict name>.npy per parameter, attn_mask.npy for a "
                       "float --mask and sinks.npy for --sinks (the inputs', mask's and sinks' "
                       "each in its file's type, as PyTorch's .grad; the parameters' in float32, "
                       "the type --params are computed in; .safetensors files instead, each one "
                       "tensor under that name, when --out is .safetensors)")
          ->type_name("DIR")
          ->check(file_name_check("a directory name"));
  command->add_flag("--ring", options->ring,
                    "Ring attention over MPI: run as `mpirun -np P attn run --ring ...`; each rank "
                    "reads only its zig-zag shard of every input, rank 0 writes --out and the "
                    "gradients. Dot-product with --valid-lens, --causal, --alignment, --window, "
                    "--scale, --heads/--kv-heads, --softcap, --alibi (docs/distributed.md)");
  command->callback([options] { run(*options); });
}

}  // namespace attn::cli
