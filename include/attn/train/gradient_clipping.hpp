// Global-norm gradient clipping, as torch.nn.utils.clip_grad_norm_.
#pragma once

#include <vector>

#include "attn/nn/state_dict.hpp"

namespace attn {

// Scales every gradient by min(1, max_norm / (‖g‖ + 1e-6)), where ‖g‖ is the 2-norm of all
// gradients together, and returns ‖g‖ before clipping. ValueError for a negative max_norm and
// for a non-finite norm (a NaN or infinite gradient is never applied silently).
float clip_grad_norm(const std::vector<NamedParameter>& parameters, float max_norm);

}  // namespace attn
