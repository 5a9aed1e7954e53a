// Measures which execution pipes this core's 512-bit vector instructions share: the cycles of 16
// independent instances of one instruction, and of two kinds interleaved (equal to the slower
// alone: separate pipes; the sum: shared ones). What the softmax's operations cost next to the
// products' multiply-adds (docs/benchmarks.md, "What each operation of the fp32 softmax costs").
//
// Build and run on an AVX-512 machine (x86-64 Linux, GCC or Clang):
//   cc -O2 -mavx512f -mavx512dq tools/vector_pipes.c -o /tmp/vector_pipes && /tmp/vector_pipes
// Cycles come from rdtscp scaled by a chain of dependent integer adds (one per cycle), so they are
// core cycles whatever the TSC's rate; run on an idle core.
#include <stdint.h>
#include <stdio.h>
#include <x86intrin.h>

enum { kIterations = 10000000 };

static inline uint64_t ticks(void) {
  unsigned aux;
  return __rdtscp(&aux);
}

// Sixteen instances of one instruction, each writing its own register from zmm30/zmm31 (no
// dependency between them but the multiply-adds' accumulators, 16 chains: more than latency ×
// throughput on current cores).
#define R16(m) m(0) m(1) m(2) m(3) m(4) m(5) m(6) m(7) m(8) m(9) m(10) m(11) m(12) m(13) m(14) m(15)
#define FMA(i) "vfmadd231ps %%zmm30, %%zmm31, %%zmm" #i "\n"
#define ADD(i) "vaddps %%zmm30, %%zmm31, %%zmm" #i "\n"
#define MUL(i) "vmulps %%zmm30, %%zmm31, %%zmm" #i "\n"
#define MAX(i) "vmaxps %%zmm30, %%zmm31, %%zmm" #i "\n"
#define CMP(i) "vcmpps $13, %%zmm30, %%zmm31, %%k1\n"
#define SCALEF(i) "vscalefps %%zmm30, %%zmm31, %%zmm" #i "\n"
#define REDUCE(i) "vreduceps $9, %%zmm31, %%zmm" #i "\n"
#define ROUND(i) "vrndscaleps $9, %%zmm31, %%zmm" #i "\n"
#define PERMUTE(i) "vpermps %%zmm30, %%zmm31, %%zmm" #i "\n"
#define SHIFT(i) "vpslld $23, %%zmm31, %%zmm" #i "\n"
#define IADD(i) "vpaddd %%zmm30, %%zmm31, %%zmm" #i "\n"
#define STORE(i) "vmovaps %%zmm30, 64*" #i "(%0)\n"
#define LOAD(i) "vmovaps 64*" #i "(%0), %%zmm29\n"
#define CHAIN(i) "add $1, %%rax\n"

static float buffer[16 * 16] __attribute__((aligned(64)));
static double ticks_per_cycle;

#define RUN(name, body)                                                                           \
  do {                                                                                            \
    const uint64_t start = ticks();                                                               \
    for (long n = 0; n < kIterations; ++n) {                                                      \
      __asm__ volatile(body ::"r"(buffer)                                                         \
                       : "memory", "rax", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", \
                         "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14",     \
                         "xmm15", "xmm29");                                                       \
    }                                                                                             \
    const double per_iteration = (double)(ticks() - start) / kIterations;                         \
    if (ticks_per_cycle == 0.0) ticks_per_cycle = per_iteration / 64.0;                           \
    printf("%-26s %6.2f cycles\n", name, per_iteration / ticks_per_cycle);                        \
  } while (0)

int main(void) {
  __asm__ volatile(
      "vxorps %%zmm30, %%zmm30, %%zmm30\n"
      "vxorps %%zmm31, %%zmm31, %%zmm31\n"
      "kxnorw %%k1, %%k1, %%k1\n" ::
          : "xmm30", "xmm31", "k1");
  RUN("64 dependent integer adds", R16(CHAIN) R16(CHAIN) R16(CHAIN) R16(CHAIN));
  printf("(the calibration: 64 by definition)\n\n16 of one kind:\n");
  RUN("multiply-add", R16(FMA));
  RUN("add", R16(ADD));
  RUN("multiply", R16(MUL));
  RUN("max", R16(MAX));
  RUN("compare into a mask", R16(CMP));
  RUN("vscalefps", R16(SCALEF));
  RUN("vreduceps", R16(REDUCE));
  RUN("vrndscaleps", R16(ROUND));
  RUN("vpermps", R16(PERMUTE));
  RUN("vpslld", R16(SHIFT));
  RUN("vpaddd", R16(IADD));
  RUN("store", R16(STORE));
  RUN("load", R16(LOAD));
  printf("\n16 of each, interleaved by kind:\n");
  RUN("multiply-add + add", R16(FMA) R16(ADD));
  RUN("multiply-add + max", R16(FMA) R16(MAX));
  RUN("multiply-add + compare", R16(FMA) R16(CMP));
  RUN("multiply-add + vscalefps", R16(FMA) R16(SCALEF));
  RUN("multiply-add + vreduceps", R16(FMA) R16(REDUCE));
  RUN("multiply-add + vrndscaleps", R16(FMA) R16(ROUND));
  RUN("multiply-add + vpermps", R16(FMA) R16(PERMUTE));
  RUN("multiply-add + vpslld", R16(FMA) R16(SHIFT));
  RUN("multiply-add + store", R16(FMA) R16(STORE));
  RUN("multiply-add + load", R16(FMA) R16(LOAD));
  RUN("add + max", R16(ADD) R16(MAX));
  RUN("add + compare", R16(ADD) R16(CMP));
  RUN("add + vscalefps", R16(ADD) R16(SCALEF));
  RUN("add + vpslld", R16(ADD) R16(SHIFT));
  RUN("add + store", R16(ADD) R16(STORE));
  return 0;
}
