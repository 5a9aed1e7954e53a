// Tensor and view construction, reshaping and slicing, with the shape checks shared by all layers.
#include "attn/core/tensor.hpp"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>

#include "attn/core/error.hpp"
#include "core/fork_safety.hpp"
#include "core/magnitude_scan.hpp"

namespace attn {

template <class T>
BasicTensorView<T> BasicTensorView<T>::reshaped(const Shape& shape) const {
  if (shape.numel() != numel()) {
    throw ShapeError("reshape: cannot view " + std::to_string(numel()) + " elements of shape " +
                     shape_.str() + " as shape " + shape.str());
  }
  return {data_, shape};
}

template <class T>
BasicTensorView<T> BasicTensorView<T>::operator[](int64_t index) const {
  if (shape_.rank() == 0) throw ShapeError("index: cannot index a tensor of rank 0");
  if (index < 0 || index >= shape_[0]) {
    throw ShapeError("index: " + std::to_string(index) +
                     " is out of range for the first axis of shape " + shape_.str());
  }
  const Shape inner = Shape::from_dims(shape_.data() + 1, shape_.rank() - 1);
  return {data_ + index * inner.numel(), inner};
}

template class BasicTensorView<float>;
template class BasicTensorView<const float>;

namespace {

// Long passes over a tensor's values (fills, copies, scans) run on the OpenMP threads in chunks of
// 2^16 floats from 16 chunks (4 MiB) on, where they pay for the threads: the layers' copies and
// checks would otherwise stay serial beside parallel GEMMs and kernels, and a fresh tensor's first
// touch (the page faults and the kernel's zeroing of its pages) would stay on one thread.
constexpr int64_t kParallelChunk = int64_t{1} << 16;
constexpr int64_t kParallelFrom = 16 * kParallelChunk;

int64_t parallel_chunks(int64_t count) {
  return (count + kParallelChunk - 1) / kParallelChunk;
}

// pass(begin, count) over [0, total): one call below kParallelFrom, chunks on the threads above.
template <class Pass>
void in_chunks(int64_t total, const Pass& pass) {
  if (total <= kParallelFrom) {
    pass(int64_t{0}, total);
    return;
  }
  const int64_t chunks = parallel_chunks(total);
  core_detail::note_parallel_region(omp_get_max_threads());
#pragma omp parallel for
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t begin = chunk * kParallelChunk;
    pass(begin, std::min(kParallelChunk, total - begin));
  }
}

void require_value_count(const Shape& shape, size_t count) {
  if (static_cast<int64_t>(count) != shape.numel()) {
    throw ShapeError("tensor: shape " + shape.str() + " needs " + std::to_string(shape.numel()) +
                     " values, got " + std::to_string(count));
  }
}

}  // namespace

Tensor::Tensor(const Shape& shape) {
  assign_zeros(shape);
}

Tensor::Tensor(const Tensor& other) {
  assign(other.view());
}

Tensor& Tensor::operator=(const Tensor& other) {
  if (this != &other) assign(other.view());
  return *this;
}

Tensor::Tensor(const Shape& shape, Storage values) : values_(std::move(values)), shape_(shape) {
  require_value_count(shape, values_.size());
}

Tensor::Tensor(const Shape& shape, const std::vector<float>& values) : shape_(shape) {
  require_value_count(shape, values.size());
  values_.resize(values.size());
  const float* from = values.data();
  float* to = values_.data();
  in_chunks(shape.numel(), [from, to](int64_t begin, int64_t count) {
    std::copy_n(from + begin, count, to + begin);
  });
}

Tensor::Tensor(const Shape& shape, std::initializer_list<float> values)
    : values_(values), shape_(shape) {
  require_value_count(shape, values_.size());
}

Tensor Tensor::full(const Shape& shape, float value) {
  Tensor tensor;
  tensor.assign_filled(shape, value);
  return tensor;
}

Tensor Tensor::from(ConstTensorView view) {
  Tensor tensor;
  tensor.assign(view);  // a fresh tensor never overlaps the view
  return tensor;
}

void Tensor::reshape(const Shape& shape) {
  if (shape.numel() != numel()) {
    throw ShapeError("reshape: cannot view " + std::to_string(numel()) + " elements of shape " +
                     shape_.str() + " as shape " + shape.str());
  }
  shape_ = shape;
}

void Tensor::assign_uninitialized(const Shape& shape) {
  values_.resize(static_cast<size_t>(shape.numel()));
  shape_ = shape;
}

void Tensor::assign_filled(const Shape& shape, float value) {
  assign_uninitialized(shape);
  float* to = values_.data();
  in_chunks(shape.numel(),
            [to, value](int64_t begin, int64_t count) { std::fill_n(to + begin, count, value); });
}

void Tensor::assign_zeros(const Shape& shape) {
  assign_filled(shape, 0.0F);
}

void Tensor::assign(ConstTensorView view) {
  const float* from = view.data();
  const auto count = static_cast<size_t>(view.numel());
  const std::less<const float*> before;  // a total order, also between unrelated buffers
  if (count > 0 && !before(from, values_.data()) && before(from, values_.data() + values_.size())) {
    *this = Tensor::from(view);  // a view of this tensor itself: copied out before resizing
    return;
  }
  values_.resize(count);
  float* to = values_.data();
  in_chunks(static_cast<int64_t>(count),
            [from, to](int64_t begin, int64_t n) { std::copy_n(from + begin, n, to + begin); });
  shape_ = view.shape();
}

namespace {

using core_detail::kFirstNonFinite;

// core_detail::largest_magnitude_bits over the whole run, in parallel chunks from kParallelFrom on.
uint32_t largest_magnitude_bits(const float* values, int64_t count) {
  if (count <= kParallelFrom) return core_detail::largest_magnitude_bits(values, count);
  const int64_t chunks = parallel_chunks(count);
  uint32_t largest = 0;
  core_detail::note_parallel_region(omp_get_max_threads());
#pragma omp parallel for reduction(max : largest)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t begin = chunk * kParallelChunk;
    largest = std::max(largest, core_detail::largest_magnitude_bits(
                                    values + begin, std::min(kParallelChunk, count - begin)));
  }
  return largest;
}

}  // namespace

bool all_finite(ConstTensorView tensor) {
  return largest_magnitude_bits(tensor.data(), tensor.numel()) < kFirstNonFinite;
}

float max_magnitude(ConstTensorView tensor) {
  const uint32_t largest = largest_magnitude_bits(tensor.data(), tensor.numel());
  return largest < kFirstNonFinite ? std::bit_cast<float>(largest)
                                   : std::numeric_limits<float>::infinity();
}

float require_finite(std::string_view name, ConstTensorView tensor) {
  const float* values = tensor.data();
  const int64_t count = tensor.numel();
  const uint32_t largest = largest_magnitude_bits(values, count);
  if (largest < kFirstNonFinite) return std::bit_cast<float>(largest);
  for (int64_t index = 0; index < count; ++index) {  // rare: name the first culprit
    if (std::isfinite(values[index])) continue;
    throw ValueError(std::string(name) + ": expected finite values, got " +
                     std::to_string(values[index]) + " at flat index " + std::to_string(index) +
                     " of shape " + tensor.shape().str());
  }
  return std::bit_cast<float>(largest);
}

void require_rank(std::string_view name, const Shape& shape, int rank) {
  if (shape.rank() != rank) {
    throw ShapeError(std::string(name) + ": expected a tensor of rank " + std::to_string(rank) +
                     ", got shape " + shape.str() + " (rank " + std::to_string(shape.rank()) + ")");
  }
}

void require_dim(std::string_view name, const Shape& shape, int axis, int64_t expected,
                 std::string_view what) {
  if (shape.dim(axis) != expected) {
    const std::string which =
        axis == -1 ? "the last dimension" : "dimension " + std::to_string(axis);
    throw ShapeError(std::string(name) + ": expected " + which + " to be " +
                     std::to_string(expected) + " (" + std::string(what) + "), got shape " +
                     shape.str());
  }
}

}  // namespace attn
