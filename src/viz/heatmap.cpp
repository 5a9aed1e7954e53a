// save_heatmaps: checks its arguments, lays out a grid of panels with ticks, labels, titles and a
// colour bar, and draws them with Cairo to PNG, SVG or PDF.
#include "attn/viz/heatmap.hpp"

#include <cairo.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <numbers>

#include "attn/core/error.hpp"
#include "cairo_canvas.hpp"
#include "heatmap_layout.hpp"

namespace attn {
namespace heatmap_detail {
namespace {

using canvas::fit_text;
using canvas::line_metrics;
using canvas::LineMetrics;
using canvas::PatternPtr;
using canvas::select_font;
using canvas::SurfacePtr;
using canvas::text_width;

constexpr const char* kCaller = "save_heatmaps";

// Sizes in points. Fonts are a little smaller than matplotlib's 10 pt because a panel is only
// 2.5 inches wide, as in the book.
constexpr double kMargin = 6.0;
constexpr double kTickFontSize = 9.0;
constexpr double kLabelFontSize = 10.0;
constexpr double kTitleFontSize = 10.0;
constexpr double kTickLength = 3.5;
constexpr double kTickPad = 2.5;
constexpr double kLabelPad = 4.0;
constexpr double kTitlePad = 4.0;
constexpr double kPanelGap = 10.0;
constexpr double kColorbarGap = 12.0;
constexpr double kColorbarWidth = 10.0;
constexpr double kColorbarFraction = 0.8;
constexpr double kMinColorbarHeight = 100.0;
constexpr double kLineWidth = 0.8;
// Long tokens are cut with an ellipsis so that one of them cannot take over the page.
constexpr double kMaxTickLabelWidth = 90.0;
// Distance between neighbouring tick labels, and the distance between integer ticks that keeps an
// axis from looking crowded (matplotlib shows about five ticks on a 2.5-inch axis).
constexpr double kTickLabelGap = 6.0;
constexpr double kIntegerTickDistance = 30.0;
constexpr double kColorbarTickDistance = 24.0;
constexpr int64_t kMaxColorbarTicks = 8;
// A 1 × 500 matrix would otherwise be a strip too thin to see or to label; its cells then stop
// being square.
constexpr double kMinPanelSideFraction = 0.25;
constexpr double kMinPanelSize = 1.0;
constexpr double kMaxPanelSize = canvas::kMaxPageSide;
// Matrices larger than this per side are sampled for the embedded image: a cell is then far
// smaller than a pixel of any reasonable picture.
constexpr int64_t kMaxImageSide = 8192;
// In SVG and PDF, cells at least this large are drawn as rectangles, which viewers never blur;
// smaller ones go into one image, which keeps the file small.
constexpr double kMinVectorCellSize = 2.0;

// ColorBrewer's 9-class Reds, which matplotlib's 'Reds' interpolates linearly.
constexpr std::array<Rgb, 9> kRedsAnchors{{
    {255.0 / 255.0, 245.0 / 255.0, 240.0 / 255.0},
    {254.0 / 255.0, 224.0 / 255.0, 210.0 / 255.0},
    {252.0 / 255.0, 187.0 / 255.0, 161.0 / 255.0},
    {252.0 / 255.0, 146.0 / 255.0, 114.0 / 255.0},
    {251.0 / 255.0, 106.0 / 255.0, 74.0 / 255.0},
    {239.0 / 255.0, 59.0 / 255.0, 44.0 / 255.0},
    {203.0 / 255.0, 24.0 / 255.0, 29.0 / 255.0},
    {165.0 / 255.0, 15.0 / 255.0, 21.0 / 255.0},
    {103.0 / 255.0, 0.0 / 255.0, 13.0 / 255.0},
}};

std::string shape_message(const Shape& shape) {
  return "weights " + shape.str();
}

// The distance in cells between labelled ticks: 1, 2, 5, 10, 20, ... — the first that leaves
// `spacing` points between neighbours and gives at most `max_ticks` ticks.
int64_t tick_step(int64_t count, double cell, double spacing, int64_t max_ticks) {
  constexpr std::array<int64_t, 3> kMultipliers{1, 2, 5};
  for (int64_t decade = 1;; decade *= 10) {
    for (const int64_t multiplier : kMultipliers) {
      const int64_t step = multiplier * decade;
      if (step >= count) return step;
      const int64_t ticks = (count - 1) / step + 1;
      if (static_cast<double>(step) * cell >= spacing && ticks <= max_ticks) return step;
    }
  }
}

int64_t integer_tick_limit(double axis_length) {
  return std::max<int64_t>(2, static_cast<int64_t>(axis_length / kIntegerTickDistance) + 1);
}

// The labelled ticks of an axis of `count` cells `cell` points long, with either the cell indices
// or the given tokens as labels.
struct AxisPlan {
  std::vector<Tick> ticks;
  bool rotated = false;
  double widest = 0.0;  // the widest label drawn
};

// `horizontal` is the x axis, whose labels sit side by side (or upright when too wide).
AxisPlan plan_axis(cairo_t* context, int64_t count, double cell,
                   const std::vector<std::string>& tokens, bool horizontal) {
  const LineMetrics line = line_metrics(context);
  AxisPlan plan;
  int64_t step = 1;
  std::vector<std::string> fitted;
  if (tokens.empty()) {
    const double widest_index = text_width(context, std::to_string(count - 1));
    const double spacing = horizontal ? widest_index + kTickLabelGap : line.height() + 4.0;
    step = tick_step(count, cell, spacing, integer_tick_limit(static_cast<double>(count) * cell));
  } else {
    double widest_token = 0.0;
    fitted.reserve(tokens.size());
    for (const std::string& token : tokens) {
      fitted.push_back(fit_text(context, valid_utf8(token), kMaxTickLabelWidth));
      widest_token = std::max(widest_token, text_width(context, fitted.back()));
    }
    // Tokens are turned upright as soon as they would not fit side by side one per cell.
    plan.rotated = horizontal && widest_token + kTickLabelGap > cell;
    const double spacing =
        horizontal && !plan.rotated ? widest_token + kTickLabelGap : line.height() + 2.0;
    step = tick_step(count, cell, spacing, std::numeric_limits<int64_t>::max());
  }
  for (int64_t index = 0; index < count; index += step) {
    std::string label = tokens.empty() ? std::to_string(index) : fitted[static_cast<size_t>(index)];
    plan.widest = std::max(plan.widest, text_width(context, label));
    plan.ticks.push_back({static_cast<double>(index), std::move(label)});
  }
  return plan;
}

// name: the option's own name, a literal (the error keeps it as its argument).
void require_label_count(const std::vector<std::string>& labels, int64_t expected, const char* name,
                         const std::string& what) {
  if (!labels.empty() && static_cast<int64_t>(labels.size()) != expected) {
    throw ValueError("save_heatmaps: expected " + std::to_string(expected) + " " + name + " (" +
                         what + ") or none, got " + std::to_string(labels.size()),
                     name);
  }
}

}  // namespace

Grid infer_grid(const Shape& shape, int64_t rows, int64_t cols) {
  const int rank = shape.rank();
  if (rank < 2 || rank > 4) {
    throw ShapeError(
        "save_heatmaps: weights must have rank 2 (n, m), 3 (panels, n, m) or 4 (rows, cols, n, "
        "m), got shape " +
            shape.str(),
        "weights");
  }
  Grid grid;
  grid.n = shape.dim(-2);
  grid.m = shape.dim(-1);
  if (grid.n == 0 || grid.m == 0) {
    throw ShapeError("save_heatmaps: " + shape_message(shape) +
                         " hold empty matrices; n and m must be at least 1",
                     "weights");
  }
  const int64_t inferred_rows = rank == 4 ? shape[0] : 1;
  const int64_t inferred_cols = rank == 4 ? shape[1] : (rank == 3 ? shape[0] : 1);
  const int64_t panels = inferred_rows * inferred_cols;
  if (panels == 0) {
    throw ShapeError("save_heatmaps: " + shape_message(shape) + " hold no panels", "weights");
  }
  const std::string requested =
      "rows = " + std::to_string(rows) + ", cols = " + std::to_string(cols);
  if (rows < 0 || cols < 0) {
    throw ShapeError(
        "save_heatmaps: rows and cols must be 0 (inferred) or positive, got " + requested,
        "rows, cols");
  }
  const std::string panels_message =
      "the " + std::to_string(panels) + " panels of " + shape_message(shape);
  if (rows == 0 && cols == 0) {
    grid.rows = inferred_rows;
    grid.cols = inferred_cols;
  } else if (rows == 0 || cols == 0) {
    const int64_t given = std::max(rows, cols);
    if (panels % given != 0) {
      throw ShapeError("save_heatmaps: " + requested + " cannot arrange " + panels_message + ": " +
                           std::to_string(given) + " does not divide " + std::to_string(panels),
                       "rows, cols");
    }
    grid.rows = rows == 0 ? panels / given : rows;
    grid.cols = cols == 0 ? panels / given : cols;
  } else {
    // Divided rather than multiplied so that huge requests cannot overflow.
    if (rows > panels || cols > panels / rows || rows * cols != panels) {
      throw ShapeError("save_heatmaps: " + requested + " does not match " + panels_message +
                           " (rows × cols must equal " + std::to_string(panels) + ")",
                       "rows, cols");
    }
    grid.rows = rows;
    grid.cols = cols;
  }
  return grid;
}

std::span<const Rgb> reds_anchors() {
  return kRedsAnchors;
}

Rgb reds(double fraction) {
  if (!(fraction > 0.0)) return kRedsAnchors.front();  // also NaN
  if (fraction >= 1.0) return kRedsAnchors.back();
  const double position = fraction * static_cast<double>(kRedsAnchors.size() - 1);
  const auto lower = static_cast<size_t>(position);
  const double weight = position - static_cast<double>(lower);
  const Rgb& from = kRedsAnchors[lower];
  const Rgb& to = kRedsAnchors[lower + 1];
  return {from.red + (to.red - from.red) * weight, from.green + (to.green - from.green) * weight,
          from.blue + (to.blue - from.blue) * weight};
}

double ColorScale::fraction(double value) const {
  return std::clamp((value - low) / (high - low), 0.0, 1.0);
}

ColorScale color_scale(std::span<const float> values) {
  ColorScale scale{0.0, 0.0};
  if (!values.empty()) {
    const auto [lowest, highest] = std::minmax_element(values.begin(), values.end());
    scale.low = std::min(0.0, static_cast<double>(*lowest));
    scale.high = static_cast<double>(*highest);
  }
  if (!(scale.high > scale.low)) scale.high = scale.low + 1.0;
  return scale;
}

Rect HeatmapLayout::cell(int64_t panel, int64_t i, int64_t j) const {
  const Rect& area = panels.at(static_cast<size_t>(panel));
  return {area.x + static_cast<double>(j) * cell_width,
          area.y + static_cast<double>(i) * cell_height, cell_width, cell_height};
}

HeatmapLayout layout_heatmaps(const Grid& grid, const HeatmapOptions& options,
                              const ColorScale& scale) {
  require_label_count(options.titles, grid.panels(), "titles", "one per panel");
  require_label_count(options.x_tick_labels, grid.m, "x_tick_labels",
                      "one per column, m = " + std::to_string(grid.m));
  require_label_count(options.y_tick_labels, grid.n, "y_tick_labels",
                      "one per row, n = " + std::to_string(grid.n));
  const double panel_size = options.panel_size;
  if (!(panel_size >= kMinPanelSize && panel_size <= kMaxPanelSize)) {
    throw ValueError("save_heatmaps: panel_size must be between 1 and 14400 points, got " +
                         number_text(panel_size),
                     "panel_size");
  }

  // Text is measured with the fonts the drawing will use.
  const canvas::MeasuringContext context;
  cairo_t* const text = context.get();

  HeatmapLayout layout;
  layout.grid = grid;
  layout.scale = scale;

  const auto n = static_cast<double>(grid.n);
  const auto m = static_cast<double>(grid.m);
  const double longest = std::max(n, m);
  const double panel_width = std::max(panel_size * m / longest, panel_size * kMinPanelSideFraction);
  const double panel_height =
      std::max(panel_size * n / longest, panel_size * kMinPanelSideFraction);
  layout.cell_width = panel_width / m;
  layout.cell_height = panel_height / n;

  select_font(text, kTickFontSize);
  const LineMetrics tick_line = line_metrics(text);
  AxisPlan y_axis = plan_axis(text, grid.n, layout.cell_height, options.y_tick_labels, false);
  AxisPlan x_axis = plan_axis(text, grid.m, layout.cell_width, options.x_tick_labels, true);
  layout.x_labels_rotated = x_axis.rotated;
  // How far the x tick labels reach beyond the panel's left and right edges.
  double x_overhang_left = 0.0;
  double x_overhang_right = 0.0;
  for (const Tick& tick : x_axis.ticks) {
    const double centre = (tick.position + 0.5) * layout.cell_width;
    const double half =
        x_axis.rotated ? tick_line.height() / 2.0 : text_width(text, tick.label) / 2.0;
    x_overhang_left = std::max(x_overhang_left, half - centre);
    x_overhang_right = std::max(x_overhang_right, centre + half - panel_width);
  }
  const double x_labels_height = x_axis.rotated ? x_axis.widest : tick_line.height();
  // How far the y tick labels reach above the panel's top and below its bottom.
  const double y_overhang = std::max(0.0, (tick_line.height() - layout.cell_height) / 2.0);

  select_font(text, kLabelFontSize);
  const LineMetrics label_line = line_metrics(text);
  // Labels and titles may reach 2 points past each side of their panel, which leaves at least
  // kPanelGap − 4 points between those of neighbouring panels.
  const double fitted_width = panel_width + kPanelGap - 6.0;
  layout.xlabel = fit_text(text, valid_utf8(options.xlabel), fitted_width);
  layout.ylabel = fit_text(text, valid_utf8(options.ylabel), panel_height + kPanelGap - 6.0);
  const double ylabel_overhang =
      std::max(0.0, (text_width(text, layout.ylabel) - panel_height) / 2.0);

  select_font(text, kTitleFontSize);
  const LineMetrics title_line = line_metrics(text);
  double title_overhang = 0.0;
  for (const std::string& title : options.titles) {
    layout.titles.push_back(fit_text(text, valid_utf8(title), fitted_width));
    title_overhang =
        std::max(title_overhang, (text_width(text, layout.titles.back()) - panel_width) / 2.0);
  }
  const double title_band = options.titles.empty() ? 0.0 : title_line.height() + kTitlePad;

  const double ylabel_band = layout.ylabel.empty() ? 0.0 : label_line.height() + kLabelPad;
  const double left_of_panel = ylabel_band + y_axis.widest + kTickPad + kTickLength;
  const double column_gap =
      std::max({kPanelGap, x_overhang_left + x_overhang_right + 4.0, 2.0 * title_overhang + 4.0});
  const double row_gap = kPanelGap + title_band + 2.0 * std::max(y_overhang, ylabel_overhang);
  const double below_panel =
      std::max({kTickLength + kTickPad + x_labels_height +
                    (layout.xlabel.empty() ? 0.0 : kLabelPad + label_line.height()),
                y_overhang, ylabel_overhang});

  const auto rows = static_cast<double>(grid.rows);
  const auto cols = static_cast<double>(grid.cols);
  const double grid_width = cols * panel_width + (cols - 1.0) * column_gap;
  const double grid_height = rows * panel_height + (rows - 1.0) * row_gap;
  const double left = kMargin + std::max({left_of_panel, x_overhang_left, title_overhang, 0.0});
  double top = kMargin + std::max({title_band, y_overhang, ylabel_overhang});

  // The colour bar is centred on the grid; when it is the taller of the two, the grid moves down
  // to make room for it and its end labels.
  const double bar_height = std::max(kColorbarFraction * grid_height, kMinColorbarHeight);
  double bar_top = top + (grid_height - bar_height) / 2.0;
  const double bar_room = kMargin + tick_line.height() / 2.0;
  if (bar_top < bar_room) {
    top += bar_room - bar_top;
    bar_top = bar_room;
  }
  const double bar_left =
      left + grid_width +
      std::max({kColorbarGap, x_overhang_right + kTickLabelGap, title_overhang + kTickLabelGap});
  layout.colorbar = {bar_left, bar_top, kColorbarWidth, bar_height};

  select_font(text, kTickFontSize);
  layout.colorbar_ticks = canvas::nice_ticks(
      scale.low, scale.high,
      std::min(static_cast<int64_t>(bar_height / kColorbarTickDistance) + 1, kMaxColorbarTicks));
  double widest_value = 0.0;
  for (const Tick& tick : layout.colorbar_ticks) {
    widest_value = std::max(widest_value, text_width(text, tick.label));
  }

  layout.width = bar_left + kColorbarWidth + kTickLength + kTickPad + widest_value + kMargin;
  layout.height = std::max(top + grid_height + below_panel + kMargin,
                           bar_top + bar_height + tick_line.height() / 2.0 + kMargin);
  for (int64_t row = 0; row < grid.rows; ++row) {
    for (int64_t col = 0; col < grid.cols; ++col) {
      layout.panels.push_back({left + static_cast<double>(col) * (panel_width + column_gap),
                               top + static_cast<double>(row) * (panel_height + row_gap),
                               panel_width, panel_height});
    }
  }
  layout.x_ticks = std::move(x_axis.ticks);
  layout.y_ticks = std::move(y_axis.ticks);
  return layout;
}

double png_scale(const HeatmapLayout& layout) {
  const double scale = canvas::png_scale(layout.width, layout.height);
  if (scale > 0.0) return scale;
  throw ValueError("save_heatmaps: a PNG of " + std::to_string(layout.grid.rows) + " × " +
                       std::to_string(layout.grid.cols) + " panels would be " +
                       number_text(std::ceil(layout.width)) + " × " +
                       number_text(std::ceil(layout.height)) +
                       " pixels, more than Cairo's images hold (32767 a side, 64 Mi in all); use "
                       "fewer panels, a smaller panel_size, or .svg / .pdf",
                   "path");
}

namespace {

void require_finite(ConstTensorView weights) {
  const std::span<const float> values = weights.span();
  const auto bad =
      std::find_if(values.begin(), values.end(), [](float value) { return !std::isfinite(value); });
  if (bad == values.end()) return;
  // The flat offset back to an index of every axis, for the message.
  auto offset = static_cast<int64_t>(bad - values.begin());
  std::array<int64_t, Shape::kMaxRank> index{};
  for (int axis = weights.rank() - 1; axis >= 0; --axis) {
    index[static_cast<size_t>(axis)] = offset % weights.dim(axis);
    offset /= weights.dim(axis);
  }
  std::string position;
  for (int axis = 0; axis < weights.rank(); ++axis) {
    position += (axis == 0 ? "" : ", ") + std::to_string(index[static_cast<size_t>(axis)]);
  }
  throw ValueError("save_heatmaps: weights[" + position + "] is " +
                       (std::isnan(*bad) ? "nan" : (*bad > 0 ? "inf" : "-inf")) +
                       "; attention weights must be finite",
                   "weights");
}

struct Rgb8 {
  uint32_t red = 0;
  uint32_t green = 0;
  uint32_t blue = 0;
  uint32_t packed() const { return (red << 16U) | (green << 8U) | blue; }
};

Rgb8 to_rgb8(const Rgb& colour) {
  const auto channel = [](double value) {
    return static_cast<uint32_t>(std::lround(std::clamp(value, 0.0, 1.0) * 255.0));
  };
  return {channel(colour.red), channel(colour.green), channel(colour.blue)};
}

class Painter {
 public:
  Painter(cairo_t* context, const HeatmapLayout& layout, const float* values, bool vector,
          double device_scale)
      : context_(context),
        layout_(layout),
        values_(values),
        vector_(vector),
        device_scale_(device_scale) {}

  void paint() {
    cairo_set_source_rgb(context_, 1.0, 1.0, 1.0);
    cairo_paint(context_);
    const Grid& grid = layout_.grid;
    for (int64_t panel = 0; panel < grid.panels(); ++panel) {
      const Rect& area = layout_.panels[static_cast<size_t>(panel)];
      const float* matrix = values_ + panel * grid.n * grid.m;
      const bool rectangles =
          vector_ && std::min(layout_.cell_width, layout_.cell_height) >= kMinVectorCellSize;
      if (rectangles) {
        fill_cells(area, matrix);
      } else {
        paint_cells_image(area, matrix);
      }
      draw_axes(area, panel % grid.cols == 0, panel / grid.cols == grid.rows - 1);
      if (!layout_.titles.empty()) {
        select_font(context_, kTitleFontSize);
        const LineMetrics line = line_metrics(context_);
        show_centred(layout_.titles[static_cast<size_t>(panel)], area.x + area.width / 2.0,
                     area.y - kTitlePad - line.descent);
      }
    }
    draw_colorbar();
  }

 private:
  Rgb8 colour_of(float value) const {
    return to_rgb8(reds(layout_.scale.fraction(static_cast<double>(value))));
  }

  // Runs of equal colour become one rectangle. Each reaches one cell further right and down than
  // its own cells; the cells drawn after it cover that, so viewers that anti-alias edges show no
  // hairline of background between cells.
  void fill_cells(const Rect& area, const float* matrix) {
    const Grid& grid = layout_.grid;
    const double right = area.x + area.width;
    const double bottom = area.y + area.height;
    for (int64_t i = 0; i < grid.n; ++i) {
      const float* row = matrix + i * grid.m;
      const double top = area.y + static_cast<double>(i) * layout_.cell_height;
      const double lower = std::min(top + 2.0 * layout_.cell_height, bottom);
      int64_t start = 0;
      while (start < grid.m) {
        const Rgb8 colour = colour_of(row[start]);
        int64_t end = start + 1;
        while (end < grid.m && colour_of(row[end]).packed() == colour.packed()) ++end;
        const double x = area.x + static_cast<double>(start) * layout_.cell_width;
        const double x_end =
            std::min(area.x + static_cast<double>(end + 1) * layout_.cell_width, right);
        cairo_set_source_rgb(context_, colour.red / 255.0, colour.green / 255.0,
                             colour.blue / 255.0);
        cairo_rectangle(context_, x, top, x_end - x, lower - top);
        cairo_fill(context_);
        start = end;
      }
    }
  }

  // One pixel per cell, scaled onto the panel: nearest-neighbour keeps cells sharp when they are
  // larger than a pixel, Cairo's GOOD filter averages them when they are smaller.
  void paint_cells_image(const Rect& area, const float* matrix) {
    const Grid& grid = layout_.grid;
    const int64_t width = std::min(grid.m, kMaxImageSide);
    const int64_t height = std::min(grid.n, kMaxImageSide);
    const SurfacePtr image(cairo_image_surface_create(CAIRO_FORMAT_RGB24, static_cast<int>(width),
                                                      static_cast<int>(height)));
    // With both sides within Cairo's limits, only a lack of memory makes this fail.
    if (cairo_surface_status(image.get()) != CAIRO_STATUS_SUCCESS) throw std::bad_alloc();
    cairo_surface_flush(image.get());
    unsigned char* const pixels = cairo_image_surface_get_data(image.get());
    const auto stride = static_cast<size_t>(cairo_image_surface_get_stride(image.get()));
    for (int64_t y = 0; y < height; ++y) {
      // Sampled at pixel centres when the matrix has more cells than the image pixels.
      const int64_t i = (2 * y + 1) * grid.n / (2 * height);
      unsigned char* const line = pixels + static_cast<size_t>(y) * stride;
      for (int64_t x = 0; x < width; ++x) {
        const int64_t j = (2 * x + 1) * grid.m / (2 * width);
        const uint32_t pixel = 0xFF000000U | colour_of(matrix[i * grid.m + j]).packed();
        std::memcpy(line + static_cast<size_t>(x) * sizeof pixel, &pixel, sizeof pixel);
      }
    }
    cairo_surface_mark_dirty(image.get());

    const double pixel_width = area.width / static_cast<double>(width);
    const double pixel_height = area.height / static_cast<double>(height);
    const bool enlarged = vector_ || std::min(pixel_width, pixel_height) * device_scale_ >= 1.0;
    cairo_save(context_);
    cairo_rectangle(context_, area.x, area.y, area.width, area.height);
    cairo_clip(context_);
    cairo_translate(context_, area.x, area.y);
    cairo_scale(context_, pixel_width, pixel_height);
    cairo_set_source_surface(context_, image.get(), 0.0, 0.0);
    cairo_pattern_t* const source = cairo_get_source(context_);
    cairo_pattern_set_filter(source, enlarged ? CAIRO_FILTER_NEAREST : CAIRO_FILTER_GOOD);
    cairo_pattern_set_extend(source, CAIRO_EXTEND_PAD);
    cairo_paint(context_);
    cairo_restore(context_);
  }

  void draw_axes(const Rect& area, bool first_column, bool bottom_row) {
    const double bottom = area.y + area.height;
    cairo_set_source_rgb(context_, 0.0, 0.0, 0.0);
    cairo_set_line_width(context_, kLineWidth);
    cairo_rectangle(context_, area.x, area.y, area.width, area.height);
    for (const Tick& tick : layout_.x_ticks) {
      const double x = area.x + (tick.position + 0.5) * layout_.cell_width;
      cairo_move_to(context_, x, bottom);
      cairo_line_to(context_, x, bottom + kTickLength);
    }
    for (const Tick& tick : layout_.y_ticks) {
      const double y = area.y + (tick.position + 0.5) * layout_.cell_height;
      cairo_move_to(context_, area.x, y);
      cairo_line_to(context_, area.x - kTickLength, y);
    }
    cairo_stroke(context_);

    select_font(context_, kTickFontSize);
    const LineMetrics tick_line = line_metrics(context_);
    double below = bottom + kTickLength + kTickPad;
    double beside = area.x - kTickLength - kTickPad;
    if (bottom_row) {
      for (const Tick& tick : layout_.x_ticks) {
        const double x = area.x + (tick.position + 0.5) * layout_.cell_width;
        if (layout_.x_labels_rotated) {
          // Read upwards, ending just under the tick.
          const double width = text_width(context_, tick.label);
          cairo_save(context_);
          cairo_move_to(context_, x + (tick_line.ascent - tick_line.descent) / 2.0, below + width);
          cairo_rotate(context_, -std::numbers::pi / 2.0);
          cairo_show_text(context_, tick.label.c_str());
          cairo_restore(context_);
        } else {
          show_centred(tick.label, x, below + tick_line.ascent);
        }
      }
    }
    double widest_y_label = 0.0;
    for (const Tick& tick : layout_.y_ticks) {
      const double width = text_width(context_, tick.label);
      widest_y_label = std::max(widest_y_label, width);
      if (!first_column) continue;
      const double y = area.y + (tick.position + 0.5) * layout_.cell_height;
      cairo_move_to(context_, beside - width, tick_line.baseline(y));
      cairo_show_text(context_, tick.label.c_str());
    }
    below += x_labels_height(tick_line) + kLabelPad;
    beside -= widest_y_label + kLabelPad;

    select_font(context_, kLabelFontSize);
    const LineMetrics label_line = line_metrics(context_);
    if (bottom_row && !layout_.xlabel.empty()) {
      show_centred(layout_.xlabel, area.x + area.width / 2.0, below + label_line.ascent);
    }
    if (first_column && !layout_.ylabel.empty()) {
      canvas::show_upright(context_, layout_.ylabel, beside - label_line.descent,
                           area.y + area.height / 2.0);
    }
  }

  double x_labels_height(const LineMetrics& tick_line) {
    if (!layout_.x_labels_rotated) return tick_line.height();
    double widest = 0.0;
    for (const Tick& tick : layout_.x_ticks) {
      widest = std::max(widest, text_width(context_, tick.label));
    }
    return widest;
  }

  void draw_colorbar() {
    const Rect& bar = layout_.colorbar;
    const double bottom = bar.y + bar.height;
    const PatternPtr gradient(cairo_pattern_create_linear(0.0, bottom, 0.0, bar.y));
    const std::span<const Rgb> anchors = reds_anchors();
    for (size_t k = 0; k < anchors.size(); ++k) {
      cairo_pattern_add_color_stop_rgb(
          gradient.get(), static_cast<double>(k) / static_cast<double>(anchors.size() - 1),
          anchors[k].red, anchors[k].green, anchors[k].blue);
    }
    cairo_rectangle(context_, bar.x, bar.y, bar.width, bar.height);
    cairo_set_source(context_, gradient.get());
    cairo_fill(context_);

    cairo_set_source_rgb(context_, 0.0, 0.0, 0.0);
    cairo_set_line_width(context_, kLineWidth);
    cairo_rectangle(context_, bar.x, bar.y, bar.width, bar.height);
    const double right = bar.x + bar.width;
    for (const Tick& tick : layout_.colorbar_ticks) {
      const double y = bottom - layout_.scale.fraction(tick.position) * bar.height;
      cairo_move_to(context_, right, y);
      cairo_line_to(context_, right + kTickLength, y);
    }
    cairo_stroke(context_);

    select_font(context_, kTickFontSize);
    const LineMetrics line = line_metrics(context_);
    for (const Tick& tick : layout_.colorbar_ticks) {
      const double y = bottom - layout_.scale.fraction(tick.position) * bar.height;
      cairo_move_to(context_, right + kTickLength + kTickPad, line.baseline(y));
      cairo_show_text(context_, tick.label.c_str());
    }
  }

  void show_centred(const std::string& text, double centre_x, double baseline) {
    canvas::show_centred(context_, text, centre_x, baseline);
  }

  cairo_t* context_;
  const HeatmapLayout& layout_;
  const float* values_;
  bool vector_;
  double device_scale_;
};

}  // namespace
}  // namespace heatmap_detail

void save_heatmaps(ConstTensorView weights, const std::filesystem::path& path,
                   const HeatmapOptions& options) {
  using namespace heatmap_detail;
  const Grid grid = infer_grid(weights.shape(), options.rows, options.cols);
  if (weights.data() == nullptr) {
    throw ValueError("save_heatmaps: weights of shape " + weights.shape().str() + " has no data",
                     "weights");
  }
  const canvas::Format format = canvas::format_of(path, kCaller);
  require_finite(weights);
  const HeatmapLayout layout = layout_heatmaps(grid, options, color_scale(weights.span()));
  const double scale = format == canvas::Format::kPng ? png_scale(layout) : 1.0;
  canvas::write_page(
      path, format, layout.width, layout.height, scale,
      [&](cairo_t* context, bool vector, double device_scale) {
        Painter(context, layout, weights.data(), vector, device_scale).paint();
      },
      kCaller);
}

}  // namespace attn
