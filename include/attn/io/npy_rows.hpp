// Parts of a .npy file without reading the rest of it: the header alone (shape and dtype), and
// chosen ranges of rows along one axis — what a rank of `attn run --ring` reads of its shard.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>

#include "attn/core/shape.hpp"
#include "attn/io/npy.hpp"

namespace attn {

// The shape and dtype a .npy file's header declares, checked as read_npy checks them (the file's
// size included), its data left unread.
struct NpyHeader {
  Shape shape;
  NpyDType dtype = NpyDType::kFloat32;
};
NpyHeader read_npy_header(const std::filesystem::path& path);

// Indices [begin, begin + count) of one axis.
struct NpyRowRange {
  int64_t begin = 0;
  int64_t count = 0;
};

// The ranges of `axis` (negative counts from the end) of a .npy array, concatenated along that
// axis in the order given: the file's shape with the ranges' total at `axis`, decoded as read_npy
// decodes. Reads the header, then seeks to each range once per index of the axes before `axis`;
// memory is the selection's. FileError as read_npy, and for a finite float64 value past float's
// range (as load_npy_tensor, naming it and its flat index in the whole array); ShapeError naming
// the path for an axis outside the array or a range outside [0, size of the axis].
NpyArray read_npy_rows(const std::filesystem::path& path, int axis,
                       std::span<const NpyRowRange> ranges);

}  // namespace attn
