// HeadsView construction from tensors, with the shape checks.
#include "attn/kernels/heads_view.hpp"

#include <algorithm>
#include <string>

#include "attn/core/error.hpp"

namespace attn {

namespace {
template <class T>
BasicHeadsView<T> make_heads(T* data, const Shape& shape, int64_t heads, std::string_view name) {
  require_rank(name, shape, 3);
  if (heads <= 0 || shape[2] % heads != 0) {
    throw ShapeError(std::string(name) + ": expected the last dimension to split into " +
                     std::to_string(heads) + " heads, got shape " + shape.str());
  }
  BasicHeadsView<T> view;
  view.data = data;
  view.batch = shape[0];
  view.heads = heads;
  view.rows = shape[1];
  view.cols = shape[2] / heads;
  view.batch_stride = shape[1] * shape[2];
  view.head_stride = view.cols;
  view.row_stride = shape[2];
  return view;
}
}  // namespace

namespace {
template <class T>
void fill_matrices(const BasicHeadsView<T>& view, T value) {
  for (int64_t b = 0; b < view.batch; ++b)
    for (int64_t h = 0; h < view.heads; ++h)
      for (int64_t i = 0; i < view.rows; ++i)
        std::fill_n(view.matrix(b, h) + i * view.row_stride, view.cols, value);
}
}  // namespace

void fill_heads(const HeadsView& view, float value) {
  fill_matrices(view, value);
}
void fill_heads(const HalfHeadsView& view, uint16_t bits) {
  fill_matrices(view, bits);
}

ConstHeadsView single_head(ConstTensorView tensor, std::string_view name) {
  return make_heads(tensor.data(), tensor.shape(), 1, name);
}
HeadsView single_head(TensorView tensor, std::string_view name) {
  return make_heads(tensor.data(), tensor.shape(), 1, name);
}
ConstHeadsView split_heads(ConstTensorView tensor, int64_t heads, std::string_view name) {
  return make_heads(tensor.data(), tensor.shape(), heads, name);
}
HeadsView split_heads(TensorView tensor, int64_t heads, std::string_view name) {
  return make_heads(tensor.data(), tensor.shape(), heads, name);
}

}  // namespace attn
