// NumPy .npy files: reading float32/float64/float16 (as float32; float16 also as its bits),
// int32/int64 and bool arrays (in C order, rearranged from Fortran order where a file has it), and
// writing float32, float16, int64 and bool ones. Every header field is checked against the bytes
// that follow.
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

enum class NpyDType { kFloat32, kFloat64, kFloat16, kInt32, kInt64, kBool };

// The contents of a .npy file: floating data lands in `floats` (float64 rounded to float32,
// float16 widened exactly, its bits also kept in `halves` for the half-precision kernels),
// integer data in `integers`, bool data in `bools` (one byte each, 0 or 1, as NumPy stores them);
// the other vectors are empty.
struct NpyArray {
  Shape shape;
  NpyDType dtype = NpyDType::kFloat32;  // as stored in the file
  std::vector<float> floats;
  std::vector<uint16_t> halves;
  std::vector<int64_t> integers;
  std::vector<uint8_t> bools;

  bool is_integer() const { return dtype == NpyDType::kInt32 || dtype == NpyDType::kInt64; }
  bool is_bool() const { return dtype == NpyDType::kBool; }
};

// Parses the bytes of a .npy file; `source` names it in error messages. Throws FileError for a bad
// magic, version, header, dtype (anything but little-endian <f4 <f8 <f2 <i4 <i8, or |b1), a rank
// above 8, or a data size that disagrees with the header. A bool byte other than 0
// or 1 is refused too (FileError naming its index): NumPy never writes one, so such a file holds
// some other data under a bool header, and guessing "nonzero = true" would hide that.
NpyArray parse_npy(std::span<const std::byte> bytes, std::string_view source);
NpyArray read_npy(const std::filesystem::path& path);

// A float tensor from a float32/float64/float16 file; FileError naming `name` for integer or bool
// data.
Tensor load_npy_tensor(const std::filesystem::path& path, std::string_view name);
// A float16 file's bits as they are (for the half-precision kernels) and its shape; FileError
// naming `name` for any other dtype.
struct NpyFloat16 {
  Shape shape;
  std::vector<uint16_t> bits;
};
NpyFloat16 load_npy_float16(const std::filesystem::path& path, std::string_view name);
// Valid lengths from an int32/int64 file of shape (B) or (B, n); FileError/ShapeError otherwise.
ValidLengths load_npy_valid_lengths(const std::filesystem::path& path, std::string_view name);

// Serialises as version 1.0, little-endian, C order.
std::vector<std::byte> serialize_npy(ConstTensorView tensor);
std::vector<std::byte> serialize_npy(std::span<const int64_t> values, const Shape& shape);
// float16 ('<f2') from its bits; ShapeError unless there are shape.numel() of them.
std::vector<std::byte> serialize_npy_float16(std::span<const uint16_t> bits, const Shape& shape);
// A bool array ('|b1'): nonzero values are written as 1 (True).
std::vector<std::byte> serialize_npy_bool(std::span<const uint8_t> values, const Shape& shape);
void save_npy(const std::filesystem::path& path, ConstTensorView tensor);
void save_npy(const std::filesystem::path& path, std::span<const int64_t> values,
              const Shape& shape);
void save_npy_float16(const std::filesystem::path& path, std::span<const uint16_t> bits,
                      const Shape& shape);
void save_npy_bool(const std::filesystem::path& path, std::span<const uint8_t> values,
                   const Shape& shape);

}  // namespace attn
