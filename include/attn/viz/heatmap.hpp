// Heatmaps of attention weights, like the book's show_heatmaps: a grid of panels sharing one colour
// scale and colour bar, drawn with Cairo to PNG, SVG or PDF (chosen by the file's extension).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "attn/core/tensor.hpp"

namespace attn {

struct HeatmapOptions {
  std::string xlabel = "Keys";
  std::string ylabel = "Queries";
  // One title per panel (row-major), or none.
  std::vector<std::string> titles;
  // Grid of panels; 0 infers it: rank 4 (R, C, n, m) gives R × C, rank 3 (P, n, m) gives 1 × P,
  // rank 2 (n, m) a single panel. When given, rows · cols must equal the number of panels.
  int64_t rows = 0;
  int64_t cols = 0;
  // Optional tick labels (e.g. tokens): m for the x axis, n for the y axis.
  std::vector<std::string> x_tick_labels;
  std::vector<std::string> y_tick_labels;
  // Side of one panel's plot area in points (1/72 inch); cells stay square up to this size.
  double panel_size = 180.0;
};

// weights (..., n, m) of rank 2 to 4. Throws ShapeError for a grid that does not fit, ValueError
// for titles or tick labels of the wrong count, FileError for an unknown extension or a failed
// write. Values are mapped linearly from min(0, lowest) to the highest value (the book's 'Reds').
void save_heatmaps(ConstTensorView weights, const std::filesystem::path& path,
                   const HeatmapOptions& options = {});

}  // namespace attn
