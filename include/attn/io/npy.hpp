// NumPy .npy files: reading float32/float64 (as float32) and int32/int64 arrays in C order, and
// writing float32 and int64 ones. Every header field is checked against the bytes that follow.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>
#include <vector>

#include "attn/core/shape.hpp"
#include "attn/core/tensor.hpp"
#include "attn/core/valid_lengths.hpp"

namespace attn {

enum class NpyDType { kFloat32, kFloat64, kInt32, kInt64 };

// The contents of a .npy file: floating data lands in `floats` (float64 rounded to float32),
// integer data in `integers`; the other vector is empty.
struct NpyArray {
  Shape shape;
  NpyDType dtype = NpyDType::kFloat32;  // as stored in the file
  std::vector<float> floats;
  std::vector<int64_t> integers;

  bool is_integer() const { return dtype == NpyDType::kInt32 || dtype == NpyDType::kInt64; }
};

// Parses the bytes of a .npy file; `source` names it in error messages. Throws FileError for a bad
// magic, version, header, dtype (anything but little-endian <f4 <f8 <i4 <i8), Fortran order, a
// rank above 4, or a data size that disagrees with the header.
NpyArray parse_npy(std::span<const std::byte> bytes, std::string_view source);
NpyArray read_npy(const std::filesystem::path& path);

// A float tensor from a float32/float64 file; FileError naming `name` for integer data.
Tensor load_npy_tensor(const std::filesystem::path& path, std::string_view name);
// Valid lengths from an int32/int64 file of shape (B) or (B, n); FileError/ShapeError otherwise.
ValidLengths load_npy_valid_lengths(const std::filesystem::path& path, std::string_view name);

// Serialises as version 1.0, little-endian, C order.
std::vector<std::byte> serialize_npy(ConstTensorView tensor);
std::vector<std::byte> serialize_npy(std::span<const int64_t> values, const Shape& shape);
void save_npy(const std::filesystem::path& path, ConstTensorView tensor);
void save_npy(const std::filesystem::path& path, std::span<const int64_t> values,
              const Shape& shape);

}  // namespace attn
