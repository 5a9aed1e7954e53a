// The kernels' SIMD target and its cap: Highway's dispatch (SetSupportedTargetsForTest) and
// oneDNN's (dnnl_set_max_cpu_isa) lowered together.
#include "attn/kernels/simd_target.hpp"

#include <hwy/targets.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdint>

#include "attn/core/error.hpp"

namespace attn {
namespace {

// The targets limit_simd_target left, in Highway's bits (a lower bit is a better target); 0: no
// cap.
std::atomic<int64_t> allowed_targets{0};

std::string upper(std::string_view text) {
  std::string result(text);
  std::transform(result.begin(), result.end(), result.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return result;
}

// Compiled and supported by this CPU, best first, ignoring the cap.
std::vector<int64_t> runnable_targets() {
  hwy::SetSupportedTargetsForTest(0);
  std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  hwy::SetSupportedTargetsForTest(allowed_targets.load());
  return targets;
}

// oneDNN's instruction-set cap for a Highway target: AVX-512 targets leave oneDNN's own choice,
// the targets below AVX2 (SSE4, SSSE3, EMU128, SCALAR) get oneDNN's lowest.
dnnl_cpu_isa_t dnnl_isa_for(int64_t target) {
  if (target == HWY_AVX2) return dnnl_cpu_isa_avx2;
  return target > HWY_AVX2 ? dnnl_cpu_isa_sse41 : dnnl_cpu_isa_all;
}

}  // namespace

std::string simd_target() {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  return targets.empty() ? "none" : hwy::TargetName(targets.front());
}

std::vector<std::string> available_simd_targets() {
  std::vector<std::string> names;
  for (const int64_t target : runnable_targets()) names.emplace_back(hwy::TargetName(target));
  return names;
}

void limit_simd_target(std::string_view name) {
  const std::string wanted = upper(name);
  const std::vector<int64_t> targets = runnable_targets();
  int64_t chosen = 0;
  if (wanted == "BEST") {
    chosen = targets.empty() ? 0 : targets.front();
  } else {
    for (const int64_t target : targets) {
      if (upper(hwy::TargetName(target)) == wanted) chosen = target;
    }
  }
  if (chosen == 0) {
    std::string list;
    for (const int64_t target : targets) list += std::string(hwy::TargetName(target)) + ", ";
    throw ValueError("simd target name: expected one of " + list + "or best (any case), got '" +
                     std::string(name) + "'");
  }
  // The chosen target and every worse one (a higher bit). Highway 1.0.3's DisableTargets would
  // leave a dispatch already made in place (the chosen target is cached at the first
  // HWY_DYNAMIC_DISPATCH); SetSupportedTargetsForTest resets that cache.
  int64_t allowed = 0;
  for (const int64_t target : targets) allowed |= target >= chosen ? target : 0;
  allowed_targets.store(wanted == "BEST" ? 0 : allowed);
  hwy::SetSupportedTargetsForTest(allowed_targets.load());
  // oneDNN accepts a cap only before its first primitive; after that it keeps its choice.
  (void)dnnl_set_max_cpu_isa(dnnl_isa_for(chosen));
}

}  // namespace attn
