// What the Cairo pictures (heatmaps, line plots) share: RAII wrappers, the file format from the
// extension, fonts and text measuring, round tick values, and writing a page to PNG, SVG or PDF.
#pragma once

#include <cairo.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace attn::canvas {

struct SurfaceDeleter {
  void operator()(cairo_surface_t* surface) const { cairo_surface_destroy(surface); }
};
struct ContextDeleter {
  void operator()(cairo_t* context) const { cairo_destroy(context); }
};
struct PatternDeleter {
  void operator()(cairo_pattern_t* pattern) const { cairo_pattern_destroy(pattern); }
};
struct FontOptionsDeleter {
  void operator()(cairo_font_options_t* options) const { cairo_font_options_destroy(options); }
};
using SurfacePtr = std::unique_ptr<cairo_surface_t, SurfaceDeleter>;
using ContextPtr = std::unique_ptr<cairo_t, ContextDeleter>;
using PatternPtr = std::unique_ptr<cairo_pattern_t, PatternDeleter>;
using FontOptionsPtr = std::unique_ptr<cairo_font_options_t, FontOptionsDeleter>;

struct Rgb {
  double red = 0.0;
  double green = 0.0;
  double blue = 0.0;
};

// A rectangle on the page, in points from its top-left corner.
struct Rect {
  double x = 0.0;
  double y = 0.0;
  double width = 0.0;
  double height = 0.0;
  double right() const { return x + width; }
  double bottom() const { return y + height; }
};

// One labelled tick: a position on an axis (cell index or value) and its text.
struct Tick {
  double position = 0.0;
  std::string label;
};

// PDF's largest page is 200 inches.
inline constexpr double kMaxPageSide = 14400.0;

enum class Format { kPng, kSvg, kPdf };

// The format of `path` from its extension, case-insensitively; FileError naming `caller` and the
// path for anything but .png, .svg and .pdf.
Format format_of(const std::filesystem::path& path, std::string_view caller);

// FileError "<caller>: cannot <action> '<path>': <Cairo's reason>" unless `status` is success.
void throw_if_failed(cairo_status_t status, const std::filesystem::path& path,
                     std::string_view action, std::string_view caller);

// A 1 × 1 image to measure text on before the page exists.
class MeasuringContext {
 public:
  MeasuringContext();
  cairo_t* get() const { return context_.get(); }

 private:
  SurfacePtr surface_;
  ContextPtr context_;
};

// The sans-serif face at `size` points, with unhinted metrics so that text measures the same on
// every surface and at every scale.
void select_font(cairo_t* context, double size);
double text_width(cairo_t* context, const std::string& text);

struct LineMetrics {
  double ascent = 0.0;
  double descent = 0.0;
  double height() const { return ascent + descent; }
  // The baseline that centres a line vertically on `centre`.
  double baseline(double centre) const { return centre + (ascent - descent) / 2.0; }
};
LineMetrics line_metrics(cairo_t* context);

// Shows `text` centred horizontally on `centre_x`, on `baseline`.
void show_centred(cairo_t* context, const std::string& text, double centre_x, double baseline);
// Shows `text` read upwards, centred vertically on `centre_y`, its baseline at `baseline_x`.
void show_upright(cairo_t* context, const std::string& text, double baseline_x, double centre_y);

// `text` with every invalid UTF-8 byte replaced by '?' and control characters by spaces, as
// Cairo rejects invalid UTF-8 by failing the whole drawing.
std::string valid_utf8(std::string_view text);

// `text` (valid UTF-8) if it is at most `max_width` wide, else its longest prefix that fits with an
// ellipsis appended, or nothing when not even the ellipsis fits.
std::string fit_text(cairo_t* context, const std::string& text, double max_width);

// `value` with enough decimals to tell ticks `step` apart (0.2 → 1, 2.5 → 1, 0.25 → 2, 5 → 0), in
// %g form for very large or small steps; `magnitude` is the largest |value| on the axis.
std::string format_value(double value, double step, double magnitude);

// Round values 1, 2, 2.5 or 5 × 10^k apart inside [low, high] (low < high, both finite), at least
// two and at most `max_ticks` (≥ 2) of them; when no step gives that, the first and last of the
// coarsest step that gives more.
std::vector<Tick> nice_ticks(double low, double high, int64_t max_ticks);

// Pixels per point for a PNG page of width × height points: 2 for crisp pictures, 1 when 2 would
// exceed Cairo's image limits, 0 when even 1 does.
double png_scale(double width, double height);

// Draws the page: `vector` is true for SVG and PDF, `device_scale` the pixels per point of a PNG
// (1 for vector output).
using PagePainter = std::function<void(cairo_t* context, bool vector, double device_scale)>;

// Writes a page of width × height points to `path` in `format` (PNG at `scale` pixels per point,
// from png_scale) with `paint`; FileError naming `caller` and the path when Cairo fails.
void write_page(const std::filesystem::path& path, Format format, double width, double height,
                double scale, const PagePainter& paint, std::string_view caller);

}  // namespace attn::canvas
