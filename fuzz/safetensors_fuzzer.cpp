// Fuzz target: the safetensors reader (parse_safetensors and parse_safetensors_metadata) on
// arbitrary bytes. A file it accepts must survive a round trip through attn's writer.
#include <cstring>

#include "attn/io/safetensors.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto bytes = attn::fuzz::bytes_of(data, size);
  attn::fuzz::refuse_only_with_attn_errors([&] {
    const std::map<std::string, std::string> metadata =
        attn::parse_safetensors_metadata(bytes, "fuzz.safetensors");
    const attn::StateDict tensors = attn::parse_safetensors(bytes, "fuzz.safetensors");
    attn::StateDict again;
    try {
      again = attn::parse_safetensors(attn::serialize_safetensors(tensors, metadata), "again");
    } catch (const attn::ValueError&) {
      return;  // names or metadata the writer refuses (not UTF-8 it can write): fine
    }
    if (again.size() != tensors.size()) attn::fuzz::finding("round trip lost tensors");
    for (const auto& [name, tensor] : tensors) {
      const auto found = again.find(name);
      if (found == again.end() || found->second.shape() != tensor.shape() ||
          (tensor.numel() > 0 &&
           std::memcmp(found->second.data(), tensor.data(),
                       static_cast<size_t>(tensor.numel()) * sizeof(float)) != 0)) {
        attn::fuzz::finding("round trip changed a tensor");
      }
    }
  });
  return 0;
}
