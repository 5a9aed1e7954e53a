// safetensors reading and writing: an 8-byte header length, a JSON table of tensors and their
// byte ranges, then the data; every field is checked before a single data byte is read.
#include "attn/io/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

#include "attn/core/error.hpp"
#include "attn/core/half.hpp"
#include "io/bounded_json.hpp"
#include "io/excerpt.hpp"
#include "io/file_bytes.hpp"
#include "io/float64_range.hpp"
#include "io/limits.hpp"
#include "io/regular_file.hpp"

namespace attn {
namespace {

// Data is decoded and encoded by copying bytes, which is only right on a little-endian host.
static_assert(std::endian::native == std::endian::little, "attn assumes a little-endian host");

constexpr size_t kLengthSize = 8;
// The reference implementation refuses headers above 100 MB; so do we, before allocating.
constexpr uint64_t kMaxHeaderSize = 100'000'000;
// The reference implementation pads the header with spaces so that the data starts 8-aligned.
constexpr size_t kHeaderAlignment = 8;
constexpr std::string_view kMetadataKey = "__metadata__";
// A header describes each tensor in a dozen JSON values; a million lets a file hold tens of
// thousands of tensors (a large model's shard holds about a thousand) while keeping the parsed
// header's memory to tens of megabytes, whatever its text.
constexpr io_detail::JsonLimits kHeaderLimits{64, 1'000'000};

// One entry of the header, checked against itself but not yet against the others.
struct TensorEntry {
  std::string name;
  std::string dtype;
  Shape shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

[[noreturn]] void fail(std::string_view source, const std::string& message) {
  throw FileError(std::string(source) + ": " + message);
}

// Tensor names come from the file: escaped, so that NULs or terminal escapes never reach a message.
[[noreturn]] void fail_tensor(std::string_view source, std::string_view name,
                              const std::string& message) {
  fail(source, "tensor '" + io_detail::escaped(name) + "': " + message);
}

// A JSON value as text for an error message: cut short, escaped, and written without recursion.
std::string excerpt(const nlohmann::json& value) {
  return io_detail::json_excerpt(value);
}

// The bytes of one element of a safetensors dtype: the four attn reads, and the others the format
// names (a tokenizer's I64 ids, a BOOL mask), whose byte ranges are checked as any tensor's so that
// a file holding them beside float tensors still gives those.
std::optional<int64_t> itemsize_of(std::string_view dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "BOOL" || dtype == "U8" || dtype == "I8" || dtype == "F8_E4M3" ||
      dtype == "F8_E5M2") {
    return 1;
  }
  return std::nullopt;
}

bool readable(std::string_view dtype) {
  return dtype == "F32" || dtype == "F64" || dtype == "F16" || dtype == "BF16";
}

[[noreturn]] void unsupported_dtype(std::string_view source, const TensorEntry& entry) {
  fail_tensor(source, entry.name,
              "unsupported dtype '" + io_detail::escaped(entry.dtype) +
                  "': expected F32, F64, F16 or BF16");
}

const nlohmann::json& field(const nlohmann::json& info, const char* key, std::string_view name,
                            std::string_view source) {
  const auto found = info.find(key);
  if (found == info.end()) fail_tensor(source, name, std::string("missing field '") + key + "'");
  return *found;
}

// A JSON value that must be an integer in [0, INT64_MAX]; `what` names it in the message.
int64_t non_negative_integer(const nlohmann::json& value, const std::string& what,
                             std::string_view name, std::string_view source) {
  if (!value.is_number_unsigned() ||
      value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    fail_tensor(source, name,
                "expected " + what + " to be a non-negative 64-bit integer, got " + excerpt(value));
  }
  return value.get<int64_t>();
}

Shape read_shape(const nlohmann::json& value, std::string_view name, std::string_view source) {
  if (!value.is_array()) {
    fail_tensor(source, name, "expected 'shape' to be an array, got " + excerpt(value));
  }
  if (value.size() > static_cast<size_t>(Shape::kMaxRank)) {
    fail_tensor(source, name,
                "expected a rank of at most " + std::to_string(Shape::kMaxRank) + ", got shape " +
                    excerpt(value));
  }
  std::vector<int64_t> dims;
  for (const nlohmann::json& dim : value) {
    dims.push_back(non_negative_integer(dim, "every dimension of 'shape'", name, source));
  }
  // Overflow check over the non-zero dimensions, so that every partial product of Shape::numel
  // fits in int64 too, whatever the position of a zero; at most the elements a Shape counts.
  int64_t product = 1;
  for (const int64_t dim : dims) {
    if (dim == 0) continue;
    if (product > Shape::kMaxElements / dim) {
      fail_tensor(source, name, "shape " + excerpt(value) + " has too many elements");
    }
    product *= dim;
  }
  if (io_detail::empty_extent(dims) > io_detail::kMaxEmptyExtent) {
    fail_tensor(source, name, "shape " + excerpt(value) + " " + io_detail::empty_extent_message());
  }
  return Shape::from_dims(dims.data(), static_cast<int>(dims.size()));
}

TensorEntry read_entry(const std::string& name, const nlohmann::json& info,
                       std::string_view source) {
  if (!info.is_object()) {
    fail_tensor(
        source, name,
        "expected an object with 'dtype', 'shape' and 'data_offsets', got " + excerpt(info));
  }
  TensorEntry entry;
  entry.name = name;
  const nlohmann::json& dtype = field(info, "dtype", name, source);
  if (!dtype.is_string()) {
    fail_tensor(source, name, "expected 'dtype' to be a string, got " + excerpt(dtype));
  }
  entry.dtype = dtype.get<std::string>();
  entry.shape = read_shape(field(info, "shape", name, source), name, source);
  const nlohmann::json& offsets = field(info, "data_offsets", name, source);
  if (!offsets.is_array() || offsets.size() != 2) {
    fail_tensor(source, name,
                "expected 'data_offsets' to be an array [begin, end], got " + excerpt(offsets));
  }
  entry.begin =
      static_cast<uint64_t>(non_negative_integer(offsets[0], "'data_offsets'", name, source));
  entry.end =
      static_cast<uint64_t>(non_negative_integer(offsets[1], "'data_offsets'", name, source));
  const std::optional<int64_t> itemsize = itemsize_of(entry.dtype);
  if (!itemsize) unsupported_dtype(source, entry);
  if (entry.begin > entry.end) {
    fail_tensor(source, name,
                "data_offsets [" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) +
                    "] end before they begin");
  }
  // numel · itemsize may exceed int64 even though numel does not; compare in the other direction.
  const uint64_t length = entry.end - entry.begin;
  const auto numel = static_cast<uint64_t>(entry.shape.numel());
  if (length % static_cast<uint64_t>(*itemsize) != 0 ||
      length / static_cast<uint64_t>(*itemsize) != numel) {
    fail_tensor(source, name,
                "shape " + entry.shape.str() + " of " + entry.dtype + " needs " +
                    std::to_string(numel) + " elements of " + std::to_string(*itemsize) +
                    " bytes, but data_offsets span " + std::to_string(length) + " bytes");
  }
  return entry;
}

void check_metadata(const nlohmann::json& metadata, std::string_view source) {
  const bool all_strings = metadata.is_object() && std::all_of(metadata.begin(), metadata.end(),
                                                               [](const nlohmann::json& value) {
                                                                 return value.is_string();
                                                               });
  if (!all_strings) {
    fail(source, "expected '__metadata__' to map strings to strings, got " + excerpt(metadata));
  }
}

// The tensors must tile the data buffer exactly: sorted by offset, each begins where the
// previous one ended, and the last one ends where the file does.
void check_tiling(std::vector<TensorEntry>& entries, uint64_t buffer_size,
                  std::string_view source) {
  std::sort(entries.begin(), entries.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  std::string previous = "the start of the data";
  for (const TensorEntry& entry : entries) {
    if (entry.end > buffer_size) {
      fail_tensor(source, entry.name,
                  "data_offsets end at byte " + std::to_string(entry.end) +
                      ", past the end of the " + std::to_string(buffer_size) + "-byte data buffer");
    }
    if (entry.begin < covered) {
      fail_tensor(source, entry.name,
                  "data_offsets begin at byte " + std::to_string(entry.begin) + ", overlapping " +
                      previous + " which ends at byte " + std::to_string(covered));
    }
    if (entry.begin > covered) {
      fail_tensor(source, entry.name,
                  "data_offsets begin at byte " + std::to_string(entry.begin) +
                      ", leaving a gap after " + previous + " at byte " + std::to_string(covered));
    }
    covered = entry.end;
    previous = "'" + io_detail::escaped(entry.name) + "'";
  }
  if (covered != buffer_size) {
    fail(source, "the tensors cover " + std::to_string(covered) + " bytes of the " +
                     std::to_string(buffer_size) + "-byte data buffer");
  }
}

// 16-bit floats of `type` widened (exactly) to float32.
// Decoded straight into a tensor's storage (no second copy of a large tensor while loading).
Tensor::Storage decode_half(std::span<const std::byte> data, HalfType type) {
  Tensor::Storage values(data.size() / sizeof(uint16_t));
  for (size_t index = 0; index < values.size(); ++index) {
    uint16_t bits;
    std::memcpy(&bits, data.data() + index * sizeof bits, sizeof bits);
    values[index] = half_bits_to_float(type, bits);
  }
  return values;
}

template <class Stored>
Tensor::Storage decode(std::span<const std::byte> data) {
  Tensor::Storage values(data.size() / sizeof(Stored));
  for (size_t index = 0; index < values.size(); ++index) {
    Stored value;
    std::memcpy(&value, data.data() + index * sizeof(Stored), sizeof(Stored));
    values[index] = static_cast<float>(value);
  }
  return values;
}

// An F64 tensor's values rounded to float32, attn's type: a finite value past float's range
// (1e300) is a FileError naming the tensor, as load_state_dict and the Python functions refuse
// such values; it became ∞ without a word, which the next call named as the parameter's own.
// Infinities and NaN stay what they are, for the checks of their use.
Tensor::Storage decode_float64(std::span<const std::byte> data, std::string_view source,
                               const std::string& name) {
  Tensor::Storage values = decode<double>(data);
  if (const auto past = io_detail::first_float64_past_float_range(data, values)) {
    fail_tensor(source, name,
                "expected F64 values float32 holds (within ±3.4e38; attn computes in float32), "
                "got " +
                    number_text(past->value) + " at flat index " + std::to_string(past->index));
  }
  return values;
}

// The header of a file of `file_size` bytes whose first bytes are `bytes` (the whole file, or
// its length and header alone): the length, the JSON and the tiling of the data checked, the
// entries in offset order and the data's offset returned, the metadata into `metadata` (when
// wanted).
struct Header {
  std::vector<TensorEntry> entries;
  uint64_t data_offset = 0;
};
Header parse_header(std::span<const std::byte> bytes, uint64_t file_size, std::string_view source,
                    std::map<std::string, std::string>* metadata) {
  if (file_size < kLengthSize || bytes.size() < kLengthSize) {
    fail(source, "too short for a safetensors file: expected at least 8 bytes, got " +
                     std::to_string(file_size));
  }
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), kLengthSize);
  if (header_size > kMaxHeaderSize) {
    fail(source, "header length " + std::to_string(header_size) + " exceeds the limit of " +
                     std::to_string(kMaxHeaderSize) + " bytes");
  }
  if (header_size > file_size - kLengthSize || header_size > bytes.size() - kLengthSize) {
    fail(source, "header length " + std::to_string(header_size) + " is larger than the " +
                     std::to_string(file_size - kLengthSize) + " bytes after it");
  }
  const std::string_view header_text(reinterpret_cast<const char*>(bytes.data() + kLengthSize),
                                     static_cast<size_t>(header_size));
  const nlohmann::json header =
      io_detail::parse_bounded_json(header_text, source, "header", kHeaderLimits);
  if (!header.is_object()) {
    fail(source, "expected the header to be a JSON object, got " + std::string(header.type_name()));
  }

  Header result;
  for (const auto& [name, info] : header.items()) {
    if (name == kMetadataKey) {
      check_metadata(info, source);
      if (metadata != nullptr) {
        for (const auto& [key, value] : info.items()) {
          metadata->emplace(key, value.get<std::string>());
        }
      }
    } else {
      result.entries.push_back(read_entry(name, info, source));
    }
  }
  result.data_offset = kLengthSize + header_size;
  check_tiling(result.entries, file_size - result.data_offset, source);
  return result;
}

// The whole file checked, its tensors decoded into `tensors` and its metadata into `metadata`
// (either may be null when not wanted).
void parse_file(std::span<const std::byte> bytes, std::string_view source, StateDict* tensors,
                std::map<std::string, std::string>* metadata) {
  const Header header = parse_header(bytes, bytes.size(), source, metadata);
  if (tensors == nullptr) return;
  const std::span<const std::byte> buffer = bytes.subspan(header.data_offset);
  for (const TensorEntry& entry : header.entries) {
    if (!readable(entry.dtype)) unsupported_dtype(source, entry);
  }
  for (const TensorEntry& entry : header.entries) {
    const std::span<const std::byte> data = buffer.subspan(entry.begin, entry.end - entry.begin);
    Tensor::Storage values =
        entry.dtype == "F32" ? decode<float>(data)
        : entry.dtype == "F64"
            ? decode_float64(data, source, entry.name)
            : decode_half(data, entry.dtype == "F16" ? HalfType::kFloat16 : HalfType::kBFloat16);
    tensors->emplace(entry.name, Tensor(entry.shape, std::move(values)));
  }
}

}  // namespace

StateDict parse_safetensors(std::span<const std::byte> bytes, std::string_view source) {
  StateDict tensors;
  parse_file(bytes, source, &tensors, nullptr);
  return tensors;
}

StateDict load_safetensors(const std::filesystem::path& path) {
  return parse_safetensors(io_detail::read_file_bytes(path), path.string());
}

std::map<std::string, std::string> parse_safetensors_metadata(std::span<const std::byte> bytes,
                                                              std::string_view source) {
  std::map<std::string, std::string> metadata;
  parse_file(bytes, source, nullptr, &metadata);
  return metadata;
}

std::map<std::string, std::string> load_safetensors_metadata(const std::filesystem::path& path) {
  return parse_safetensors_metadata(io_detail::read_file_bytes(path), path.string());
}

SafetensorsTensor load_safetensors_tensor(const std::filesystem::path& path,
                                          std::string_view name) {
  const io_detail::RegularFile file(path);
  const std::string& source = file.source();
  const uint64_t size = file.size();
  // The length and the header alone, checked as the whole-file parser checks them against the
  // file's size: only the chosen tensor's bytes are read after.
  std::vector<std::byte> head(static_cast<size_t>(std::min<uint64_t>(size, kLengthSize)));
  file.read_into(0, head);
  uint64_t header_size = 0;
  if (head.size() == kLengthSize) std::memcpy(&header_size, head.data(), kLengthSize);
  if (head.size() == kLengthSize && header_size <= kMaxHeaderSize &&
      header_size <= size - kLengthSize) {
    head.resize(static_cast<size_t>(kLengthSize + header_size));
    file.read_into(kLengthSize, std::span(head).subspan(kLengthSize));
  }
  const Header header = parse_header(head, size, source, nullptr);
  const std::vector<TensorEntry>& entries = header.entries;
  const TensorEntry* chosen = nullptr;
  std::string held;
  for (const TensorEntry& entry : entries) {
    held += (held.empty() ? "'" : ", '") + io_detail::escaped(entry.name) + "'";
    if (entry.name == name) chosen = &entry;
  }
  if (name.empty() && entries.size() == 1) chosen = &entries.front();
  if (chosen == nullptr) {
    fail(source, name.empty()
                     ? "expected one tensor (or FILE:NAME to choose one), got " +
                           std::to_string(entries.size()) +
                           (held.empty() ? std::string(" (the file holds none)") : ": " + held)
                     : "no tensor '" + io_detail::escaped(name) + "': it holds " +
                           (held.empty() ? std::string("none") : held));
  }
  // The other tensors may be of any dtype the format names (a BOOL attention mask beside them).
  if (!readable(chosen->dtype)) unsupported_dtype(source, *chosen);
  SafetensorsTensor result;
  result.shape = chosen->shape;
  const uint64_t offset = header.data_offset + chosen->begin, bytes = chosen->end - chosen->begin;
  if (chosen->dtype == "F16" || chosen->dtype == "BF16") {
    result.half = chosen->dtype == "F16" ? HalfType::kFloat16 : HalfType::kBFloat16;
    result.bits.resize(static_cast<size_t>(bytes / sizeof(uint16_t)));
    file.read_into(offset, std::as_writable_bytes(std::span(result.bits)));
  } else if (chosen->dtype == "F32") {
    result.floats = Tensor(chosen->shape);
    file.read_into(offset, std::as_writable_bytes(result.floats.span()));
  } else {
    std::vector<std::byte> data(static_cast<size_t>(bytes));  // F64: rounded to float32
    file.read_into(offset, data);
    result.floats = Tensor(chosen->shape, decode_float64(data, file.source(), chosen->name));
  }
  return result;
}

namespace {

// A header's entry for one tensor: its dtype, shape and byte range in the data.
nlohmann::ordered_json header_entry(std::string_view dtype, const Shape& shape, uint64_t begin,
                                    uint64_t end) {
  nlohmann::ordered_json dims = nlohmann::ordered_json::array();
  for (int axis = 0; axis < shape.rank(); ++axis) dims.push_back(shape[axis]);
  nlohmann::ordered_json entry = nlohmann::ordered_json::object();
  entry["dtype"] = dtype;
  entry["shape"] = dims;
  entry["data_offsets"] = {begin, end};
  return entry;
}

// The file's first bytes: the header's 8-byte length, then its text padded with spaces to a
// multiple of 8 as the reference implementation pads it. ValueError from `writer` for names and
// metadata that are not UTF-8.
std::vector<std::byte> header_bytes(const nlohmann::ordered_json& header, std::string_view writer) {
  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const nlohmann::json::type_error& error) {
    throw ValueError(std::string(writer) +
                     ": tensor names and metadata must be valid UTF-8: " + error.what());
  }
  header_text.append((kHeaderAlignment - header_text.size() % kHeaderAlignment) % kHeaderAlignment,
                     ' ');
  std::vector<std::byte> bytes(kLengthSize);
  const uint64_t header_size = header_text.size();
  std::memcpy(bytes.data(), &header_size, kLengthSize);
  for (const char c : header_text) bytes.push_back(static_cast<std::byte>(c));
  return bytes;
}

}  // namespace

void save_safetensors_half(const std::filesystem::path& path, std::string_view name, HalfType type,
                           const Shape& shape, std::span<const uint16_t> bits) {
  if (name == kMetadataKey) {
    throw ValueError(
        "tensors: '__metadata__' is reserved for the file's metadata and cannot name a tensor");
  }
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header[std::string(name)] = header_entry(type == HalfType::kFloat16 ? "F16" : "BF16", shape, 0,
                                           static_cast<uint64_t>(bits.size_bytes()));
  const std::vector<std::byte> head = header_bytes(header, "save_safetensors_half");
  const std::span<const std::byte> pieces[] = {head, std::as_bytes(bits)};
  io_detail::write_file_pieces(path, pieces);
}

std::vector<std::byte> serialize_safetensors(const StateDict& tensors,
                                             const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps insertion order, so the header lists "__metadata__" first and then the
  // tensors in name order, byte for byte as the reference implementation writes it.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json entries = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) entries[key] = value;
    header[std::string(kMetadataKey)] = entries;
  }
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name == kMetadataKey) {
      throw ValueError(
          "tensors: '__metadata__' is reserved for the file's metadata and cannot name a tensor");
    }
    const auto size = static_cast<uint64_t>(tensor.numel()) * sizeof(float);
    header[name] = header_entry("F32", tensor.shape(), offset, offset + size);
    offset += size;
  }
  std::vector<std::byte> bytes = header_bytes(header, "serialize_safetensors");
  for (const auto& [name, tensor] : tensors) {
    const std::span<const std::byte> data = std::as_bytes(tensor.span());
    bytes.insert(bytes.end(), data.begin(), data.end());
  }
  return bytes;
}

void save_safetensors(const std::filesystem::path& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata) {
  io_detail::write_file_bytes(path, serialize_safetensors(tensors, metadata));
}

}  // namespace attn
