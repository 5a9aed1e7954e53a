// Which SIMD instruction set attn's kernels run on, and a cap on it: to measure or test the kernels
// another CPU would run (AVX2 on an AVX-512 machine), as oneDNN's ONEDNN_MAX_CPU_ISA does.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace attn {

// The target the kernels dispatch to now, by Highway's name: "AVX3" (AVX-512), "AVX2", "SSE4", ...
std::string simd_target();

// The targets this build has kernels for and this CPU runs, best first (simd_target() is the first
// unless limit_simd_target lowered it).
std::vector<std::string> available_simd_targets();

// Makes the kernels run no better than `name` (case-insensitive, one of available_simd_targets(),
// or "best" to lift the cap), from the next kernel call on, process-wide. Also caps oneDNN's GEMMs
// at the matching instruction set, which oneDNN honours only before its first GEMM. Throws
// ValueError naming the available targets for any other name. Not for use while kernels run on
// other threads.
void limit_simd_target(std::string_view name);

}  // namespace attn
