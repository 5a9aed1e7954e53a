// Keeping the kernels' sums inside float's range: finite inputs whose exact result is finite must
// give a finite result. The fused kernels accumulate unnormalised sums — Σ_j exp(s_j − max)·v_j in
// the forward pass, whose terms are each at most max|v|, S of them — so values near float's maximum
// overflow a sum whose normalised result is a mere convex combination. Scaling an input by an
// exact power of two 2^−k before a kernel and the result by 2^k after it changes no bit of the
// result (unless a value falls below float's normal range) and keeps every sum finite.
#pragma once

#include <string_view>

#include "attn/core/strided_view.hpp"
#include "attn/core/tensor.hpp"
#include "attn/kernels/heads_view.hpp"

namespace attn::functional_detail {

// The largest magnitude a kernel's sum is allowed to reach: 2^120, 2^8 below float's maximum
// (about 2^128), which leaves room for the rounding of long sums and for one more addition.
inline constexpr double kSafeMagnitude = 0x1p120;

// The smallest k ≥ 0 with bound · 2^−k ≤ kSafeMagnitude (0 for any bound of ordinary inputs).
int shift_for(double bound);

// A contiguous copy of `view` times 2^−shift.
Tensor scaled_copy(const ConstStridedView& view, int shift);

// Multiplies every element of every matrix of `view` by 2^shift.
void scale_heads(const HeadsView& view, int shift);
// Multiplies `count` contiguous floats by 2^shift.
void scale_values(float* data, int64_t count, int shift);

// Whether every value of `view` is finite (no NaN, no ±∞).
bool heads_finite(const ConstHeadsView& view);

// ValueError "<name>: the exact result overflows float32 ..." when a value of `view` is not finite
// after scaling back: the sums were kept in range, so only the exact result can be out of it.
void require_finite_result(const ConstHeadsView& view, std::string_view name,
                           std::string_view inputs);
void require_finite_result(const float* data, int64_t count, std::string_view name,
                           std::string_view inputs);

}  // namespace attn::functional_detail
