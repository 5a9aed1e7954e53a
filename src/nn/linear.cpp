// Linear: initialisation, the forward product over the last axis, parameter naming.
#include "attn/nn/linear.hpp"

#include <cmath>

#include "attn/core/error.hpp"
#include "attn/kernels/gemm.hpp"

namespace attn {

int64_t require_positive_size(std::string_view name, int64_t size) {
  if (size <= 0)
    throw ValueError(std::string(name) + ": expected a positive size, got " + std::to_string(size));
  return size;
}

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, Rng& rng)
    : weight_(Shape{out_features, in_features}),
      bias_(Shape{bias ? out_features : 0}),
      weight_grad_(weight_.shape()),
      bias_grad_(bias_.shape()),
      has_bias_(bias) {
  if (in_features <= 0 || out_features <= 0) {
    throw ValueError("Linear: expected positive in_features and out_features, got " +
                     std::to_string(in_features) + " and " + std::to_string(out_features));
  }
  const float bound = 1.0F / std::sqrt(static_cast<float>(in_features));
  for (float& value : weight_.span()) value = rng.uniform(-bound, bound);
  for (float& value : bias_.span()) value = rng.uniform(-bound, bound);
}

Tensor Linear::forward(ConstTensorView x, std::string_view name) const {
  Tensor y;
  forward_into(x, y, name);
  return y;
}

void Linear::forward_into(ConstTensorView x, Tensor& y, std::string_view name) const {
  if (x.rank() < 1)
    throw ShapeError(std::string(name) + ": expected a tensor of rank 1 to 4, got rank 0");
  const int64_t in = in_features(), out = out_features();
  require_dim(name, x.shape(), -1, in, "the layer's input size");
  int64_t dims[Shape::kMaxRank];
  for (int axis = 0; axis < x.rank(); ++axis) dims[axis] = x.shape()[axis];
  dims[x.rank() - 1] = out;
  // linear_product writes every element of y.
  y.assign_uninitialized(Shape::from_dims(dims, x.rank()));
  const int64_t rows = in == 0 ? 0 : x.numel() / in;
  // y = x Wᵀ (+ b): one product over all leading positions.
  linear_product(rows, in, out, x.data(), weight_.data(), has_bias_ ? bias_.data() : nullptr,
                 y.data());
}

Tensor Linear::backward(ConstTensorView x, ConstTensorView grad_y) {
  const int64_t in = in_features(), out = out_features();
  if (x.rank() < 1 || grad_y.rank() < 1)
    throw ShapeError("Linear.backward: expected tensors of rank 1 to 4, got rank 0");
  require_dim("input", x.shape(), -1, in, "the layer's input size");
  require_dim("grad_output", grad_y.shape(), -1, out, "the layer's output size");
  const int64_t rows = x.numel() / in;
  if (grad_y.numel() != rows * out) {
    throw ShapeError("grad_output: expected " + std::to_string(rows) + " rows of " +
                     std::to_string(out) + " (one per input row), got shape " +
                     grad_y.shape().str());
  }
  Tensor grad_x(x.shape());
  // dx = dy W; dW += dyᵀ x; db += Σ dy.
  gemm(Transpose::kNo, Transpose::kNo, rows, in, out, 1.0F, grad_y.data(), out, weight_.data(), in,
       0.0F, grad_x.data(), in);
  gemm(Transpose::kYes, Transpose::kNo, out, in, rows, 1.0F, grad_y.data(), out, x.data(), in, 1.0F,
       weight_grad_.data(), in);
  if (has_bias_) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < out; ++o) bias_grad_.data()[o] += grad_y.data()[r * out + o];
  }
  return grad_x;
}

void Linear::accumulate_weight_grad(ConstTensorView grad) {
  if (grad.shape() != weight_.shape()) {
    throw ShapeError("grad: expected shape " + weight_.shape().str() +
                     " (that of the weight), got shape " + grad.shape().str());
  }
  // Pointers and count read once: with numel() and data() called per element the loop neither
  // vectorised nor hoisted them (14% of a Bahdanau decoder step's training at B = 4).
  const float* from = grad.data();
  float* to = weight_grad_.data();
  const int64_t count = grad.numel();
  for (int64_t index = 0; index < count; ++index) to[index] += from[index];
}

void Linear::append_parameters(const std::string& prefix, std::vector<NamedParameter>& parameters) {
  parameters.push_back({prefix + ".weight", &weight_, &weight_grad_});
  if (has_bias_) parameters.push_back({prefix + ".bias", &bias_, &bias_grad_});
}

}  // namespace attn
