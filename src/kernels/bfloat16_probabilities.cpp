// The process-wide choice of how the bf16 forward gives P to P·V
// (include/attn/kernels/bfloat16_probabilities.hpp).
#include "attn/kernels/bfloat16_probabilities.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "attn/kernels/amx.hpp"
#include "attn/kernels/flash_attention.hpp"

namespace attn {
namespace {

Bf16Probabilities choice_from_environment() {
  const char* value = std::getenv("ATTN_BF16_P");
  if (value == nullptr) return Bf16Probabilities::kWhereCheap;
  if (std::strcmp(value, "rounded") == 0) return Bf16Probabilities::kRounded;
  if (std::strcmp(value, "split") == 0) return Bf16Probabilities::kSplit;
  return Bf16Probabilities::kWhereCheap;
}

std::atomic<Bf16Probabilities>& current_choice() {
  static std::atomic<Bf16Probabilities> choice{choice_from_environment()};
  return choice;
}

}  // namespace

Bf16Probabilities bf16_probabilities() {
  return current_choice().load();
}

void set_bf16_probabilities(Bf16Probabilities choice) {
  current_choice().store(choice);
}

bool bf16_probabilities_split(bool on_tiles) {
  switch (bf16_probabilities()) {
    case Bf16Probabilities::kRounded:
      return false;
    case Bf16Probabilities::kSplit:
      return true;
    case Bf16Probabilities::kWhereCheap:
      break;
  }
  return on_tiles;
}

std::string bf16_probabilities_status() {
  std::string status;
  const char* setting = std::getenv("ATTN_BF16_P");
  if (setting != nullptr && std::strcmp(setting, "rounded") != 0 &&
      std::strcmp(setting, "split") != 0) {
    status =
        "ATTN_BF16_P='" + std::string(setting) + "' not understood (expected rounded or split); ";
  }
  // What runs here, as the forward decides it: the setting matters only on bf16 products.
  if (!flash_attention_bfloat16_native(0))
    return status + "bf16 widened to fp32: P in fp32 for P·V";
  const bool on_tiles = amx_tiles_in_use();
  return status +
         (bf16_probabilities_split(on_tiles) ? "bf16 P in two bf16 parts for P·V"
                                             : "bf16 P rounded to bf16 for P·V") +
         (on_tiles ? " on AMX tiles" : " on vdpbf16ps");
}

}  // namespace attn
