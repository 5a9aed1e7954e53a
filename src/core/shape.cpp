// Shape: construction checks, element count and printing.
#include "attn/core/shape.hpp"

#include "attn/core/error.hpp"

namespace attn {

Shape::Shape(std::initializer_list<int64_t> dims)
    : Shape(from_dims(dims.begin(), static_cast<int>(dims.size()))) {}

Shape Shape::from_dims(const int64_t* dims, int rank) {
  if (rank < 0 || rank > kMaxRank) {
    throw ShapeError("shape: expected a rank from 0 to " + std::to_string(kMaxRank) +
                     ", got rank " + std::to_string(rank));
  }
  Shape shape;
  shape.rank_ = rank;
  for (int axis = 0; axis < rank; ++axis) {
    if (dims[axis] < 0) {
      throw ShapeError("shape: expected non-negative dimensions, got " +
                       std::to_string(dims[axis]) + " at axis " + std::to_string(axis));
    }
    shape.dims_[static_cast<size_t>(axis)] = dims[axis];
  }
  // The count, checked before numel() multiplies it unchecked (dimensions from a caller's sizes,
  // such as a layer's, wrapped around int64 before): the non-zero dimensions' product, so that
  // every partial product numel() forms fits, wherever a zero stands (as the file readers check).
  int64_t count = 1;
  bool too_many = false;
  for (int axis = 0; axis < rank && !too_many; ++axis) {
    if (dims[axis] == 0) continue;
    too_many = __builtin_mul_overflow(count, dims[axis], &count) || count > kMaxElements;
  }
  if (too_many) {
    throw ShapeError("shape: expected at most " + std::to_string(kMaxElements) +
                     " elements (the floats an address space holds), got shape " + shape.str());
  }
  return shape;
}

int64_t Shape::dim(int axis) const {
  const int resolved = axis < 0 ? axis + rank_ : axis;
  if (resolved < 0 || resolved >= rank_) {
    throw ShapeError("shape: axis " + std::to_string(axis) + " is out of range for shape " + str());
  }
  return dims_[static_cast<size_t>(resolved)];
}

int64_t Shape::numel() const {
  int64_t count = 1;
  for (int axis = 0; axis < rank_; ++axis) count *= dims_[static_cast<size_t>(axis)];
  return count;
}

bool Shape::operator==(const Shape& other) const {
  if (rank_ != other.rank_) return false;
  for (int axis = 0; axis < rank_; ++axis) {
    if (dims_[static_cast<size_t>(axis)] != other.dims_[static_cast<size_t>(axis)]) return false;
  }
  return true;
}

std::string Shape::str() const {
  std::string text = "(";
  for (int axis = 0; axis < rank_; ++axis) {
    if (axis > 0) text += ", ";
    text += std::to_string(dims_[static_cast<size_t>(axis)]);
  }
  if (rank_ == 1) text += ",";
  return text + ")";
}

}  // namespace attn
