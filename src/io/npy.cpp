// .npy reading and writing: the header's Python-literal dictionary, parsed and checked field by
// field, and the little-endian C-order data that must follow it exactly.
#include "attn/io/npy.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <string>

#include "attn/core/error.hpp"
#include "attn/core/half.hpp"
#include "io/excerpt.hpp"
#include "io/file_bytes.hpp"
#include "io/float64_range.hpp"
#include "io/limits.hpp"
#include "io/npy_file.hpp"
#include "io/npy_layout.hpp"

namespace attn {
namespace {

// Data is decoded and encoded by copying bytes, which is only right on a little-endian host.
static_assert(std::endian::native == std::endian::little, "attn assumes a little-endian host");

constexpr std::string_view kMagic = "\x93NUMPY";
// NumPy aligns the start of the data to 64 bytes so that the file can be memory-mapped.
constexpr size_t kDataAlignment = 64;
// NumPy leaves room after the dictionary for the first dimension to grow to 21 digits, so that
// appending to an array can rewrite the header in place; we copy it to write identical headers.
constexpr size_t kGrowthAxisMaxDigits = 21;
// The most dimensions the header parser collects before refusing the shape outright.
constexpr size_t kMaxShapeLength = 64;

struct DTypeInfo {
  NpyDType dtype;
  std::string_view descr;
  int64_t itemsize;
};

// NumPy writes bool as '|b1': one byte, so no byte order ('|'), holding 0 or 1.
constexpr std::array<DTypeInfo, 6> kDTypes = {{
    {NpyDType::kFloat32, "<f4", 4},
    {NpyDType::kFloat16, "<f2", 2},
    {NpyDType::kFloat64, "<f8", 8},
    {NpyDType::kInt32, "<i4", 4},
    {NpyDType::kInt64, "<i8", 8},
    {NpyDType::kBool, "|b1", 1},
}};

[[noreturn]] void fail(std::string_view source, const std::string& message) {
  throw FileError(std::string(source) + ": " + message);
}

const DTypeInfo& dtype_info(NpyDType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return info;
  }
  throw FileError("npy: unknown dtype");  // unreachable: kDTypes lists every NpyDType
}

const DTypeInfo& dtype_from_descr(std::string_view descr, std::string_view source) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.descr == descr) return info;
  }
  fail(source, "unsupported dtype '" + io_detail::escaped(descr) +
                   "': expected little-endian '<f4', '<f8', '<f2', '<i4' or '<i8', or bool "
                   "'|b1'");
}

uint64_t read_little_endian(std::span<const std::byte> bytes) {
  uint64_t value = 0;
  for (size_t index = bytes.size(); index > 0; --index) {
    value = (value << 8) | std::to_integer<uint64_t>(bytes[index - 1]);
  }
  return value;
}

// The dictionary's three fields, each unset until the header names it.
struct HeaderFields {
  std::optional<std::string> descr;
  std::optional<bool> fortran_order;
  std::optional<std::vector<int64_t>> shape;
};

// A parser for the small subset of Python literals NumPy writes: a dict of string keys whose
// values are strings, booleans and tuples of non-negative integers.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, std::string_view source) : text_(text), source_(source) {}

  HeaderFields parse() {
    HeaderFields fields;
    expect('{');
    while (!consume('}')) {
      const std::string key = parse_string();
      expect(':');
      if (key == "descr" && !fields.descr) {
        skip_whitespace();
        if (peek() == '[') fail(source_, "unsupported dtype: structured arrays are not supported");
        fields.descr = parse_string();
      } else if (key == "fortran_order" && !fields.fortran_order) {
        fields.fortran_order = parse_bool();
      } else if (key == "shape" && !fields.shape) {
        fields.shape = parse_shape();
      } else {
        fail(source_, "malformed header: unexpected or repeated key '" + io_detail::escaped(key) +
                          "' (expected 'descr', 'fortran_order' and 'shape' once each)");
      }
      if (!consume(',')) {
        expect('}');
        break;
      }
    }
    skip_whitespace();
    if (position_ != text_.size()) error("the end of the header after '}'");
    return fields;
  }

 private:
  char peek() const { return position_ < text_.size() ? text_[position_] : '\0'; }

  void skip_whitespace() {
    while (position_ < text_.size() && (text_[position_] == ' ' || text_[position_] == '\n' ||
                                        text_[position_] == '\r' || text_[position_] == '\t')) {
      ++position_;
    }
  }

  bool consume(char wanted) {
    skip_whitespace();
    if (peek() != wanted) return false;
    ++position_;
    return true;
  }

  void expect(char wanted) {
    if (!consume(wanted)) error(std::string("'") + wanted + "'");
  }

  [[noreturn]] void error(const std::string& expected) const {
    const std::string got = position_ < text_.size()
                                ? "'" + io_detail::escaped(text_.substr(position_), 12) + "'"
                                : "the end of the header";
    fail(source_, "malformed header at character " + std::to_string(position_) + ": expected " +
                      expected + ", got " + got);
  }

  std::string parse_string() {
    skip_whitespace();
    const char quote = peek();
    if (quote != '\'' && quote != '"') error("a quoted string");
    const size_t end = text_.find(quote, position_ + 1);
    if (end == std::string_view::npos) error("a closing quote");
    std::string value(text_.substr(position_ + 1, end - position_ - 1));
    // Escapes never occur in the keys and dtypes NumPy writes; refuse rather than misread them.
    if (value.find('\\') != std::string::npos) error("a string without escape sequences");
    position_ = end + 1;
    return value;
  }

  bool parse_bool() {
    skip_whitespace();
    for (const auto& [word, value] : {std::pair<std::string_view, bool>{"True", true},
                                      std::pair<std::string_view, bool>{"False", false}}) {
      if (text_.substr(position_, word.size()) == word) {
        position_ += word.size();
        return value;
      }
    }
    error("True or False");
  }

  // "()", "(3,)" or "(2, 3)"; a single element without its comma is not a tuple in Python.
  std::vector<int64_t> parse_shape() {
    expect('(');
    std::vector<int64_t> dims;
    bool trailing_comma = false;
    while (!consume(')')) {
      // A hostile header can make the tuple millions long: stop well past any rank attn reads
      // (the rank check below names the shape of a merely too-high rank).
      if (dims.size() == kMaxShapeLength) {
        fail(source_, "expected a rank of at most " + std::to_string(Shape::kMaxRank) +
                          ", got a shape tuple of more than " + std::to_string(kMaxShapeLength) +
                          " dimensions");
      }
      dims.push_back(parse_dimension());
      trailing_comma = consume(',');
      if (!trailing_comma) {
        expect(')');
        break;
      }
    }
    if (dims.size() == 1 && !trailing_comma) error("a tuple such as (3,) for the shape");
    return dims;
  }

  int64_t parse_dimension() {
    skip_whitespace();
    if (peek() < '0' || peek() > '9') error("a non-negative integer dimension");
    const size_t start = position_;
    int64_t value = 0;
    while (peek() >= '0' && peek() <= '9') {
      const int digit = peek() - '0';
      if (value > (std::numeric_limits<int64_t>::max() - digit) / 10) {
        const size_t end = text_.find_first_not_of("0123456789", start);
        fail(source_, "shape dimension " + io_detail::escaped(text_.substr(start, end - start)) +
                          " is too large for a 64-bit integer");
      }
      value = value * 10 + digit;
      ++position_;
    }
    return value;
  }

  std::string_view text_;
  std::string_view source_;
  size_t position_ = 0;
};

std::string shape_text(const std::vector<int64_t>& dims) {
  std::string text = "(";
  for (size_t axis = 0; axis < dims.size(); ++axis) {
    if (axis > 0) text += ", ";
    text += std::to_string(dims[axis]);
  }
  return text + (dims.size() == 1 ? ",)" : ")");
}

// numel · itemsize, or nullopt if it does not fit in int64 or numel is more than a Shape counts
// (Shape::kMaxElements: 1- and 2-byte dtypes reach it first). Zero dimensions are left out of the
// overflow check's product but zero the result, so every partial product (as Shape::numel forms
// them) fits too.
std::optional<int64_t> data_size(const std::vector<int64_t>& dims, int64_t itemsize) {
  int64_t total = itemsize;
  int64_t count = 1;
  bool has_zero = false;
  for (const int64_t dim : dims) {
    if (dim == 0) {
      has_zero = true;
    } else if (total > std::numeric_limits<int64_t>::max() / dim ||
               count > Shape::kMaxElements / dim) {
      return std::nullopt;
    } else {
      total *= dim;
      count *= dim;
    }
  }
  return has_zero ? 0 : total;
}

template <class Stored, class Decoded, class Values = std::vector<Decoded>>
Values decode(std::span<const std::byte> data) {
  Values values(data.size() / sizeof(Stored));
  for (size_t index = 0; index < values.size(); ++index) {
    Stored value;
    std::memcpy(&value, data.data() + index * sizeof(Stored), sizeof(Stored));
    values[index] = static_cast<Decoded>(value);
  }
  return values;
}

// float16 bits widened to floats (exactly).
template <class Values = std::vector<float>>
Values decode_float16(std::span<const std::byte> data) {
  Values values(data.size() / sizeof(uint16_t));
  for (size_t index = 0; index < values.size(); ++index) {
    uint16_t bits;
    std::memcpy(&bits, data.data() + index * sizeof bits, sizeof bits);
    values[index] = half_to_float(bits);
  }
  return values;
}

// Bool bytes as stored: each must be 0 or 1, the only values NumPy writes for bool.
std::vector<uint8_t> decode_bools(std::span<const std::byte> data, std::string_view source) {
  std::vector<uint8_t> values(data.size());
  for (size_t index = 0; index < data.size(); ++index) {
    const auto value = std::to_integer<uint8_t>(data[index]);
    if (value > 1) {
      fail(source, "bool data must hold bytes 0 or 1 (False or True), got " +
                       std::to_string(value) + " at flat index " + std::to_string(index));
    }
    values[index] = value;
  }
  return values;
}

// ShapeError unless `count` values fill `shape`; `function` names the caller.
void require_values(size_t count, const Shape& shape, std::string_view function) {
  if (static_cast<int64_t>(count) == shape.numel()) return;
  throw ShapeError(std::string(function) + ": shape " + shape.str() + " needs " +
                   std::to_string(shape.numel()) + " values, got " + std::to_string(count));
}

// A .npy file's bytes before its data: magic, version 1.0, the header's length and the header.
std::vector<std::byte> npy_preamble(const DTypeInfo& dtype, const Shape& shape) {
  std::string header = "{'descr': '" + std::string(dtype.descr) +
                       "', 'fortran_order': False, 'shape': " + shape.str() + ", }";
  if (shape.rank() > 0) {
    const size_t digits = std::to_string(shape[0]).size();
    header.append(kGrowthAxisMaxDigits - std::min(digits, kGrowthAxisMaxDigits), ' ');
  }
  // Magic, two version bytes, two length bytes, the header and its closing newline; NumPy adds a
  // full 64 spaces when that is already aligned, and so do we.
  const size_t unpadded = kMagic.size() + 2 + 2 + header.size() + 1;
  header.append(kDataAlignment - unpadded % kDataAlignment, ' ');
  header += '\n';

  std::vector<std::byte> bytes;
  bytes.reserve(kMagic.size() + 4 + header.size());
  for (const char c : kMagic) bytes.push_back(static_cast<std::byte>(c));
  bytes.push_back(std::byte{1});
  bytes.push_back(std::byte{0});
  bytes.push_back(static_cast<std::byte>(header.size() & 0xFF));
  bytes.push_back(static_cast<std::byte>(header.size() >> 8));
  for (const char c : header) bytes.push_back(static_cast<std::byte>(c));
  return bytes;
}

// The whole file in memory: the preamble, then the data.
std::vector<std::byte> build_npy(const DTypeInfo& dtype, const Shape& shape,
                                 std::span<const std::byte> data) {
  std::vector<std::byte> bytes = npy_preamble(dtype, shape);
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

// Writes the file as its preamble, then `data` from where it lies: no copy of the data in memory
// (a copy of attn run's 32 MiB output used to raise its peak memory by as much).
void write_npy(const std::filesystem::path& path, const DTypeInfo& dtype, const Shape& shape,
               std::span<const std::byte> data) {
  const std::vector<std::byte> preamble = npy_preamble(dtype, shape);
  const std::span<const std::byte> pieces[] = {preamble, data};
  io_detail::write_file_pieces(path, pieces);
}

}  // namespace

namespace io_detail {

NpyPreamble parse_npy_preamble(std::span<const std::byte> bytes, std::string_view source) {
  const size_t version_end = kMagic.size() + 2;
  if (bytes.size() < version_end) {
    fail(source, "too short for a .npy file: expected at least " + std::to_string(version_end) +
                     " bytes, got " + std::to_string(bytes.size()));
  }
  const std::string_view magic(reinterpret_cast<const char*>(bytes.data()), kMagic.size());
  if (magic != kMagic) fail(source, "not a .npy file: it does not start with \"\\x93NUMPY\"");
  const auto major = std::to_integer<int>(bytes[kMagic.size()]);
  const auto minor = std::to_integer<int>(bytes[kMagic.size() + 1]);
  if (major < 1 || major > 3 || minor != 0) {
    fail(source, "unsupported .npy version " + std::to_string(major) + "." + std::to_string(minor) +
                     ": expected 1.0, 2.0 or 3.0");
  }

  // Version 1.0 stores the header length in 2 bytes, versions 2.0 and 3.0 in 4.
  const size_t length_size = major == 1 ? 2 : 4;
  const size_t header_start = version_end + length_size;
  if (bytes.size() < header_start) {
    fail(source, "truncated: expected " + std::to_string(header_start) +
                     " bytes up to the header length, got " + std::to_string(bytes.size()));
  }
  const uint64_t header_length = read_little_endian(bytes.subspan(version_end, length_size));
  return {header_start, header_length};
}

NpyLayout parse_npy_header(std::span<const std::byte> bytes, std::string_view source) {
  const auto [header_start, header_length] = parse_npy_preamble(bytes, source);
  if (header_length > bytes.size() - header_start) {
    fail(source, "header length field says " + std::to_string(header_length) + " bytes, but only " +
                     std::to_string(bytes.size() - header_start) + " bytes follow");
  }
  const std::string_view header_text(reinterpret_cast<const char*>(bytes.data() + header_start),
                                     static_cast<size_t>(header_length));
  const HeaderFields fields = HeaderParser(header_text, source).parse();
  if (!fields.descr || !fields.fortran_order || !fields.shape) {
    fail(source, "malformed header: expected the keys 'descr', 'fortran_order' and 'shape'");
  }

  const DTypeInfo& dtype = dtype_from_descr(*fields.descr, source);
  const std::vector<int64_t>& dims = *fields.shape;
  if (dims.size() > static_cast<size_t>(Shape::kMaxRank)) {
    fail(source, "expected a rank of at most " + std::to_string(Shape::kMaxRank) + ", got shape " +
                     shape_text(dims) + " (rank " + std::to_string(dims.size()) + ")");
  }
  const std::optional<int64_t> expected_size = data_size(dims, dtype.itemsize);
  if (!expected_size) {
    fail(source, "shape " + shape_text(dims) + " has too many elements for 64-bit sizes");
  }
  if (io_detail::empty_extent(dims) > io_detail::kMaxEmptyExtent) {
    fail(source, "shape " + shape_text(dims) + " " + io_detail::empty_extent_message());
  }

  return {dtype.dtype, Shape::from_dims(dims.data(), static_cast<int>(dims.size())),
          header_start + static_cast<size_t>(header_length), static_cast<uint64_t>(*expected_size),
          *fields.fortran_order};
}

std::vector<std::byte> c_order_data(const NpyLayout& layout, std::vector<std::byte> data) {
  const Shape& shape = layout.shape;
  const int rank = shape.rank();
  if (!layout.fortran_order || rank < 2 || shape.numel() == 0) return data;
  // Walk the C-order destination with an odometer over the axes, last fastest; the source element
  // of index (i0, …, ir−1) lies at Σ ik·Fk elements, Fk the product of the extents before k.
  const auto itemsize = static_cast<size_t>(npy_itemsize(layout.dtype));
  int64_t fortran_strides[Shape::kMaxRank];
  int64_t index[Shape::kMaxRank] = {};
  fortran_strides[0] = 1;
  for (int k = 1; k < rank; ++k) fortran_strides[k] = fortran_strides[k - 1] * shape[k - 1];
  std::vector<std::byte> c_order(data.size());
  const int64_t last = rank - 1;
  const int64_t inner = shape[static_cast<int>(last)];
  int64_t source = 0;
  for (size_t out = 0; out < c_order.size();) {
    for (int64_t i = 0; i < inner; ++i, out += itemsize) {
      std::memcpy(c_order.data() + out,
                  data.data() + static_cast<size_t>(source + i * fortran_strides[last]) * itemsize,
                  itemsize);
    }
    for (int k = static_cast<int>(last) - 1; k >= 0; --k) {
      source += fortran_strides[k];
      if (++index[k] < shape[k]) break;
      source -= index[k] * fortran_strides[k];
      index[k] = 0;
    }
  }
  return c_order;
}

void check_npy_data_size(const NpyLayout& layout, uint64_t size, std::string_view source) {
  if (layout.data_size == size) return;
  const std::vector<int64_t> dims(layout.shape.data(), layout.shape.data() + layout.shape.rank());
  fail(source, "expected " + std::to_string(layout.data_size) + " bytes of data for shape " +
                   shape_text(dims) + " of '" + std::string(dtype_info(layout.dtype).descr) +
                   "', got " + std::to_string(size) + " bytes");
}

int64_t npy_itemsize(NpyDType dtype) {
  return dtype_info(dtype).itemsize;
}

NpyArray decode_npy_data(NpyDType dtype, const Shape& shape, std::span<const std::byte> data,
                         std::string_view source) {
  NpyArray array;
  array.shape = shape;
  array.dtype = dtype;
  switch (dtype) {
    case NpyDType::kFloat32:
      array.floats = decode<float, float>(data);
      break;
    case NpyDType::kFloat64:
      array.floats = decode<double, float>(data);
      break;
    case NpyDType::kFloat16:
      array.halves = decode<uint16_t, uint16_t>(data);
      array.floats = decode_float16(data);
      break;
    case NpyDType::kInt32:
      array.integers = decode<int32_t, int64_t>(data);
      break;
    case NpyDType::kInt64:
      array.integers = decode<int64_t, int64_t>(data);
      break;
    case NpyDType::kBool:
      array.bools = decode_bools(data, source);
      break;
  }
  return array;
}

}  // namespace io_detail

NpyArray parse_npy(std::span<const std::byte> bytes, std::string_view source) {
  const io_detail::NpyLayout layout = io_detail::parse_npy_header(bytes, source);
  const std::span<const std::byte> data = bytes.subspan(layout.data_offset);
  io_detail::check_npy_data_size(layout, data.size(), source);
  if (layout.fortran_order) {
    const std::vector<std::byte> c_order =
        io_detail::c_order_data(layout, std::vector<std::byte>(data.begin(), data.end()));
    return io_detail::decode_npy_data(layout.dtype, layout.shape, c_order, source);
  }
  return io_detail::decode_npy_data(layout.dtype, layout.shape, data, source);
}

NpyArray read_npy(const std::filesystem::path& path) {
  return parse_npy(io_detail::read_file_bytes(path), path.string());
}

// Decoded straight into the tensor's storage: one copy of the data beside the file's bytes while
// loading, as parse_npy makes for its own arrays.
Tensor load_npy_tensor(const std::filesystem::path& path, std::string_view name) {
  // The header first, then the data: float32 straight into the tensor (reading the whole file and
  // decoding it held every input twice, for a moment, in attn run), the others through their
  // bytes.
  const io_detail::NpyFile file(path);
  const io_detail::NpyLayout& layout = file.layout();
  const std::string& source = file.source();
  switch (layout.dtype) {
    case NpyDType::kFloat32: {
      Tensor tensor;
      tensor.assign_uninitialized(layout.shape);
      if (layout.fortran_order) {
        const std::vector<std::byte> c_order = io_detail::c_order_data(layout, file.read_data());
        std::memcpy(tensor.data(), c_order.data(), c_order.size());
      } else {
        file.read_into(layout.data_offset, std::as_writable_bytes(tensor.span()));
      }
      return tensor;
    }
    case NpyDType::kFloat64: {
      // A finite value past float's range (1e300) is refused here, naming the file: rounded to
      // ∞, the call named it as an infinite input ("got inf") the file never held. ±∞ and NaN
      // stay, for the checks of their use. (Masks, read by read_npy, keep the rounding: NumPy's
      // float64 lowest, which masks fill, becomes −∞ there.)
      const std::vector<std::byte> data = io_detail::c_order_data(layout, file.read_data());
      Tensor::Storage values = decode<double, float, Tensor::Storage>(data);
      if (const auto past = io_detail::first_float64_past_float_range(data, values)) {
        throw FileError(std::string(name) + " (" + source +
                        "): expected float64 values float32 holds (within ±3.4e38; attn computes "
                        "in float32), got " +
                        number_text(past->value) + " at flat index " + std::to_string(past->index));
      }
      return Tensor(layout.shape, std::move(values));
    }
    case NpyDType::kFloat16:
      return Tensor(layout.shape, decode_float16<Tensor::Storage>(
                                      io_detail::c_order_data(layout, file.read_data())));
    case NpyDType::kInt32:
    case NpyDType::kInt64:
    case NpyDType::kBool:
      break;
  }
  throw FileError(std::string(name) + " (" + source +
                  "): expected float32, float64 or float16 data, got " +
                  (layout.dtype == NpyDType::kBool ? "bool" : "integer") + " dtype '" +
                  std::string(dtype_info(layout.dtype).descr) + "'");
}

NpyFloat16 load_npy_float16(const std::filesystem::path& path, std::string_view name) {
  const io_detail::NpyFile file(path);
  const io_detail::NpyLayout& layout = file.layout();
  if (layout.dtype != NpyDType::kFloat16) {
    throw FileError(std::string(name) + " (" + file.source() +
                    "): expected float16 data, got dtype '" +
                    std::string(dtype_info(layout.dtype).descr) + "'");
  }
  NpyFloat16 result{layout.shape, std::vector<uint16_t>(static_cast<size_t>(layout.shape.numel()))};
  if (layout.fortran_order) {
    const std::vector<std::byte> c_order = io_detail::c_order_data(layout, file.read_data());
    std::memcpy(result.bits.data(), c_order.data(), c_order.size());
  } else {
    file.read_into(layout.data_offset, std::as_writable_bytes(std::span(result.bits)));
  }
  return result;
}

ValidLengths load_npy_valid_lengths(const std::filesystem::path& path, std::string_view name) {
  const NpyArray array = read_npy(path);
  if (!array.is_integer()) {
    throw FileError(std::string(name) + " (" + path.string() +
                    "): expected int32 or int64 valid lengths, got dtype '" +
                    std::string(dtype_info(array.dtype).descr) + "'");
  }
  if (array.shape.rank() != 1 && array.shape.rank() != 2) {
    throw ShapeError(std::string(name) + " (" + path.string() +
                     "): expected valid lengths of shape (B,) or (B, n), got shape " +
                     array.shape.str());
  }
  return ValidLengths::from_shape(std::span<const int64_t>(array.integers), array.shape);
}

std::vector<std::byte> serialize_npy(ConstTensorView tensor) {
  return build_npy(dtype_info(NpyDType::kFloat32), tensor.shape(), std::as_bytes(tensor.span()));
}

std::vector<std::byte> serialize_npy_float16(std::span<const uint16_t> bits, const Shape& shape) {
  require_values(bits.size(), shape, "serialize_npy_float16");
  return build_npy(dtype_info(NpyDType::kFloat16), shape, std::as_bytes(bits));
}

std::vector<std::byte> serialize_npy(std::span<const int64_t> values, const Shape& shape) {
  require_values(values.size(), shape, "serialize_npy");
  return build_npy(dtype_info(NpyDType::kInt64), shape, std::as_bytes(values));
}

std::vector<std::byte> serialize_npy_bool(std::span<const uint8_t> values, const Shape& shape) {
  require_values(values.size(), shape, "serialize_npy_bool");
  std::vector<std::byte> data(values.size());
  for (size_t index = 0; index < values.size(); ++index) {
    data[index] = std::byte{values[index] != 0 ? uint8_t{1} : uint8_t{0}};
  }
  return build_npy(dtype_info(NpyDType::kBool), shape, data);
}

void save_npy(const std::filesystem::path& path, ConstTensorView tensor) {
  write_npy(path, dtype_info(NpyDType::kFloat32), tensor.shape(), std::as_bytes(tensor.span()));
}

void save_npy(const std::filesystem::path& path, std::span<const int64_t> values,
              const Shape& shape) {
  require_values(values.size(), shape, "save_npy");
  write_npy(path, dtype_info(NpyDType::kInt64), shape, std::as_bytes(values));
}

void save_npy_float16(const std::filesystem::path& path, std::span<const uint16_t> bits,
                      const Shape& shape) {
  require_values(bits.size(), shape, "save_npy_float16");
  write_npy(path, dtype_info(NpyDType::kFloat16), shape, std::as_bytes(bits));
}

void save_npy_bool(const std::filesystem::path& path, std::span<const uint8_t> values,
                   const Shape& shape) {
  io_detail::write_file_bytes(path, serialize_npy_bool(values, shape));
}

}  // namespace attn
