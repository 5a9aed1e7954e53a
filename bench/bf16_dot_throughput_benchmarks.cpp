// Products per nanosecond of vdpbf16ps (two bf16 products per fp32 lane) against vfmadd231ps (one)
// on 12 independent 512-bit chains (Google Benchmark): the throughput behind bf16_dot_outpaces_fma
// (include/attn/kernels/bfloat16_dot.hpp). Skips itself where the CPU has no AVX512-BF16.
//   build/release/bench/attn_bf16_dot_benchmarks --benchmark_repetitions=3
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <cstdint>

#include "attn/kernels/bfloat16_dot.hpp"

namespace {

constexpr int kChains = 12;
constexpr int64_t kStepsPerIteration = 1 << 16;

// kStepsPerIteration steps of one `Step` per chain, the 12 chains in named registers (an array
// of them went through the stack on every step, which store throughput then bounded); returns the
// chains' sum, kept live.
#define ATTN_TWELVE_CHAINS(Step)                                                                \
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0;        \
  __m512 a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0;                                         \
  for (int64_t step = 0; step < kStepsPerIteration; ++step) {                                   \
    Step(a0) Step(a1) Step(a2) Step(a3) Step(a4) Step(a5) Step(a6) Step(a7) Step(a8) Step(a9)   \
        Step(a10) Step(a11)                                                                     \
  }                                                                                             \
  const __m512 sum =                                                                            \
      _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),  \
                                  _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7))), \
                    _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));             \
  alignas(64) float lanes[16];                                                                  \
  _mm512_store_ps(lanes, sum);                                                                  \
  return lanes[0];

// One instruction per chain and step, kept in order by the empty asm.
#define ATTN_DOT_STEP(a)         \
  a = _mm512_dpbf16_ps(a, x, y); \
  __asm__ volatile("" : "+v"(a));
#define ATTN_FMA_STEP(a)        \
  a = _mm512_fmadd_ps(x, y, a); \
  __asm__ volatile("" : "+v"(a));

__attribute__((target("avx512f,avx512bf16"), noinline)) float DotSteps() {
  const auto x = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3f80));  // bf16 1.0
  const auto y = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3380));  // bf16 2^-24
  ATTN_TWELVE_CHAINS(ATTN_DOT_STEP)
}

__attribute__((target("avx512f"), noinline)) float FmaSteps() {
  const __m512 x = _mm512_set1_ps(1.0F), y = _mm512_set1_ps(0x1p-24F);
  ATTN_TWELVE_CHAINS(ATTN_FMA_STEP)
}

// `products` multiply-adds per lane per instruction: 2 for vdpbf16ps, 1 for an FMA.
void Report(benchmark::State& state, int products) {
  state.counters["products_per_ns"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * kStepsPerIteration * kChains * 16 * products * 1e-9,
      benchmark::Counter::kIsRate);
}

void BM_Vdpbf16ps(benchmark::State& state) {
  if (!attn::bf16_dot_available()) {
    state.SkipWithError("no AVX512-BF16 on this CPU");
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(DotSteps());
  Report(state, 2);
}
BENCHMARK(BM_Vdpbf16ps);

void BM_Vfmadd231ps(benchmark::State& state) {
  if (!__builtin_cpu_supports("avx512f")) {
    state.SkipWithError("no AVX-512 on this CPU");
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(FmaSteps());
  Report(state, 1);
}
BENCHMARK(BM_Vfmadd231ps);

}  // namespace

BENCHMARK_MAIN();
