// StateDict: a layer's parameters by PyTorch's state-dict names ("W_q.weight", ...), and the
// strict loading that names every missing, unexpected or mis-shaped tensor.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "attn/core/named_tensors.hpp"
#include "attn/core/tensor.hpp"

namespace attn {

// StateDict itself lives in attn/core/named_tensors.hpp (attn/io uses it too).

// A parameter a layer owns, under its state-dict name, with the gradient its backward passes
// accumulate into (same shape; like PyTorch's .grad, cleared only by zero_grad).
struct NamedParameter {
  std::string name;
  Tensor* tensor;
  Tensor* grad = nullptr;
};

// Sets every parameter's gradient to zero.
void zero_grad(const std::vector<NamedParameter>& parameters);

// Copies every parameter into a StateDict.
StateDict collect_state_dict(const std::vector<NamedParameter>& parameters);
// Throws what load_state_dict would throw, without changing anything.
void check_state_dict(const StateDict& state, const std::vector<NamedParameter>& parameters,
                      std::string_view layer_name);
// Copies `state` into `parameters` like PyTorch's load_state_dict(strict=True): throws ShapeError
// naming the tensor for a missing, unexpected or mis-shaped entry, and changes nothing then.
void load_state_dict(const StateDict& state, const std::vector<NamedParameter>& parameters,
                     std::string_view layer_name);

// Views of tensors the caller owns, by state-dict name; load_state_dict reads a StateDict as these.
using StateViews = std::map<std::string, ConstTensorView>;
StateViews views_of(const StateDict& state);
// load_state_dict from views, each copied once into its parameter's own storage (the Python
// modules load their parameters at every call, 4 MiB at 512 hidden units, from their arrays).
void load_state_views(const StateViews& state, const std::vector<NamedParameter>& parameters,
                      std::string_view layer_name);

}  // namespace attn
