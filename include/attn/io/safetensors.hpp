// safetensors files: a layer's parameters under PyTorch's state-dict names, so a layer trained in
// PyTorch (safetensors.torch.save_file(model.state_dict(), ...)) runs in attn unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attn/core/half.hpp"
#include "attn/core/named_tensors.hpp"

namespace attn {

// Parses the bytes of a safetensors file; `source` names it in error messages. F32 tensors load
// as they are, F16 and BF16 ones (PyTorch's half-precision state dicts) are widened to float32
// exactly, and F64 ones are rounded to float32; any other dtype, a rank above 4, a header
// that is not JSON of the format, offsets that overlap, leave gaps or point past the data, or a
// shape that disagrees with its byte range throws FileError naming the tensor.
// The header is JSON read within limits: nesting at most 64 levels deep, at most a million values,
// no key twice in an object; an empty tensor's other dimensions multiply to at most 65536.
// load_safetensors refuses anything but a regular file (a FIFO, a device, a directory) before
// reading from it.
StateDict parse_safetensors(std::span<const std::byte> bytes, std::string_view source);
StateDict load_safetensors(const std::filesystem::path& path);
// The string metadata ("__metadata__"; empty when the file has none), after checking the whole file
// as parse_safetensors does; for attn.load, which rebuilds a layer from it.
std::map<std::string, std::string> parse_safetensors_metadata(std::span<const std::byte> bytes,
                                                              std::string_view source);
std::map<std::string, std::string> load_safetensors_metadata(const std::filesystem::path& path);

// Writes F32 tensors in name order, with optional string metadata ("__metadata__"). save_ writes
// a temporary file in the same folder and renames it over `path`, so that a failed write leaves
// any previous file intact; FileError naming the path and the system's reason.
std::vector<std::byte> serialize_safetensors(
    const StateDict& tensors, const std::map<std::string, std::string>& metadata = {});
void save_safetensors(const std::filesystem::path& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// One tensor of a safetensors file, as the CLI reads its inputs: the header checked as
// parse_safetensors checks it (the tensors must tile the data), then only that tensor's bytes read,
// straight into float32 values (F32; F64 rounded) or into its 16-bit words as stored (F16, BF16:
// `half` says which; never widened). `name` empty: the file must hold exactly one tensor.
// FileError naming the file, and the tensor where the name is missing (listing the names held).
struct SafetensorsTensor {
  Shape shape;
  std::optional<HalfType> half;
  Tensor floats;               // F32 and F64 tensors
  std::vector<uint16_t> bits;  // F16 and BF16 tensors
};
SafetensorsTensor load_safetensors_tensor(const std::filesystem::path& path, std::string_view name);

// Writes one F16 or BF16 tensor `name` of `shape` from its 16-bit words, as save_safetensors
// writes (through a temporary file renamed over `path`).
void save_safetensors_half(const std::filesystem::path& path, std::string_view name, HalfType type,
                           const Shape& shape, std::span<const uint16_t> bits);

}  // namespace attn
