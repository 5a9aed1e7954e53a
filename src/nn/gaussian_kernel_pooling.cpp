// GaussianKernelPooling: Gaussian-kernel scores, then the shared pooling step.
#include "attn/nn/gaussian_kernel_pooling.hpp"

#include <cmath>
#include <string>

#include "attn/core/error.hpp"
#include "attn/functional/gaussian_kernel_pooling.hpp"

namespace attn {

GaussianKernelPooling::GaussianKernelPooling(float width, float dropout, uint64_t seed)
    : AttentionLayer(dropout, seed), width_(Shape{1}, {width}), width_grad_(Shape{1}) {
  if (!std::isfinite(width))
    throw ValueError("width: expected a finite number, got " + std::to_string(width));
}

Tensor GaussianKernelPooling::forward(ConstTensorView queries, ConstTensorView keys,
                                      ConstTensorView values, const ValidLengths& valid_lens) {
  check_attention_inputs(queries, keys, values);
  require_dim("keys", keys.shape(), 2, queries.dim(2), "the size of each query");
  valid_lens.check("valid_lens", queries.dim(0), queries.dim(1), keys.dim(1));
  require_finite("values", values);
  Tensor scores = gaussian_kernel_shifted_scores(queries, keys, width(), valid_lens);
  queries_.assign(queries);
  keys_.assign(keys);
  return pool(std::move(scores), valid_lens, values);
}

// S_ij = −½ w² ‖q_i − k_j‖², so with δ = q_i − k_j:
//   dq_i += −w² dS_ij δ,   dk_j += w² dS_ij δ,   dw += −w ‖δ‖² dS_ij.
AttentionGradients GaussianKernelPooling::backward(ConstTensorView grad_output) {
  PoolGradients pooled = pool_backward(grad_output, "GaussianKernelPooling");
  require_finite("grad_output", grad_output);
  const int64_t batch = queries_.dim(0), n = queries_.dim(1), m = keys_.dim(1), d = queries_.dim(2);
  const float w = width();
  AttentionGradients grads{Tensor(queries_.shape()), Tensor(keys_.shape()),
                           std::move(pooled.values)};
  double grad_width = 0.0;  // ‖δ‖² in double: distances beyond 1.8e19 square past float
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        const float ds = pooled.scores(b, i, j);
        if (ds == 0.0F) continue;
        double squared = 0.0;
        for (int64_t t = 0; t < d; ++t) {
          const float delta = queries_(b, i, t) - keys_(b, j, t);
          squared += static_cast<double>(delta) * delta;
          grads.queries(b, i, t) -= w * w * ds * delta;
          grads.keys(b, j, t) += w * w * ds * delta;
        }
        grad_width -= static_cast<double>(w) * squared * ds;
      }
    }
  }
  width_grad_.data()[0] += static_cast<float>(grad_width);
  return grads;
}

std::vector<NamedParameter> GaussianKernelPooling::parameters() {
  return {{"w", &width_, &width_grad_}};
}

StateDict GaussianKernelPooling::state_dict() const {
  // parameters() hands out mutable pointers, but collecting only copies through them.
  return collect_state_dict(const_cast<GaussianKernelPooling*>(this)->parameters());
}

void GaussianKernelPooling::load_state_dict(const StateDict& state) {
  load_state_views(views_of(state));
}

void GaussianKernelPooling::load_state_views(const StateViews& state) {
  attn::load_state_views(state, parameters(), "GaussianKernelPooling");
  forget_forward_pass();
  if (!std::isfinite(width())) {
    throw ValueError(
        "GaussianKernelPooling.load_state_dict: tensor 'w' expected a finite width, got " +
        std::to_string(width()));
  }
}

}  // namespace attn
