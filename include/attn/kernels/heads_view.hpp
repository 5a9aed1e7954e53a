// HeadsView: a batch of attention heads addressed by strides, so the fused kernels read
// multi-head projections (B, n, heads·d) in place, without the book's transpose copies.
#pragma once

#include <cstdint>
#include <string_view>
#include <type_traits>

#include "attn/core/tensor.hpp"

namespace attn {

// Matrix (b, h) — rows × cols, row-major with contiguous columns — starts at
// data + b·batch_stride + h·head_stride; its row i at + i·row_stride.
template <class T>
struct BasicHeadsView {
  T* data = nullptr;
  int64_t batch = 0;
  int64_t heads = 1;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t batch_stride = 0;
  int64_t head_stride = 0;
  int64_t row_stride = 0;

  T* matrix(int64_t b, int64_t h) const { return data + b * batch_stride + h * head_stride; }

  // A mutable view converts to a const one.
  operator BasicHeadsView<const T>() const requires(!std::is_const_v<T>) {
    return {data, batch, heads, rows, cols, batch_stride, head_stride, row_stride};
  }
};

using HeadsView = BasicHeadsView<float>;
using ConstHeadsView = BasicHeadsView<const float>;

// Half-precision heads: fp16 or bf16 bits, addressed as HeadsView's floats are.
using ConstHalfHeadsView = BasicHeadsView<const uint16_t>;
using HalfHeadsView = BasicHeadsView<uint16_t>;

// The shapes and strides of a half-precision view as a float view without data: what the argument
// checks and the kernels' float arguments read of a half-precision pass.
template <class Half>
auto shape_only(const BasicHeadsView<Half>& view) {
  using Float = std::conditional_t<std::is_const_v<Half>, const float, float>;
  return BasicHeadsView<Float>{nullptr,   view.batch,        view.heads,       view.rows,
                               view.cols, view.batch_stride, view.head_stride, view.row_stride};
}

// A (B, n, d) tensor as B single-head matrices. ShapeError unless rank 3.
ConstHeadsView single_head(ConstTensorView tensor, std::string_view name);
HeadsView single_head(TensorView tensor, std::string_view name);
// A (B, n, heads·d) tensor as B × heads matrices of n × d (head h = columns [h·d, (h+1)·d)), the
// layout of multi-head projections. ShapeError unless rank 3 with the last axis divisible by heads.
ConstHeadsView split_heads(ConstTensorView tensor, int64_t heads, std::string_view name);
HeadsView split_heads(TensorView tensor, int64_t heads, std::string_view name);
// Sets every element of every matrix of `view` to `value` (for half-precision views, its bits).
void fill_heads(const HeadsView& view, float value);
void fill_heads(const HalfHeadsView& view, uint16_t bits);

// Tensors convert to both view kinds; these pick by constness.
inline ConstHeadsView single_head(const Tensor& tensor, std::string_view name) {
  return single_head(tensor.view(), name);
}
inline HeadsView single_head(Tensor& tensor, std::string_view name) {
  return single_head(tensor.view(), name);
}
inline ConstHeadsView split_heads(const Tensor& tensor, int64_t heads, std::string_view name) {
  return split_heads(tensor.view(), heads, name);
}
inline HeadsView split_heads(Tensor& tensor, int64_t heads, std::string_view name) {
  return split_heads(tensor.view(), heads, name);
}

}  // namespace attn
