// SGD with optional momentum and weight decay, with torch.optim.SGD's update rule and defaults.
#pragma once

#include <vector>

#include "attn/train/optimizer.hpp"

namespace attn {

class Sgd : public Optimizer {
 public:
  // ValueError for a negative or non-finite learning rate, momentum or weight decay.
  Sgd(std::vector<NamedParameter> parameters, float lr, float momentum = 0.0F,
      float weight_decay = 0.0F);

  // g = grad + λ·p; with momentum μ: b = g on the first step, b = μ·b + g after, and g = b;
  // then p −= lr·g (PyTorch's rule with dampening 0 and no Nesterov).
  void step() override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;

  float lr() const { return lr_; }
  void set_lr(float lr);

 private:
  float lr_;
  float momentum_;
  float weight_decay_;
  bool has_momentum_buffers_ = false;
  std::vector<Tensor> momentum_buffers_;
};

}  // namespace attn
