// Whether the bf16 kernels multiply on the CPU's bf16 dot-product instruction (vdpbf16ps) or widen
// bf16 to fp32 for fp32 FMAs, where AMX tiles do not take the products (amx.hpp).
#pragma once

#include <string>

namespace attn {

// - kNever: bf16 always widened to fp32 (the fp32 kernels on the widened values);
// - kWhereFaster (the default): vdpbf16ps where it makes more products per cycle than fp32 FMAs
//   (bf16_dot_outpaces_fma()), widened elsewhere;
// - kAlways: vdpbf16ps wherever the CPU has it (tests, and measuring it where it is slower).
enum class Bf16DotUse { kNever, kWhereFaster, kAlways };

// Whether this CPU has AVX512-BF16 (vdpbf16ps): Zen 4 and later, Cooper Lake, Sapphire Rapids and
// later Xeons.
bool bf16_dot_available();

// Whether vdpbf16ps outpaces fp32 FMAs here: on AMD's Zen 4 and 5 it makes two products per lane
// at the FMA's rate (the bf16 forward ran 1.8–2.0× the fp32 one there); on Intel's cores it issues
// on one port, half the rate of the two FMA ports in products (16 against 32 per cycle measured on
// Emerald Rapids), so the bf16 forward on it ran at 0.4–0.77× the fp32 forward. Decided by vendor:
// true for AMD CPUs with AVX512-BF16, false elsewhere.
bool bf16_dot_outpaces_fma();

// The current choice; at start-up kNever when the environment variable ATTN_BF16_DOT is "0",
// kAlways when it is "1", kWhereFaster otherwise. Process-wide, from the next kernel call on; not
// for use while kernels run on other threads.
Bf16DotUse bf16_dot_use();
void set_bf16_dot_use(Bf16DotUse use);

// Whether the bf16 kernels' products outside AMX tiles go to vdpbf16ps under the current choice
// (bf16_dot_available(), and kAlways or kWhereFaster where bf16_dot_outpaces_fma()). The
// kernels' own SIMD target decides too: below AVX-512 (limit_simd_target) bf16 always widens.
bool bf16_dot_in_use();

// One line for benchmark headers: "bf16 products on vdpbf16ps", "bf16 widened to fp32 (vdpbf16ps
// slower than fp32 FMAs here; ATTN_BF16_DOT=1 uses it)" and the like, after a note naming an
// ATTN_BF16_DOT value other than 0 or 1.
std::string bf16_dot_status();

}  // namespace attn
