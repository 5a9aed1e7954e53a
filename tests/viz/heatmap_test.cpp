// Tests of save_heatmaps: grid inference, the 'Reds' colour map and colour scale, the layout, and
// the PNG (read back and sampled pixel by pixel), SVG and PDF files, and every error it reports.
#include "attn/viz/heatmap.hpp"

#include <cairo.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/core/tensor.hpp"
#include "test_support.hpp"
#include "viz/heatmap_layout.hpp"

namespace attn {
namespace {

using heatmap_detail::color_scale;
using heatmap_detail::HeatmapLayout;
using heatmap_detail::infer_grid;
using heatmap_detail::layout_heatmaps;
using heatmap_detail::png_scale;
using heatmap_detail::reds;
using heatmap_detail::Rgb;
using heatmap_detail::valid_utf8;

struct Pixel {
  int red = 0;
  int green = 0;
  int blue = 0;
};

std::ostream& operator<<(std::ostream& out, const Pixel& pixel) {
  return out << "(" << pixel.red << ", " << pixel.green << ", " << pixel.blue << ")";
}

// |a − b| ≤ tolerance in every channel.
::testing::AssertionResult same_colour(const Pixel& actual, const Pixel& expected, int tolerance) {
  if (std::abs(actual.red - expected.red) <= tolerance &&
      std::abs(actual.green - expected.green) <= tolerance &&
      std::abs(actual.blue - expected.blue) <= tolerance) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "pixel " << actual << " differs from " << expected << " by more than " << tolerance;
}

// The colour map at `fraction` as the 8-bit pixel the drawing stores.
Pixel reds_pixel(double fraction) {
  const Rgb colour = reds(fraction);
  return {static_cast<int>(std::lround(colour.red * 255.0)),
          static_cast<int>(std::lround(colour.green * 255.0)),
          static_cast<int>(std::lround(colour.blue * 255.0))};
}

constexpr Pixel kLowColour{255, 245, 240};
constexpr Pixel kHighColour{103, 0, 13};
constexpr Pixel kWhite{255, 255, 255};

struct SurfaceDeleter {
  void operator()(cairo_surface_t* surface) const { cairo_surface_destroy(surface); }
};

// A PNG read back with Cairo.
class PngImage {
 public:
  explicit PngImage(const std::filesystem::path& path)
      : surface_(cairo_image_surface_create_from_png(path.c_str())) {}

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

  // The pixel under the point (x, y) of the layout, drawn at `scale` pixels per point.
  Pixel at_point(double x, double y, double scale) const {
    return at(static_cast<int>(std::floor(x * scale)), static_cast<int>(std::floor(y * scale)));
  }

 private:
  std::unique_ptr<cairo_surface_t, SurfaceDeleter> surface_;
};

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The layout save_heatmaps computes for these weights and options.
HeatmapLayout layout_for(const Tensor& weights, const HeatmapOptions& options = {}) {
  return layout_heatmaps(infer_grid(weights.shape(), options.rows, options.cols), options,
                         color_scale(weights.span()));
}

Tensor identity(int64_t size) {
  Tensor eye(Shape{size, size});
  for (int64_t i = 0; i < size; ++i) eye(i, i) = 1.0F;
  return eye;
}

// Each test writes into its own fresh directory, removed afterwards.
class HeatmapFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    directory_ = std::filesystem::temp_directory_path() /
                 ("attn_viz_test_" + std::to_string(::getpid()) + "_" + info->name() + "_" +
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

// ---- grid inference ------------------------------------------------------------------------

TEST(HeatmapGrid, InfersOnePanelFromRankTwo) {
  const auto grid = infer_grid(Shape{3, 5}, 0, 0);
  EXPECT_EQ(grid.rows, 1);
  EXPECT_EQ(grid.cols, 1);
  EXPECT_EQ(grid.n, 3);
  EXPECT_EQ(grid.m, 5);
}

TEST(HeatmapGrid, InfersOneRowFromRankThree) {
  const auto grid = infer_grid(Shape{4, 3, 5}, 0, 0);
  EXPECT_EQ(grid.rows, 1);
  EXPECT_EQ(grid.cols, 4);
  EXPECT_EQ(grid.n, 3);
  EXPECT_EQ(grid.m, 5);
}

TEST(HeatmapGrid, InfersRowsAndColsFromRankFour) {
  const auto grid = infer_grid(Shape{2, 3, 4, 5}, 0, 0);
  EXPECT_EQ(grid.rows, 2);
  EXPECT_EQ(grid.cols, 3);
  EXPECT_EQ(grid.n, 4);
  EXPECT_EQ(grid.m, 5);
}

TEST(HeatmapGrid, TakesAnExplicitGridWithTheRightPanelCount) {
  const auto grid = infer_grid(Shape{6, 2, 2}, 2, 3);
  EXPECT_EQ(grid.rows, 2);
  EXPECT_EQ(grid.cols, 3);
  const auto rearranged = infer_grid(Shape{2, 3, 2, 2}, 3, 2);
  EXPECT_EQ(rearranged.rows, 3);
  EXPECT_EQ(rearranged.cols, 2);
}

TEST(HeatmapGrid, CompletesAGridGivenOnlyRowsOrCols) {
  const auto by_rows = infer_grid(Shape{6, 2, 2}, 2, 0);
  EXPECT_EQ(by_rows.rows, 2);
  EXPECT_EQ(by_rows.cols, 3);
  const auto by_cols = infer_grid(Shape{6, 2, 2}, 0, 6);
  EXPECT_EQ(by_cols.rows, 1);
  EXPECT_EQ(by_cols.cols, 6);
}

TEST(HeatmapGrid, RejectsAGridThatDoesNotHoldThePanels) {
  EXPECT_THROW_MESSAGE(infer_grid(Shape{4, 2, 2}, 3, 2), ShapeError, "rows = 3, cols = 2");
  EXPECT_THROW_MESSAGE(infer_grid(Shape{4, 2, 2}, 3, 2), ShapeError, "the 4 panels");
  EXPECT_THROW_MESSAGE(infer_grid(Shape{2, 2, 2, 2}, 1, 2), ShapeError, "the 4 panels");
  EXPECT_THROW_MESSAGE(infer_grid(Shape{4, 2, 2}, 3, 0), ShapeError, "3 does not divide 4");
  EXPECT_THROW_MESSAGE(infer_grid(Shape{4, 2, 2}, 0, -1), ShapeError, "cols = -1");
  // A product that would overflow int64 is still a plain mismatch.
  const int64_t huge = std::numeric_limits<int64_t>::max() / 2;
  EXPECT_THROW_MESSAGE(infer_grid(Shape{4, 2, 2}, huge, huge), ShapeError, "the 4 panels");
}

TEST(HeatmapGrid, RejectsOtherRanksAndEmptyMatrices) {
  EXPECT_THROW_MESSAGE(infer_grid(Shape{5}, 0, 0), ShapeError, "got shape (5,)");
  EXPECT_THROW_MESSAGE(infer_grid(Shape{}, 0, 0), ShapeError, "rank 2");
  EXPECT_THROW_MESSAGE(infer_grid(Shape{0, 3}, 0, 0), ShapeError, "(0, 3)");
  EXPECT_THROW_MESSAGE(infer_grid(Shape{2, 3, 0}, 0, 0), ShapeError, "n and m must be at least 1");
  EXPECT_THROW_MESSAGE(infer_grid(Shape{0, 3, 3}, 0, 0), ShapeError, "no panels");
}

// ---- colour map and scale ------------------------------------------------------------------

TEST(HeatmapColours, RedsRunsFromNearWhiteToDarkRed) {
  EXPECT_TRUE(same_colour(reds_pixel(0.0), kLowColour, 0));
  EXPECT_TRUE(same_colour(reds_pixel(1.0), kHighColour, 0));
  // The middle anchor of ColorBrewer's nine, #fb6a4a.
  EXPECT_TRUE(same_colour(reds_pixel(0.5), {251, 106, 74}, 0));
  // Halfway between the first two anchors #fff5f0 and #fee0d2 (254.5 and 234.5 round up).
  EXPECT_TRUE(same_colour(reds_pixel(1.0 / 16.0), {255, 235, 225}, 0));
  EXPECT_TRUE(same_colour(reds_pixel(-3.0), kLowColour, 0));
  EXPECT_TRUE(same_colour(reds_pixel(7.0), kHighColour, 0));
  EXPECT_TRUE(same_colour(reds_pixel(std::nan("")), kLowColour, 0));
}

TEST(HeatmapColours, RedsDarkensSteadily) {
  double previous = 4.0;
  for (int step = 0; step <= 100; ++step) {
    const Rgb colour = reds(step / 100.0);
    const double brightness = colour.red + colour.green + colour.blue;
    EXPECT_LT(brightness, previous) << "at " << step / 100.0;
    previous = brightness;
  }
}

TEST(HeatmapColours, ScaleRunsFromZeroOrTheLowestToTheHighest) {
  const std::vector<float> positive{0.2F, 0.8F, 0.5F};
  EXPECT_DOUBLE_EQ(color_scale(positive).low, 0.0);
  EXPECT_DOUBLE_EQ(color_scale(positive).high, 0.8F);
  const std::vector<float> mixed{-1.0F, 3.0F};
  EXPECT_DOUBLE_EQ(color_scale(mixed).low, -1.0);
  EXPECT_DOUBLE_EQ(color_scale(mixed).high, 3.0);
  EXPECT_DOUBLE_EQ(color_scale(mixed).fraction(1.0), 0.5);
  const std::vector<float> negative{-2.0F, -1.0F};
  EXPECT_DOUBLE_EQ(color_scale(negative).low, -2.0);
  EXPECT_DOUBLE_EQ(color_scale(negative).high, -1.0);
}

TEST(HeatmapColours, ScaleOfZeroWidthGetsAUnitRange) {
  const std::vector<float> zeros{0.0F, 0.0F};
  EXPECT_DOUBLE_EQ(color_scale(zeros).low, 0.0);
  EXPECT_DOUBLE_EQ(color_scale(zeros).high, 1.0);
  EXPECT_DOUBLE_EQ(color_scale(zeros).fraction(0.0), 0.0);
  const std::vector<float> negative{-2.0F};
  EXPECT_DOUBLE_EQ(color_scale(negative).low, -2.0);
  EXPECT_DOUBLE_EQ(color_scale(negative).high, -1.0);
}

// ---- layout --------------------------------------------------------------------------------

bool inside(const heatmap_detail::Rect& rect, const HeatmapLayout& layout) {
  return rect.x >= 0.0 && rect.y >= 0.0 && rect.x + rect.width <= layout.width &&
         rect.y + rect.height <= layout.height;
}

TEST(HeatmapLayout, SquareMatrixFillsAPanelOfSquareCells) {
  const HeatmapLayout layout = layout_for(identity(10));
  ASSERT_EQ(layout.panels.size(), 1U);
  EXPECT_DOUBLE_EQ(layout.panels[0].width, 180.0);
  EXPECT_DOUBLE_EQ(layout.panels[0].height, 180.0);
  EXPECT_DOUBLE_EQ(layout.cell_width, 18.0);
  EXPECT_DOUBLE_EQ(layout.cell_height, 18.0);
  EXPECT_TRUE(inside(layout.panels[0], layout));
  EXPECT_TRUE(inside(layout.colorbar, layout));
  EXPECT_GT(layout.colorbar.x, layout.panels[0].x + layout.panels[0].width);
}

TEST(HeatmapLayout, ChoosesAFewIntegerTicks) {
  const HeatmapLayout layout = layout_for(identity(10));
  std::vector<double> positions;
  for (const auto& tick : layout.y_ticks) positions.push_back(tick.position);
  EXPECT_EQ(positions, (std::vector<double>{0, 2, 4, 6, 8}));
  ASSERT_EQ(layout.x_ticks.size(), 5U);
  EXPECT_EQ(layout.x_ticks[4].label, "8");
  EXPECT_FALSE(layout.x_labels_rotated);

  const HeatmapLayout wide = layout_for(Tensor(Shape{200, 500}));
  std::vector<std::string> labels;
  for (const auto& tick : wide.x_ticks) labels.push_back(tick.label);
  EXPECT_EQ(labels, (std::vector<std::string>{"0", "100", "200", "300", "400"}));
  EXPECT_DOUBLE_EQ(wide.panels[0].width, 180.0);
  EXPECT_DOUBLE_EQ(wide.panels[0].height, 72.0);
  EXPECT_DOUBLE_EQ(wide.cell_width, wide.cell_height);
}

TEST(HeatmapLayout, ColourBarTicksAreRoundValuesWithoutNegativeZero) {
  const HeatmapLayout layout = layout_for(identity(10));
  std::vector<std::string> labels;
  for (const auto& tick : layout.colorbar_ticks) labels.push_back(tick.label);
  EXPECT_EQ(labels, (std::vector<std::string>{"0.0", "0.2", "0.4", "0.6", "0.8", "1.0"}));

  Tensor mixed(Shape{2, 2}, {-600.0F, 0.0F, 1000.0F, 1800.0F});
  std::vector<std::string> mixed_labels;
  for (const auto& tick : layout_for(mixed).colorbar_ticks) mixed_labels.push_back(tick.label);
  EXPECT_EQ(mixed_labels, (std::vector<std::string>{"-500", "0", "500", "1000", "1500"}));
}

TEST(HeatmapLayout, PlacesPanelsRowMajorWithoutOverlap) {
  HeatmapOptions options;
  options.titles = {"a", "b", "c", "d", "e", "f"};
  const HeatmapLayout layout = layout_for(Tensor(Shape{2, 3, 4, 4}), options);
  ASSERT_EQ(layout.panels.size(), 6U);
  for (size_t panel = 0; panel < 6; ++panel) {
    const auto& area = layout.panels[panel];
    EXPECT_TRUE(inside(area, layout)) << panel;
    if (panel % 3 != 0) {
      const auto& left = layout.panels[panel - 1];
      EXPECT_DOUBLE_EQ(area.y, left.y);
      EXPECT_GT(area.x, left.x + left.width) << panel;
    }
    if (panel >= 3) {
      const auto& above = layout.panels[panel - 3];
      EXPECT_DOUBLE_EQ(area.x, above.x);
      EXPECT_GT(area.y, above.y + above.height) << panel;
    }
  }
  EXPECT_GT(layout.colorbar.x, layout.panels[2].x + layout.panels[2].width);
  EXPECT_EQ(layout.titles, options.titles);
}

TEST(HeatmapLayout, KeepsAOneRowMatrixVisible) {
  const HeatmapLayout layout = layout_for(Tensor(Shape{1, 60}));
  EXPECT_DOUBLE_EQ(layout.panels[0].width, 180.0);
  // A quarter of the panel size rather than 3 points.
  EXPECT_DOUBLE_EQ(layout.panels[0].height, 45.0);
  EXPECT_DOUBLE_EQ(layout.cell_width, 3.0);
}

TEST(HeatmapLayout, ShowsEveryTokenThatFitsAndTurnsLongOnesUpright) {
  HeatmapOptions options;
  options.x_tick_labels = {"<bos>", "the", "cat", "sat", "on", "the", "mat", ".", "<eos>"};
  options.y_tick_labels = {"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"};
  const HeatmapLayout layout = layout_for(Tensor(Shape{12, 9}), options);
  ASSERT_EQ(layout.x_ticks.size(), 9U);
  ASSERT_EQ(layout.y_ticks.size(), 12U);
  EXPECT_EQ(layout.x_ticks[8].label, "<eos>");
  EXPECT_EQ(layout.y_ticks[11].label, "l");
  EXPECT_TRUE(layout.x_labels_rotated);
}

TEST(HeatmapLayout, CutsOverlongTokensWithAnEllipsis) {
  HeatmapOptions options;
  options.x_tick_labels = {std::string(500, 'w'), "b"};
  const HeatmapLayout layout = layout_for(Tensor(Shape{2, 2}), options);
  ASSERT_EQ(layout.x_ticks.size(), 2U);
  const std::string& cut = layout.x_ticks[0].label;
  EXPECT_LT(cut.size(), 100U);
  EXPECT_EQ(cut.substr(cut.size() - 3), "\xE2\x80\xA6");
  EXPECT_EQ(layout.x_ticks[1].label, "b");
}

TEST(HeatmapLayout, ThinsOutTokensTooCrowdedToRead) {
  HeatmapOptions options;
  for (int i = 0; i < 100; ++i) options.y_tick_labels.push_back("t" + std::to_string(i));
  const HeatmapLayout layout = layout_for(Tensor(Shape{100, 100}), options);
  // 1.8-point cells: a 9-point font needs every fifth or tenth label.
  ASSERT_LT(layout.y_ticks.size(), 25U);
  ASSERT_GE(layout.y_ticks.size(), 2U);
  EXPECT_EQ(layout.y_ticks[1].label,
            "t" + std::to_string(static_cast<int>(layout.y_ticks[1].position)));
}

TEST(HeatmapLayout, RejectsLabelCountsThatDoNotMatch) {
  HeatmapOptions titles;
  titles.titles = {"only one"};
  EXPECT_THROW_MESSAGE(layout_for(Tensor(Shape{3, 2, 2}), titles), ValueError,
                       "expected 3 titles (one per panel) or none, got 1");
  HeatmapOptions x_labels;
  x_labels.x_tick_labels = {"a", "b"};
  EXPECT_THROW_MESSAGE(layout_for(Tensor(Shape{2, 3}), x_labels), ValueError,
                       "expected 3 x_tick_labels");
  HeatmapOptions y_labels;
  y_labels.y_tick_labels = {"a", "b", "c"};
  EXPECT_THROW_MESSAGE(layout_for(Tensor(Shape{2, 3}), y_labels), ValueError,
                       "expected 2 y_tick_labels");
}

TEST(HeatmapLayout, RejectsPanelSizesOutOfRange) {
  for (const double size : {0.0, -5.0, 1e6, std::nan("")}) {
    HeatmapOptions options;
    options.panel_size = size;
    EXPECT_THROW_MESSAGE(layout_for(identity(2), options), ValueError, "panel_size");
  }
}

TEST(HeatmapLayout, PngScaleDropsToOneThenRefuses) {
  EXPECT_DOUBLE_EQ(png_scale(layout_for(identity(3))), 2.0);
  // 100 panels side by side are about 19 000 points wide: too wide at 2 pixels per point.
  EXPECT_DOUBLE_EQ(png_scale(layout_for(Tensor(Shape{1, 100, 2, 2}))), 1.0);
  EXPECT_THROW_MESSAGE(png_scale(layout_for(Tensor(Shape{1, 400, 2, 2}))), ValueError,
                       "use fewer panels");
}

TEST(HeatmapText, ReplacesInvalidUtf8) {
  EXPECT_EQ(valid_utf8("a\xFF"
                       "b"),
            "a?b");
  EXPECT_EQ(valid_utf8("caf\xC3\xA9"), "caf\xC3\xA9");
  EXPECT_EQ(valid_utf8("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
  EXPECT_EQ(valid_utf8("\xC0\xAF"), "??");            // overlong '/'
  EXPECT_EQ(valid_utf8("\xED\xA0\x80"), "???");       // a UTF-16 surrogate
  EXPECT_EQ(valid_utf8("x\xE2\x82"), "x??");          // cut short
  EXPECT_EQ(valid_utf8("\xF4\x90\x80\x80"), "????");  // beyond U+10FFFF
  EXPECT_EQ(valid_utf8("a\nb\tc"), "a b c");
}

// ---- files ---------------------------------------------------------------------------------

TEST_F(HeatmapFiles, PngHasTheLayoutsSizeAndCellColours) {
  const Tensor weights(Shape{2, 2}, {0.0F, 1.0F, 1.0F, 0.0F});
  const auto path = file("cells.png");
  save_heatmaps(weights, path);

  const std::string bytes = read_file(path);
  ASSERT_GE(bytes.size(), 8U);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1A\n", 8));

  const HeatmapLayout layout = layout_for(weights);
  const double scale = png_scale(layout);
  const PngImage image(path);
  ASSERT_TRUE(image.ok());
  EXPECT_EQ(image.width(), static_cast<int>(std::ceil(layout.width * scale)));
  EXPECT_EQ(image.height(), static_cast<int>(std::ceil(layout.height * scale)));

  // Cells are painted as one nearest-neighbour pixel each, so their centres carry the colour map's
  // 8-bit colour exactly.
  const auto centre = [&](int64_t i, int64_t j) {
    const auto cell = layout.cell(0, i, j);
    return image.at_point(cell.x + cell.width / 2.0, cell.y + cell.height / 2.0, scale);
  };
  EXPECT_TRUE(same_colour(centre(0, 0), kLowColour, 0));
  EXPECT_TRUE(same_colour(centre(0, 1), kHighColour, 0));
  EXPECT_TRUE(same_colour(centre(1, 0), kHighColour, 0));
  EXPECT_TRUE(same_colour(centre(1, 1), kLowColour, 0));
  EXPECT_TRUE(same_colour(image.at(1, 1), kWhite, 0));
}

TEST_F(HeatmapFiles, ColourBarRunsFromLowAtTheBottomToHighAtTheTop) {
  const auto path = file("bar.png");
  const Tensor weights = identity(4);
  save_heatmaps(weights, path);
  const HeatmapLayout layout = layout_for(weights);
  const double scale = png_scale(layout);
  const PngImage image(path);
  ASSERT_TRUE(image.ok());
  const auto& bar = layout.colorbar;
  const double middle = bar.x + bar.width / 2.0;
  // Sampled 2 points inside the ends: the gradient changes by at most 62 levels over an eighth of
  // the bar (≥ 12.5 points), i.e. 5 levels per point, so 2 points in stays within 10 levels.
  EXPECT_TRUE(same_colour(image.at_point(middle, bar.y + 2.0, scale), kHighColour, 10));
  EXPECT_TRUE(same_colour(image.at_point(middle, bar.y + bar.height - 2.0, scale), kLowColour, 10));
  EXPECT_TRUE(
      same_colour(image.at_point(middle, bar.y + bar.height / 2.0, scale), reds_pixel(0.5), 10));
}

TEST_F(HeatmapFiles, EveryPanelOfAGridGetsItsColourOnOneSharedScale) {
  // Panel p holds the single value p, so the shared scale is [0, 5] and panel p is at p / 5.
  Tensor weights(Shape{2, 3, 1, 1}, {0.0F, 1.0F, 2.0F, 3.0F, 4.0F, 5.0F});
  HeatmapOptions options;
  options.titles = {"p0", "p1", "p2", "p3", "p4", "p5"};
  const auto path = file("grid.png");
  save_heatmaps(weights, path, options);
  const HeatmapLayout layout = layout_for(weights, options);
  const double scale = png_scale(layout);
  const PngImage image(path);
  ASSERT_TRUE(image.ok());
  for (int64_t panel = 0; panel < 6; ++panel) {
    const auto& area = layout.panels[static_cast<size_t>(panel)];
    const Pixel pixel =
        image.at_point(area.x + area.width / 2.0, area.y + area.height / 2.0, scale);
    EXPECT_TRUE(same_colour(pixel, reds_pixel(static_cast<double>(panel) / 5.0), 0)) << panel;
  }
  // 0.2 lies 60% of the way from #fee0d2 to #fcbba1.
  EXPECT_TRUE(same_colour(reds_pixel(0.2), {253, 202, 181}, 0));
}

TEST_F(HeatmapFiles, DrawsTextAroundThePanel) {
  const auto path = file("text.png");
  const Tensor weights = identity(10);
  save_heatmaps(weights, path);
  const HeatmapLayout layout = layout_for(weights);
  const double scale = png_scale(layout);
  const PngImage image(path);
  ASSERT_TRUE(image.ok());
  const auto& area = layout.panels[0];
  // Pixels of black text: tick labels and axis labels left of and under the panel.
  const auto text_pixels = [&](double x0, double y0, double x1, double y1) {
    int count = 0;
    for (int y = static_cast<int>(y0 * scale); y < static_cast<int>(y1 * scale); ++y) {
      for (int x = static_cast<int>(x0 * scale); x < static_cast<int>(x1 * scale); ++x) {
        const Pixel pixel = image.at(x, y);
        // Black text anti-aliased on any background is dark and nearly grey; the high end of
        // 'Reds' (103, 0, 13) is dark but far from grey.
        const int brightest = std::max({pixel.red, pixel.green, pixel.blue});
        const int dimmest = std::min({pixel.red, pixel.green, pixel.blue});
        if (brightest < 120 && brightest - dimmest < 30) ++count;
      }
    }
    return count;
  };
  EXPECT_GT(text_pixels(0.0, area.y, area.x - 6.0, area.y + area.height), 50);
  EXPECT_GT(text_pixels(area.x, area.y + area.height + 5.0, area.x + area.width, layout.height),
            50);
  EXPECT_EQ(text_pixels(area.x + 2.0, area.y + 2.0, area.x + 10.0, area.y + 10.0), 0)
      << "the top-left cell holds the high colour, not text";
}

TEST_F(HeatmapFiles, LargeAndSingleCellMatricesRender) {
  // Left half 0, right half 1: the halves keep their colours however small the cells get.
  for (const auto& [n, m] : {std::pair<int64_t, int64_t>{200, 500}, {50, 50}, {1, 1}}) {
    Tensor weights(Shape{n, m});
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = m / 2; j < m; ++j) weights(i, j) = 1.0F;
    }
    const auto path = file("large_" + std::to_string(n) + "x" + std::to_string(m) + ".png");
    save_heatmaps(weights, path);
    const HeatmapLayout layout = layout_for(weights);
    const double scale = png_scale(layout);
    const PngImage image(path);
    ASSERT_TRUE(image.ok()) << path;
    const auto& area = layout.panels[0];
    const double middle = area.y + area.height / 2.0;
    EXPECT_TRUE(
        same_colour(image.at_point(area.x + area.width * 0.75, middle, scale), kHighColour, 0))
        << n << "x" << m;
    if (m > 1) {
      EXPECT_TRUE(
          same_colour(image.at_point(area.x + area.width * 0.25, middle, scale), kLowColour, 0))
          << n << "x" << m;
    }
  }
}

TEST_F(HeatmapFiles, SvgIsXmlOfTheLayoutsSize) {
  const Tensor weights = identity(5);
  const auto path = file("eye.svg");
  save_heatmaps(weights, path);
  const std::string text = read_file(path);
  EXPECT_EQ(text.rfind("<?xml", 0), 0U);
  const size_t svg = text.find("<svg");
  ASSERT_NE(svg, std::string::npos);
  const size_t width = text.find("width=\"", svg);
  ASSERT_NE(width, std::string::npos);
  // Cairo writes sizes with a few decimals; 0.01 point is far below anything visible.
  EXPECT_NEAR(std::stod(text.substr(width + 7, 20)), layout_for(weights).width, 0.01);
  EXPECT_NE(text.find("</svg>"), std::string::npos);
}

TEST_F(HeatmapFiles, PdfIsACompletePdf) {
  const auto path = file("eye.pdf");
  save_heatmaps(identity(5), path);
  const std::string bytes = read_file(path);
  EXPECT_EQ(bytes.rfind("%PDF", 0), 0U);
  EXPECT_NE(bytes.find("%%EOF", bytes.size() > 16 ? bytes.size() - 16 : 0), std::string::npos);
}

TEST_F(HeatmapFiles, ExtensionsAreCaseInsensitive) {
  save_heatmaps(identity(3), file("upper.PNG"));
  save_heatmaps(identity(3), file("mixed.Svg"));
  save_heatmaps(identity(3), file("upper.PDF"));
  EXPECT_TRUE(PngImage(file("upper.PNG")).ok());
  EXPECT_EQ(read_file(file("mixed.Svg")).rfind("<?xml", 0), 0U);
  EXPECT_EQ(read_file(file("upper.PDF")).rfind("%PDF", 0), 0U);
}

TEST_F(HeatmapFiles, RejectsUnknownExtensions) {
  const auto jpeg = file("picture.jpg");
  EXPECT_THROW_MESSAGE(save_heatmaps(identity(3), jpeg), FileError, jpeg.string());
  EXPECT_THROW_MESSAGE(save_heatmaps(identity(3), jpeg), FileError, ".png, .svg or .pdf");
  EXPECT_THROW_MESSAGE(save_heatmaps(identity(3), file("no_extension")), FileError,
                       ".png, .svg or .pdf");
  EXPECT_FALSE(std::filesystem::exists(jpeg));
}

TEST_F(HeatmapFiles, ReportsFilesThatCannotBeWritten) {
  for (const std::string name : {"picture.png", "picture.svg", "picture.pdf"}) {
    const auto path = file("missing_directory") / name;
    EXPECT_THROW_MESSAGE(save_heatmaps(identity(3), path), FileError, path.string());
  }
  // A directory where the file should go.
  const auto directory = file("taken.png");
  std::filesystem::create_directory(directory);
  EXPECT_THROW_MESSAGE(save_heatmaps(identity(3), directory), FileError, directory.string());
}

TEST_F(HeatmapFiles, RejectsWeightsThatAreNotFinite) {
  Tensor weights(Shape{2, 3, 4});
  weights(1, 0, 2) = std::numeric_limits<float>::quiet_NaN();
  const auto path = file("nan.png");
  EXPECT_THROW_MESSAGE(save_heatmaps(weights, path), ValueError, "weights[1, 0, 2] is nan");
  weights(1, 0, 2) = 0.0F;
  weights(0, 2, 3) = -std::numeric_limits<float>::infinity();
  EXPECT_THROW_MESSAGE(save_heatmaps(weights, path), ValueError, "weights[0, 2, 3] is -inf");
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST_F(HeatmapFiles, ReportsShapeAndLabelErrorsBeforeWriting) {
  const auto path = file("bad.png");
  HeatmapOptions grid;
  grid.rows = 2;
  grid.cols = 2;
  EXPECT_THROW_MESSAGE(save_heatmaps(Tensor(Shape{3, 2, 2}), path, grid), ShapeError,
                       "rows = 2, cols = 2 does not match the 3 panels");
  EXPECT_THROW_MESSAGE(save_heatmaps(Tensor(Shape{0, 2}), path), ShapeError, "(0, 2)");
  HeatmapOptions titles;
  titles.titles = {"a", "b"};
  EXPECT_THROW_MESSAGE(save_heatmaps(Tensor(Shape{3, 2, 2}), path, titles), ValueError,
                       "expected 3 titles");
  EXPECT_FALSE(std::filesystem::exists(path));
}

// Each error carries the argument at fault (Error::argument), which the CLI turns into its own
// option without reading the message.
TEST_F(HeatmapFiles, EveryErrorNamesItsArgument) {
  const auto argument_of = [](const std::function<void()>& call) -> std::string {
    try {
      call();
    } catch (const Error& error) {
      return std::string(error.argument());
    }
    return "(nothing thrown)";
  };
  const auto path = file("bad.png");
  const auto with = [](const std::function<void(HeatmapOptions&)>& set) {
    HeatmapOptions options;
    set(options);
    return options;
  };
  Tensor not_finite(Shape{2, 2});
  not_finite(0, 1) = std::numeric_limits<float>::infinity();
  const HeatmapOptions grid = with([](HeatmapOptions& o) { o.rows = 2, o.cols = 2; });
  const HeatmapOptions undivided = with([](HeatmapOptions& o) { o.rows = 3; });
  const HeatmapOptions negative = with([](HeatmapOptions& o) { o.cols = -1; });
  const HeatmapOptions titles = with([](HeatmapOptions& o) { o.titles = {"a"}; });
  const HeatmapOptions x_ticks = with([](HeatmapOptions& o) { o.x_tick_labels = {"a"}; });
  const HeatmapOptions y_ticks = with([](HeatmapOptions& o) { o.y_tick_labels = {"a"}; });
  const HeatmapOptions panel = with([](HeatmapOptions& o) { o.panel_size = 0.0; });
  EXPECT_EQ(argument_of([&] { save_heatmaps(Tensor(Shape{5}), path); }), "weights");
  EXPECT_EQ(argument_of([&] { save_heatmaps(Tensor(Shape{2, 0}), path); }), "weights");
  EXPECT_EQ(argument_of([&] { save_heatmaps(Tensor(Shape{0, 2, 2}), path); }), "weights");
  EXPECT_EQ(argument_of([&] { save_heatmaps(not_finite, path); }), "weights");
  EXPECT_EQ(argument_of([&] { save_heatmaps(Tensor(Shape{3, 2, 2}), path, grid); }), "rows, cols");
  EXPECT_EQ(argument_of([&] {
              save_heatmaps(Tensor(Shape{4, 2, 2}), path, undivided);
            }),
            "rows, cols");
  EXPECT_EQ(argument_of([&] {
              save_heatmaps(Tensor(Shape{4, 2, 2}), path, negative);
            }),
            "rows, cols");
  EXPECT_EQ(argument_of([&] { save_heatmaps(Tensor(Shape{3, 2, 2}), path, titles); }), "titles");
  EXPECT_EQ(argument_of([&] { save_heatmaps(identity(2), path, x_ticks); }), "x_tick_labels");
  EXPECT_EQ(argument_of([&] { save_heatmaps(identity(2), path, y_ticks); }), "y_tick_labels");
  EXPECT_EQ(argument_of([&] { save_heatmaps(identity(2), path, panel); }), "panel_size");
  EXPECT_EQ(argument_of([&] { save_heatmaps(Tensor(Shape{1, 400, 2, 2}), path); }), "path");
  EXPECT_EQ(argument_of([&] { save_heatmaps(identity(2), file("picture.jpg")); }), "path");
  EXPECT_EQ(argument_of([&] { save_heatmaps(identity(2), file("missing") / "a.png"); }), "path");
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST_F(HeatmapFiles, SurvivesInvalidUtf8InLabels) {
  HeatmapOptions options;
  options.xlabel = "keys \xFF\xFE";
  options.titles = {"\xC0"};
  options.x_tick_labels = {"\xE2\x82", "ok"};
  const auto path = file("utf8.png");
  save_heatmaps(identity(2), path, options);
  EXPECT_TRUE(PngImage(path).ok());
}

}  // namespace
}  // namespace attn
