// Dropout: range check, the in-place masked scaling and a drawn mask applied again.
#include "attn/nn/dropout.hpp"

#include <cmath>
#include <string>

#include "attn/core/error.hpp"

namespace attn {

Dropout::Dropout(float p, uint64_t seed) : p_(p), rng_(seed) {
  if (!(p >= 0.0F && p <= 1.0F)) {
    throw ValueError("dropout: expected a probability in [0, 1], got " + number_text(p));
  }
}

void Dropout::apply(TensorView values) {
  if (p_ == 0.0F) return;
  const float keep_scale = p_ == 1.0F ? 0.0F : 1.0F / (1.0F - p_);
  for (float& value : values.span()) value = rng_.uniform() < p_ ? 0.0F : value * keep_scale;
}

void Dropout::apply_mask(TensorView values, ConstTensorView mask) {
  if (values.shape() != mask.shape()) {
    throw ShapeError("dropout mask: expected shape " + values.shape().str() + ", got " +
                     mask.shape().str());
  }
  float* value = values.data();
  const float* keep = mask.data();
  const int64_t count = values.numel();
  for (int64_t index = 0; index < count; ++index) value[index] *= keep[index];
}

Tensor Dropout::draw_mask(const Shape& shape) {
  Tensor mask = Tensor::full(shape, 1.0F);
  apply(mask);
  return mask;
}

}  // namespace attn
