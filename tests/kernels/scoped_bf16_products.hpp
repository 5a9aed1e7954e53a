// Process-wide choices of where the bf16 kernels multiply (AMX tiles, vdpbf16ps or fp32 on
// widened values), set for one test's lifetime and restored after it, failed or not.
#pragma once

#include "attn/kernels/amx.hpp"
#include "attn/kernels/bfloat16_dot.hpp"

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

}  // namespace attn::testing
