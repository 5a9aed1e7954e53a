// `attn run`: builds the chosen layer from the shapes of its saved parameters, runs it in
// evaluation mode on .npy inputs and writes the output (and optionally weights, a heatmap and the
// gradients of sum(output · G) from its backward pass).
#include "run_command.hpp"

#include <CLI/CLI.hpp>

#include <cstdint>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/core/tensor.hpp"
#include "attn/core/valid_lengths.hpp"
#include "attn/io/npy.hpp"
#include "attn/io/safetensors.hpp"
#include "attn/nn/additive_attention.hpp"
#include "attn/nn/dot_product_attention.hpp"
#include "attn/nn/multi_head_attention.hpp"
#include "attn/nn/state_dict.hpp"
#include "attn/viz/heatmap.hpp"
#include "command_support.hpp"

namespace attn::cli {

namespace {

const std::string kAdditive = "additive";
const std::string kDotProduct = "dot-product";
const std::string kMultiHead = "multi-head";

struct RunOptions {
  std::string layer;
  int64_t heads = 0;
  float scale = 0.0F;
  std::string params;
  std::string queries;
  std::string keys;
  std::string values;
  std::string valid_lens;
  std::string out;
  std::string weights_out;
  std::string heatmap;
  std::string out_grad;
  std::string grads_out;
  // Which optional options were given: CLI11 fills these in while parsing.
  CLI::Option* heads_option = nullptr;
  CLI::Option* scale_option = nullptr;
  CLI::Option* params_option = nullptr;
  CLI::Option* valid_lens_option = nullptr;
  CLI::Option* weights_out_option = nullptr;
  CLI::Option* heatmap_option = nullptr;
  CLI::Option* out_grad_option = nullptr;
  CLI::Option* grads_out_option = nullptr;
};

// Combinations CLI11 cannot express: which options each layer needs or refuses.
void check_layer_options(const RunOptions& options) {
  const bool multi_head = options.layer == kMultiHead;
  const bool dot_product = options.layer == kDotProduct;
  if (multi_head && options.heads_option->count() == 0) {
    throw ValueError(
        "--heads: required for --layer multi-head (the number of heads cannot be inferred from "
        "the parameter shapes)");
  }
  if (!multi_head && options.heads_option->count() > 0) {
    throw ValueError("--heads: only --layer multi-head has heads, got --layer " + options.layer);
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

// The inputs of one forward pass, with the option each came from for error messages.
struct Inputs {
  Tensor queries;
  Tensor keys;
  Tensor values;
  ValidLengths valid_lens;
};

Inputs load_inputs(const RunOptions& options) {
  Inputs inputs;
  inputs.queries =
      with_context("--queries", [&] { return load_npy_tensor(options.queries, "queries"); });
  inputs.keys = with_context("--keys", [&] { return load_npy_tensor(options.keys, "keys"); });
  inputs.values =
      with_context("--values", [&] { return load_npy_tensor(options.values, "values"); });
  if (options.valid_lens_option->count() > 0) {
    inputs.valid_lens = with_context(
        "--valid-lens", [&] { return load_npy_valid_lengths(options.valid_lens, "valid_lens"); });
  }
  return inputs;
}

// The library names the argument a shape error is about ("keys: expected ..."); the user also
// needs to know which file that was.
template <class Forward>
Tensor forward_with_sources(const RunOptions& options, Forward&& forward) {
  try {
    return std::forward<Forward>(forward)();
  } catch (const Error& error) {
    const std::string message = error.what();
    const std::map<std::string, std::pair<std::string, std::string>> sources = {
        {"queries", {"--queries", options.queries}},
        {"keys", {"--keys", options.keys}},
        {"values", {"--values", options.values}},
        {"valid_lens", {"--valid-lens", options.valid_lens}}};
    for (const auto& [argument, source] : sources) {
      if (message.starts_with(argument + ":") || message.starts_with(argument + "[")) {
        rethrow_with_message(
            error, message + " (" + argument + " from " + source.first + " " + source.second + ")");
      }
    }
    throw;
  }
}

// One gradient of sum(output · G), under the name of its file in --grads-out.
struct NamedGradient {
  std::string name;
  Tensor gradient;
};

struct Result {
  Tensor output;
  Tensor weights;
  // Multi-head weights are (B·heads, n, m); the heatmap shows them as a B × heads grid.
  int64_t heads = 1;
  // With --out-grad: the inputs' gradients, then the parameters' in state-dict order.
  std::vector<NamedGradient> gradients;
};

// G must be shaped like the output, as sum(output · G) pairs them element by element.
void check_grad_output(const RunOptions& options, const Tensor& grad_output, const Tensor& output) {
  if (grad_output.shape() != output.shape()) {
    throw ShapeError("--out-grad: " + options.out_grad + " has shape " + grad_output.shape().str() +
                     ", expected the shape of the layer's output " + output.shape().str() +
                     " (G is the gradient of a loss with respect to it)");
  }
}

std::vector<NamedGradient> input_gradients(AttentionGradients gradients) {
  std::vector<NamedGradient> named;
  named.push_back({"queries", std::move(gradients.queries)});
  named.push_back({"keys", std::move(gradients.keys)});
  named.push_back({"values", std::move(gradients.values)});
  return named;
}

// The backward pass of a layer with parameters: gradients start from zero (a fresh layer's, but
// backward() accumulates), then the inputs' and every parameter's under its state-dict name.
template <class Layer>
std::vector<NamedGradient> layer_gradients(Layer& layer, const Tensor& grad_output) {
  zero_grad(layer.parameters());
  std::vector<NamedGradient> named = input_gradients(layer.backward(grad_output));
  for (const NamedParameter& parameter : layer.parameters()) {
    named.push_back({parameter.name, *parameter.grad});
  }
  return named;
}

Result run_additive(const RunOptions& options, const StateDict& state, const Inputs& inputs,
                    const Tensor* grad_output) {
  const Tensor& W_q = required_matrix(state, "W_q.weight", options);
  const Tensor& W_k = required_matrix(state, "W_k.weight", options);
  AdditiveAttention layer(/*key_size=*/W_k.dim(1), /*query_size=*/W_q.dim(1),
                          /*num_hiddens=*/W_q.dim(0), /*dropout=*/0.0F);
  // Strict loading checks W_k (h, k) and w_v (1, h) against W_q's h and names what is wrong.
  with_context("--params: " + options.params, [&] { layer.load_state_dict(state); });
  layer.eval();
  Tensor output = forward_with_sources(options, [&] {
    return layer(inputs.queries, inputs.keys, inputs.values, inputs.valid_lens);
  });
  Result result{std::move(output), layer.attention_weights(), 1, {}};
  if (grad_output != nullptr) {
    check_grad_output(options, *grad_output, result.output);
    result.gradients = layer_gradients(layer, *grad_output);
  }
  return result;
}

Result run_dot_product(const RunOptions& options, const Inputs& inputs, const Tensor* grad_output) {
  const std::optional<float> scale =
      options.scale_option->count() > 0 ? std::optional<float>(options.scale) : std::nullopt;
  DotProductAttention layer =
      with_context("--scale", [&] { return DotProductAttention(/*dropout=*/0.0F, scale); });
  layer.eval();
  Tensor output = forward_with_sources(options, [&] {
    return layer(inputs.queries, inputs.keys, inputs.values, inputs.valid_lens);
  });
  Result result{std::move(output), layer.attention_weights(), 1, {}};
  if (grad_output != nullptr) {
    // No parameters: only the inputs have gradients.
    check_grad_output(options, *grad_output, result.output);
    result.gradients = input_gradients(layer.backward(*grad_output));
  }
  return result;
}

Result run_multi_head(const RunOptions& options, const StateDict& state, const Inputs& inputs,
                      const Tensor* grad_output) {
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
  layer.eval();
  Tensor output = forward_with_sources(options, [&] {
    return layer(inputs.queries, inputs.keys, inputs.values, inputs.valid_lens);
  });
  Result result{std::move(output), layer.attention_weights(), options.heads, {}};
  if (grad_output != nullptr) {
    check_grad_output(options, *grad_output, result.output);
    result.gradients = layer_gradients(layer, *grad_output);
  }
  return result;
}

void save_heatmap(const RunOptions& options, const Result& result) {
  const Tensor& weights = result.weights;
  HeatmapOptions heatmap_options;
  ConstTensorView view = weights;
  if (result.heads > 1) {
    const int64_t batch = weights.dim(0) / result.heads;
    heatmap_options = head_grid_options(batch, result.heads);
    view = view.reshaped(Shape{batch, result.heads, weights.dim(1), weights.dim(2)});
  }
  with_context("--heatmap", [&] { save_heatmaps(view, options.heatmap, heatmap_options); });
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

void save_gradients(const RunOptions& options, const std::vector<NamedGradient>& gradients) {
  const std::filesystem::path directory = options.grads_out;
  create_output_directory(directory, "--grads-out");
  for (const NamedGradient& gradient : gradients) {
    with_context("--grads-out",
                 [&] { save_npy(directory / (gradient.name + ".npy"), gradient.gradient); });
  }
}

void run(const RunOptions& options) {
  check_layer_options(options);
  check_gradient_options(options);
  StateDict state;
  if (options.params_option->count() > 0) {
    state = with_context("--params", [&] { return load_safetensors(options.params); });
  }
  const Inputs inputs = load_inputs(options);
  std::optional<Tensor> grad_output;
  if (options.out_grad_option->count() > 0) {
    grad_output =
        with_context("--out-grad", [&] { return load_npy_tensor(options.out_grad, "G"); });
  }
  const Tensor* const grad = grad_output ? &*grad_output : nullptr;
  Result result;
  if (options.layer == kAdditive) {
    result = run_additive(options, state, inputs, grad);
  } else if (options.layer == kDotProduct) {
    result = run_dot_product(options, inputs, grad);
  } else {
    result = run_multi_head(options, state, inputs, grad);
  }

  with_context("--out", [&] { save_npy(options.out, result.output); });
  std::string summary = "attn run: " + options.layer + " attention, output " +
                        result.output.shape().str() + " -> " + options.out;
  if (options.weights_out_option->count() > 0) {
    with_context("--weights-out", [&] { save_npy(options.weights_out, result.weights); });
    summary += ", weights " + result.weights.shape().str() + " -> " + options.weights_out;
  }
  if (options.heatmap_option->count() > 0) {
    save_heatmap(options, result);
    summary += ", heatmap -> " + options.heatmap;
  }
  if (grad_output) {
    save_gradients(options, result.gradients);
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
      "run", "Run one attention layer (evaluation mode) on .npy inputs, writing its output");
  command->footer(
      "The layer's sizes come from the shapes of its parameters in --params, stored under "
      "PyTorch's state-dict names: W_q.weight (h, query_size), W_k.weight (h, key_size) and "
      "w_v.weight (1, h) for additive; W_q, W_k, W_v, W_o .weight (and .bias if any) for "
      "multi-head. A layer saved from PyTorch with safetensors.torch.save_file(layer.state_dict(), "
      "path) runs unchanged. Dropout is off (evaluation mode).");
  command->add_option("--layer", options->layer, "Layer type")
      ->required()
      ->check(CLI::IsMember({kAdditive, kDotProduct, kMultiHead}));
  options->heads_option =
      command->add_option("--heads", options->heads, "Number of heads (required for multi-head)")
          ->default_str("");
  options->params_option = command
                               ->add_option("--params", options->params,
                                            "Parameters as safetensors (required for additive and "
                                            "multi-head; none for dot-product)")
                               ->type_name("FILE");
  options->scale_option =
      command->add_option("--scale", options->scale, "Score scale for dot-product")
          ->default_str("1/sqrt(query size)");
  command->add_option("--queries", options->queries, "Queries (B, n, query_size), float .npy")
      ->type_name("FILE")
      ->required();
  command->add_option("--keys", options->keys, "Keys (B, m, key_size), float .npy")
      ->type_name("FILE")
      ->required();
  command->add_option("--values", options->values, "Values (B, m, value_size), float .npy")
      ->type_name("FILE")
      ->required();
  options->valid_lens_option =
      command
          ->add_option("--valid-lens", options->valid_lens,
                       "Valid lengths (B) or (B, n), integer .npy (default: every key is valid)")
          ->type_name("FILE");
  command
      ->add_option(
          "--out", options->out,
          "Where to write the output as .npy: (B, n, value_size), or (B, n, h) for multi-head")
      ->type_name("FILE")
      ->required();
  options->weights_out_option = command
                                    ->add_option("--weights-out", options->weights_out,
                                                 "Where to write the attention weights (B, n, m) "
                                                 "as .npy; (B*heads, n, m) for multi-head")
                                    ->type_name("FILE");
  options->heatmap_option =
      command
          ->add_option("--heatmap", options->heatmap,
                       "Where to draw the attention weights as heatmaps (.png, .svg or .pdf)")
          ->type_name("FILE");
  options->out_grad_option =
      command
          ->add_option("--out-grad", options->out_grad,
                       "G, float .npy shaped like the output: run the backward pass for the "
                       "gradients of sum(output * G) (with --grads-out)")
          ->type_name("FILE");
  options->grads_out_option =
      command
          ->add_option("--grads-out", options->grads_out,
                       "Directory for the gradients (with --out-grad): queries.npy, keys.npy, "
                       "values.npy and one <state-dict name>.npy per parameter")
          ->type_name("DIR");
  command->callback([options] { run(*options); });
}

}  // namespace attn::cli
