// Line plots (loss curves, regression fits): several labelled series on shared axes with a legend,
// drawn with Cairo to PNG, SVG or PDF (chosen by the file's extension), like a small matplotlib
// plot.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace attn {

struct LineSeries {
  enum class Style { kLine, kDashed, kMarkers };
  std::string label;  // shown in the legend; empty for none
  std::vector<double> x;
  std::vector<double> y;
  Style style = Style::kLine;
};

struct LinePlotOptions {
  std::string title;
  std::string xlabel;
  std::string ylabel;
  double width = 480.0;   // points (1/72 inch)
  double height = 320.0;  // points
  bool log_y = false;     // logarithmic y axis (every y must then be > 0)
};

// ValueError for no series, x and y of different lengths, an empty series, non-finite values, or
// y ≤ 0 with log_y; FileError for an unknown extension or a failed write.
void save_line_plot(const std::vector<LineSeries>& series, const std::filesystem::path& path,
                    const LinePlotOptions& options = {});

}  // namespace attn
