// Process-wide choices of where the bf16 kernels multiply (AMX tiles, vdpbf16ps or fp32 on
// widened values), set for one test's lifetime and restored after it, failed or not; a test body
// run under each use of the tiles by fp32.
#pragma once

#include "attn/kernels/amx.hpp"
#include "attn/kernels/bfloat16_dot.hpp"
#include "attn/kernels/bfloat16_probabilities.hpp"
#include "attn/kernels/flash_attention.hpp"

namespace attn::testing {

// Sets amx_use() for a scope.
class ScopedAmxUse {
 public:
  explicit ScopedAmxUse(AmxUse use) : before_(amx_use()) { set_amx_use(use); }
  ~ScopedAmxUse() { set_amx_use(before_); }
  ScopedAmxUse(const ScopedAmxUse&) = delete;
  ScopedAmxUse& operator=(const ScopedAmxUse&) = delete;

 private:
  AmxUse before_;
};

// Sets bf16_dot_use() for a scope.
class ScopedBf16DotUse {
 public:
  explicit ScopedBf16DotUse(Bf16DotUse use) : before_(bf16_dot_use()) { set_bf16_dot_use(use); }
  ~ScopedBf16DotUse() { set_bf16_dot_use(before_); }
  ScopedBf16DotUse(const ScopedBf16DotUse&) = delete;
  ScopedBf16DotUse& operator=(const ScopedBf16DotUse&) = delete;

 private:
  Bf16DotUse before_;
};

// Sets bf16_probabilities() for a scope.
class ScopedBf16Probabilities {
 public:
  explicit ScopedBf16Probabilities(Bf16Probabilities choice) : before_(bf16_probabilities()) {
    set_bf16_probabilities(choice);
  }
  ~ScopedBf16Probabilities() { set_bf16_probabilities(before_); }
  ScopedBf16Probabilities(const ScopedBf16Probabilities&) = delete;
  ScopedBf16Probabilities& operator=(const ScopedBf16Probabilities&) = delete;

 private:
  Bf16Probabilities before_;
};

// Sets fp32_on_amx() for a scope.
class ScopedFp32OnAmx {
 public:
  explicit ScopedFp32OnAmx(bool on) : before_(fp32_on_amx()) { set_fp32_on_amx(on); }
  ~ScopedFp32OnAmx() { set_fp32_on_amx(before_); }
  ScopedFp32OnAmx(const ScopedFp32OnAmx&) = delete;
  ScopedFp32OnAmx& operator=(const ScopedFp32OnAmx&) = delete;

 private:
  bool before_;
};

// Runs body() with fp32 on AMX tiles, on the hardware where this CPU offers them and in the C++
// model of the tiles; whether either ran (neither where the target lacks AVX512-BF16, which the
// parts' packing needs).
template <class Body>
bool for_each_float_tiles_use(const Body& body) {
  bool ran = false;
  for (const AmxUse use : {AmxUse::kWhereAvailable, AmxUse::kModel}) {
    if (use == AmxUse::kWhereAvailable && !amx_available()) continue;
    const ScopedAmxUse amx(use);
    const ScopedFp32OnAmx on(true);
    if (!flash_attention_float_on_tiles()) continue;
    body();
    ran = true;
  }
  return ran;
}

}  // namespace attn::testing
