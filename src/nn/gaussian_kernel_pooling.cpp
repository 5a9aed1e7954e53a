// GaussianKernelPooling: Gaussian-kernel scores, then the shared pooling step.
#include "attn/nn/gaussian_kernel_pooling.hpp"

#include <cmath>
#include <string>

#include "attn/core/error.hpp"

namespace attn {

GaussianKernelPooling::GaussianKernelPooling(float width, float dropout, uint64_t seed)
    : AttentionLayer(dropout, seed), width_(Shape{1}, {width}) {
  if (!std::isfinite(width))
    throw ValueError("width: expected a finite number, got " + std::to_string(width));
}

Tensor GaussianKernelPooling::forward(ConstTensorView queries, ConstTensorView keys,
                                      ConstTensorView values, const ValidLengths& valid_lens) {
  check_attention_inputs(queries, keys, values);
  require_dim("keys", keys.shape(), 2, queries.dim(2), "the size of each query");
  valid_lens.check("valid_lens", queries.dim(0), queries.dim(1), keys.dim(1));
  const int64_t batch = queries.dim(0), n = queries.dim(1), m = keys.dim(1), d = queries.dim(2);
  const float w = width();
  Tensor scores(Shape{batch, n, m});
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        float squared = 0.0F;
        for (int64_t t = 0; t < d; ++t) {
          const float scaled = (queries(b, i, t) - keys(b, j, t)) * w;
          squared += scaled * scaled;
        }
        scores(b, i, j) = -0.5F * squared;
      }
    }
  }
  return pool(std::move(scores), valid_lens, values);
}

std::vector<NamedParameter> GaussianKernelPooling::parameters() {
  return {{"w", &width_}};
}

StateDict GaussianKernelPooling::state_dict() const {
  // parameters() hands out mutable pointers, but collecting only copies through them.
  return collect_state_dict(const_cast<GaussianKernelPooling*>(this)->parameters());
}

void GaussianKernelPooling::load_state_dict(const StateDict& state) {
  attn::load_state_dict(state, parameters(), "GaussianKernelPooling");
  if (!std::isfinite(width())) {
    throw ValueError(
        "GaussianKernelPooling.load_state_dict: tensor 'w' expected a finite width, got " +
        std::to_string(width()));
  }
}

}  // namespace attn
