// StateDict collection and strict, all-or-nothing loading.
#include "attn/nn/state_dict.hpp"

#include "attn/core/error.hpp"

namespace attn {

void zero_grad(const std::vector<NamedParameter>& parameters) {
  for (const auto& parameter : parameters) {
    if (parameter.grad != nullptr) *parameter.grad = Tensor(parameter.tensor->shape());
  }
}

StateDict collect_state_dict(const std::vector<NamedParameter>& parameters) {
  StateDict state;
  for (const auto& parameter : parameters) state.emplace(parameter.name, *parameter.tensor);
  return state;
}

StateViews views_of(const StateDict& state) {
  StateViews views;
  for (const auto& [name, tensor] : state) views.emplace(name, tensor.view());
  return views;
}

namespace {

void check_state(const StateViews& state, const std::vector<NamedParameter>& parameters,
                 std::string_view layer_name) {
  const std::string layer(layer_name);
  for (const auto& parameter : parameters) {
    const auto found = state.find(parameter.name);
    if (found == state.end()) {
      throw ShapeError(layer + ".load_state_dict: missing tensor '" + parameter.name +
                       "' of shape " + parameter.tensor->shape().str());
    }
    if (found->second.shape() != parameter.tensor->shape()) {
      throw ShapeError(layer + ".load_state_dict: tensor '" + parameter.name + "' expected shape " +
                       parameter.tensor->shape().str() + ", got shape " +
                       found->second.shape().str());
    }
  }
  for (const auto& [name, tensor] : state) {
    bool known = false;
    for (const auto& parameter : parameters) known = known || parameter.name == name;
    if (!known) {
      std::string expected;
      for (const auto& parameter : parameters)
        expected += (expected.empty() ? "" : ", ") + parameter.name;
      throw ShapeError(layer + ".load_state_dict: unexpected tensor '" + name + "' of shape " +
                       tensor.shape().str() + " (expected only: " + expected + ")");
    }
  }
}

}  // namespace

void check_state_dict(const StateDict& state, const std::vector<NamedParameter>& parameters,
                      std::string_view layer_name) {
  check_state(views_of(state), parameters, layer_name);
}

void load_state_dict(const StateDict& state, const std::vector<NamedParameter>& parameters,
                     std::string_view layer_name) {
  load_state_views(views_of(state), parameters, layer_name);
}

void load_state_views(const StateViews& state, const std::vector<NamedParameter>& parameters,
                      std::string_view layer_name) {
  check_state(state, parameters, layer_name);
  for (const auto& parameter : parameters) parameter.tensor->assign(state.at(parameter.name));
}

}  // namespace attn
