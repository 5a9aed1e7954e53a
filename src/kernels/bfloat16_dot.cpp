// Whether vdpbf16ps outpaces fp32 FMAs on this CPU, and the process-wide choice of whether the bf16
// kernels multiply on it (include/attn/kernels/bfloat16_dot.hpp).
#include "attn/kernels/bfloat16_dot.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu_features.hpp"

namespace attn {
namespace {

Bf16DotUse use_from_environment() {
  const char* value = std::getenv("ATTN_BF16_DOT");
  if (value == nullptr) return Bf16DotUse::kWhereFaster;
  if (std::strcmp(value, "0") == 0) return Bf16DotUse::kNever;
  if (std::strcmp(value, "1") == 0) return Bf16DotUse::kAlways;
  return Bf16DotUse::kWhereFaster;
}

std::atomic<Bf16DotUse>& current_use() {
  static std::atomic<Bf16DotUse> use{use_from_environment()};
  return use;
}

}  // namespace

bool bf16_dot_available() {
  return cpu_has_avx512_bf16();
}

bool bf16_dot_outpaces_fma() {
  return bf16_dot_available() && cpu_is_amd();
}

Bf16DotUse bf16_dot_use() {
  return current_use().load();
}

void set_bf16_dot_use(Bf16DotUse use) {
  current_use().store(use);
}

bool bf16_dot_in_use() {
  switch (bf16_dot_use()) {
    case Bf16DotUse::kNever:
      return false;
    case Bf16DotUse::kWhereFaster:
      return bf16_dot_outpaces_fma();
    case Bf16DotUse::kAlways:
      break;
  }
  return bf16_dot_available();
}

std::string bf16_dot_status() {
  std::string status;
  const char* setting = std::getenv("ATTN_BF16_DOT");
  if (setting != nullptr && std::strcmp(setting, "0") != 0 && std::strcmp(setting, "1") != 0) {
    status = "ATTN_BF16_DOT='" + std::string(setting) + "' not understood (expected 0 or 1); ";
  }
  if (!bf16_dot_available()) return status + "no AVX512-BF16: bf16 widened to fp32";
  if (bf16_dot_in_use()) return status + "bf16 products on vdpbf16ps";
  if (bf16_dot_use() == Bf16DotUse::kNever)
    return status +
           "bf16 widened to fp32 (vdpbf16ps turned off: ATTN_BF16_DOT=0 or set_bf16_dot_use)";
  return status +
         "bf16 widened to fp32 (vdpbf16ps slower than fp32 FMAs here; ATTN_BF16_DOT=1 uses it)";
}

}  // namespace attn
