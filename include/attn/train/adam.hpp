// Adam, with torch.optim.Adam's update rule and defaults (lr 1e-3, betas (0.9, 0.999), eps 1e-8).
#pragma once

#include <cstdint>
#include <vector>

#include "attn/train/optimizer.hpp"

namespace attn {

struct AdamOptions {
  float lr = 1e-3F;
  float beta1 = 0.9F;
  float beta2 = 0.999F;
  float eps = 1e-8F;
  float weight_decay = 0.0F;  // L2 added to the gradient, as Adam (not AdamW) does
};

class Adam : public Optimizer {
 public:
  // ValueError for an option out of range (lr, eps, weight_decay < 0; betas outside [0, 1)).
  Adam(std::vector<NamedParameter> parameters, const AdamOptions& options = {});

  // t += 1; g = grad + λ·p; m = β₁m + (1−β₁)g; v = β₂v + (1−β₂)g²;
  // p −= lr/(1−β₁ᵗ) · m / (√v/√(1−β₂ᵗ) + ε), computed in that order as PyTorch does.
  void step() override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;

  const AdamOptions& options() const { return options_; }
  void set_lr(float lr);
  int64_t steps() const { return steps_; }

 private:
  AdamOptions options_;
  int64_t steps_ = 0;
  std::vector<Tensor> first_moments_;
  std::vector<Tensor> second_moments_;
};

}  // namespace attn
