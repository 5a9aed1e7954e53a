// Global-norm clipping: the norm is accumulated in double so thousands of parameters lose nothing.
#include "attn/train/gradient_clipping.hpp"

#include <cmath>
#include <string>

#include "attn/core/error.hpp"

namespace attn {

float clip_grad_norm(const std::vector<NamedParameter>& parameters, float max_norm) {
  if (!(max_norm >= 0.0F))
    throw ValueError("max_norm: expected a number ≥ 0, got " + std::to_string(max_norm));
  double squares = 0.0;
  for (const auto& parameter : parameters) {
    for (const float g : parameter.grad->span()) squares += static_cast<double>(g) * g;
  }
  const double norm = std::sqrt(squares);
  if (!std::isfinite(norm)) {
    throw ValueError("clip_grad_norm: expected finite gradients, got a total norm of " +
                     std::to_string(norm));
  }
  const double coefficient = static_cast<double>(max_norm) / (norm + 1e-6);
  if (coefficient < 1.0) {
    for (const auto& parameter : parameters) {
      for (float& g : parameter.grad->span()) g = static_cast<float>(g * coefficient);
    }
  }
  return static_cast<float>(norm);
}

}  // namespace attn
