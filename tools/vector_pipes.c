// Measures which execution pipes this core's vector instructions share: the cycles of independent
// instances of one instruction, and of two kinds interleaved (equal to the slower alone: separate
// pipes; the sum: shared ones), as cycles per 16 instructions of each kind. What the softmax's
// operations cost next to the products' multiply-adds (docs/benchmarks.md, "What each operation of
// the fp32 softmax costs" for 512-bit code on Zen 4, "The softmax's instruction mix on Zen 1" for
// 256-bit code). Built with AVX-512 it times 512-bit instructions, 16 per kind; built with AVX2
// only, 256-bit ones, 12 per kind (AVX2 has 16 registers: 12 written, 2 sources, 1 loaded), and
// the AVX2 exponential's mix (ShiftedExp2 with its load, store and running sum) as a whole.
//
// Build and run (x86-64 Linux, GCC or Clang), on an AVX-512 machine or an AVX2 one:
//   cc -O2 -mavx512f -mavx512dq tools/vector_pipes.c -o /tmp/vector_pipes && /tmp/vector_pipes
//   cc -O2 -mavx2 -mfma tools/vector_pipes.c -o /tmp/vector_pipes && /tmp/vector_pipes
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

// kInstances instances of one instruction, each writing its own register from the two source
// registers S0 and S1 (no dependency between them but the multiply-adds' accumulators: more chains
// than latency × throughput on current cores).
#define R16(m) m(0) m(1) m(2) m(3) m(4) m(5) m(6) m(7) m(8) m(9) m(10) m(11) m(12) m(13) m(14) m(15)
#ifdef __AVX512F__
enum { kInstances = 16 };
#define RN(m) R16(m)
#define V(i) "%%zmm" #i
#define S0 "%%zmm30"
#define S1 "%%zmm31"
#define LOADED "%%zmm29"
#define BYTES "64"
#define CMP(i) "vcmpps $13, " S0 ", " S1 ", %%k1\n"
#else
enum { kInstances = 12 };
#define RN(m) m(0) m(1) m(2) m(3) m(4) m(5) m(6) m(7) m(8) m(9) m(10) m(11)
#define V(i) "%%ymm" #i
#define S0 "%%ymm14"
#define S1 "%%ymm15"
#define LOADED "%%ymm13"
#define BYTES "32"
#define CMP(i) "vcmpps $13, " S0 ", " S1 ", " V(i) "\n"
#endif
#define FMA(i) "vfmadd231ps " S0 ", " S1 ", " V(i) "\n"
#define ADD(i) "vaddps " S0 ", " S1 ", " V(i) "\n"
#define MUL(i) "vmulps " S0 ", " S1 ", " V(i) "\n"
#define MAX(i) "vmaxps " S0 ", " S1 ", " V(i) "\n"
#define SCALEF(i) "vscalefps " S0 ", " S1 ", " V(i) "\n"
#define REDUCE(i) "vreduceps $9, " S1 ", " V(i) "\n"
#define ROUND(i) "vrndscaleps $9, " S1 ", " V(i) "\n"
#define ROUNDPS(i) "vroundps $9, " S1 ", " V(i) "\n"
#define PERMUTE(i) "vpermps " S0 ", " S1 ", " V(i) "\n"
#define SHIFT(i) "vpslld $23, " S1 ", " V(i) "\n"
#define IADD(i) "vpaddd " S0 ", " S1 ", " V(i) "\n"
#define STORE(i) "vmovaps " S0 ", " BYTES "*" #i "(%0)\n"
#define LOAD(i) "vmovaps " BYTES "*" #i "(%0), " LOADED "\n"
#define CHAIN(i) "add $1, %%rax\n"

static float buffer[16 * 16] __attribute__((aligned(64)));
static double ticks_per_cycle;

#ifdef __AVX512F__
#define CLOBBERED                                                                          \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", \
      "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm29"
#else
#define CLOBBERED                                                                          \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", \
      "xmm11", "xmm12", "xmm13"
#endif

// Times `body` and prints its cycles per 16 of what `scale` counts (a kind's instances, or
// exponentials for the mix).
#define RUN_SCALED(name, body, scale)                                                     \
  do {                                                                                    \
    const uint64_t start = ticks();                                                       \
    for (long n = 0; n < kIterations; ++n) {                                              \
      __asm__ volatile(body ::"r"(buffer) : "memory", "rax", CLOBBERED);                  \
    }                                                                                     \
    const double per_iteration = (double)(ticks() - start) / kIterations;                 \
    if (ticks_per_cycle == 0.0) ticks_per_cycle = per_iteration / 64.0;                   \
    printf("%-26s %6.2f cycles\n", name, per_iteration / ticks_per_cycle * 16.0 / scale); \
  } while (0)
#define RUN(name, body) RUN_SCALED(name, body, kInstances)

#ifndef __AVX512F__
// The exponential as OnlineSoftmaxStep's folded loop runs it (ShiftedExp2, degree 5): a query
// vector's 64 scores one key after another, each exponential's instructions dependent on each
// other (about 40 cycles deep through the clamp, the rounding, r, four multiply-adds, r·P(r) and
// 2ⁿ), the exponentials independent but for the running sum; exponentials_in_pairs interleaves
// two keys' steps. Scores read from one buffer and P written to another, so that repeated
// calls see the same finite values. time_exponentials prints cycles per 16 exponentials (8 scores
// each).
enum { kKeys = 64, kQueryVectors = 4 };
static float scores[kKeys * kQueryVectors * 8] __attribute__((aligned(64)));
static float probabilities[kKeys * kQueryVectors * 8] __attribute__((aligned(64)));

// ShiftedExp2's steps (fast_math-inl.h), each a function so that two keys' exponentials can run
// a step at a time: the clamp and the rounding's reduction (r, and the biased
// exponent), a Horner step of P(r) (degree 5, tools/fit_exp.py --base 2), and 2ⁿ + (r·P(r))·2ⁿ.
static inline __m256 reduced(__m256 score, __m256 lowest, __m256 magic, __m256* biased) {
  const __m256 x = _mm256_max_ps(lowest, score);
  *biased = _mm256_add_ps(x, magic);
  return _mm256_sub_ps(x, _mm256_sub_ps(*biased, magic));
}

static const float kExp2Coefficients[5] = {1.3264698209e-03F, 9.6715083346e-03F, 5.5507339537e-02F,
                                           2.4022242427e-01F, 6.9314700365e-01F};

static inline __m256 horner_step(__m256 p, __m256 r, int degree) {
  return _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExp2Coefficients[degree + 1]));
}

static inline __m256 scaled(__m256 q, __m256 biased) {
  const __m256 two = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(biased), 23));
  return _mm256_fmadd_ps(q, two, two);
}

// One key's exponential after another (the kernel's loop).
static __attribute__((noinline)) void exponentials_one_by_one(float lowest_value,
                                                              float magic_value) {
  const __m256 lowest = _mm256_set1_ps(lowest_value), magic = _mm256_set1_ps(magic_value);
  for (int g = 0; g < kQueryVectors; ++g) {
    __m256 sum = _mm256_setzero_ps();
    for (int j = 0; j < kKeys; ++j) {
      const int at = (j * kQueryVectors + g) * 8;
      __m256 biased;
      const __m256 r = reduced(_mm256_load_ps(scores + at), lowest, magic, &biased);
      __m256 p = _mm256_set1_ps(kExp2Coefficients[0]);
      for (int step = 0; step < 4; ++step) p = horner_step(p, r, step);
      const __m256 e = scaled(_mm256_mul_ps(p, r), biased);
      _mm256_store_ps(probabilities + at, e);
      sum = _mm256_add_ps(sum, e);
    }
    _mm256_store_ps(buffer + 8 * g, sum);
  }
}

// Two keys' exponentials a step at a time. A function of its own: written as a branch of the
// loop above, GCC merged the two into one key's code run twice, one chain after the other.
static __attribute__((noinline)) void exponentials_in_pairs(float lowest_value, float magic_value) {
  const __m256 lowest = _mm256_set1_ps(lowest_value), magic = _mm256_set1_ps(magic_value);
  for (int g = 0; g < kQueryVectors; ++g) {
    __m256 sum = _mm256_setzero_ps(), other_sum = _mm256_setzero_ps();
    for (int j = 0; j < kKeys; j += 2) {
      const int at = (j * kQueryVectors + g) * 8, next = at + kQueryVectors * 8;
      __m256 x_biased, y_biased;
      const __m256 rx = reduced(_mm256_load_ps(scores + at), lowest, magic, &x_biased);
      const __m256 ry = reduced(_mm256_load_ps(scores + next), lowest, magic, &y_biased);
      __m256 px = _mm256_set1_ps(kExp2Coefficients[0]), py = px;
      for (int step = 0; step < 4; ++step) {
        px = horner_step(px, rx, step);
        py = horner_step(py, ry, step);
      }
      const __m256 ex = scaled(_mm256_mul_ps(px, rx), x_biased);
      const __m256 ey = scaled(_mm256_mul_ps(py, ry), y_biased);
      _mm256_store_ps(probabilities + at, ex);
      _mm256_store_ps(probabilities + next, ey);
      sum = _mm256_add_ps(sum, ex);
      other_sum = _mm256_add_ps(other_sum, ey);
    }
    _mm256_store_ps(buffer + 8 * g, _mm256_add_ps(sum, other_sum));
  }
}

static void time_exponentials(const char* name, void (*exponentials)(float, float)) {
  enum { kCalls = 200000 };
  volatile float lowest = -127.0F, magic = 12583039.0F;  // a shift of 0 folded (FoldShift)
  const uint64_t start = ticks();
  for (long n = 0; n < kCalls; ++n) exponentials(lowest, magic);
  const double per_exponential =
      (double)(ticks() - start) / ticks_per_cycle / kCalls / (kKeys * kQueryVectors);
  printf("%-26s %6.2f cycles\n", name, per_exponential * 16.0);
}
#endif

int main(void) {
#ifdef __AVX512F__
  __asm__ volatile(
      "vxorps %%zmm30, %%zmm30, %%zmm30\n"
      "vxorps %%zmm31, %%zmm31, %%zmm31\n"
      "kxnorw %%k1, %%k1, %%k1\n" ::
          : "xmm30", "xmm31", "k1");
#else
  __asm__ volatile(
      "vxorps %%ymm14, %%ymm14, %%ymm14\n"
      "vxorps %%ymm15, %%ymm15, %%ymm15\n" ::
          : "xmm14", "xmm15");
#endif
  RUN_SCALED("64 dependent integer adds", R16(CHAIN) R16(CHAIN) R16(CHAIN) R16(CHAIN), 16);
  printf("(the calibration: 64 by definition)\n\n%d of one kind, in cycles per 16:\n", kInstances);
  RUN("multiply-add", RN(FMA));
  RUN("add", RN(ADD));
  RUN("multiply", RN(MUL));
  RUN("max", RN(MAX));
#ifdef __AVX512F__
  RUN("compare into a mask", RN(CMP));
  RUN("vscalefps", RN(SCALEF));
  RUN("vreduceps", RN(REDUCE));
  RUN("vrndscaleps", RN(ROUND));
#else
  RUN("compare", RN(CMP));
  RUN("vroundps", RN(ROUNDPS));
#endif
  RUN("vpermps", RN(PERMUTE));
  RUN("vpslld", RN(SHIFT));
  RUN("vpaddd", RN(IADD));
  RUN("store", RN(STORE));
  RUN("load", RN(LOAD));
  printf("\n%d of each, interleaved by kind, in cycles per 16 of each:\n", kInstances);
  RUN("multiply-add + add", RN(FMA) RN(ADD));
  RUN("multiply-add + multiply", RN(FMA) RN(MUL));
  RUN("multiply-add + max", RN(FMA) RN(MAX));
  RUN("multiply-add + compare", RN(FMA) RN(CMP));
#ifdef __AVX512F__
  RUN("multiply-add + vscalefps", RN(FMA) RN(SCALEF));
  RUN("multiply-add + vreduceps", RN(FMA) RN(REDUCE));
  RUN("multiply-add + vrndscaleps", RN(FMA) RN(ROUND));
#else
  RUN("multiply-add + vroundps", RN(FMA) RN(ROUNDPS));
  RUN("multiply-add + vpaddd", RN(FMA) RN(IADD));
#endif
  RUN("multiply-add + vpermps", RN(FMA) RN(PERMUTE));
  RUN("multiply-add + vpslld", RN(FMA) RN(SHIFT));
  RUN("multiply-add + store", RN(FMA) RN(STORE));
  RUN("multiply-add + load", RN(FMA) RN(LOAD));
  RUN("add + max", RN(ADD) RN(MAX));
  RUN("add + compare", RN(ADD) RN(CMP));
#ifdef __AVX512F__
  RUN("add + vscalefps", RN(ADD) RN(SCALEF));
#else
  RUN("add + vroundps", RN(ADD) RN(ROUNDPS));
#endif
  RUN("add + vpslld", RN(ADD) RN(SHIFT));
  RUN("add + store", RN(ADD) RN(STORE));
#ifndef __AVX512F__
  // ShiftedExp2's instructions per exponential, independent of each other: a load with the clamp's
  // max, the rounding's add and two subtractions, four multiply-adds and a multiply for r·P(r), the
  // shift, the multiply-add with 2ⁿ, the store and the running sum's add (OnlineSoftmaxStep's
  // folded loop); the sum of its pipes' work, without its dependency chain (about 40 cycles deep).
  printf(
      "\nthe AVX2 exponential, in cycles per 16 exponentials (8 scores each): its mix alone,\n"
      "then the kernel's loop\n");
  RUN_SCALED("exponential's mix",
             RN(LOAD) RN(MAX) RN(ADD) RN(ADD) RN(ADD) RN(FMA) RN(FMA) RN(FMA) RN(FMA) RN(MUL)
                 RN(SHIFT) RN(FMA) RN(STORE) RN(ADD),
             kInstances);
  for (int i = 0; i < kKeys * kQueryVectors * 8; ++i) scores[i] = -(float)(i % 997) * 0.01F;
  time_exponentials("one after another", exponentials_one_by_one);
  time_exponentials("two interleaved", exponentials_in_pairs);
#endif
  return 0;
}
