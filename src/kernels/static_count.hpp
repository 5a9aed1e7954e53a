// WithStaticCount: a run-time count handed to a routine as a compile-time constant, so that one
// call site instantiates the routine per count (register arrays sized by it, loops unrolled).
#pragma once

#include <cstddef>
#include <type_traits>

namespace attn {

// f(std::integral_constant<size_t, count>()) for a run-time count in [1, kMax].
template <size_t kMax, class F>
inline void WithStaticCount(size_t count, const F& f) {
  if constexpr (kMax > 1) {
    if (count < kMax) return WithStaticCount<kMax - 1>(count, f);
  }
  f(std::integral_constant<size_t, kMax>());
}

}  // namespace attn
