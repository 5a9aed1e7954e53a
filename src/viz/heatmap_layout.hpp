// Internals of save_heatmaps shared with its tests: the grid of panels, the 'Reds' colour map, the
// colour scale and where every panel, tick, label and the colour bar go on the page.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "attn/core/shape.hpp"
#include "attn/viz/heatmap.hpp"
#include "cairo_canvas.hpp"

namespace attn::heatmap_detail {

// Panels of n × m cells arranged rows × cols.
struct Grid {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t n = 0;
  int64_t m = 0;
  int64_t panels() const { return rows * cols; }
};

// The grid for weights of shape (n, m), (P, n, m) or (R, C, n, m) and the requested rows and cols
// (0 infers). Throws ShapeError for another rank, an empty matrix or a grid that does not fit.
Grid infer_grid(const Shape& shape, int64_t rows, int64_t cols);

using canvas::Rgb;

// matplotlib's 'Reds' (ColorBrewer's 9-class Reds, interpolated linearly) at `fraction`, clamped to
// [0, 1]: 0 is near-white, 1 dark red.
Rgb reds(double fraction);

// The colours 'Reds' is interpolated between, evenly spaced from fraction 0 to 1.
std::span<const Rgb> reds_anchors();

// Values mapped to colours: low → fraction 0, high → fraction 1.
struct ColorScale {
  double low = 0.0;
  double high = 1.0;
  double fraction(double value) const;
};

// min(0, lowest) to the highest value; a scale of zero width becomes [low, low + 1] so every cell
// gets the low colour instead of a division by zero.
ColorScale color_scale(std::span<const float> values);

using canvas::Rect;

// One labelled tick: position is a cell index on an axis, or a value on the colour bar.
using canvas::Tick;

// Everything the drawing needs, in points (1/72 inch) from the top-left corner of the page.
struct HeatmapLayout {
  double width = 0.0;
  double height = 0.0;
  Grid grid;
  double cell_width = 0.0;
  double cell_height = 0.0;
  std::vector<Rect> panels;         // row-major, each the plot area of one matrix
  std::vector<std::string> titles;  // fitted to the panel width; empty when there are none
  std::string xlabel;
  std::string ylabel;
  std::vector<Tick> x_ticks;  // labelled under the bottom row
  std::vector<Tick> y_ticks;  // labelled left of the first column
  bool x_labels_rotated = false;
  Rect colorbar;
  ColorScale scale;
  std::vector<Tick> colorbar_ticks;

  // The plot area of cell (i, j) of panel `panel`.
  Rect cell(int64_t panel, int64_t i, int64_t j) const;
};

// Throws ValueError for titles or tick labels of the wrong count or a panel_size out of range.
HeatmapLayout layout_heatmaps(const Grid& grid, const HeatmapOptions& options,
                              const ColorScale& scale);

// Pixels per point of the PNG for `layout`: 2 for crisp pictures, 1 when 2 would exceed Cairo's
// image limits; throws ValueError when even 1 does.
double png_scale(const HeatmapLayout& layout);

using canvas::valid_utf8;

}  // namespace attn::heatmap_detail
