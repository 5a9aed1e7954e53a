// StateDict: tensors by name (PyTorch's state-dict names, "W_q.weight", ...), the currency that
// layers (attn/nn) hand out and file formats (attn/io) read and write.
#pragma once

#include <map>
#include <string>

#include "attn/core/tensor.hpp"

namespace attn {

// In core rather than nn so that attn/io can read and write named tensors without depending on
// the layers; std::map keeps the names sorted, the order safetensors files list them in.
using StateDict = std::map<std::string, Tensor>;

}  // namespace attn
