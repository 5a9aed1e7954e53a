// StridedView: a non-owning view of an array of rank 0 to 8 whose elements lie at any
// non-negative strides (in elements), as NumPy and PyTorch describe theirs — what the functional
// attention API takes, so transposed or broadcast inputs are read in place.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "attn/core/error.hpp"
#include "attn/core/shape.hpp"
#include "attn/core/tensor.hpp"

namespace attn {

template <class T>
class StridedView {
 public:
  using Strides = std::array<int64_t, Shape::kMaxRank>;

  StridedView() = default;
  // Contiguous row-major data of `shape`.
  StridedView(T* data, const Shape& shape) : data_(data), shape_(shape) {
    int64_t stride = 1;
    for (int axis = shape.rank() - 1; axis >= 0; --axis) {
      strides_[static_cast<size_t>(axis)] = stride;
      stride *= shape[axis];
    }
  }
  // Element `index` lies at data + Σ index[a]·strides[a]. ShapeError unless there is one stride
  // per axis, each non-negative (stride 0 repeats an element along that axis, as broadcasting
  // does).
  StridedView(T* data, const Shape& shape, std::span<const int64_t> strides)
      : data_(data), shape_(shape) {
    if (strides.size() != static_cast<size_t>(shape.rank())) {
      throw ShapeError("strides: expected " + std::to_string(shape.rank()) + " (one per axis of " +
                       shape.str() + "), got " + std::to_string(strides.size()));
    }
    for (size_t axis = 0; axis < strides.size(); ++axis) {
      if (strides[axis] < 0) {
        throw ShapeError("strides: expected non-negative strides, got " +
                         std::to_string(strides[axis]) + " at axis " + std::to_string(axis));
      }
      strides_[axis] = strides[axis];
    }
  }
  // Contiguous tensors and views convert implicitly.
  template <class U>
  requires std::is_same_v<const U, T> || std::is_same_v<U, T> StridedView(
      const BasicTensorView<U>& view)  // NOLINT(google-explicit-constructor)
      : StridedView(view.data(), view.shape()) {}
  StridedView(const Tensor& tensor)  // NOLINT(google-explicit-constructor)
      requires std::is_same_v<T, const float> : StridedView(tensor.data(), tensor.shape()) {}
  StridedView(Tensor& tensor)  // NOLINT(google-explicit-constructor)
      requires std::is_same_v < std::remove_const_t<T>,
  float > : StridedView(tensor.data(), tensor.shape()) {}
  // A mutable view converts to a const one.
  operator StridedView<const T>() const  // NOLINT(google-explicit-constructor)
      requires(!std::is_const_v<T>) {
    return StridedView<const T>(
        data_, shape_, std::span<const int64_t>(strides_.data(), static_cast<size_t>(rank())));
  }

  T* data() const { return data_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  // Negative axes count from the end, as in NumPy; ShapeError when out of range.
  int64_t dim(int axis) const { return shape_.dim(axis); }
  int64_t stride(int axis) const {
    return strides_[static_cast<size_t>(axis < 0 ? axis + rank() : axis)];
  }
  std::span<const int64_t> strides() const {
    return {strides_.data(), static_cast<size_t>(rank())};
  }
  int64_t numel() const { return shape_.numel(); }
  // Row-major without gaps: what a Tensor of this shape would hold (a view without elements always
  // is: any strides describe it).
  bool is_contiguous() const { return shape_.numel() == 0 || *this == StridedView(data_, shape_); }

  // Elements from data() up to the farthest one the view reaches, inclusive: (Σ (dim − 1)·stride)
  // + 1, 0 for a view without elements, INT64_MAX where that overflows (no memory holds such a
  // view). Two views whose spans share no byte read and write separate memory.
  int64_t span_elements() const {
    if (numel() == 0) return 0;
    int64_t last = 0;
    for (int axis = 0; axis < rank(); ++axis) {
      int64_t reach = 0;
      if (__builtin_mul_overflow(shape_[axis] - 1, stride(axis), &reach) ||
          __builtin_add_overflow(last, reach, &last) || last == INT64_MAX) {
        return INT64_MAX;
      }
    }
    return last + 1;
  }

  bool operator==(const StridedView& other) const {
    if (data_ != other.data_ || shape_ != other.shape_) return false;
    for (int axis = 0; axis < rank(); ++axis) {
      // Strides of axes of size 1 never move the address.
      if (shape_[axis] != 1 && stride(axis) != other.stride(axis)) return false;
    }
    return true;
  }

 private:
  T* data_ = nullptr;
  Shape shape_ = Shape{0};
  Strides strides_{};
};

using ConstStridedView = StridedView<const float>;
using MutableStridedView = StridedView<float>;

}  // namespace attn
