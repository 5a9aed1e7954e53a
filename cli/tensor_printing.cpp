// PyTorch's tensor printing (torch/_tensor_str.py with the default print options) re-done in C++:
// one element style chosen from all shown values, then nested brackets wrapped at 80 columns.
#include "tensor_printing.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include "attn/core/error.hpp"

namespace attn::cli {

namespace {

// PyTorch's default print options.
constexpr int kPrecision = 4;
constexpr int64_t kSummaryThreshold = 1000;
constexpr int64_t kEdgeItems = 3;
constexpr int64_t kLineWidth = 80;
// "tensor(" is the prefix every nested line is indented under.
constexpr int64_t kPrefixWidth = 7;

// Python prints non-finite floats as nan / inf / -inf whatever the format; C's printf may say
// "-nan", so they are spelled out here.
std::string non_finite(double value) {
  if (std::isnan(value)) return "nan";
  return value > 0 ? "inf" : "-inf";
}

std::string fixed(double value, int precision) {
  if (!std::isfinite(value)) return non_finite(value);
  char buffer[64];  // a float32 has at most 39 integer digits
  std::snprintf(buffer, sizeof buffer, "%.*f", precision, value);
  return buffer;
}

std::string scientific(double value) {
  if (!std::isfinite(value)) return non_finite(value);
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*e", kPrecision, value);
  return buffer;
}

std::string pad_left(const std::string& text, int64_t width) {
  const auto length = static_cast<int64_t>(text.size());
  return length >= width ? text : std::string(static_cast<size_t>(width - length), ' ') + text;
}

// The flat indices PyTorch looks at: every element, or when summarising only the first and last
// kEdgeItems along each axis longer than 2·kEdgeItems.
void collect_shown(const Shape& shape, int axis, int64_t offset, bool summarize,
                   std::vector<int64_t>& shown) {
  if (axis == shape.rank()) {
    shown.push_back(offset);
    return;
  }
  int64_t stride = 1;
  for (int inner = axis + 1; inner < shape.rank(); ++inner) stride *= shape[inner];
  const int64_t size = shape[axis];
  for (int64_t i = 0; i < size; ++i) {
    if (summarize && size > 2 * kEdgeItems && i >= kEdgeItems && i < size - kEdgeItems) continue;
    collect_shown(shape, axis + 1, offset + i * stride, summarize, shown);
  }
}

// How every float is written: PyTorch's _Formatter for floating dtypes.
struct FloatStyle {
  bool int_mode = true;
  bool sci_mode = false;
  int64_t width = 1;
};

FloatStyle choose_float_style(const std::vector<double>& shown) {
  FloatStyle style;
  std::vector<double> magnitudes;
  for (double value : shown) {
    if (!std::isfinite(value) || value == 0.0) continue;
    magnitudes.push_back(std::abs(value));
    if (value != std::ceil(value)) style.int_mode = false;
  }
  if (magnitudes.empty()) return style;
  const double low = *std::min_element(magnitudes.begin(), magnitudes.end());
  const double high = *std::max_element(magnitudes.begin(), magnitudes.end());
  style.sci_mode = high / low > 1000.0 || high > 1.0e8 || (!style.int_mode && low < 1.0e-4);
  for (double value : shown) {
    if (!std::isfinite(value) || value == 0.0) continue;
    int64_t length = 0;
    if (style.sci_mode) {
      length = static_cast<int64_t>(scientific(value).size());
    } else if (style.int_mode) {
      length = static_cast<int64_t>(fixed(value, 0).size()) + 1;  // the trailing "."
    } else {
      length = static_cast<int64_t>(fixed(value, kPrecision).size());
    }
    style.width = std::max(style.width, length);
  }
  return style;
}

std::string format_float(double value, const FloatStyle& style) {
  std::string text;
  if (style.sci_mode) {
    text = scientific(value);
  } else if (style.int_mode) {
    text = fixed(value, 0);
    if (std::isfinite(value)) text += ".";
  } else {
    text = fixed(value, kPrecision);
  }
  return pad_left(text, style.width);
}

// Lays out elements in nested brackets as _tensor_str_with_formatter does; `element(i)` gives
// flat element i already padded to `width`.
class Layout {
 public:
  Layout(const Shape& shape, bool summarize, int64_t width,
         std::function<std::string(int64_t)> element)
      : shape_(shape), summarize_(summarize), width_(width), element_(std::move(element)) {}

  std::string str(int axis, int64_t offset, int64_t indent) const {
    const int remaining = shape_.rank() - axis;
    if (remaining == 0) return element_(offset);
    if (remaining == 1) return vector(axis, offset, indent);
    int64_t stride = 1;
    for (int inner = axis + 1; inner < shape_.rank(); ++inner) stride *= shape_[inner];
    const int64_t size = shape_[axis];
    std::vector<std::string> slices;
    for (int64_t i = 0; i < size; ++i) {
      if (elided(size, i)) {
        if (i == kEdgeItems) slices.emplace_back("...");
        continue;
      }
      slices.push_back(str(axis + 1, offset + i * stride, indent + 1));
    }
    const std::string separator = "," + std::string(static_cast<size_t>(remaining - 1), '\n') +
                                  std::string(static_cast<size_t>(indent + 1), ' ');
    return "[" + join(slices, separator) + "]";
  }

 private:
  bool elided(int64_t size, int64_t i) const {
    return summarize_ && size > 2 * kEdgeItems && i >= kEdgeItems && i < size - kEdgeItems;
  }

  static std::string join(const std::vector<std::string>& parts, const std::string& separator) {
    std::string joined;
    for (size_t i = 0; i < parts.size(); ++i) joined += (i == 0 ? "" : separator) + parts[i];
    return joined;
  }

  // One innermost row, wrapped so that each line fits the 80 columns after `indent`.
  std::string vector(int axis, int64_t offset, int64_t indent) const {
    const int64_t element_length = width_ + 2;  // ", " between elements
    const int64_t per_line = std::max<int64_t>(1, (kLineWidth - indent) / element_length);
    const int64_t size = shape_[axis];
    std::vector<std::string> data;
    for (int64_t i = 0; i < size; ++i) {
      if (elided(size, i)) {
        if (i == kEdgeItems) data.emplace_back(" ...");
        continue;
      }
      data.push_back(element_(offset + i));
    }
    std::vector<std::string> lines;
    for (size_t start = 0; start < data.size(); start += static_cast<size_t>(per_line)) {
      const size_t end = std::min(data.size(), start + static_cast<size_t>(per_line));
      lines.push_back(join({data.begin() + static_cast<std::ptrdiff_t>(start),
                            data.begin() + static_cast<std::ptrdiff_t>(end)},
                           ", "));
    }
    return "[" + join(lines, ",\n" + std::string(static_cast<size_t>(indent + 1), ' ')) + "]";
  }

  const Shape& shape_;
  bool summarize_;
  int64_t width_;
  std::function<std::string(int64_t)> element_;
};

// PyTorch prints empty tensors as "[]" and adds the shape unless it is (0,).
std::string format_empty(const Shape& shape) {
  if (shape.rank() == 1) return "tensor([])";
  return "tensor([], size=" + shape.str() + ")";
}

}  // namespace

std::string format_tensor(ConstTensorView tensor) {
  const Shape& shape = tensor.shape();
  if (tensor.numel() == 0) return format_empty(shape);
  const bool summarize = tensor.numel() > kSummaryThreshold;
  std::vector<int64_t> shown_indices;
  collect_shown(shape, 0, 0, summarize, shown_indices);
  std::vector<double> shown;
  shown.reserve(shown_indices.size());
  for (int64_t index : shown_indices) shown.push_back(tensor.data()[index]);
  const FloatStyle style = choose_float_style(shown);
  const float* data = tensor.data();
  const Layout layout(shape, summarize, style.width,
                      [&](int64_t index) { return format_float(data[index], style); });
  return "tensor(" + layout.str(0, 0, kPrefixWidth) + ")";
}

std::string format_integer_tensor(std::span<const int64_t> values, const Shape& shape) {
  if (static_cast<int64_t>(values.size()) != shape.numel()) {
    throw ShapeError("format_integer_tensor: shape " + shape.str() + " needs " +
                     std::to_string(shape.numel()) + " values, got " +
                     std::to_string(values.size()));
  }
  if (shape.numel() == 0) return format_empty(shape);
  const bool summarize = shape.numel() > kSummaryThreshold;
  std::vector<int64_t> shown_indices;
  collect_shown(shape, 0, 0, summarize, shown_indices);
  int64_t width = 1;
  for (int64_t index : shown_indices) {
    width = std::max(width, static_cast<int64_t>(std::to_string(values[index]).size()));
  }
  const Layout layout(shape, summarize, width, [&](int64_t index) {
    return pad_left(std::to_string(values[index]), width);
  });
  return "tensor(" + layout.str(0, 0, kPrefixWidth) + ")";
}

std::string format_valid_lengths(const ValidLengths& valid_lens) {
  if (valid_lens.is_all()) return "None";
  return format_integer_tensor(valid_lens.values(), valid_lens.shape());
}

}  // namespace attn::cli
