// Optimizer: the interface SGD and Adam share — update a layer's parameters from their
// accumulated gradients, and save or restore the optimizer's own state for checkpoints.
#pragma once

#include <vector>

#include "attn/nn/state_dict.hpp"

namespace attn {

class Optimizer {
 public:
  // `parameters` point into a layer that must outlive the optimizer; each needs a gradient.
  explicit Optimizer(std::vector<NamedParameter> parameters);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update from the current gradients.
  virtual void step() = 0;
  // Sets every gradient to zero, as torch.optim.Optimizer.zero_grad(set_to_none=False).
  void zero_grad() { attn::zero_grad(parameters_); }

  // The optimizer's buffers under "<parameter>.<buffer>" names, for checkpoints.
  virtual StateDict state_dict() const = 0;
  // Strict: a missing, unexpected or mis-shaped buffer is a ShapeError naming it.
  virtual void load_state_dict(const StateDict& state) = 0;

  const std::vector<NamedParameter>& parameters() const { return parameters_; }

 protected:
  std::vector<NamedParameter> parameters_;
};

}  // namespace attn
