// The Cairo helpers the heatmaps and line plots share: formats, fonts and text, UTF-8 cleaning,
// round tick values and writing a page to PNG, SVG or PDF.
#include "cairo_canvas.hpp"

#include <cairo-pdf.h>
#include <cairo-svg.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <numbers>

#include "attn/core/error.hpp"
#include "core/file_access.hpp"

namespace attn::canvas {

namespace {

constexpr const char* kFontFamily = "sans-serif";
constexpr const char* kEllipsis = "\xE2\x80\xA6";
// Cairo's image surfaces are at most 32767 pixels a side; the area bound keeps a PNG in memory
// below 256 MiB.
constexpr double kMaxPngSide = 32767.0;
constexpr double kMaxPngPixels = 64.0 * 1024.0 * 1024.0;
constexpr double kPreferredPngScale = 2.0;

// Byte offsets where the code points of valid UTF-8 `text` start, and its size at the end.
std::vector<size_t> code_point_starts(const std::string& text) {
  std::vector<size_t> starts;
  for (size_t i = 0; i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0U) != 0x80U) starts.push_back(i);
  }
  starts.push_back(text.size());
  return starts;
}

}  // namespace

Format format_of(const std::filesystem::path& path, std::string_view caller) {
  std::string extension = path.extension().string();
  std::transform(extension.begin(), extension.end(), extension.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (extension == ".png") return Format::kPng;
  if (extension == ".svg") return Format::kSvg;
  if (extension == ".pdf") return Format::kPdf;
  throw FileError(std::string(caller) + ": cannot save '" + path.string() +
                      "': unknown extension '" + extension + "', expected .png, .svg or .pdf",
                  "path");
}

void throw_if_failed(cairo_status_t status, const std::filesystem::path& path,
                     std::string_view action, std::string_view caller) {
  if (status == CAIRO_STATUS_SUCCESS) return;
  // Cairo reports a failed write as such; the C library's errno says why (callers zero it first).
  const int reason = errno;
  std::string message = std::string(caller) + ": cannot " + std::string(action) + " '" +
                        path.string() + "': " + cairo_status_to_string(status);
  if (status == CAIRO_STATUS_WRITE_ERROR && reason != 0) {
    message += " (" + file_access::system_reason(reason) + ")";
  }
  throw FileError(message);
}

MeasuringContext::MeasuringContext()
    : surface_(cairo_image_surface_create(CAIRO_FORMAT_RGB24, 1, 1)),
      context_(cairo_create(surface_.get())) {}

// Unhinted metrics make text as wide on the measuring surface as on the PNG (drawn at twice the
// scale) and on SVG or PDF, so what was measured is what gets drawn.
void select_font(cairo_t* context, double size) {
  cairo_select_font_face(context, kFontFamily, CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(context, size);
  const FontOptionsPtr options(cairo_font_options_create());
  cairo_font_options_set_hint_metrics(options.get(), CAIRO_HINT_METRICS_OFF);
  cairo_font_options_set_hint_style(options.get(), CAIRO_HINT_STYLE_NONE);
  cairo_set_font_options(context, options.get());
}

double text_width(cairo_t* context, const std::string& text) {
  cairo_text_extents_t extents;
  cairo_text_extents(context, text.c_str(), &extents);
  return extents.x_advance;
}

LineMetrics line_metrics(cairo_t* context) {
  cairo_font_extents_t extents;
  cairo_font_extents(context, &extents);
  return {extents.ascent, extents.descent};
}

void show_centred(cairo_t* context, const std::string& text, double centre_x, double baseline) {
  cairo_move_to(context, centre_x - text_width(context, text) / 2.0, baseline);
  cairo_show_text(context, text.c_str());
}

void show_upright(cairo_t* context, const std::string& text, double baseline_x, double centre_y) {
  const double width = text_width(context, text);
  cairo_save(context);
  cairo_move_to(context, baseline_x, centre_y + width / 2.0);
  cairo_rotate(context, -std::numbers::pi / 2.0);
  cairo_show_text(context, text.c_str());
  cairo_restore(context);
}

std::string valid_utf8(std::string_view text) {
  static constexpr std::array<uint32_t, 5> kSmallestOfLength{0, 0, 0x80, 0x800, 0x10000};
  std::string result;
  result.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    if (lead < 0x80U) {
      result.push_back(lead < 0x20U || lead == 0x7FU ? ' ' : text[i]);
      ++i;
      continue;
    }
    size_t length = 0;
    uint32_t code = 0;
    if ((lead & 0xE0U) == 0xC0U) {
      length = 2;
      code = lead & 0x1FU;
    } else if ((lead & 0xF0U) == 0xE0U) {
      length = 3;
      code = lead & 0x0FU;
    } else if ((lead & 0xF8U) == 0xF0U) {
      length = 4;
      code = lead & 0x07U;
    }
    bool valid = length != 0 && length <= text.size() - i;
    for (size_t k = 1; valid && k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      valid = (next & 0xC0U) == 0x80U;
      code = (code << 6U) | (next & 0x3FU);
    }
    // Overlong forms, UTF-16 surrogates and code points beyond Unicode are not valid UTF-8.
    valid = valid && code >= kSmallestOfLength[length] && code <= 0x10FFFFU &&
            (code < 0xD800U || code > 0xDFFFU);
    if (valid) {
      result.append(text.substr(i, length));
      i += length;
    } else {
      result.push_back('?');
      ++i;
    }
  }
  return result;
}

std::string fit_text(cairo_t* context, const std::string& text, double max_width) {
  // Anything beyond this many code points could not fit on a page anyway; the cap bounds the work.
  constexpr size_t kMaxCodePoints = 256;
  if (text.empty()) return text;
  const std::vector<size_t> starts = code_point_starts(text);
  if (starts.size() - 1 <= kMaxCodePoints && text_width(context, text) <= max_width) return text;
  size_t fitting = 0;  // code points known to fit before the ellipsis
  size_t too_many = std::min(starts.size() - 1, kMaxCodePoints);
  const auto fits = [&](size_t count) {
    return text_width(context, text.substr(0, starts[count]) + kEllipsis) <= max_width;
  };
  if (!fits(0)) return {};
  while (too_many - fitting > 1) {
    const size_t middle = fitting + (too_many - fitting) / 2;
    if (fits(middle)) {
      fitting = middle;
    } else {
      too_many = middle;
    }
  }
  return text.substr(0, starts[fitting]) + kEllipsis;
}

std::string format_value(double value, double step, double magnitude) {
  std::array<char, 64> buffer{};
  if (step >= 1e5 || step < 1e-4) {
    const int digits = std::clamp(
        static_cast<int>(std::floor(std::log10(magnitude)) - std::floor(std::log10(step))) + 2, 1,
        17);
    std::snprintf(buffer.data(), buffer.size(), "%.*g", digits, value);
    return buffer.data();
  }
  int decimals = 0;
  double scaled = step;
  while (decimals < 6 && std::abs(scaled - std::round(scaled)) > 1e-6 * scaled) {
    scaled *= 10.0;
    ++decimals;
  }
  std::snprintf(buffer.data(), buffer.size(), "%.*f", decimals, value);
  return buffer.data();
}

std::vector<Tick> nice_ticks(double low, double high, int64_t max_ticks) {
  constexpr std::array<double, 4> kMultipliers{1.0, 2.0, 2.5, 5.0};
  const double range = high - low;
  const double magnitude = std::max(std::abs(low), std::abs(high));
  const auto ticks_between = [&](double first, double last, double stride, double step) {
    std::vector<Tick> ticks;
    for (double index = first; index <= last; index += stride) {
      // `+ 0.0` turns the -0 that ceil(-1e-9) leads to into 0, so no label reads "-0.0".
      const double value = index * step + 0.0;
      ticks.push_back({value, format_value(value, step, magnitude)});
    }
    return ticks;
  };
  // A tenth of the range or less, so the first candidates give many ticks and the search only
  // coarsens from there; a step of the whole range or more leaves at most two.
  double decade = std::pow(10.0, std::floor(std::log10(range)) - 1.0);
  double previous_first = 0.0;
  double previous_last = 0.0;
  double previous_step = 0.0;
  for (int round = 0; round < 4; ++round, decade *= 10.0) {
    for (const double multiplier : kMultipliers) {
      const double step = multiplier * decade;
      // The slack keeps an end that is a multiple of the step (such as 1.0) from being lost to
      // rounding.
      const double first = std::ceil(low / step - 1e-9);
      const double last = std::floor(high / step + 1e-9);
      const double count = last - first + 1.0;
      if (count < 2.0) {
        // Coarser steps only give fewer: the ends of the last step that gave two or more (round
        // values still), or the ends of the range when there was none.
        if (previous_step > 0.0) {
          return ticks_between(previous_first, previous_last, previous_last - previous_first,
                               previous_step);
        }
        return {{low, format_value(low, range, magnitude)},
                {high, format_value(high, range, magnitude)}};
      }
      if (count <= static_cast<double>(max_ticks)) return ticks_between(first, last, 1.0, step);
      previous_first = first;
      previous_last = last;
      previous_step = step;
    }
  }
  return {{low, format_value(low, range, magnitude)}, {high, format_value(high, range, magnitude)}};
}

double png_scale(double width, double height) {
  for (const double scale : {kPreferredPngScale, 1.0}) {
    const double pixel_width = std::ceil(width * scale);
    const double pixel_height = std::ceil(height * scale);
    if (pixel_width <= kMaxPngSide && pixel_height <= kMaxPngSide &&
        pixel_width * pixel_height <= kMaxPngPixels) {
      return scale;
    }
  }
  return 0.0;
}

namespace {

// write_page's drawing into `path`, which is the temporary file write_page renames over the target.
void draw_page(const std::filesystem::path& path, Format format, double width, double height,
               double scale, const PagePainter& paint, std::string_view caller) {
  if (format == Format::kPng) {
    const SurfacePtr surface(
        cairo_image_surface_create(CAIRO_FORMAT_RGB24, static_cast<int>(std::ceil(width * scale)),
                                   static_cast<int>(std::ceil(height * scale))));
    throw_if_failed(cairo_surface_status(surface.get()), path, "draw", caller);
    {
      const ContextPtr context(cairo_create(surface.get()));
      cairo_scale(context.get(), scale, scale);
      paint(context.get(), false, scale);
      throw_if_failed(cairo_status(context.get()), path, "draw", caller);
    }
    errno = 0;
    throw_if_failed(cairo_surface_write_to_png(surface.get(), path.c_str()), path, "write", caller);
    return;
  }
  errno = 0;
  const SurfacePtr surface(format == Format::kSvg
                               ? cairo_svg_surface_create(path.c_str(), width, height)
                               : cairo_pdf_surface_create(path.c_str(), width, height));
  throw_if_failed(cairo_surface_status(surface.get()), path, "write", caller);
  {
    const ContextPtr context(cairo_create(surface.get()));
    paint(context.get(), true, 1.0);
    throw_if_failed(cairo_status(context.get()), path, "draw", caller);
  }
  // Finishing flushes the file; a full disk shows up only here.
  errno = 0;
  cairo_surface_finish(surface.get());
  throw_if_failed(cairo_surface_status(surface.get()), path, "write", caller);
}

}  // namespace

void write_page(const std::filesystem::path& path, Format format, double width, double height,
                double scale, const PagePainter& paint, std::string_view caller) {
  // Cairo writes in place, truncating first: drawing into a temporary file renamed over `path`
  // keeps the previous picture whole when a write fails (a full disk, a file-size limit).
  try {
    file_access::write_atomically(path, [&](const std::filesystem::path& temporary) {
      try {
        draw_page(temporary, format, width, height, scale, paint, caller);
      } catch (const FileError& error) {
        // Name the file the caller asked for, not the temporary one.
        std::string message = error.what();
        const std::string temporary_name = temporary.string();
        for (size_t at = message.find(temporary_name); at != std::string::npos;
             at = message.find(temporary_name, at + 1)) {
          message.replace(at, temporary_name.size(), path.string());
        }
        throw FileError(message);
      }
    });
  } catch (const FileError& error) {
    // Whatever failed (the folder, the temporary file, Cairo's write), the fault is the path's.
    throw FileError(error.what(), "path");
  }
}

}  // namespace attn::canvas
