// `attn demo`: the book's masked softmax, additive, dot-product and multi-head examples, each
// printed under the PyTorch line it mirrors, and a heatmap of each one's attention weights.
#include "demo_command.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/core/random.hpp"
#include "attn/core/tensor.hpp"
#include "attn/core/valid_lengths.hpp"
#include "attn/kernels/masked_softmax.hpp"
#include "attn/nn/additive_attention.hpp"
#include "attn/nn/dot_product_attention.hpp"
#include "attn/nn/multi_head_attention.hpp"
#include "attn/viz/heatmap.hpp"
#include "command_support.hpp"
#include "number_options.hpp"
#include "tensor_printing.hpp"

namespace attn::cli {

namespace {

struct DemoOptions {
  std::string out = "attn-demo";
  uint64_t seed = 0;
};

Tensor uniform_tensor(const Shape& shape, Rng& rng) {
  Tensor tensor(shape);
  for (float& value : tensor.span()) value = rng.uniform();
  return tensor;
}

Tensor normal_tensor(const Shape& shape, Rng& rng) {
  Tensor tensor(shape);
  for (float& value : tensor.span()) value = rng.normal();
  return tensor;
}

// A heading and a blank line between the examples, so the output reads as four sections.
void print_heading(const std::string& title) {
  std::cout << "\n== " << title << " ==\n";
}

void print_tensor(const std::string& label, ConstTensorView tensor) {
  std::cout << label << "\n" << format_tensor(tensor) << "\n";
}

void save_picture(ConstTensorView weights, const std::filesystem::path& path,
                  const HeatmapOptions& options) {
  with_context("--out", [&] { save_heatmaps(weights, path, options); });
  std::cout << "heatmap of the attention weights: " << path.string() << "\n";
}

// The book's masked_softmax example, both kinds of valid lengths applied to one random input so
// the two results can be compared entry by entry.
void masked_softmax_example(Rng& rng, const std::filesystem::path& directory) {
  print_heading("Masked softmax");
  const Tensor scores = uniform_tensor(Shape{2, 2, 4}, rng);
  print_tensor("X = torch.rand(2, 2, 4)", scores);

  const ValidLengths per_batch = ValidLengths::per_batch({2, 3});
  const Tensor per_batch_weights = masked_softmax(scores, per_batch);
  print_tensor("masked_softmax(X, torch.tensor([2, 3]))", per_batch_weights);

  const ValidLengths per_query = ValidLengths::per_query({1, 3, 2, 4}, 2, 2);
  const Tensor per_query_weights = masked_softmax(scores, per_query);
  print_tensor("masked_softmax(X, torch.tensor([[1, 3], [2, 4]]))", per_query_weights);

  // One row of panels per kind of valid lengths, one column per batch element.
  Tensor grid(Shape{2, 2, 2, 4});
  const auto per_batch_values = per_batch_weights.span();
  const auto per_query_values = per_query_weights.span();
  std::copy(per_batch_values.begin(), per_batch_values.end(), grid.data());
  std::copy(per_query_values.begin(), per_query_values.end(),
            grid.data() + per_batch_weights.numel());
  HeatmapOptions options;
  options.titles = {"valid length 2", "valid length 3", "valid lengths 1, 3", "valid lengths 2, 4"};
  save_picture(grid, directory / "masked_softmax.png", options);
}

// The toy inputs both single-head examples share: keys of ones, so every key scores the same and
// the output is the mean of the valid values whatever the parameters.
struct ToyInputs {
  Tensor keys = Tensor::full(Shape{2, 10, 2}, 1.0F);
  Tensor values{Shape{2, 10, 4}};
  ValidLengths valid_lens = ValidLengths::per_batch({2, 6});

  ToyInputs() {
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t i = 0; i < 40; ++i) values.data()[b * 40 + i] = static_cast<float>(i);
    }
  }
};

void print_toy_inputs(const ToyInputs& inputs) {
  print_tensor("keys = torch.ones((2, 10, 2))", inputs.keys);
  print_tensor("values = torch.arange(40, dtype=torch.float32).reshape(1, 10, 4).repeat(2, 1, 1)",
               inputs.values);
  std::cout << "valid_lens = " << format_valid_lengths(inputs.valid_lens) << "\n";
}

// The book draws one row of weights per batch element in a single panel.
void save_toy_picture(const Tensor& weights, const std::string& title,
                      const std::filesystem::path& path) {
  HeatmapOptions options;
  options.titles = {title};
  save_picture(weights.view().reshaped(Shape{weights.dim(0) * weights.dim(1), weights.dim(2)}),
               path, options);
}

void additive_example(Rng& rng, uint64_t seed, const std::filesystem::path& directory) {
  print_heading("Additive attention");
  const Tensor queries = normal_tensor(Shape{2, 1, 20}, rng);
  print_tensor("queries = torch.normal(0, 1, (2, 1, 20))", queries);
  const ToyInputs inputs;
  print_toy_inputs(inputs);
  AdditiveAttention attention(/*key_size=*/2, /*query_size=*/20, /*num_hiddens=*/8,
                              /*dropout=*/0.1F, seed);
  attention.eval();
  std::cout << "attention = AdditiveAttention(key_size=2, query_size=20, num_hiddens=8, "
               "dropout=0.1); attention.eval()\n";
  const Tensor output = attention(queries, inputs.keys, inputs.values, inputs.valid_lens);
  print_tensor("attention(queries, keys, values, valid_lens)", output);
  print_tensor("attention.attention_weights", attention.attention_weights());
  save_toy_picture(attention.attention_weights(), "additive attention", directory / "additive.png");
}

void dot_product_example(Rng& rng, uint64_t seed, const std::filesystem::path& directory) {
  print_heading("Scaled dot-product attention");
  const Tensor queries = normal_tensor(Shape{2, 1, 2}, rng);
  print_tensor("queries = torch.normal(0, 1, (2, 1, 2))", queries);
  const ToyInputs inputs;
  std::cout << "keys, values, valid_lens: as above\n";
  DotProductAttention attention(/*dropout=*/0.5F, /*scale=*/std::nullopt, seed);
  attention.eval();
  std::cout << "attention = DotProductAttention(dropout=0.5); attention.eval()\n";
  const Tensor output = attention(queries, inputs.keys, inputs.values, inputs.valid_lens);
  print_tensor("attention(queries, keys, values, valid_lens)", output);
  print_tensor("attention.attention_weights", attention.attention_weights());
  save_toy_picture(attention.attention_weights(), "scaled dot-product attention",
                   directory / "dot_product.png");
}

void multi_head_example(Rng& rng, uint64_t seed, const std::filesystem::path& directory) {
  print_heading("Multi-head attention");
  constexpr int64_t kHiddens = 100, kHeads = 5, kBatch = 2, kQueries = 4, kPairs = 6;
  MultiHeadAttention attention(kHiddens, kHiddens, kHiddens, kHiddens, kHeads, /*dropout=*/0.5F,
                               /*bias=*/false, seed);
  attention.eval();
  std::cout << "num_hiddens, num_heads = 100, 5\n"
               "attention = MultiHeadAttention(num_hiddens, num_heads, 0.5); attention.eval()\n"
               "batch_size, num_queries, num_kvpairs = 2, 4, 6\n";
  const ValidLengths valid_lens = ValidLengths::per_batch({3, 2});
  std::cout << "valid_lens = " << format_valid_lengths(valid_lens) << "\n";
  // The book feeds ones; random inputs give the same shapes and let the heads differ visibly.
  const Tensor queries = normal_tensor(Shape{kBatch, kQueries, kHiddens}, rng);
  const Tensor key_values = normal_tensor(Shape{kBatch, kPairs, kHiddens}, rng);
  std::cout << "X = torch.normal(0, 1, (batch_size, num_queries, num_hiddens))\n"
               "Y = torch.normal(0, 1, (batch_size, num_kvpairs, num_hiddens))\n";
  const Tensor output = attention(queries, key_values, key_values, valid_lens);
  std::cout << "attention(X, Y, Y, valid_lens).shape: " << output.shape().str() << "\n";
  const Tensor& weights = attention.attention_weights();
  std::cout << "attention weights (batch_size * num_heads, num_queries, num_kvpairs): "
            << weights.shape().str() << "\n";
  save_picture(weights.view().reshaped(Shape{kBatch, kHeads, kQueries, kPairs}),
               directory / "multi_head.png", head_grid_options(kBatch, kHeads));
}

void run_demo(const DemoOptions& options) {
  const std::filesystem::path directory = options.out;
  create_output_directory(directory);
  // Every picture's place before the first is drawn (a folder named dot_product.png failed after
  // two pictures had been replaced).
  std::vector<OutputFile> pictures;
  for (const char* name :
       {"masked_softmax.png", "additive.png", "dot_product.png", "multi_head.png"})
    pictures.push_back({"--out", directory / name, OutputKind::kPicture});
  check_outputs(pictures, {});
  std::cout << "attn demo: the attention examples of \"Dive into Deep Learning\" (seed "
            << options.seed << ")\n";
  // One generator for all random inputs, in the order the book draws them.
  Rng rng(options.seed);
  masked_softmax_example(rng, directory);
  additive_example(rng, options.seed, directory);
  dot_product_example(rng, options.seed, directory);
  multi_head_example(rng, options.seed, directory);
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto options = std::make_shared<DemoOptions>();
  CLI::App* demo = app.add_subcommand(
      "demo", "Reproduce the book's attention examples and draw their attention weights");
  demo->footer(
      "Masked softmax, additive, scaled dot-product and multi-head attention as in \"Dive into "
      "Deep Learning\": inputs and results are printed as PyTorch prints them, and heatmaps of "
      "the attention weights are written to masked_softmax.png, additive.png, dot_product.png and "
      "multi_head.png in --out.");
  demo->add_option("--out", options->out, "Directory for the heatmap pictures (created if missing)")
      ->type_name("DIR");
  demo->add_option("--seed", options->seed,
                   "Seed of the random inputs and of the layers' initialisation")
      ->transform(number_check(options->seed));
  demo->callback([options] { run_demo(*options); });
}

}  // namespace attn::cli
