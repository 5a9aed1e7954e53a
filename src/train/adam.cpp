// Adam: PyTorch's bias-corrected update, with the moments kept per parameter.
#include "attn/train/adam.hpp"

#include <cmath>
#include <string>

#include "attn/core/error.hpp"

namespace attn {

namespace {
void check_options(const AdamOptions& options) {
  const auto require = [](bool ok, const char* name, float value, const char* expected) {
    if (!ok)
      throw ValueError(std::string("Adam: expected ") + name + " " + expected + ", got " +
                       std::to_string(value));
  };
  require(options.lr >= 0.0F && std::isfinite(options.lr), "lr", options.lr, "finite and ≥ 0");
  require(options.beta1 >= 0.0F && options.beta1 < 1.0F, "beta1", options.beta1, "in [0, 1)");
  require(options.beta2 >= 0.0F && options.beta2 < 1.0F, "beta2", options.beta2, "in [0, 1)");
  require(options.eps >= 0.0F && std::isfinite(options.eps), "eps", options.eps, "finite and ≥ 0");
  require(options.weight_decay >= 0.0F && std::isfinite(options.weight_decay), "weight_decay",
          options.weight_decay, "finite and ≥ 0");
}
}  // namespace

Adam::Adam(std::vector<NamedParameter> parameters, const AdamOptions& options)
    : Optimizer(std::move(parameters)), options_(options) {
  check_options(options_);
  for (const auto& parameter : parameters_) {
    first_moments_.emplace_back(parameter.tensor->shape());
    second_moments_.emplace_back(parameter.tensor->shape());
  }
}

void Adam::set_lr(float lr) {
  AdamOptions changed = options_;
  changed.lr = lr;
  check_options(changed);
  options_ = changed;
}

void Adam::step() {
  ++steps_;
  const auto t = static_cast<double>(steps_);
  const float bias_correction1 =
      1.0F - static_cast<float>(std::pow(static_cast<double>(options_.beta1), t));
  const float bias_correction2 =
      1.0F - static_cast<float>(std::pow(static_cast<double>(options_.beta2), t));
  const float step_size = options_.lr / bias_correction1;
  const float bias_correction2_sqrt = std::sqrt(bias_correction2);
  for (size_t index = 0; index < parameters_.size(); ++index) {
    float* values = parameters_[index].tensor->data();
    const float* grads = parameters_[index].grad->data();
    float* m = first_moments_[index].data();
    float* v = second_moments_[index].data();
    const int64_t count = parameters_[index].tensor->numel();
    for (int64_t i = 0; i < count; ++i) {
      const float g = grads[i] + options_.weight_decay * values[i];
      m[i] = options_.beta1 * m[i] + (1.0F - options_.beta1) * g;
      v[i] = options_.beta2 * v[i] + (1.0F - options_.beta2) * g * g;
      const float denominator = std::sqrt(v[i]) / bias_correction2_sqrt + options_.eps;
      values[i] -= step_size * m[i] / denominator;
    }
  }
}

StateDict Adam::state_dict() const {
  StateDict state;
  for (size_t index = 0; index < parameters_.size(); ++index) {
    state.emplace(parameters_[index].name + ".exp_avg", first_moments_[index]);
    state.emplace(parameters_[index].name + ".exp_avg_sq", second_moments_[index]);
  }
  state.emplace("step", Tensor(Shape{1}, {static_cast<float>(steps_)}));
  return state;
}

void Adam::load_state_dict(const StateDict& state) {
  std::vector<Tensor> first(parameters_.size()), second(parameters_.size());
  Tensor step(Shape{1});
  std::vector<NamedParameter> expected;
  for (size_t index = 0; index < parameters_.size(); ++index) {
    first[index] = Tensor(parameters_[index].tensor->shape());
    second[index] = Tensor(parameters_[index].tensor->shape());
    expected.push_back({parameters_[index].name + ".exp_avg", &first[index]});
    expected.push_back({parameters_[index].name + ".exp_avg_sq", &second[index]});
  }
  expected.push_back({"step", &step});
  attn::load_state_dict(state, expected, "Adam");
  const float steps = step.data()[0];
  if (!(steps >= 0.0F) || steps != std::floor(steps)) {
    throw ValueError("Adam.load_state_dict: tensor 'step' expected a whole number ≥ 0, got " +
                     std::to_string(steps));
  }
  first_moments_ = std::move(first);
  second_moments_ = std::move(second);
  steps_ = static_cast<int64_t>(steps);
}

}  // namespace attn
