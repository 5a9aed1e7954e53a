// Checkpoints: parameters and optimizer buffers in one safetensors file, loaded all-or-nothing.
#include "attn/train/checkpoint.hpp"

#include "attn/io/safetensors.hpp"

namespace attn {

namespace {
constexpr std::string_view kOptimizerPrefix = "optimizer.";
}

void save_checkpoint(const std::filesystem::path& path,
                     const std::vector<NamedParameter>& parameters, const Optimizer* optimizer) {
  StateDict state = collect_state_dict(parameters);
  if (optimizer != nullptr) {
    for (auto& [name, tensor] : optimizer->state_dict())
      state.emplace(std::string(kOptimizerPrefix) + name, tensor);
  }
  save_safetensors(path, state);
}

void load_checkpoint(const std::filesystem::path& path,
                     const std::vector<NamedParameter>& parameters, Optimizer* optimizer) {
  StateDict parameter_state, optimizer_state;
  for (auto& [name, tensor] : load_safetensors(path)) {
    if (name.starts_with(kOptimizerPrefix)) {
      optimizer_state.emplace(name.substr(kOptimizerPrefix.size()), std::move(tensor));
    } else {
      parameter_state.emplace(name, std::move(tensor));
    }
  }
  const std::string source = "checkpoint " + path.string();
  check_state_dict(parameter_state, parameters, source);
  if (optimizer != nullptr) optimizer->load_state_dict(optimizer_state);
  load_state_dict(parameter_state, parameters, source);
}

}  // namespace attn
