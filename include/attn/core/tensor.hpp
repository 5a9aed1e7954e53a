// Tensor: an owning, contiguous, row-major float32 array of rank 0 to 8; TensorView and
// ConstTensorView: cheap non-owning views of the same layout that functions take as arguments.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "attn/core/shape.hpp"
#include "attn/core/tensor_allocator.hpp"

namespace attn {

// A non-owning view of contiguous row-major data. T is float or const float.
template <class T>
class BasicTensorView {
 public:
  BasicTensorView() = default;
  BasicTensorView(T* data, const Shape& shape) : data_(data), shape_(shape) {}
  // A mutable view converts to a const one.
  template <class U>
  requires std::is_same_v<const U, T> &&
      (!std::is_same_v<U, T>)BasicTensorView(const BasicTensorView<U>& other)
      : data_(other.data()), shape_(other.shape()) {}

  T* data() const { return data_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  int64_t dim(int axis) const { return shape_.dim(axis); }
  int64_t numel() const { return shape_.numel(); }
  std::span<T> span() const { return {data_, static_cast<size_t>(numel())}; }

  // The same data under another shape with as many elements; throws ShapeError otherwise.
  BasicTensorView reshaped(const Shape& shape) const;
  // The sub-tensor at `index` of the first axis (rank drops by one); throws ShapeError if out of
  // range.
  BasicTensorView operator[](int64_t index) const;

  // Unchecked element access by full index; the caller guarantees rank and bounds.
  T& operator()(int64_t i) const { return data_[i]; }
  T& operator()(int64_t i, int64_t j) const { return data_[i * shape_[1] + j]; }
  T& operator()(int64_t i, int64_t j, int64_t k) const {
    return data_[(i * shape_[1] + j) * shape_[2] + k];
  }
  T& operator()(int64_t i, int64_t j, int64_t k, int64_t l) const {
    return data_[((i * shape_[1] + j) * shape_[2] + k) * shape_[3] + l];
  }

 private:
  T* data_ = nullptr;
  Shape shape_ = Shape{0};  // default: empty, zero elements
};

using TensorView = BasicTensorView<float>;
using ConstTensorView = BasicTensorView<const float>;

// Owns its elements; copying copies them, moving is cheap.
class Tensor {
 public:
  // The elements, 64-byte aligned (TensorAllocator).
  using Storage = std::vector<float, TensorAllocator<float>>;

  Tensor() = default;
  // Copies in vectors (on the OpenMP threads from a few MB on, as `assign`): the storage's own
  // copy went element by element, through the allocator's construct (scalar loads and stores).
  Tensor(const Tensor& other);
  Tensor& operator=(const Tensor& other);
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;
  ~Tensor() = default;
  // Zero-filled (on the OpenMP threads from a few MB on, as `assign` copies).
  explicit Tensor(const Shape& shape);
  // Takes `values`, which must hold exactly shape.numel() elements (ShapeError otherwise).
  Tensor(const Shape& shape, Storage values);
  // The same from a std::vector, copied into the tensor's storage.
  Tensor(const Shape& shape, const std::vector<float>& values);
  Tensor(const Shape& shape, std::initializer_list<float> values);
  static Tensor full(const Shape& shape, float value);
  // A copy of any view.
  static Tensor from(ConstTensorView view);

  float* data() { return values_.data(); }
  const float* data() const { return values_.data(); }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  int64_t dim(int axis) const { return shape_.dim(axis); }
  int64_t numel() const { return shape_.numel(); }
  std::span<float> span() { return values_; }
  std::span<const float> span() const { return values_; }
  const Storage& values() const { return values_; }
  // A copy of the elements as a std::vector (to compare with one, or to hand to an API that
  // takes one).
  std::vector<float> to_vector() const { return {values_.begin(), values_.end()}; }

  TensorView view() { return {values_.data(), shape_}; }
  ConstTensorView view() const { return {values_.data(), shape_}; }
  operator TensorView() { return view(); }
  operator ConstTensorView() const { return view(); }

  // Changes the shape in place, keeping the elements; throws ShapeError if the count differs.
  void reshape(const Shape& shape);
  // Becomes a copy of `view`, in the storage it already has when that holds enough elements (a
  // layer keeping its inputs for the backward pass allocates once, not at every call), copied on
  // the OpenMP threads from a few MB on.
  void assign(ConstTensorView view);
  // Becomes a zero-filled tensor of `shape`, in the storage it already has when that holds enough
  // elements (filled on the OpenMP threads from a few MB on): a layer's per-call outputs reuse
  // their pages instead of faulting in fresh ones at every call.
  void assign_zeros(const Shape& shape);
  // The same without the fill, for a caller that writes every element before any is read (a
  // product's output, whose threads then make the first touch): elements kept from the storage
  // are stale, new ones unspecified.
  void assign_uninitialized(const Shape& shape);

  template <class... Index>
  float& operator()(Index... index) {
    return view()(static_cast<int64_t>(index)...);
  }
  template <class... Index>
  const float& operator()(Index... index) const {
    return view()(static_cast<int64_t>(index)...);
  }

 private:
  // assign_zeros with `value`.
  void assign_filled(const Shape& shape, float value);

  Storage values_;
  Shape shape_ = Shape{0};  // default: empty, zero elements
};

// Throws ValueError naming `name` and the first index holding NaN or ±∞; returns max |value|.
// Both scans are vectorised, and run on the OpenMP threads from a million elements on.
float require_finite(std::string_view name, ConstTensorView tensor);
// True when no element is NaN or ±∞.
bool all_finite(ConstTensorView tensor);
// max |value| in one scan, or +∞ when some element is NaN or ±∞.
float max_magnitude(ConstTensorView tensor);
// Throws ShapeError unless `view` has rank `rank`; `name` is the argument's name for the message.
void require_rank(std::string_view name, const Shape& shape, int rank);
// Throws ShapeError unless dimension `axis` of `shape` equals `expected`; `what` says what that
// dimension must agree with (e.g. "the batch size of queries").
void require_dim(std::string_view name, const Shape& shape, int axis, int64_t expected,
                 std::string_view what);

}  // namespace attn
