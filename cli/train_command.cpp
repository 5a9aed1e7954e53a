// `attn train` and its `nadaraya-watson` example: the book's kernel regression trained with SGD,
// its progress printed per epoch, and pictures of the fit, the attention weights and the loss.
#include "train_command.hpp"

#include <CLI/CLI.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/core/tensor.hpp"
#include "attn/train/nadaraya_watson.hpp"
#include "attn/viz/heatmap.hpp"
#include "attn/viz/line_plot.hpp"
#include "command_support.hpp"
#include "number_options.hpp"
#include "seq2seq_commands.hpp"

namespace attn::cli {

namespace {

// Enough for any sensible run (the book's is 5 epochs) while keeping a typo from running for hours.
constexpr int kMaxEpochs = 100000;

struct NadarayaWatsonCommandOptions {
  std::string out = "attn-nadaraya-watson";
  uint64_t seed = 0;
  int epochs = 5;
  float lr = 0.5F;
};

void check_options(const NadarayaWatsonCommandOptions& options) {
  if (options.epochs < 1 || options.epochs > kMaxEpochs) {
    throw ValueError("--epochs: expected a whole number from 1 to " + std::to_string(kMaxEpochs) +
                     ", got " + std::to_string(options.epochs));
  }
}

std::string fixed(double value, int decimals) {
  std::array<char, 64> buffer{};
  std::snprintf(buffer.data(), buffer.size(), "%.*f", decimals, value);
  return buffer.data();
}

// A width for people: 4 decimals, or 4 significant digits once it is large (a learning rate too
// large can send it far).
std::string width_text(double width) {
  if (std::abs(width) < 1e4) return fixed(width, 4);
  std::array<char, 64> buffer{};
  std::snprintf(buffer.data(), buffer.size(), "%.4g", width);
  return buffer.data();
}

std::vector<double> to_doubles(const Tensor& tensor) {
  const std::span<const float> values = tensor.span();
  return {values.begin(), values.end()};
}

void save_regression_plot(const NadarayaWatsonData& data, const NadarayaWatsonFit& fit,
                          const std::filesystem::path& path) {
  const std::vector<double> x_test = to_doubles(data.x_test);
  // As the book's plot_kernel_reg: the truth and the predictions on the test inputs, the noisy
  // training points as markers.
  const std::vector<LineSeries> series{
      {"Truth", x_test, to_doubles(data.y_truth), LineSeries::Style::kLine},
      {"Pred (nonparametric, w = 1)", x_test, to_doubles(fit.nonparametric_predictions),
       LineSeries::Style::kLine},
      {"Pred (parametric, w = " + width_text(fit.trained_width) + ")", x_test,
       to_doubles(fit.parametric_predictions), LineSeries::Style::kDashed},
      {"Training data", to_doubles(data.x_train), to_doubles(data.y_train),
       LineSeries::Style::kMarkers}};
  LinePlotOptions options;
  options.title = "Nadaraya-Watson kernel regression";
  options.xlabel = "x";
  options.ylabel = "y";
  with_context("--out", [&] { save_line_plot(series, path, options); });
}

void save_weights(const Tensor& weights, const std::string& title,
                  const std::filesystem::path& path) {
  HeatmapOptions options;
  options.xlabel = "Sorted training inputs";
  options.ylabel = "Sorted testing inputs";
  options.titles = {title};
  with_context("--out", [&] { save_heatmaps(weights, path, options); });
}

void save_loss_plot(const std::vector<float>& losses, const std::filesystem::path& path) {
  std::vector<double> epochs;
  for (size_t epoch = 1; epoch <= losses.size(); ++epoch) {
    epochs.push_back(static_cast<double>(epoch));
  }
  LinePlotOptions options;
  options.title = "Training loss (parametric model)";
  options.xlabel = "epoch";
  options.ylabel = "loss (sum of squared errors)";
  with_context("--out", [&] {
    save_line_plot({{"loss", epochs, {losses.begin(), losses.end()}, LineSeries::Style::kLine}},
                   path, options);
  });
}

void train_nadaraya_watson(const NadarayaWatsonCommandOptions& options) {
  check_options(options);
  const std::filesystem::path directory = options.out;
  create_output_directory(directory);
  // Every picture's place before training (a folder named weights_parametric.png failed after two
  // pictures had been replaced).
  std::vector<OutputFile> pictures;
  for (const char* name :
       {"regression.png", "weights_nonparametric.png", "weights_parametric.png", "loss.png"})
    pictures.push_back({"--out", directory / name, OutputKind::kPicture});
  check_outputs(pictures, {});

  const NadarayaWatsonData data = make_nadaraya_watson_data(options.seed);
  std::cout << "attn train nadaraya-watson: the book's kernel regression (seed " << options.seed
            << ", " << options.epochs << " epochs, SGD lr " << options.lr << ")\n"
            << data.x_train.numel() << " training points y = 2 sin(x) + x^0.8 + noise, "
            << data.x_test.numel() << " test inputs 0, 0.1, ..., 4.9\n";

  NadarayaWatsonOptions fit_options;
  fit_options.epochs = options.epochs;
  fit_options.lr = options.lr;
  fit_options.seed = options.seed;
  std::cout << "training the width w of the parametric model (each training point attends to "
               "all the others)\n";
  NadarayaWatsonFit fit;
  try {
    fit = fit_nadaraya_watson(data, fit_options, [&](int epoch, float loss) {
      // A learning rate too large sends the width to infinity; stop before plotting nonsense.
      if (!std::isfinite(loss)) {
        throw ValueError("--lr: training diverged at epoch " + std::to_string(epoch) + " (loss " +
                         std::to_string(loss) + "); try a smaller learning rate than " +
                         float_text(options.lr));
      }
      std::cout << "epoch " << epoch << ", loss " << fixed(loss, 3) << "\n";
    });
  } catch (const Error& error) {
    // A learning rate too large can also overflow the width itself before a loss is reported;
    // the library names the width, the user gave --lr.
    const std::string message = error.what();
    if (message.starts_with("--")) throw;
    rethrow_with_message(error, "--lr: training diverged with learning rate " +
                                    float_text(options.lr) + " (" + message +
                                    "); try a smaller learning rate");
  }
  std::cout << "width w: initial " << width_text(fit.initial_width) << ", trained "
            << width_text(fit.trained_width) << "\n"
            << "test MSE against the truth: nonparametric (w = 1) "
            << fixed(fit.nonparametric_test_mse, 4)
            << ", parametric (w = " << width_text(fit.trained_width) << ") "
            << fixed(fit.parametric_test_mse, 4) << "\n";

  const std::filesystem::path regression = directory / "regression.png";
  save_regression_plot(data, fit, regression);
  std::cout << "truth, both predictions and the training data: " << regression.string() << "\n";
  const std::filesystem::path nonparametric = directory / "weights_nonparametric.png";
  save_weights(fit.nonparametric_weights, "Nonparametric (w = 1)", nonparametric);
  std::cout << "attention weights, nonparametric: " << nonparametric.string() << "\n";
  const std::filesystem::path parametric = directory / "weights_parametric.png";
  save_weights(fit.parametric_weights, "Parametric (w = " + width_text(fit.trained_width) + ")",
               parametric);
  std::cout << "attention weights, parametric: " << parametric.string() << "\n";
  const std::filesystem::path loss = directory / "loss.png";
  save_loss_plot(fit.epoch_losses, loss);
  std::cout << "loss per epoch: " << loss.string() << "\n";
}

}  // namespace

void add_train_command(CLI::App& app) {
  CLI::App* train =
      app.add_subcommand("train", "Train a model of the book and plot how it learned");
  train->require_subcommand(1);
  // One line per training example; each adds its own subcommand under `train`.
  add_train_nadaraya_watson_command(*train);
  add_train_seq2seq_command(*train);
}

void add_train_nadaraya_watson_command(CLI::App& train) {
  auto options = std::make_shared<NadarayaWatsonCommandOptions>();
  CLI::App* command = train.add_subcommand(
      "nadaraya-watson",
      "Nadaraya-Watson kernel regression: fit the Gaussian kernel's width with SGD, as the book");
  command->footer(
      "The book's example: 50 noisy training points of y = 2 sin(x) + x^0.8, the nonparametric "
      "model (Gaussian kernel of width 1) against the parametric one, whose width is trained with "
      "SGD on the sum of squared errors, each training point attending to all the others. Writes "
      "regression.png, weights_nonparametric.png, weights_parametric.png and loss.png to --out.");
  command->add_option("--out", options->out, "Directory for the pictures (created if missing)")
      ->type_name("DIR");
  command
      ->add_option("--seed", options->seed,
                   "Seed of the training data's noise and of the initial width")
      ->transform(number_check(options->seed));
  command
      ->add_option("--epochs", options->epochs, "SGD steps on the full training set (1 to 100000)")
      ->transform(number_check(options->epochs));
  command->add_option("--lr", options->lr, "SGD learning rate (> 0)")
      ->transform(number_check(options->lr, positive()));
  command->callback([options] { train_nadaraya_watson(*options); });
}

}  // namespace attn::cli
