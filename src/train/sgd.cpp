// SGD: PyTorch's update with momentum buffers created on the first step.
#include "attn/train/sgd.hpp"

#include <cmath>
#include <string>

#include "attn/core/error.hpp"

namespace attn {

namespace {
void require_non_negative(const char* name, float value) {
  if (!(value >= 0.0F) || !std::isfinite(value)) {
    throw ValueError(std::string("Sgd: expected a finite, non-negative ") + name + ", got " +
                     std::to_string(value));
  }
}
}  // namespace

Sgd::Sgd(std::vector<NamedParameter> parameters, float lr, float momentum, float weight_decay)
    : Optimizer(std::move(parameters)), lr_(lr), momentum_(momentum), weight_decay_(weight_decay) {
  require_non_negative("lr", lr);
  require_non_negative("momentum", momentum);
  require_non_negative("weight_decay", weight_decay);
}

void Sgd::set_lr(float lr) {
  require_non_negative("lr", lr);
  lr_ = lr;
}

void Sgd::step() {
  const bool first_step = !has_momentum_buffers_;
  if (momentum_ != 0.0F && first_step) {
    for (const auto& parameter : parameters_)
      momentum_buffers_.emplace_back(parameter.tensor->shape());
    has_momentum_buffers_ = true;
  }
  for (size_t index = 0; index < parameters_.size(); ++index) {
    float* values = parameters_[index].tensor->data();
    const float* grads = parameters_[index].grad->data();
    const int64_t count = parameters_[index].tensor->numel();
    for (int64_t i = 0; i < count; ++i) {
      float g = grads[i] + weight_decay_ * values[i];
      if (momentum_ != 0.0F) {
        float& buffer = momentum_buffers_[index].data()[i];
        buffer = first_step ? g : momentum_ * buffer + g;
        g = buffer;
      }
      values[i] -= lr_ * g;
    }
  }
}

StateDict Sgd::state_dict() const {
  StateDict state;
  if (!has_momentum_buffers_) return state;
  for (size_t index = 0; index < parameters_.size(); ++index) {
    state.emplace(parameters_[index].name + ".momentum_buffer", momentum_buffers_[index]);
  }
  return state;
}

void Sgd::load_state_dict(const StateDict& state) {
  if (state.empty()) {
    momentum_buffers_.clear();
    has_momentum_buffers_ = false;
    return;
  }
  std::vector<Tensor> buffers(parameters_.size());
  std::vector<NamedParameter> expected;
  for (size_t index = 0; index < parameters_.size(); ++index) {
    buffers[index] = Tensor(parameters_[index].tensor->shape());
    expected.push_back({parameters_[index].name + ".momentum_buffer", &buffers[index]});
  }
  attn::load_state_dict(state, expected, "Sgd");
  momentum_buffers_ = std::move(buffers);
  has_momentum_buffers_ = true;
}

}  // namespace attn
