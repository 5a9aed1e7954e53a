// Linear: y = x Wᵀ + b over the last axis, PyTorch's nn.Linear with its default initialisation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attn/core/random.hpp"
#include "attn/core/tensor.hpp"
#include "attn/nn/state_dict.hpp"

namespace attn {

// Returns `size`, or throws ValueError naming `name` when it is not positive; for layer
// constructors that build their Linear members from user-given sizes.
int64_t require_positive_size(std::string_view name, int64_t size);

class Linear {
 public:
  // weight (out_features, in_features) and bias (out_features) drawn uniformly from
  // ±1/√in_features, as nn.Linear's default (kaiming_uniform with a = √5) amounts to.
  Linear(int64_t in_features, int64_t out_features, bool bias, Rng& rng);

  // x (..., in_features) → (..., out_features); ShapeError names `name` when the last axis is
  // wrong.
  Tensor forward(ConstTensorView x, std::string_view name = "input") const;
  // The same into `y`, in the storage it already has when that holds enough elements; y must not
  // be x.
  void forward_into(ConstTensorView x, Tensor& y, std::string_view name = "input") const;
  // Given the forward input x (..., in) and grad_y (..., out): accumulates dW += Σ grad_yᵀ x and
  // db += Σ grad_y over all leading positions, and returns grad_x = grad_y W (..., in).
  Tensor backward(ConstTensorView x, ConstTensorView grad_y);
  // Adds `grad` (out, in) to the weight gradient, for callers that computed it themselves.
  void accumulate_weight_grad(ConstTensorView grad);

  int64_t in_features() const { return weight_.dim(1); }
  int64_t out_features() const { return weight_.dim(0); }
  bool has_bias() const { return has_bias_; }
  Tensor& weight() { return weight_; }
  const Tensor& weight() const { return weight_; }
  Tensor& bias() { return bias_; }
  const Tensor& bias() const { return bias_; }
  const Tensor& weight_grad() const { return weight_grad_; }
  const Tensor& bias_grad() const { return bias_grad_; }

  // "prefix.weight" (and "prefix.bias"), as a submodule named `prefix` appears in PyTorch.
  void append_parameters(const std::string& prefix, std::vector<NamedParameter>& parameters);

 private:
  Tensor weight_;
  Tensor bias_;
  Tensor weight_grad_;
  Tensor bias_grad_;
  bool has_bias_;
};

}  // namespace attn
