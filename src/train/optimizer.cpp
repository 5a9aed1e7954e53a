// Optimizer: the shared parameter list, and the buffer-name helpers SGD and Adam use.
#include "attn/train/optimizer.hpp"

#include "attn/core/error.hpp"

namespace attn {

Optimizer::Optimizer(std::vector<NamedParameter> parameters) : parameters_(std::move(parameters)) {
  for (const auto& parameter : parameters_) {
    if (parameter.tensor == nullptr || parameter.grad == nullptr) {
      throw ValueError("optimizer: parameter '" + parameter.name +
                       "' has no tensor or no gradient");
    }
  }
}

}  // namespace attn
