// read_npy_header and read_npy_rows: a .npy file's header, then only the chosen rows of one axis,
// each read at its own offset — what lets every rank of a ring read just its shard (a
// Fortran-order file is read whole).
#include "attn/io/npy_rows.hpp"

#include <cstring>
#include <string>
#include <vector>

#include "attn/core/error.hpp"
#include "io/float64_range.hpp"
#include "io/npy_file.hpp"
#include "io/npy_layout.hpp"

namespace attn {

using io_detail::NpyFile;

NpyHeader read_npy_header(const std::filesystem::path& path) {
  const NpyFile file(path);
  return {file.layout().shape, file.layout().dtype};
}

NpyArray read_npy_rows(const std::filesystem::path& path, int axis,
                       std::span<const NpyRowRange> ranges) {
  NpyFile file(path);
  const Shape& shape = file.layout().shape;
  const int rank = shape.rank();
  const int a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank) {
    throw ShapeError(file.source() + ": axis " + std::to_string(axis) +
                     " is outside the array of shape " + shape.str());
  }
  int64_t rows = 0;
  for (const NpyRowRange& range : ranges) {
    if (range.begin < 0 || range.count < 0 || range.begin > shape[a] - range.count) {
      throw ShapeError(file.source() + ": rows [" + std::to_string(range.begin) + ", " +
                       std::to_string(range.begin + range.count) + ") of axis " +
                       std::to_string(axis) + " lie outside the array of shape " + shape.str());
    }
    rows += range.count;
  }
  // The array is (outer, shape[a], inner) in C order: each range of each outer index is one
  // contiguous run of bytes.
  int64_t outer = 1, inner = io_detail::npy_itemsize(file.layout().dtype);
  for (int d = 0; d < a; ++d) outer *= shape[d];
  for (int d = a + 1; d < rank; ++d) inner *= shape[d];
  int64_t dims[Shape::kMaxRank];
  for (int d = 0; d < rank; ++d) dims[d] = d == a ? rows : shape[d];
  const Shape selected = Shape::from_dims(dims, rank);
  // A Fortran-order file's rows are not contiguous runs: it is read whole and rearranged first.
  const std::vector<std::byte> whole =
      file.layout().fortran_order ? io_detail::c_order_data(file.layout(), file.read_data())
                                  : std::vector<std::byte>();
  std::vector<std::byte> data(static_cast<size_t>(outer * rows * inner));
  size_t at = 0;
  for (int64_t o = 0; o < outer; ++o) {
    for (const NpyRowRange& range : ranges) {
      const auto bytes = static_cast<size_t>(range.count * inner);
      if (bytes == 0) continue;
      const auto offset = static_cast<uint64_t>((o * shape[a] + range.begin) * inner);
      const std::span<std::byte> piece = std::span(data).subspan(at, bytes);
      if (file.layout().fortran_order) {
        std::memcpy(piece.data(), whole.data() + offset, bytes);
      } else {
        file.read_into(file.layout().data_offset + offset, piece);
      }
      at += bytes;
    }
  }
  NpyArray array = io_detail::decode_npy_data(file.layout().dtype, selected, data, file.source());
  if (array.dtype == NpyDType::kFloat64) {
    // As load_npy_tensor: a finite value float32 cannot hold is named as the file holds it, at its
    // index in the whole array (rounded to ∞, a rank named an infinity at an index of its shard).
    if (const auto past = io_detail::first_float64_past_float_range(data, array.floats)) {
      const int64_t inner_elements = inner / io_detail::npy_itemsize(NpyDType::kFloat64);
      const int64_t per_outer = rows * inner_elements;
      const auto index = static_cast<int64_t>(past->index);
      int64_t within = index % per_outer, file_row = 0;
      for (const NpyRowRange& range : ranges) {
        if (within < range.count * inner_elements) {
          file_row = range.begin + within / inner_elements;
          within %= inner_elements;
          break;
        }
        within -= range.count * inner_elements;
      }
      const int64_t file_index =
          ((index / per_outer) * shape[a] + file_row) * inner_elements + within;
      throw FileError(file.source() +
                      ": expected float64 values float32 holds (within ±3.4e38; attn computes in "
                      "float32), got " +
                      number_text(past->value) + " at flat index " + std::to_string(file_index));
    }
  }
  return array;
}

}  // namespace attn
