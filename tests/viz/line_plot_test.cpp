// Tests of save_line_plot: views, round ticks, tab10 colours and legend placement of the layout,
// the PNG (read back and sampled pixel by pixel), SVG and PDF files, and every error it reports.
#include "attn/viz/line_plot.hpp"

#include <cairo.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "attn/core/error.hpp"
#include "test_support.hpp"
#include "viz/line_plot_layout.hpp"

namespace attn {
namespace {

using line_plot_detail::axis_ticks;
using line_plot_detail::axis_view;
using line_plot_detail::layout_line_plot;
using line_plot_detail::LinePlotLayout;
using line_plot_detail::png_scale;
using line_plot_detail::series_colour;
using line_plot_detail::tab10;
using Style = LineSeries::Style;

struct Pixel {
  int red = 0;
  int green = 0;
  int blue = 0;
  bool operator==(const Pixel&) const = default;
};

std::ostream& operator<<(std::ostream& out, const Pixel& pixel) {
  return out << "(" << pixel.red << ", " << pixel.green << ", " << pixel.blue << ")";
}

bool same_colour(const Pixel& actual, const Pixel& expected, int tolerance) {
  return std::abs(actual.red - expected.red) <= tolerance &&
         std::abs(actual.green - expected.green) <= tolerance &&
         std::abs(actual.blue - expected.blue) <= tolerance;
}

// Series colour i as the 8-bit pixel Cairo stores.
Pixel colour_pixel(size_t index) {
  const canvas::Rgb colour = series_colour(index);
  return {static_cast<int>(std::lround(colour.red * 255.0)),
          static_cast<int>(std::lround(colour.green * 255.0)),
          static_cast<int>(std::lround(colour.blue * 255.0))};
}

constexpr Pixel kWhite{255, 255, 255};

struct SurfaceDeleter {
  void operator()(cairo_surface_t* surface) const { cairo_surface_destroy(surface); }
};

// A PNG read back with Cairo; pixels are addressed in points of the layout at `scale`.
class PngImage {
 public:
  PngImage(const std::filesystem::path& path, double scale)
      : surface_(cairo_image_surface_create_from_png(path.c_str())), scale_(scale) {}

  bool ok() const { return cairo_surface_status(surface_.get()) == CAIRO_STATUS_SUCCESS; }
  int width() const { return cairo_image_surface_get_width(surface_.get()); }
  int height() const { return cairo_image_surface_get_height(surface_.get()); }

  Pixel at(int x, int y) const {
    EXPECT_TRUE(x >= 0 && x < width() && y >= 0 && y < height()) << x << ", " << y;
    x = std::clamp(x, 0, width() - 1);
    y = std::clamp(y, 0, height() - 1);
    const unsigned char* row =
        cairo_image_surface_get_data(surface_.get()) +
        static_cast<size_t>(y) *
            static_cast<size_t>(cairo_image_surface_get_stride(surface_.get()));
    uint32_t value = 0;
    std::memcpy(&value, row + static_cast<size_t>(x) * sizeof value, sizeof value);
    return {static_cast<int>((value >> 16U) & 0xFFU), static_cast<int>((value >> 8U) & 0xFFU),
            static_cast<int>(value & 0xFFU)};
  }

  // The pixel under the page point (x, y).
  Pixel at_point(double x, double y) const {
    return at(static_cast<int>(std::floor(x * scale_)), static_cast<int>(std::floor(y * scale_)));
  }

  // How many pixels inside `rect` (in points) have `colour`, within `tolerance` per channel.
  int64_t count(const canvas::Rect& rect, const Pixel& colour, int tolerance) const {
    return count_if(rect,
                    [&](const Pixel& pixel) { return same_colour(pixel, colour, tolerance); });
  }

  template <class Predicate>
  int64_t count_if(const canvas::Rect& rect, Predicate predicate) const {
    int64_t found = 0;
    const int left = std::max(0, static_cast<int>(std::ceil(rect.x * scale_)));
    const int right = std::min(width(), static_cast<int>(std::floor(rect.right() * scale_)));
    const int top = std::max(0, static_cast<int>(std::ceil(rect.y * scale_)));
    const int bottom = std::min(height(), static_cast<int>(std::floor(rect.bottom() * scale_)));
    for (int y = top; y < bottom; ++y) {
      for (int x = left; x < right; ++x) {
        if (predicate(at(x, y))) ++found;
      }
    }
    return found;
  }

 private:
  std::unique_ptr<cairo_surface_t, SurfaceDeleter> surface_;
  double scale_;
};

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<double> positions(const std::vector<canvas::Tick>& ticks) {
  std::vector<double> values;
  for (const auto& tick : ticks) values.push_back(tick.position);
  return values;
}

std::vector<std::string> labels(const std::vector<canvas::Tick>& ticks) {
  std::vector<std::string> texts;
  for (const auto& tick : ticks) texts.push_back(tick.label);
  return texts;
}

bool inside(const canvas::Rect& inner, const canvas::Rect& outer) {
  return inner.x >= outer.x && inner.y >= outer.y && inner.right() <= outer.right() &&
         inner.bottom() <= outer.bottom();
}

LineSeries series_of(std::string label, std::vector<double> x, std::vector<double> y,
                     Style style = Style::kLine) {
  return {std::move(label), std::move(x), std::move(y), style};
}

// x = 0, 1, ..., count − 1 with y = value everywhere.
LineSeries flat(std::string label, double value, int count, Style style = Style::kLine) {
  std::vector<double> x;
  for (int i = 0; i < count; ++i) x.push_back(i);
  return series_of(std::move(label), x, std::vector<double>(x.size(), value), style);
}

// ---- colours, views and ticks --------------------------------------------------------------

TEST(LinePlotColours, AreMatplotlibsTab10InOrderAndCycle) {
  ASSERT_EQ(tab10().size(), 10U);
  EXPECT_EQ(colour_pixel(0), (Pixel{0x1F, 0x77, 0xB4}));  // blue
  EXPECT_EQ(colour_pixel(1), (Pixel{0xFF, 0x7F, 0x0E}));  // orange
  EXPECT_EQ(colour_pixel(2), (Pixel{0x2C, 0xA0, 0x2C}));  // green
  EXPECT_EQ(colour_pixel(3), (Pixel{0xD6, 0x27, 0x28}));  // red
  EXPECT_EQ(colour_pixel(9), (Pixel{0x17, 0xBE, 0xCF}));  // cyan
  EXPECT_EQ(colour_pixel(10), colour_pixel(0));
}

TEST(LinePlotAxes, ViewAddsFivePercentMarginsAndWidensConstants) {
  const auto view = axis_view(0.0, 10.0, false, "x");
  EXPECT_DOUBLE_EQ(view.low, -0.5);
  EXPECT_DOUBLE_EQ(view.high, 10.5);
  EXPECT_DOUBLE_EQ(view.fraction(-0.5), 0.0);
  EXPECT_DOUBLE_EQ(view.fraction(5.0), 0.5);
  // A constant 4 becomes 4 ± 5%, then gets its margins: [3.8 − 0.02, 4.2 + 0.02].
  const auto constant = axis_view(4.0, 4.0, false, "y");
  EXPECT_NEAR(constant.low, 3.78, 1e-12);
  EXPECT_NEAR(constant.high, 4.22, 1e-12);
  const auto zero = axis_view(0.0, 0.0, false, "y");
  EXPECT_NEAR(zero.low, -1.1, 1e-12);
  EXPECT_NEAR(zero.high, 1.1, 1e-12);
  const double largest = std::numeric_limits<double>::max();
  EXPECT_THROW_MESSAGE(axis_view(-largest, largest, false, "x"), ValueError,
                       "x values from -1.79769e+308 to 1.79769e+308 span more than a double");
}

TEST(LinePlotAxes, TicksAreRoundNumbersInsideTheView) {
  const auto view = axis_view(0.0, 10.0, false, "x");
  EXPECT_EQ(positions(axis_ticks(view, 11)),
            (std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  EXPECT_EQ(labels(axis_ticks(view, 6)), (std::vector<std::string>{"0", "2", "4", "6", "8", "10"}));
  EXPECT_EQ(labels(axis_ticks(axis_view(0.0, 1.0, false, "y"), 6)),
            (std::vector<std::string>{"0.0", "0.2", "0.4", "0.6", "0.8", "1.0"}));
  EXPECT_EQ(labels(axis_ticks(axis_view(-0.3, 0.45, false, "y"), 8)),
            (std::vector<std::string>{"-0.3", "-0.2", "-0.1", "0.0", "0.1", "0.2", "0.3", "0.4"}));

  // Any range: 2 to max_ticks ticks, increasing, evenly spaced by 1, 2, 2.5 or 5 × 10^k, in view.
  for (const auto& [low, high] : std::vector<std::pair<double, double>>{{0.0, 1.0},
                                                                        {-3.7, 12.9},
                                                                        {1e-7, 3e-7},
                                                                        {12345.0, 12345.5},
                                                                        {-1e9, 3e9},
                                                                        {0.5, 0.5001}}) {
    const auto axis = axis_view(low, high, false, "x");
    for (int64_t max_ticks = 2; max_ticks <= 11; ++max_ticks) {
      const auto ticks = axis_ticks(axis, max_ticks);
      SCOPED_TRACE(std::to_string(low) + " to " + std::to_string(high) + ", at most " +
                   std::to_string(max_ticks));
      ASSERT_GE(ticks.size(), 2U);
      EXPECT_LE(static_cast<int64_t>(ticks.size()), max_ticks);
      const double step = ticks[1].position - ticks[0].position;
      const double mantissa = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
      EXPECT_TRUE(std::abs(mantissa - 1.0) < 1e-6 || std::abs(mantissa - 2.0) < 1e-6 ||
                  std::abs(mantissa - 2.5) < 1e-6 || std::abs(mantissa - 5.0) < 1e-6)
          << step;
      for (size_t k = 0; k < ticks.size(); ++k) {
        // Relative slack of 1e-9 of the range, which the tick search allows at the ends.
        const double slack = 1e-9 * (axis.high - axis.low);
        EXPECT_GE(ticks[k].position, axis.low - slack);
        EXPECT_LE(ticks[k].position, axis.high + slack);
        if (k > 0) {
          EXPECT_NEAR(ticks[k].position - ticks[k - 1].position, step, 1e-9 * step);
        }
      }
    }
  }
}

TEST(LinePlotAxes, LogAxesTickPowersOfTen) {
  const auto decades = axis_view(0.0, 3.0, true, "y");  // log10 of 1 … 1000
  EXPECT_EQ(labels(axis_ticks(decades, 11)), (std::vector<std::string>{"1", "10", "100", "1000"}));
  EXPECT_EQ(positions(axis_ticks(decades, 11)), (std::vector<double>{1, 10, 100, 1000}));
  const auto wide = axis_view(-12.0, 12.0, true, "y");
  EXPECT_EQ(labels(axis_ticks(wide, 6)),
            (std::vector<std::string>{"1e-10", "1e-5", "1", "1e5", "1e10"}));
  // Two powers of ten or fewer in view: 2 and 5 times them join them.
  const auto loss = axis_view(std::log10(0.4), std::log10(50.9), true, "y");
  EXPECT_EQ(labels(axis_ticks(loss, 10)),
            (std::vector<std::string>{"0.5", "1", "2", "5", "10", "20", "50"}));
  EXPECT_EQ(labels(axis_ticks(loss, 5)), (std::vector<std::string>{"1", "10"}));
  const auto narrow = axis_view(std::log10(1.5), std::log10(6.0), true, "y");
  EXPECT_EQ(labels(axis_ticks(narrow, 11)), (std::vector<std::string>{"2", "5"}));
  // Narrower still: round values as on a linear axis, all positive.
  const auto narrowest = axis_view(std::log10(3.0), std::log10(4.0), true, "y");
  const auto ticks = axis_ticks(narrowest, 6);
  ASSERT_GE(ticks.size(), 2U);
  for (const auto& tick : ticks) {
    EXPECT_GT(tick.position, 2.9);
    EXPECT_LT(tick.position, 4.1);
  }
}

// ---- layout --------------------------------------------------------------------------------

TEST(LinePlotLayout, PlotAreaSitsInsideThePageWithLabelsAround) {
  LinePlotOptions options;
  options.title = "Training loss";
  options.xlabel = "epoch";
  options.ylabel = "loss";
  const std::vector<LineSeries> series{series_of("loss", {1, 2, 3, 4, 5}, {50, 40, 30, 25, 22})};
  const LinePlotLayout layout = layout_line_plot(series, options);
  EXPECT_DOUBLE_EQ(layout.width, 480.0);
  EXPECT_DOUBLE_EQ(layout.height, 320.0);
  EXPECT_TRUE(inside(layout.axes, {0.0, 0.0, 480.0, 320.0}));
  // Room for the y tick labels and label on the left, the title above, the x labels below.
  EXPECT_GT(layout.axes.x, 30.0);
  EXPECT_GT(layout.axes.y, 15.0);
  EXPECT_LT(layout.axes.bottom(), 320.0 - 25.0);
  EXPECT_GT(layout.axes.width, 350.0);
  EXPECT_EQ(layout.title, "Training loss");
  EXPECT_EQ(positions(layout.x.ticks),
            (std::vector<double>{1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0}));
  // Data map to the page with y growing upwards.
  EXPECT_NEAR(layout.page_x(0.8), layout.axes.x, 1e-9);
  EXPECT_NEAR(layout.page_x(5.2), layout.axes.right(), 1e-9);
  EXPECT_NEAR(layout.page_y(50.0 + 1.4), layout.axes.y, 1e-9);
  EXPECT_NEAR(layout.page_y(22.0 - 1.4), layout.axes.bottom(), 1e-9);
  EXPECT_DOUBLE_EQ(png_scale(layout), 2.0);
}

TEST(LinePlotLayout, LegendListsLabelledSeriesWhereItHidesTheLeastData) {
  // Lines along the top and one point in the lower left: the legend goes to the lower right,
  // matplotlib's first preference after the upper corners and the lower left.
  const std::vector<LineSeries> high{flat("a", 1.0, 11), series_of("", {0}, {0}, Style::kMarkers),
                                     series_of("c", {0, 10}, {0.9, 0.9}, Style::kDashed)};
  const LinePlotLayout layout = layout_line_plot(high, {});
  ASSERT_EQ(layout.legend_entries.size(), 2U);
  EXPECT_EQ(layout.legend_entries[0].series, 0U);
  EXPECT_EQ(layout.legend_entries[0].label, "a");
  EXPECT_EQ(layout.legend_entries[1].series, 2U);
  EXPECT_TRUE(inside(layout.legend, layout.axes));
  EXPECT_GT(layout.legend.y, layout.page_y(0.9));
  EXPECT_NEAR(layout.legend.right(), layout.axes.right() - 5.0, 1e-9);

  // Points in the upper right push it to the upper left.
  const std::vector<LineSeries> corner{
      series_of("points", {0, 9, 10, 9.5}, {0, 10, 9, 9.5}, Style::kMarkers)};
  const LinePlotLayout moved = layout_line_plot(corner, {});
  EXPECT_NEAR(moved.legend.x, moved.axes.x + 5.0, 1e-9);
  EXPECT_NEAR(moved.legend.y, moved.axes.y + 5.0, 1e-9);

  EXPECT_TRUE(layout_line_plot({flat("", 1.0, 3)}, {}).legend_entries.empty());
}

TEST(LinePlotLayout, PngScaleDropsToOneThenRefuses) {
  LinePlotOptions options;
  // 28000 × 4000 pixels at 2 per point exceed the 64 Mi pixels of a Cairo image; 14000 × 2000
  // do not.
  options.width = 14000.0;
  options.height = 2000.0;
  EXPECT_DOUBLE_EQ(png_scale(layout_line_plot({flat("", 1.0, 3)}, options)), 1.0);
  options.height = 12000.0;
  EXPECT_THROW_MESSAGE(png_scale(layout_line_plot({flat("", 1.0, 3)}, options)), ValueError,
                       "use a smaller width or height, or .svg / .pdf");
}

// ---- files ---------------------------------------------------------------------------------

class LinePlotFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    directory_ = std::filesystem::temp_directory_path() /
                 ("attn_line_plot_test_" + std::to_string(::getpid()) + "_" + info->name() + "_" +
                  std::to_string(counter++));
    std::filesystem::remove_all(directory_);
    std::filesystem::create_directories(directory_);
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(directory_, ignored);
  }
  std::filesystem::path file(const std::string& name) const { return directory_ / name; }

  std::filesystem::path directory_;
};

TEST_F(LinePlotFiles, PngHasThePageSizeAndTheLineWhereItBelongs) {
  // A solid line at y = 1 and a dashed one at y = 0 across x = 0 … 10.
  const std::vector<LineSeries> series{flat("solid", 1.0, 11),
                                       flat("dashed", 0.0, 11, Style::kDashed)};
  const auto path = file("lines.png");
  save_line_plot(series, path);
  EXPECT_EQ(read_file(path).substr(0, 8), std::string("\x89PNG\r\n\x1A\n", 8));

  const LinePlotLayout layout = layout_line_plot(series, {});
  const double scale = png_scale(layout);
  const PngImage image(path, scale);
  ASSERT_TRUE(image.ok());
  EXPECT_EQ(image.width(), 960);
  EXPECT_EQ(image.height(), 640);

  // The solid line is 1.5 points (3 pixels) thick, so the pixel under its centre is covered
  // completely and carries the series colour exactly; 1 level allows for Cairo's rounding.
  const double line_y = layout.page_y(1.0);
  int sampled = 0;
  for (double x = 0.5; x < 10.0; x += 1.0) {
    const double page_x = layout.page_x(x);
    const canvas::Rect& legend = layout.legend;
    if (page_x >= legend.x - 2.0 && page_x <= legend.right() + 2.0 && line_y >= legend.y - 2.0 &&
        line_y <= legend.bottom() + 2.0) {
      continue;
    }
    EXPECT_TRUE(same_colour(image.at_point(page_x, line_y), colour_pixel(0), 1))
        << "x = " << x << ": " << image.at_point(page_x, line_y);
    // 3 points above and below is background: white or the grey of a grid line.
    for (const double offset : {-3.0, 3.0}) {
      const Pixel beside = image.at_point(page_x, line_y + offset);
      EXPECT_EQ(beside.red, beside.blue) << "x = " << x << ", offset " << offset << ": " << beside;
    }
    ++sampled;
  }
  EXPECT_GE(sampled, 7);

  // The dashed line alternates along its length between its colour and the background (white or
  // the grey grid line at y = 0 under it, both neutral); dashes are 5.55 points on, 2.4 off.
  const canvas::Rect dashed_band{layout.page_x(1.0), layout.page_y(0.0) - 0.5,
                                 layout.page_x(9.0) - layout.page_x(1.0), 1.0};
  const int64_t coloured = image.count(dashed_band, colour_pixel(1), 1);
  const int64_t neutral =
      image.count_if(dashed_band, [](const Pixel& pixel) { return pixel.red == pixel.blue; });
  EXPECT_GT(coloured, 300);
  EXPECT_GT(neutral, 100);
}

TEST_F(LinePlotFiles, LegendShowsEverySeriesColour) {
  const std::vector<LineSeries> series{
      series_of("Truth", {0, 1, 2, 3, 4}, {0, 1, 2, 3, 4}),
      series_of("Pred", {0, 1, 2, 3, 4}, {0.5, 1.5, 2.5, 3.5, 4.5}, Style::kDashed),
      series_of("Data", {0, 2, 4}, {1, 2, 3}, Style::kMarkers)};
  const auto path = file("legend.png");
  save_line_plot(series, path);
  const LinePlotLayout layout = layout_line_plot(series, {});
  ASSERT_EQ(layout.legend_entries.size(), 3U);
  const PngImage image(path, png_scale(layout));
  ASSERT_TRUE(image.ok());
  // The legend covers no data (it goes where it hides none), so every series colour inside it
  // comes from its sample: a 20-point line or a marker, tens of pixels each.
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_GT(image.count(layout.legend, colour_pixel(s), 1), 20) << "series " << s;
  }
  EXPECT_EQ(image.count(layout.legend, colour_pixel(3), 1), 0);
  // Its labels are black text on white.
  EXPECT_GT(image.count(layout.legend, Pixel{0, 0, 0}, 10), 10);
}

TEST_F(LinePlotFiles, MarkersAndLogAxesLandOnTheirPoints) {
  LinePlotOptions options;
  options.log_y = true;
  const std::vector<LineSeries> series{
      series_of("", {1, 2, 3, 4}, {1, 10, 100, 1000}, Style::kMarkers)};
  const auto path = file("log.png");
  save_line_plot(series, path, options);
  const LinePlotLayout layout = layout_line_plot(series, options);
  const PngImage image(path, png_scale(layout));
  // On a log axis the four points are evenly spaced.
  EXPECT_NEAR(layout.page_y(10.0) - layout.page_y(100.0), layout.page_y(1.0) - layout.page_y(10.0),
              1e-9);
  for (size_t i = 0; i < 4; ++i) {
    const double x = layout.page_x(series[0].x[i]);
    const double y = layout.page_y(series[0].y[i]);
    EXPECT_TRUE(same_colour(image.at_point(x, y), colour_pixel(0), 1)) << i;
    // The marker is 7 points across: 6 points away is no longer marker.
    EXPECT_FALSE(same_colour(image.at_point(x + 6.0, y), colour_pixel(0), 40)) << i;
  }
}

TEST_F(LinePlotFiles, SvgAndPdfHaveTheirSignatures) {
  const std::vector<LineSeries> series{flat("a", 1.0, 5), flat("b", 2.0, 5, Style::kDashed)};
  LinePlotOptions options;
  options.width = 300.0;
  options.height = 200.0;
  save_line_plot(series, file("plot.svg"), options);
  const std::string svg = read_file(file("plot.svg"));
  EXPECT_EQ(svg.rfind("<?xml", 0), 0U);
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("width=\"300\""), std::string::npos) << svg.substr(0, 300);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);

  save_line_plot(series, file("plot.pdf"), options);
  const std::string pdf = read_file(file("plot.pdf"));
  EXPECT_EQ(pdf.rfind("%PDF-", 0), 0U);
  EXPECT_NE(pdf.find("%%EOF", pdf.size() - 16), std::string::npos);

  // Extensions in any case.
  save_line_plot(series, file("upper.PNG"), options);
  EXPECT_TRUE(PngImage(file("upper.PNG"), 2.0).ok());
}

TEST_F(LinePlotFiles, DrawsManyPointsAndOddLabels) {
  LineSeries wave{"sin \xFF\xFE", {}, {}, Style::kLine};
  for (int i = 0; i < 20000; ++i) {
    wave.x.push_back(i * 1e-3);
    wave.y.push_back(std::sin(i * 1e-3));
  }
  LinePlotOptions options;
  options.title = std::string(500, 'T');  // cut with an ellipsis
  options.ylabel = "\xC0";
  const auto path = file("wave.png");
  save_line_plot({wave, flat("one point", 0.0, 1, Style::kMarkers)}, path, options);
  EXPECT_TRUE(PngImage(path, 2.0).ok());
  const LinePlotLayout layout = layout_line_plot({wave}, options);
  EXPECT_EQ(layout.legend_entries[0].label, "sin ??");
  EXPECT_TRUE(layout.title.ends_with("\xE2\x80\xA6"));
}

// ---- errors --------------------------------------------------------------------------------

TEST_F(LinePlotFiles, RejectsBadSeriesBeforeWriting) {
  const auto path = file("bad.png");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_THROW_MESSAGE(save_line_plot({}, path), ValueError, "no series to draw");
  EXPECT_THROW_MESSAGE(save_line_plot({flat("a", 1.0, 3), series_of("b", {1, 2}, {1})}, path),
                       ValueError, "series 1 ('b'): x has 2 values but y has 1");
  EXPECT_THROW_MESSAGE(save_line_plot({series_of("", {}, {})}, path), ValueError,
                       "series 0 is empty");
  EXPECT_THROW_MESSAGE(save_line_plot({series_of("c", {0, 1, 2}, {0, nan, 2})}, path), ValueError,
                       "series 0 ('c'): y[1] is nan; values must be finite");
  EXPECT_THROW_MESSAGE(save_line_plot({series_of("", {0, -inf}, {0, 1})}, path), ValueError,
                       "x[1] is -inf");
  EXPECT_THROW_MESSAGE(save_line_plot({series_of("", {0, 1}, {inf, 1})}, path), ValueError,
                       "y[0] is inf");
  LinePlotOptions log;
  log.log_y = true;
  EXPECT_THROW_MESSAGE(save_line_plot({series_of("loss", {0, 1, 2}, {3, 1, 0})}, path, log),
                       ValueError, "series 0 ('loss'): y[2] is 0; a logarithmic y axis");
  EXPECT_THROW_MESSAGE(save_line_plot({series_of("", {0}, {-2})}, path, log), ValueError,
                       "y[0] is -2");
  EXPECT_THROW_MESSAGE(save_line_plot({series_of("", {0}, {0}, static_cast<Style>(7))}, path),
                       ValueError, "unknown style 7");
  const double largest = std::numeric_limits<double>::max();
  EXPECT_THROW_MESSAGE(save_line_plot({series_of("", {0, 1}, {-largest, largest})}, path),
                       ValueError, "y values from");
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST_F(LinePlotFiles, RejectsPageSizesOutOfRange) {
  const auto path = file("size.png");
  for (const double side : {0.0, -10.0, 49.0, 20000.0, std::nan("")}) {
    LinePlotOptions wide;
    wide.width = side;
    EXPECT_THROW_MESSAGE(save_line_plot({flat("", 1.0, 3)}, path, wide), ValueError,
                         "width must be between 50 and 14400 points");
    LinePlotOptions tall;
    tall.height = side;
    EXPECT_THROW_MESSAGE(save_line_plot({flat("", 1.0, 3)}, path, tall), ValueError,
                         "height must be between 50 and 14400 points");
  }
  // 60 points are a legal height, but the labels leave no room for the plot.
  LinePlotOptions cramped;
  cramped.height = 60.0;
  cramped.title = "title";
  cramped.xlabel = "x";
  EXPECT_THROW_MESSAGE(save_line_plot({flat("", 1.0, 3)}, path, cramped), ValueError,
                       "too little room for the plot area");
  LinePlotOptions huge;
  huge.width = 14000.0;
  huge.height = 14000.0;
  EXPECT_THROW_MESSAGE(save_line_plot({flat("", 1.0, 3)}, path, huge), ValueError, ".svg / .pdf");
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST_F(LinePlotFiles, RejectsUnknownExtensionsAndUnwritablePaths) {
  const auto jpeg = file("plot.jpg");
  EXPECT_THROW_MESSAGE(save_line_plot({flat("", 1.0, 3)}, jpeg), FileError, jpeg.string());
  EXPECT_THROW_MESSAGE(save_line_plot({flat("", 1.0, 3)}, jpeg), FileError,
                       "unknown extension '.jpg', expected .png, .svg or .pdf");
  EXPECT_THROW_MESSAGE(save_line_plot({flat("", 1.0, 3)}, file("no_extension")), FileError,
                       "save_line_plot: cannot save");
  EXPECT_FALSE(std::filesystem::exists(jpeg));
  for (const std::string name : {"plot.png", "plot.svg", "plot.pdf"}) {
    const auto path = file("missing_directory") / name;
    EXPECT_THROW_MESSAGE(save_line_plot({flat("", 1.0, 3)}, path), FileError, path.string());
  }
}

}  // namespace
}  // namespace attn
