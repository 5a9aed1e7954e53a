// Shape: the dimensions of a row-major tensor of rank 0 to 8, and its printing for error messages.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace attn {

class Shape {
 public:
  static constexpr int kMaxRank = 8;
  // The most elements a shape may count: as many floats as an address space holds (PTRDIFF_MAX
  // bytes), so that numel() and every byte count of its elements stay within int64.
  static constexpr int64_t kMaxElements = INT64_MAX / 4;

  Shape() = default;
  // Throws ShapeError for a rank above kMaxRank, a negative dimension or more than kMaxElements
  // elements.
  Shape(std::initializer_list<int64_t> dims);
  static Shape from_dims(const int64_t* dims, int rank);

  int rank() const { return rank_; }
  int64_t operator[](int axis) const { return dims_[static_cast<size_t>(axis)]; }
  // Negative axes count from the end, as in NumPy.
  int64_t dim(int axis) const;
  int64_t numel() const;
  const int64_t* data() const { return dims_.data(); }

  bool operator==(const Shape& other) const;
  bool operator!=(const Shape& other) const { return !(*this == other); }

  // "(2, 3, 4)", as NumPy and PyTorch print shapes.
  std::string str() const;

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

}  // namespace attn
