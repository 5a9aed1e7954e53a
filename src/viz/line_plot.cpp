// save_line_plot: checks the series, lays out axes with round ticks, labels, a title and a legend
// placed where it hides the least data, and draws them with Cairo to PNG, SVG or PDF.
#include "attn/viz/line_plot.hpp"

#include <cairo.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numbers>
#include <string>
#include <utility>

#include "attn/core/error.hpp"
#include "cairo_canvas.hpp"
#include "line_plot_layout.hpp"

namespace attn {
namespace line_plot_detail {
namespace {

using canvas::line_metrics;
using canvas::LineMetrics;
using canvas::Rect;
using canvas::Rgb;
using canvas::select_font;
using canvas::text_width;
using canvas::Tick;

constexpr const char* kCaller = "save_line_plot";

// Sizes in points, as matplotlib draws them (line width 1.5, marker 6, spines and ticks 0.8),
// with the heatmaps' fonts.
constexpr double kMargin = 6.0;
constexpr double kTickFontSize = 9.0;
constexpr double kLabelFontSize = 10.0;
constexpr double kTitleFontSize = 11.0;
constexpr double kLegendFontSize = 9.0;
constexpr double kTickLength = 3.5;
constexpr double kTickPad = 2.5;
constexpr double kLabelPad = 4.0;
constexpr double kTitlePad = 6.0;
constexpr double kFrameWidth = 0.8;
constexpr double kGridWidth = 0.8;
constexpr double kGridGrey = 0xB0 / 255.0;
constexpr double kSeriesWidth = 1.5;
constexpr double kMarkerRadius = 3.5;  // a 6-point marker with its 1-point edge
// matplotlib's 'dashed': 3.7 on, 1.6 off, in units of the line width.
constexpr std::array<double, 2> kDashes{3.7 * kSeriesWidth, 1.6 * kSeriesWidth};
// matplotlib's default axes margins: 5% of the data range on each side.
constexpr double kViewMargin = 0.05;
// Narrower ranges (relative to the values) cannot be told apart on an axis; they are widened.
constexpr double kNarrowestRange = 1e-10;
// Below this the range, or the values around a constant, are lost to subnormal precision.
constexpr double kTiny = 1e-200;
// About one tick per this many points of axis, at most kMaxTicks.
constexpr double kXTickDistance = 45.0;
constexpr double kYTickDistance = 28.0;
constexpr int64_t kMaxTicks = 11;
constexpr double kTickLabelGap = 6.0;
constexpr double kMinSide = 50.0;
constexpr double kMinAxesSide = 20.0;
// The legend, in matplotlib's em-based units at its 10-point font: border pad 0.4, handle 2.0,
// handle-text pad 0.8, label spacing 0.5, inset from the axes 0.5.
constexpr double kLegendPad = 4.0;
constexpr double kLegendHandle = 20.0;
constexpr double kLegendTextPad = 8.0;
constexpr double kLegendSpacing = 5.0;
constexpr double kLegendInset = 5.0;
constexpr double kLegendCorner = 2.0;
constexpr double kLegendAlpha = 0.8;
constexpr double kLegendEdgeGrey = 0.8;

// matplotlib's tab10, the colours of its default property cycle.
constexpr std::array<Rgb, 10> kTab10{{
    {0x1F / 255.0, 0x77 / 255.0, 0xB4 / 255.0},
    {0xFF / 255.0, 0x7F / 255.0, 0x0E / 255.0},
    {0x2C / 255.0, 0xA0 / 255.0, 0x2C / 255.0},
    {0xD6 / 255.0, 0x27 / 255.0, 0x28 / 255.0},
    {0x94 / 255.0, 0x67 / 255.0, 0xBD / 255.0},
    {0x8C / 255.0, 0x56 / 255.0, 0x4B / 255.0},
    {0xE3 / 255.0, 0x77 / 255.0, 0xC2 / 255.0},
    {0x7F / 255.0, 0x7F / 255.0, 0x7F / 255.0},
    {0xBC / 255.0, 0xBD / 255.0, 0x22 / 255.0},
    {0x17 / 255.0, 0xBE / 255.0, 0xCF / 255.0},
}};

std::string number(double value) {
  std::array<char, 32> buffer{};
  std::snprintf(buffer.data(), buffer.size(), "%g", value);
  return buffer.data();
}

std::string series_name(const std::vector<LineSeries>& series, size_t index) {
  std::string name = "series " + std::to_string(index);
  if (!series[index].label.empty()) name += " ('" + series[index].label + "')";
  return name;
}

const char* describe(double value) {
  if (std::isnan(value)) return "nan";
  return value > 0 ? "inf" : "-inf";
}

// The value a y axis positions: log10 of y on a logarithmic one.
double axis_value(double value, bool log) {
  return log ? std::log10(value) : value;
}

// The label of multiplier × 10^exponent: plain decimals from 0.001 to 50000, "2e5" style beyond.
std::string power_label(int multiplier, int64_t exponent) {
  std::array<char, 32> buffer{};
  if (exponent >= -3 && exponent <= 4) {
    std::snprintf(buffer.data(), buffer.size(), "%.*f",
                  static_cast<int>(std::max<int64_t>(0, -exponent)),
                  multiplier * std::pow(10.0, static_cast<double>(exponent)));
  } else {
    std::snprintf(buffer.data(), buffer.size(), "%de%lld", multiplier,
                  static_cast<long long>(exponent));
  }
  return buffer.data();
}

std::vector<Tick> log_ticks(const Axis& axis, int64_t max_ticks) {
  // The slack keeps a power of ten at an end of the view from being lost to rounding.
  const auto first = static_cast<int64_t>(std::ceil(axis.low - 1e-9));
  const auto last = static_cast<int64_t>(std::floor(axis.high + 1e-9));
  std::vector<Tick> ticks;
  if (last - first < 2) {
    // At most two powers of ten in view: 1, 2 and 5 times them, when that is not too many.
    for (int64_t exponent = first - 1; exponent <= last; ++exponent) {
      for (const int multiplier : {1, 2, 5}) {
        const double value = multiplier * std::pow(10.0, static_cast<double>(exponent));
        const double position = std::log10(value);
        if (position >= axis.low - 1e-9 && position <= axis.high + 1e-9) {
          ticks.push_back({value, power_label(multiplier, exponent)});
        }
      }
    }
    if (ticks.size() >= 2 && static_cast<int64_t>(ticks.size()) <= max_ticks) return ticks;
    ticks.clear();
  }
  if (last > first) {
    const int64_t count = last - first + 1;
    // Every 1, 2, 5, 10, 20, ... decades: the first stride that leaves at most max_ticks.
    const auto stride = [&] {
      for (int64_t decade = 1;; decade *= 10) {
        for (const int64_t multiplier : {1, 2, 5}) {
          if ((count - 1) / (multiplier * decade) + 1 <= max_ticks) return multiplier * decade;
        }
      }
    }();
    // Multiples of the stride, as matplotlib picks them, unless fewer than two fit.
    int64_t start = first;
    const int64_t multiple =
        first >= 0 ? (first + stride - 1) / stride * stride : -((-first) / stride * stride);
    if (multiple + stride <= last) start = multiple;
    for (int64_t exponent = start; exponent <= last; exponent += stride) {
      ticks.push_back({std::pow(10.0, static_cast<double>(exponent)), power_label(1, exponent)});
    }
    return ticks;
  }
  // Narrower than a factor of 2.5 (or too few ticks allowed): round values as on a linear axis,
  // all positive.
  ticks = canvas::nice_ticks(std::pow(10.0, axis.low), std::pow(10.0, axis.high), max_ticks);
  std::erase_if(ticks, [](const Tick& tick) { return !(tick.position > 0.0); });
  return ticks;
}

int64_t tick_limit(double axis_length, double distance) {
  return std::clamp<int64_t>(static_cast<int64_t>(axis_length / distance) + 1, 2, kMaxTicks);
}

// Fewer ticks until neighbouring labels (each `extent(tick)` long along the axis) leave a gap.
template <class Extent>
std::vector<Tick> readable_ticks(const Axis& axis, double axis_length, int64_t max_ticks,
                                 Extent extent) {
  std::vector<Tick> ticks = axis_ticks(axis, max_ticks);
  while (max_ticks > 2) {
    bool crowded = false;
    for (size_t k = 1; k < ticks.size() && !crowded; ++k) {
      const double distance =
          (axis.fraction(ticks[k].position) - axis.fraction(ticks[k - 1].position)) * axis_length;
      crowded =
          std::abs(distance) < (extent(ticks[k]) + extent(ticks[k - 1])) / 2.0 + kTickLabelGap;
    }
    if (!crowded) break;
    max_ticks = std::min<int64_t>(max_ticks, static_cast<int64_t>(ticks.size())) - 1;
    ticks = axis_ticks(axis, max_ticks);
  }
  return ticks;
}

// Whether any part of the segment from (x0, y0) to (x1, y1) lies in `rect` (Liang–Barsky).
bool segment_meets(const Rect& rect, double x0, double y0, double x1, double y1) {
  const double dx = x1 - x0;
  const double dy = y1 - y0;
  double enter = 0.0;
  double leave = 1.0;
  const std::array<std::pair<double, double>, 4> sides{
      {{-dx, x0 - rect.x}, {dx, rect.right() - x0}, {-dy, y0 - rect.y}, {dy, rect.bottom() - y0}}};
  for (const auto& [direction, distance] : sides) {
    if (direction == 0.0) {
      if (distance < 0.0) return false;
      continue;
    }
    const double t = distance / direction;
    if (direction < 0.0) {
      enter = std::max(enter, t);
    } else {
      leave = std::min(leave, t);
    }
    if (enter > leave) return false;
  }
  return true;
}

bool contains(const Rect& rect, double x, double y) {
  return x >= rect.x && x <= rect.right() && y >= rect.y && y <= rect.bottom();
}

// How much data a legend at `rect` would hide: the points inside it and the line segments
// crossing it, as matplotlib's 'best' location counts them.
int64_t badness(const Rect& rect, const std::vector<LineSeries>& series,
                const LinePlotLayout& layout) {
  int64_t hidden = 0;
  for (const LineSeries& one : series) {
    const bool line = one.style != LineSeries::Style::kMarkers;
    double previous_x = 0.0;
    double previous_y = 0.0;
    for (size_t i = 0; i < one.x.size(); ++i) {
      const double x = layout.page_x(one.x[i]);
      const double y = layout.page_y(one.y[i]);
      if (contains(rect, x, y)) ++hidden;
      if (line && i > 0 && segment_meets(rect, previous_x, previous_y, x, y)) ++hidden;
      previous_x = x;
      previous_y = y;
    }
  }
  return hidden;
}

// The legend's place in the plot area: of matplotlib's locations (in its order of preference),
// the first that hides the least data.
Rect place_legend(double legend_width, double legend_height, const std::vector<LineSeries>& series,
                  const LinePlotLayout& layout) {
  const Rect& axes = layout.axes;
  const double left = axes.x + kLegendInset;
  const double right = axes.right() - kLegendInset - legend_width;
  const double centre_x = axes.x + (axes.width - legend_width) / 2.0;
  const double top = axes.y + kLegendInset;
  const double bottom = axes.bottom() - kLegendInset - legend_height;
  const double centre_y = axes.y + (axes.height - legend_height) / 2.0;
  // upper right, upper left, lower left, lower right, centre left, centre right, lower centre,
  // upper centre, centre.
  const std::array<std::pair<double, double>, 9> corners{{{right, top},
                                                          {left, top},
                                                          {left, bottom},
                                                          {right, bottom},
                                                          {left, centre_y},
                                                          {right, centre_y},
                                                          {centre_x, bottom},
                                                          {centre_x, top},
                                                          {centre_x, centre_y}}};
  Rect best;
  int64_t least = std::numeric_limits<int64_t>::max();
  for (const auto& [x, y] : corners) {
    const Rect candidate{x, y, legend_width, legend_height};
    const int64_t hidden = badness(candidate, series, layout);
    if (hidden < least) {
      least = hidden;
      best = candidate;
    }
    if (hidden == 0) break;
  }
  return best;
}

}  // namespace

std::span<const Rgb> tab10() {
  return kTab10;
}

Rgb series_colour(size_t index) {
  return kTab10[index % kTab10.size()];
}

void check_series(const std::vector<LineSeries>& series, const LinePlotOptions& options) {
  if (series.empty()) {
    throw ValueError("save_line_plot: no series to draw; expected at least one");
  }
  for (size_t s = 0; s < series.size(); ++s) {
    const LineSeries& one = series[s];
    const std::string prefix = "save_line_plot: " + series_name(series, s);
    if (one.style != LineSeries::Style::kLine && one.style != LineSeries::Style::kDashed &&
        one.style != LineSeries::Style::kMarkers) {
      throw ValueError(prefix + ": unknown style " + std::to_string(static_cast<int>(one.style)) +
                       ", expected kLine, kDashed or kMarkers");
    }
    if (one.x.size() != one.y.size()) {
      throw ValueError(prefix + ": x has " + std::to_string(one.x.size()) + " values but y has " +
                       std::to_string(one.y.size()) + "; they must have the same length");
    }
    if (one.x.empty()) {
      throw ValueError(prefix + " is empty; every series needs at least one point");
    }
    for (size_t i = 0; i < one.x.size(); ++i) {
      for (const auto& [name, value] : {std::pair{"x", one.x[i]}, std::pair{"y", one.y[i]}}) {
        if (!std::isfinite(value)) {
          throw ValueError(prefix + ": " + name + "[" + std::to_string(i) + "] is " +
                           describe(value) + "; values must be finite");
        }
      }
      if (options.log_y && !(one.y[i] > 0.0)) {
        throw ValueError(prefix + ": y[" + std::to_string(i) + "] is " + number(one.y[i]) +
                         "; a logarithmic y axis (log_y) needs every y > 0");
      }
    }
  }
}

double Axis::fraction(double value) const {
  return (axis_value(value, log) - low) / (high - low);
}

Axis axis_view(double lowest, double highest, bool log, const char* axis_name) {
  Axis axis;
  axis.log = log;
  double low = lowest;
  double high = highest;
  const double magnitude = std::max(std::abs(low), std::abs(high));
  const double range = high - low;
  if (!(range > kNarrowestRange * magnitude) || range < kTiny) {
    // Halved before adding, so that the centre of huge values cannot overflow.
    const double centre = low / 2.0 + high / 2.0;
    const double half = std::abs(centre) >= kTiny ? kViewMargin * std::abs(centre) : 1.0;
    low = centre - half;
    high = centre + half;
  }
  const double margin = kViewMargin * (high - low);
  axis.low = low - margin;
  axis.high = high + margin;
  if (!std::isfinite(margin) || !std::isfinite(axis.low) || !std::isfinite(axis.high) ||
      !std::isfinite(axis.high - axis.low)) {
    const std::string what = log ? std::string("log10 of the ") + axis_name : axis_name;
    throw ValueError("save_line_plot: " + what + " values from " + number(lowest) + " to " +
                     number(highest) + " span more than a double can hold; scale them down");
  }
  return axis;
}

std::vector<Tick> axis_ticks(const Axis& axis, int64_t max_ticks) {
  max_ticks = std::max<int64_t>(max_ticks, 2);
  if (axis.log) return log_ticks(axis, max_ticks);
  return canvas::nice_ticks(axis.low, axis.high, max_ticks);
}

double LinePlotLayout::page_x(double x_value) const {
  return axes.x + x.fraction(x_value) * axes.width;
}

double LinePlotLayout::page_y(double y_value) const {
  return axes.bottom() - y.fraction(y_value) * axes.height;
}

LinePlotLayout layout_line_plot(const std::vector<LineSeries>& series,
                                const LinePlotOptions& options) {
  check_series(series, options);
  for (const auto& [name, side] :
       {std::pair{"width", options.width}, std::pair{"height", options.height}}) {
    if (!(side >= kMinSide && side <= canvas::kMaxPageSide)) {
      throw ValueError(std::string("save_line_plot: ") + name +
                       " must be between 50 and 14400 points, got " + number(side));
    }
  }

  LinePlotLayout layout;
  layout.width = options.width;
  layout.height = options.height;
  double x_lowest = std::numeric_limits<double>::infinity();
  double x_highest = -x_lowest;
  double y_lowest = x_lowest;
  double y_highest = -x_lowest;
  for (const LineSeries& one : series) {
    const auto [x_min, x_max] = std::minmax_element(one.x.begin(), one.x.end());
    const auto [y_min, y_max] = std::minmax_element(one.y.begin(), one.y.end());
    x_lowest = std::min(x_lowest, *x_min);
    x_highest = std::max(x_highest, *x_max);
    y_lowest = std::min(y_lowest, axis_value(*y_min, options.log_y));
    y_highest = std::max(y_highest, axis_value(*y_max, options.log_y));
  }
  layout.x = axis_view(x_lowest, x_highest, false, "x");
  layout.y = axis_view(y_lowest, y_highest, options.log_y, "y");

  // Text is measured with the fonts the drawing will use.
  const canvas::MeasuringContext context;
  cairo_t* const text = context.get();
  const double text_room = options.width - 2.0 * kMargin;
  select_font(text, kTitleFontSize);
  const LineMetrics title_line = line_metrics(text);
  layout.title = canvas::fit_text(text, canvas::valid_utf8(options.title), text_room);
  select_font(text, kLabelFontSize);
  const LineMetrics label_line = line_metrics(text);
  layout.xlabel = canvas::fit_text(text, canvas::valid_utf8(options.xlabel), text_room);
  layout.ylabel =
      canvas::fit_text(text, canvas::valid_utf8(options.ylabel), options.height - 2.0 * kMargin);
  select_font(text, kTickFontSize);
  const LineMetrics tick_line = line_metrics(text);

  const double top =
      kMargin + (layout.title.empty() ? tick_line.height() / 2.0 : title_line.height() + kTitlePad);
  const double below = kTickLength + kTickPad + tick_line.height() +
                       (layout.xlabel.empty() ? 0.0 : kLabelPad + label_line.height()) + kMargin;
  const double axes_height = options.height - top - below;
  const std::string size_message = "save_line_plot: a page of " + number(options.width) + " × " +
                                   number(options.height) +
                                   " points leaves too little room for the plot area; make it "
                                   "larger or the labels shorter";
  if (axes_height < kMinAxesSide) throw ValueError(size_message);
  layout.y.ticks = readable_ticks(layout.y, axes_height, tick_limit(axes_height, kYTickDistance),
                                  [&](const Tick&) { return tick_line.height(); });
  double widest_y = 0.0;
  for (const Tick& tick : layout.y.ticks) {
    widest_y = std::max(widest_y, text_width(text, tick.label));
  }
  double left = kMargin + (layout.ylabel.empty() ? 0.0 : label_line.height() + kLabelPad) +
                widest_y + kTickPad + kTickLength;

  // The x tick labels may reach past the plot area's ends, which the ticks decide, which depend
  // on the plot area's width: a few rounds settle it.
  double right = kMargin;
  double axes_width = 0.0;
  for (int round = 0; round < 3; ++round) {
    axes_width = options.width - left - right;
    if (axes_width < kMinAxesSide) throw ValueError(size_message);
    layout.x.ticks = readable_ticks(layout.x, axes_width, tick_limit(axes_width, kXTickDistance),
                                    [&](const Tick& tick) { return text_width(text, tick.label); });
    double overhang_left = 0.0;
    double overhang_right = 0.0;
    for (const Tick& tick : layout.x.ticks) {
      const double centre = layout.x.fraction(tick.position) * axes_width;
      const double half = text_width(text, tick.label) / 2.0;
      overhang_left = std::max(overhang_left, half - centre - (left - kMargin));
      overhang_right = std::max(overhang_right, centre + half - axes_width);
    }
    if (overhang_left <= 0.0 && kMargin + overhang_right <= right) break;
    left += std::max(0.0, overhang_left);
    right = std::max(right, kMargin + overhang_right);
  }
  layout.axes = {left, top, axes_width, axes_height};

  select_font(text, kLegendFontSize);
  const LineMetrics legend_line = line_metrics(text);
  const double label_room = std::max(
      0.0, axes_width - 2.0 * (kLegendInset + kLegendPad) - kLegendHandle - kLegendTextPad);
  double widest_label = 0.0;
  for (size_t s = 0; s < series.size(); ++s) {
    if (series[s].label.empty()) continue;
    LegendEntry entry{s, canvas::fit_text(text, canvas::valid_utf8(series[s].label), label_room)};
    widest_label = std::max(widest_label, text_width(text, entry.label));
    layout.legend_entries.push_back(std::move(entry));
  }
  if (!layout.legend_entries.empty()) {
    const auto rows = static_cast<double>(layout.legend_entries.size());
    const double legend_width = 2.0 * kLegendPad + kLegendHandle + kLegendTextPad + widest_label;
    const double legend_height =
        2.0 * kLegendPad + rows * legend_line.height() + (rows - 1.0) * kLegendSpacing;
    layout.legend = place_legend(legend_width, legend_height, series, layout);
  }
  return layout;
}

double png_scale(const LinePlotLayout& layout) {
  const double scale = canvas::png_scale(layout.width, layout.height);
  if (scale > 0.0) return scale;
  throw ValueError("save_line_plot: a PNG of " + number(layout.width) + " × " +
                   number(layout.height) +
                   " points is more than Cairo's images hold (32767 pixels a side, 64 Mi in all); "
                   "use a smaller width or height, or .svg / .pdf");
}

namespace {

void set_colour(cairo_t* context, const Rgb& colour) {
  cairo_set_source_rgb(context, colour.red, colour.green, colour.blue);
}

class Painter {
 public:
  Painter(cairo_t* context, const LinePlotLayout& layout, const std::vector<LineSeries>& series)
      : context_(context), layout_(layout), series_(series) {}

  void paint() {
    cairo_set_source_rgb(context_, 1.0, 1.0, 1.0);
    cairo_paint(context_);
    draw_grid();
    cairo_save(context_);
    const Rect& axes = layout_.axes;
    cairo_rectangle(context_, axes.x, axes.y, axes.width, axes.height);
    cairo_clip(context_);
    for (size_t s = 0; s < series_.size(); ++s) draw_series(series_[s], series_colour(s));
    cairo_restore(context_);
    draw_axes();
    draw_labels();
    if (!layout_.legend_entries.empty()) draw_legend();
  }

 private:
  void draw_grid() {
    const Rect& axes = layout_.axes;
    cairo_set_source_rgb(context_, kGridGrey, kGridGrey, kGridGrey);
    cairo_set_line_width(context_, kGridWidth);
    for (const Tick& tick : layout_.x.ticks) {
      const double x = layout_.page_x(tick.position);
      cairo_move_to(context_, x, axes.y);
      cairo_line_to(context_, x, axes.bottom());
    }
    for (const Tick& tick : layout_.y.ticks) {
      const double y = layout_.page_y(tick.position);
      cairo_move_to(context_, axes.x, y);
      cairo_line_to(context_, axes.right(), y);
    }
    cairo_stroke(context_);
  }

  // The line's style: solid lines join and end round (matplotlib's 'round' join, 'projecting'
  // cap), dashes end flat.
  void set_line_style(LineSeries::Style style) {
    cairo_set_line_width(context_, kSeriesWidth);
    cairo_set_line_join(context_, CAIRO_LINE_JOIN_ROUND);
    if (style == LineSeries::Style::kDashed) {
      cairo_set_dash(context_, kDashes.data(), static_cast<int>(kDashes.size()), 0.0);
      cairo_set_line_cap(context_, CAIRO_LINE_CAP_BUTT);
    } else {
      cairo_set_dash(context_, nullptr, 0, 0.0);
      cairo_set_line_cap(context_, CAIRO_LINE_CAP_SQUARE);
    }
  }

  void add_marker(double x, double y) {
    cairo_new_sub_path(context_);
    cairo_arc(context_, x, y, kMarkerRadius, 0.0, 2.0 * std::numbers::pi);
  }

  void draw_series(const LineSeries& series, const Rgb& colour) {
    set_colour(context_, colour);
    if (series.style == LineSeries::Style::kMarkers) {
      for (size_t i = 0; i < series.x.size(); ++i) {
        add_marker(layout_.page_x(series.x[i]), layout_.page_y(series.y[i]));
      }
      cairo_fill(context_);
      return;
    }
    set_line_style(series.style);
    cairo_move_to(context_, layout_.page_x(series.x[0]), layout_.page_y(series.y[0]));
    for (size_t i = 1; i < series.x.size(); ++i) {
      cairo_line_to(context_, layout_.page_x(series.x[i]), layout_.page_y(series.y[i]));
    }
    cairo_stroke(context_);
    cairo_set_dash(context_, nullptr, 0, 0.0);
  }

  void draw_axes() {
    const Rect& axes = layout_.axes;
    cairo_set_source_rgb(context_, 0.0, 0.0, 0.0);
    cairo_set_line_width(context_, kFrameWidth);
    cairo_set_line_cap(context_, CAIRO_LINE_CAP_BUTT);
    cairo_rectangle(context_, axes.x, axes.y, axes.width, axes.height);
    for (const Tick& tick : layout_.x.ticks) {
      const double x = layout_.page_x(tick.position);
      cairo_move_to(context_, x, axes.bottom());
      cairo_line_to(context_, x, axes.bottom() + kTickLength);
    }
    for (const Tick& tick : layout_.y.ticks) {
      const double y = layout_.page_y(tick.position);
      cairo_move_to(context_, axes.x, y);
      cairo_line_to(context_, axes.x - kTickLength, y);
    }
    cairo_stroke(context_);

    select_font(context_, kTickFontSize);
    const LineMetrics line = line_metrics(context_);
    for (const Tick& tick : layout_.x.ticks) {
      canvas::show_centred(context_, tick.label, layout_.page_x(tick.position),
                           axes.bottom() + kTickLength + kTickPad + line.ascent);
    }
    for (const Tick& tick : layout_.y.ticks) {
      cairo_move_to(context_, axes.x - kTickLength - kTickPad - text_width(context_, tick.label),
                    line.baseline(layout_.page_y(tick.position)));
      cairo_show_text(context_, tick.label.c_str());
    }
  }

  void draw_labels() {
    const Rect& axes = layout_.axes;
    cairo_set_source_rgb(context_, 0.0, 0.0, 0.0);
    select_font(context_, kTickFontSize);
    const double tick_labels_height = line_metrics(context_).height();
    double widest_y = 0.0;
    for (const Tick& tick : layout_.y.ticks) {
      widest_y = std::max(widest_y, text_width(context_, tick.label));
    }
    select_font(context_, kLabelFontSize);
    const LineMetrics label_line = line_metrics(context_);
    const double below = axes.bottom() + kTickLength + kTickPad + tick_labels_height + kLabelPad;
    if (!layout_.xlabel.empty()) {
      canvas::show_centred(context_, layout_.xlabel, axes.x + axes.width / 2.0,
                           below + label_line.ascent);
    }
    if (!layout_.ylabel.empty()) {
      const double beside = axes.x - kTickLength - kTickPad - widest_y - kLabelPad;
      canvas::show_upright(context_, layout_.ylabel, beside - label_line.descent,
                           axes.y + axes.height / 2.0);
    }
    if (!layout_.title.empty()) {
      select_font(context_, kTitleFontSize);
      const LineMetrics title_line = line_metrics(context_);
      canvas::show_centred(context_, layout_.title, axes.x + axes.width / 2.0,
                           axes.y - kTitlePad - title_line.descent);
    }
  }

  void legend_frame_path(const Rect& frame) {
    const double r = kLegendCorner;
    const double pi = std::numbers::pi;
    cairo_new_sub_path(context_);
    cairo_arc(context_, frame.right() - r, frame.y + r, r, -pi / 2.0, 0.0);
    cairo_arc(context_, frame.right() - r, frame.bottom() - r, r, 0.0, pi / 2.0);
    cairo_arc(context_, frame.x + r, frame.bottom() - r, r, pi / 2.0, pi);
    cairo_arc(context_, frame.x + r, frame.y + r, r, pi, 3.0 * pi / 2.0);
    cairo_close_path(context_);
  }

  void draw_legend() {
    const Rect& frame = layout_.legend;
    legend_frame_path(frame);
    cairo_set_source_rgba(context_, 1.0, 1.0, 1.0, kLegendAlpha);
    cairo_fill_preserve(context_);
    cairo_set_source_rgba(context_, kLegendEdgeGrey, kLegendEdgeGrey, kLegendEdgeGrey,
                          kLegendAlpha);
    cairo_set_line_width(context_, kFrameWidth);
    cairo_stroke(context_);

    select_font(context_, kLegendFontSize);
    const LineMetrics line = line_metrics(context_);
    double row_top = frame.y + kLegendPad;
    for (const LegendEntry& entry : layout_.legend_entries) {
      const LineSeries& series = series_[entry.series];
      const double centre_y = row_top + line.height() / 2.0;
      const double handle_x = frame.x + kLegendPad;
      set_colour(context_, series_colour(entry.series));
      if (series.style == LineSeries::Style::kMarkers) {
        add_marker(handle_x + kLegendHandle / 2.0, centre_y);
        cairo_fill(context_);
      } else {
        set_line_style(series.style);
        cairo_set_line_cap(context_, CAIRO_LINE_CAP_BUTT);
        cairo_move_to(context_, handle_x, centre_y);
        cairo_line_to(context_, handle_x + kLegendHandle, centre_y);
        cairo_stroke(context_);
        cairo_set_dash(context_, nullptr, 0, 0.0);
      }
      cairo_set_source_rgb(context_, 0.0, 0.0, 0.0);
      cairo_move_to(context_, handle_x + kLegendHandle + kLegendTextPad, line.baseline(centre_y));
      cairo_show_text(context_, entry.label.c_str());
      row_top += line.height() + kLegendSpacing;
    }
  }

  cairo_t* context_;
  const LinePlotLayout& layout_;
  const std::vector<LineSeries>& series_;
};

}  // namespace
}  // namespace line_plot_detail

void save_line_plot(const std::vector<LineSeries>& series, const std::filesystem::path& path,
                    const LinePlotOptions& options) {
  using namespace line_plot_detail;
  check_series(series, options);
  const canvas::Format format = canvas::format_of(path, kCaller);
  const LinePlotLayout layout = layout_line_plot(series, options);
  const double scale = format == canvas::Format::kPng ? png_scale(layout) : 1.0;
  canvas::write_page(
      path, format, layout.width, layout.height, scale,
      [&](cairo_t* context, bool, double) { Painter(context, layout, series).paint(); }, kCaller);
}

}  // namespace attn
