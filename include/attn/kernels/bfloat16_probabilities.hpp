// How the bf16 forward on bf16 products (AMX tiles, vdpbf16ps) hands the softmax's probabilities P
// to P·V: rounded to bf16, as PyTorch's and FlashAttention's bf16 kernels do, or as two bf16 parts.
#pragma once

#include <string>

namespace attn {

// - kRounded: P rounded to bf16 (within 2^-8 of each P): the output off by up to
//   2^-8·Σ_j P_j·|v_j| beyond fp32's sums, as much as its own bf16 rounding where the values
//   agree in sign, far more where they cancel (|o| far under Σ P|v|);
// - kSplit: P = hi + lo, two bf16 parts each rounded to nearest (within 2^-16 of P: the bound of
//   fp32's own sums over 256 keys), P·V taken once per part;
// - kWhereCheap (the default): kSplit on AMX tiles, whose products are a small share of the pass
//   (split, the bf16 forward ran 1.30-1.34x slower and still 2.1-2.5x the fp32 forward on a
//   Sapphire Rapids-class core, docs/benchmarks.md, 2026-12-07); kRounded on vdpbf16ps, whose P·V
//   is half the pass (split, the bf16 forward there would fall under issue 14's 1.8x the fp32).
// The decode kernel's bf16 calls against bf16 caches take vector products (split under kSplit).
// Inputs widened to fp32 (CPUs without either) take fp32's P as it is, under any choice.
enum class Bf16Probabilities { kRounded, kSplit, kWhereCheap };

// The current choice; at start-up kRounded when the environment variable ATTN_BF16_P is
// "rounded", kSplit when it is "split", kWhereCheap otherwise. Process-wide, from the next kernel
// call on; not for use while kernels run on other threads.
Bf16Probabilities bf16_probabilities();
void set_bf16_probabilities(Bf16Probabilities choice);

// Whether the bf16 kernels split P under the current choice, their products on AMX tiles
// (`on_tiles`) or on vdpbf16ps.
bool bf16_probabilities_split(bool on_tiles);

// One line for benchmark headers, of what runs here under the current choice: "bf16 P in two bf16
// parts for P·V on AMX tiles", "bf16 P rounded to bf16 for P·V on vdpbf16ps", "bf16 widened to
// fp32: P in fp32 for P·V" (no bf16 products in use), after a note naming an ATTN_BF16_P value not
// understood.
std::string bf16_probabilities_status();

}  // namespace attn
