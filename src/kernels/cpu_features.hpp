// Run-time checks of instruction sets that Highway's targets do not imply (AVX512-BF16 is not part
// of the AVX3 or AVX3_DL targets) and of the CPU's vendor, asked by the kernels that have a path
// for them.
#pragma once

namespace attn {

// Whether this CPU has the bf16 dot-product instructions (vdpbf16ps): Zen 4, Zen 5, Sapphire Rapids
// and later Xeons.
inline bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = __builtin_cpu_supports("avx512bf16") != 0;
  return has;
#else
  return false;
#endif
}

// Whether this CPU is AMD's (CPUID's vendor string), for choices made by measured microarchitecture
// (bf16_dot_outpaces_fma).
inline bool cpu_is_amd() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool amd = __builtin_cpu_is("amd") != 0;
  return amd;
#else
  return false;
#endif
}

}  // namespace attn
