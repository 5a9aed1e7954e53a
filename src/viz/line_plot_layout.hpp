// Internals of save_line_plot shared with its tests: the checks on the series, the tab10 colours,
// the axes with their round ticks, and where the plot area, labels and legend go on the page.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "attn/viz/line_plot.hpp"
#include "cairo_canvas.hpp"

namespace attn::line_plot_detail {

// matplotlib's default colour cycle ('tab10'); series i gets colour i mod 10.
std::span<const canvas::Rgb> tab10();
canvas::Rgb series_colour(size_t index);

// Throws ValueError for no series, x and y of different lengths, an empty series, a non-finite
// value, a y ≤ 0 with log_y or an unknown style, naming the series by index and label.
void check_series(const std::vector<LineSeries>& series, const LinePlotOptions& options);

// One axis: the view from `low` to `high` (log10 of the data on a logarithmic axis) and its ticks,
// whose positions are data values.
struct Axis {
  double low = 0.0;
  double high = 1.0;
  bool log = false;
  std::vector<canvas::Tick> ticks;
  // Where `value` lies between the ends of the view: 0 at low, 1 at high.
  double fraction(double value) const;
};

// The view of data from `lowest` to `highest` (finite, lowest ≤ highest; log10 of the data on a
// logarithmic axis) with matplotlib's 5% margin on each side; a range too narrow to draw is
// widened first. Throws ValueError naming `axis_name` when the view does not fit in a double.
Axis axis_view(double lowest, double highest, bool log, const char* axis_name);

// Round ticks inside the view: 1, 2, 2.5 or 5 × 10^k apart, at most `max_ticks` (≥ 2); on a log
// axis the powers of ten (every 1, 2, 5, ... decades) when at least two fit, else 1, 2 and 5 ×
// 10^k, else round values as on a linear axis.
std::vector<canvas::Tick> axis_ticks(const Axis& axis, int64_t max_ticks);

// A legend row: the series it shows and its label fitted to the legend's widest allowed text.
struct LegendEntry {
  size_t series = 0;
  std::string label;
};

// Everything the drawing needs, in points (1/72 inch) from the top-left corner of the page.
struct LinePlotLayout {
  double width = 0.0;
  double height = 0.0;
  canvas::Rect axes;  // the plot area
  Axis x;
  Axis y;
  std::string title;  // fitted to the page; empty for none
  std::string xlabel;
  std::string ylabel;
  std::vector<LegendEntry> legend_entries;  // series with a label, in order; empty for no legend
  canvas::Rect legend;                      // inside the plot area, where it hides the least data

  // The page point of the data point (x, y).
  double page_x(double x_value) const;
  double page_y(double y_value) const;
};

// Checks everything (see check_series; ValueError also for a width or height outside 50–14400
// points or too small for the labels) and lays the plot out.
LinePlotLayout layout_line_plot(const std::vector<LineSeries>& series,
                                const LinePlotOptions& options);

// Pixels per point of the PNG for `layout`: 2, or 1 when 2 would exceed Cairo's image limits;
// throws ValueError when even 1 does.
double png_scale(const LinePlotLayout& layout);

}  // namespace attn::line_plot_detail
