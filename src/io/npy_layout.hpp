// The .npy reader's steps, for reading a file piece by piece (attn/io/npy_rows.hpp): the
// preamble, the header, the data's size check and its decoding — each as parse_npy does it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "attn/core/shape.hpp"
#include "attn/io/npy.hpp"

namespace attn::io_detail {

// The header lies at [header_start, header_start + header_length); the data follows it.
struct NpyPreamble {
  size_t header_start = 0;
  uint64_t header_length = 0;
};
// From the first 10 (version 1.0) or 12 (2.0, 3.0) bytes; FileError for a bad magic or version, or
// too few bytes.
NpyPreamble parse_npy_preamble(std::span<const std::byte> bytes, std::string_view source);

struct NpyLayout {
  NpyDType dtype = NpyDType::kFloat32;
  Shape shape;
  size_t data_offset = 0;  // bytes before the data
  uint64_t data_size = 0;  // bytes of data the header declares
  // NumPy writes an array that is Fortran-contiguous and not C-contiguous (a transposed matrix,
  // x.T) with its first axis varying fastest: c_order_data rearranges it.
  bool fortran_order = false;
};
// `bytes` holds at least the preamble and the header: every check parse_npy makes but the data's
// size.
NpyLayout parse_npy_header(std::span<const std::byte> bytes, std::string_view source);
// FileError unless `size` bytes of data are what the header declares.
void check_npy_data_size(const NpyLayout& layout, uint64_t size, std::string_view source);
// Bytes per element of `dtype`, from the same table the header parser reads descriptors with.
int64_t npy_itemsize(NpyDType dtype);
// The same array's elements in C order, from `data` in the order `layout` declares: `data` itself
// (moved) in C order, rearranged from Fortran order.
std::vector<std::byte> c_order_data(const NpyLayout& layout, std::vector<std::byte> data);
// Data of `dtype` and `shape` decoded as parse_npy decodes it (bool bytes checked).
NpyArray decode_npy_data(NpyDType dtype, const Shape& shape, std::span<const std::byte> data,
                         std::string_view source);

}  // namespace attn::io_detail
