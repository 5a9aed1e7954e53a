// safetensors files: a layer's parameters under PyTorch's state-dict names, so a layer trained in
// PyTorch (safetensors.torch.save_file(model.state_dict(), ...)) runs in attn unchanged.
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attn/core/named_tensors.hpp"

namespace attn {

// Parses the bytes of a safetensors file; `source` names it in error messages. F32 tensors load
// as they are and F64 ones are rounded to float32; any other dtype, a rank above 4, a header
// that is not JSON of the format, offsets that overlap, leave gaps or point past the data, or a
// shape that disagrees with its byte range throws FileError naming the tensor.
StateDict parse_safetensors(std::span<const std::byte> bytes, std::string_view source);
StateDict load_safetensors(const std::filesystem::path& path);

// Writes F32 tensors in name order, with optional string metadata ("__metadata__").
std::vector<std::byte> serialize_safetensors(
    const StateDict& tensors, const std::map<std::string, std::string>& metadata = {});
void save_safetensors(const std::filesystem::path& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace attn
