// Linear: initialisation, the forward product over the last axis, parameter naming.
#include "attn/nn/linear.hpp"

#include <cmath>

#include "attn/core/error.hpp"

namespace attn {

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, Rng& rng)
    : weight_(Shape{out_features, in_features}),
      bias_(Shape{bias ? out_features : 0}),
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
  if (x.rank() < 1)
    throw ShapeError(std::string(name) + ": expected a tensor of rank 1 to 4, got rank 0");
  const int64_t in = in_features(), out = out_features();
  require_dim(name, x.shape(), -1, in, "the layer's input size");
  int64_t dims[Shape::kMaxRank];
  for (int axis = 0; axis < x.rank(); ++axis) dims[axis] = x.shape()[axis];
  dims[x.rank() - 1] = out;
  Tensor y(Shape::from_dims(dims, x.rank()));
  const int64_t rows = in == 0 ? 0 : x.numel() / in;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x_row = x.data() + r * in;
    float* y_row = y.data() + r * out;
    for (int64_t o = 0; o < out; ++o) {
      const float* w_row = weight_.data() + o * in;
      float sum = 0.0F;
      for (int64_t t = 0; t < in; ++t) sum += x_row[t] * w_row[t];
      y_row[o] = has_bias_ ? sum + bias_.data()[o] : sum;
    }
  }
  return y;
}

void Linear::append_parameters(const std::string& prefix, std::vector<NamedParameter>& parameters) {
  parameters.push_back({prefix + ".weight", &weight_});
  if (has_bias_) parameters.push_back({prefix + ".bias", &bias_});
}

}  // namespace attn
