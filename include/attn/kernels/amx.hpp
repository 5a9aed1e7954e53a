// Intel AMX (the tile matrix unit of Sapphire Rapids and later Xeons) for the bf16 forward's and
// backward's tile products: whether this CPU and OS offer it, and whether the kernels use it.
#pragma once

#include <string>

namespace attn {

// Where the bf16 fused forward (AVX-512 targets with AVX512-BF16) computes Sᵀ = K·Qᵀ and P·V, and
// the bf16 backward its five products:
// - kNever: vdpbf16ps in vector registers where bf16_dot_in_use() (bfloat16_dot.hpp), else
//   fp32 FMAs on widened bf16;
// - kWhereAvailable (the default): AMX tiles where amx_available(), as kNever elsewhere;
// - kModel: the AMX path's own code with each tile instruction carried out by a C++ model of it
//   (slow; for tests on CPUs without AMX: it checks the layouts, tile shapes and padding).
// Depths that are not a multiple of 32 are padded with zeros to the tiles' 32 columns (forward
// and backward; until 2026-12-04 they left the tiles).
enum class AmxUse { kNever, kWhereAvailable, kModel };

// Whether this CPU has AMX-TILE and AMX-BF16 and Linux granted this process the tile state
// (arch_prctl(ARCH_REQ_XCOMP_PERM)); asked once, the first time.
bool amx_available();

// The current choice; at start-up kNever when the environment variable ATTN_AMX is "0",
// kWhereAvailable otherwise. Process-wide, from the next kernel call on; not for use while kernels
// run on other threads.
AmxUse amx_use();
void set_amx_use(AmxUse use);

// Whether the fp32 fused forward and backward (dot-product scores, no dropout) also run their
// products on the tiles where amx_tiles_in_use(): each fp32 operand split exactly into three bf16
// parts (x = hi + mid + lo) and six tile products per fp32 one, the three smallest terms left out
// (each under 2^-23 of the product: fp32's own rounding); the backward's five products for its
// tiles of whole 64 queries and 64 keys, where d and dv are multiples of 32. On by default; at start-up off when the environment
// variable ATTN_AMX_FP32 is "0". Process-wide, as set_amx_use.
bool fp32_on_amx();
void set_fp32_on_amx(bool on);

// Whether the bf16 kernels' products go to AMX tiles under the current choice: kModel, or
// kWhereAvailable where amx_available() (depths that fill whole tiles; others leave them).
bool amx_tiles_in_use();

// One line for benchmark headers: "AMX-BF16 in use", "AMX-BF16 available, turned off (ATTN_AMX=0
// or set_amx_use)", "no AMX" and the like, after a note naming an ATTN_AMX value other than 0 or 1.
std::string amx_status();

}  // namespace attn
