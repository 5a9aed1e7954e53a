// Checkpoints: a layer's parameters (and optionally its optimizer's buffers) in one safetensors
// file, under PyTorch's state-dict names ("optimizer." prefixes the optimizer's entries).
#pragma once

#include <filesystem>
#include <vector>

#include "attn/nn/state_dict.hpp"
#include "attn/train/optimizer.hpp"

namespace attn {

void save_checkpoint(const std::filesystem::path& path,
                     const std::vector<NamedParameter>& parameters,
                     const Optimizer* optimizer = nullptr);
// Strict, as load_state_dict: the file must hold exactly the parameters (and, when `optimizer` is
// given, its buffers); otherwise ShapeError/FileError naming the tensor, and nothing changes.
// Without `optimizer`, any optimizer buffers in the file are ignored.
void load_checkpoint(const std::filesystem::path& path,
                     const std::vector<NamedParameter>& parameters, Optimizer* optimizer = nullptr);

}  // namespace attn
