// Where fp32 operands split into three bf16 parts keep fp32's accuracy on AMX tiles: the tiles
// read a bf16 below the smallest normal float (2^-126) as 0, so parts of elements under about
// 2^-110 are lost. The fp32 passes on tiles check the largest magnitudes they read against this.
#pragma once

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>

namespace attn {

// Whether an operand whose largest magnitude is `largest` (times whatever the pass multiplies it
// by) loses nothing that matters when split. A lost part is under 2^-125 in absolute terms, so:
// up to 2^64, what another operand loses costs a product at most d·2^-61 (scores: absolute, far
// under fp32's rounding of any score that moves a softmax); from 2^-80, what this operand loses
// is 2^-45 of its own scale, far under fp32's 2^-24. 0 loses nothing; ∞ and NaN are left to the
// callers' checks of what was read (the FMA path gives them no better answer).
inline bool split_parts_in_range(double largest) {
  if (!std::isfinite(largest) || largest == 0.0) return true;
  return largest >= 0x1p-80 && largest <= 0x1p64;
}

// The largest magnitude a pass recorded in `bits` (a float's bits, raised as it read its rows).
inline double recorded_magnitude(const std::atomic<uint32_t>& bits) {
  return static_cast<double>(std::bit_cast<float>(bits.load()));
}

}  // namespace attn
