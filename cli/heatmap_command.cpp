// `attn heatmap`: reads weights of rank 2 to 4 from a .npy file and draws them with
// save_heatmaps, the picture format following the --out extension.
#include "heatmap_command.hpp"

#include <CLI/CLI.hpp>

#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/io/npy.hpp"
#include "attn/viz/heatmap.hpp"
#include "command_support.hpp"
#include "number_options.hpp"

namespace attn::cli {

namespace {

struct HeatmapCommandOptions {
  std::string weights;
  std::string out;
  std::string titles;  // --titles as typed, split in draw()
  const CLI::Option* titles_option = nullptr;
  HeatmapOptions heatmap;
};

// "a,,b" is three titles, the second empty (a panel left untitled): CLI11's delimiter dropped
// empty fields, so the count no longer matched what was typed ("expected 3 titles, got 2").
std::vector<std::string> split_titles(const std::string& text) {
  std::vector<std::string> titles;
  size_t start = 0;
  for (size_t comma = text.find(','); comma != std::string::npos; comma = text.find(',', start)) {
    titles.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  titles.push_back(text.substr(start));
  return titles;
}

// save_heatmaps names itself in its messages ("save_heatmaps: ..."); the user gave a weights file,
// options and --out: the source of the argument at fault goes in front instead.
[[noreturn]] void rethrow_naming_source(const Error& error, const HeatmapCommandOptions& options) {
  std::string message = error.what();
  const std::string prefix = "save_heatmaps: ";
  if (message.starts_with(prefix)) message.erase(0, prefix.size());
  // "path" and anything unnamed go to --out (a PNG too large to draw advises on panel_size too).
  const std::string_view argument = error.argument();
  std::string source = "--out";
  if (argument == "weights") {
    source = "weights " + options.weights;
  } else if (argument == "rows, cols") {
    source = "--rows/--cols";
  } else if (argument == "titles") {
    source = "--titles";
  } else if (argument == "panel_size") {
    source = "--panel-size";
  }
  rethrow_with_message(error, source + ": " + message);
}

void draw(HeatmapCommandOptions& options) {
  if (options.titles_option->count() > 0) options.heatmap.titles = split_titles(options.titles);
  check_outputs({{"--out", options.out, OutputKind::kPicture}}, {{"weights", options.weights}});
  const Tensor weights =
      with_context("weights", [&] { return load_npy_tensor(options.weights, "weights"); });
  if (weights.rank() < 2 || weights.rank() > 4) {
    throw ShapeError("weights (" + options.weights +
                     "): expected a tensor of rank 2 (n, m), 3 (panels, n, m) or 4 (rows, cols, "
                     "n, m), got shape " +
                     weights.shape().str());
  }
  try {
    save_heatmaps(weights, options.out, options.heatmap);
  } catch (const Error& error) {
    rethrow_naming_source(error, options);
  }
  std::cout << "attn heatmap: weights " << weights.shape().str() << " from " << options.weights
            << " -> " << options.out << "\n";
}

}  // namespace

void add_heatmap_command(CLI::App& app) {
  auto options = std::make_shared<HeatmapCommandOptions>();
  CLI::App* command = app.add_subcommand(
      "heatmap", "Draw attention weights from a .npy file as heatmaps (PNG, SVG or PDF)");
  command->footer(
      "Like the book's show_heatmaps: panels share one colour scale and colour bar. Rank 2 "
      "(n, m) gives one panel, rank 3 (P, n, m) a row of P panels, rank 4 (R, C, n, m) an R x C "
      "grid; --rows and --cols arrange the same panels differently.");
  command->add_option("weights", options->weights, "Attention weights, float .npy of rank 2 to 4")
      ->type_name("FILE")
      ->required();
  command->add_option("--out", options->out, "Picture to write: .png, .svg or .pdf")
      ->type_name("FILE")
      ->required();
  command->add_option("--xlabel", options->heatmap.xlabel, "Label of the x axis");
  command->add_option("--ylabel", options->heatmap.ylabel, "Label of the y axis");
  options->titles_option =
      command
          ->add_option("--titles", options->titles,
                       "One title per panel, comma-separated, row by row (an empty one leaves its "
                       "panel untitled)")
          ->default_str("none");
  CLI::Option* rows =
      command->add_option("--rows", options->heatmap.rows, "Rows of panels (with --cols)")
          ->transform(number_check(options->heatmap.rows, positive()))
          ->default_str("from the shape");
  CLI::Option* cols =
      command->add_option("--cols", options->heatmap.cols, "Columns of panels (with --rows)")
          ->transform(number_check(options->heatmap.cols, positive()))
          ->default_str("from the shape");
  rows->needs(cols);
  cols->needs(rows);
  command
      ->add_option("--panel-size", options->heatmap.panel_size,
                   "Side of one panel's plot area in points")
      ->transform(number_check(options->heatmap.panel_size, positive()));
  command->callback([options] { draw(*options); });
}

}  // namespace attn::cli
