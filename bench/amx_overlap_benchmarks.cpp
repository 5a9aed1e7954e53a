// Whether this core runs AMX tile products and AVX-512 arithmetic at the same time (Google
// Benchmark): 16 TDPBF16PS on four accumulators alone, N vector FMAs (or adds) on 12 independent
// chains alone, and the two interleaved in one loop. Overlap would read the interleaved time near
// the longer of the two; serialisation near their sum. The bf16 forward on AMX spends a third of
// its time in its fp32 softmax (docs/benchmarks.md): only overlap would let the products hide it.
// BM_SplitProduct: the fp32 kernels' 64 × 64 × 64 product in three bf16 parts (six tile products,
// amx::SplitProductOnTiles' loop) per dot, its operands in L1 or spread over L2, in either order
// of the six, starting from zeros or from C, and with B rewritten by vector stores before each
// product (as the backward splits P and dS just before their products).
// BM_AmxOverlap's fourth kind spreads the vector work evenly between the 16 dots; and
// BM_SplitProductBesideWork runs the backward's dV product beside work shaped like the splits of P
// and dS (loads, the split's arithmetic, three stores a vector), spread between its groups of four
// dots, all before it, or alone.
//   build/release/bench/attn_amx_overlap_benchmarks --benchmark_repetitions=5
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "attn/kernels/amx.hpp"

namespace {

#define ATTN_AMX_PROBE __attribute__((target("avx512f,amx-tile,amx-bf16"), noinline))

// Palette 1, tiles 0–7 all 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

enum Work : int { kDots = 1, kVectorWork = 2, kBoth = 3, kSpread = 4 };

// The twelve chains' sum, lane 0 (keeps the probes' arithmetic from being optimised away).
ATTN_AMX_PROBE float SumOfChains(__m512 c0, __m512 c1, __m512 c2, __m512 c3, __m512 c4, __m512 c5,
                                 __m512 c6, __m512 c7, __m512 c8, __m512 c9, __m512 c10,
                                 __m512 c11) {
  const __m512 sum =
      _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),
                                  _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7))),
                    _mm512_add_ps(_mm512_add_ps(c8, c9), _mm512_add_ps(c10, c11)));
  alignas(64) float lanes[16];  // GCC 12 warns falsely inside _mm512_reduce_add_ps
  _mm512_store_ps(lanes, sum);
  return lanes[0];
}

// RunIterations' fourth kind: the FMAs (adds) spread evenly, vector_ops / 16 after each dot, on
// six chains of the twelve at a time.
ATTN_AMX_PROBE float RunSpreadIterations(int64_t iterations, int vector_ops, bool adds) {
  __m512 c0 = _mm512_set1_ps(0.0F), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
  __m512 c6 = c0, c7 = c0, c8 = c0, c9 = c0, c10 = c0, c11 = c0;
  const __m512 x = _mm512_set1_ps(0.999F), y = _mm512_set1_ps(1e-4F);
  const int per_dot = vector_ops / 16;
  for (int64_t i = 0; i < iterations; ++i) {
#define ATTN_SIX(c0, c1, c2, c3, c4, c5)                                               \
  for (int six = 0; six < per_dot; six += 6) {                                         \
    c0 = adds ? _mm512_add_ps(c0, x) : _mm512_fmadd_ps(c0, x, y);                      \
    c1 = adds ? _mm512_add_ps(c1, x) : _mm512_fmadd_ps(c1, x, y);                      \
    c2 = adds ? _mm512_add_ps(c2, x) : _mm512_fmadd_ps(c2, x, y);                      \
    c3 = adds ? _mm512_add_ps(c3, x) : _mm512_fmadd_ps(c3, x, y);                      \
    c4 = adds ? _mm512_add_ps(c4, x) : _mm512_fmadd_ps(c4, x, y);                      \
    c5 = adds ? _mm512_add_ps(c5, x) : _mm512_fmadd_ps(c5, x, y);                      \
    __asm__ volatile("" : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5)); \
  }
    for (int k = 0; k < 4; ++k) {
      _tile_dpbf16ps(0, 4, 6);
      ATTN_SIX(c0, c1, c2, c3, c4, c5)
      _tile_dpbf16ps(1, 4, 7);
      ATTN_SIX(c6, c7, c8, c9, c10, c11)
      _tile_dpbf16ps(2, 5, 6);
      ATTN_SIX(c0, c1, c2, c3, c4, c5)
      _tile_dpbf16ps(3, 5, 7);
      ATTN_SIX(c6, c7, c8, c9, c10, c11)
    }
#undef ATTN_SIX
  }
  return SumOfChains(c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11);
}

// One iteration: 16 products C(0..3) += A(4, 5)·B(6, 7) when `work` has kDots, then `vector_ops`
// FMAs (adds when `adds`) over 12 chains when it has kVectorWork. Returns the chains' sum.
ATTN_AMX_PROBE float RunIterations(int64_t iterations, int work, int vector_ops, bool adds) {
  if (work == kSpread) return RunSpreadIterations(iterations, vector_ops, adds);
  __m512 c0 = _mm512_set1_ps(0.0F), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
  __m512 c6 = c0, c7 = c0, c8 = c0, c9 = c0, c10 = c0, c11 = c0;
  const __m512 x = _mm512_set1_ps(0.999F), y = _mm512_set1_ps(1e-4F);
  for (int64_t i = 0; i < iterations; ++i) {
    if (work & kDots) {
      for (int k = 0; k < 4; ++k) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
    }
    if (work & kVectorWork) {
      for (int k = 0; k < vector_ops; k += 12) {
#define ATTN_STEP(c) c = adds ? _mm512_add_ps(c, x) : _mm512_fmadd_ps(c, x, y);
        ATTN_STEP(c0)
        ATTN_STEP(c1)
        ATTN_STEP(c2)
        ATTN_STEP(c3)
        ATTN_STEP(c4)
        ATTN_STEP(c5)
        ATTN_STEP(c6) ATTN_STEP(c7) ATTN_STEP(c8) ATTN_STEP(c9) ATTN_STEP(c10) ATTN_STEP(c11)
#undef ATTN_STEP
            // Keeps the chains in registers (GCC otherwise keeps such an array in memory).
            __asm__ volatile(""
                             : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5), "+v"(c6),
                               "+v"(c7), "+v"(c8), "+v"(c9), "+v"(c10), "+v"(c11));
      }
    }
  }
  return SumOfChains(c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11);
}

ATTN_AMX_PROBE void ConfigureTiles() {
  static const TileConfig config;
  alignas(64) static const uint16_t zeros[16 * 32] = {};
  _tile_loadconfig(&config);
  _tile_loadd(4, zeros, 64);
  _tile_loadd(5, zeros, 64);
  _tile_loadd(6, zeros, 64);
  _tile_loadd(7, zeros, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}

ATTN_AMX_PROBE void ReleaseTiles() {
  _tile_release();
}

// True, with the benchmark marked skipped, where the tiles cannot run.
bool SkippedWithoutAmx(benchmark::State& state) {
  if (attn::amx_available()) return false;
  state.SkipWithError("no AMX-BF16 on this CPU, or Linux refused the tile state");
  return true;
}

// Args: work (1 dots, 2 vector work, 3 both), vector operations per iteration, adds (1) or FMAs.
void BM_AmxOverlap(benchmark::State& state) {
  if (SkippedWithoutAmx(state)) return;
  const auto work = static_cast<int>(state.range(0));
  const auto vector_ops = static_cast<int>(state.range(1));
  const bool adds = state.range(2) != 0;
  ConfigureTiles();
  constexpr int64_t kIterations = 1000;
  for (auto _ : state) benchmark::DoNotOptimize(RunIterations(kIterations, work, vector_ops, adds));
  ReleaseTiles();
  state.counters["per_iteration"] = benchmark::Counter(
      static_cast<double>(kIterations),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.SetLabel(std::string(work == kDots         ? "16 dots"
                             : work == kVectorWork ? ""
                             : work == kSpread     ? "16 dots, each followed by 1/16 of "
                                                   : "16 dots + ") +
                 (work == kDots ? "" : std::to_string(vector_ops) + (adds ? " adds" : " FMAs")));
}

void Arguments(benchmark::internal::Benchmark* benchmark) {
  for (const int adds : {0, 1}) {
    for (const int ops : {96, 192, 384}) {
      for (const int work : {kDots, kVectorWork, kBoth, kSpread}) {
        if (work == kDots && (ops != 96 || adds != 0)) continue;  // the dots alone once
        benchmark->Args({work, ops, adds});
      }
    }
  }
}
BENCHMARK(BM_AmxOverlap)->Apply(Arguments);

// Operand sets for BM_SplitProduct: A (64 rows of 32 pairs) and B (32 pair rows of 64 columns),
// three parts each, and C (64 × 64 floats); 56 KiB a set.
constexpr size_t kPartWords = 64 * 32;
struct alignas(64) SplitOperands {
  uint32_t a[3 * kPartWords];
  uint32_t b[3 * kPartWords];
  float c[64 * 64];
};

// C (=, or += with `accumulate`) A·B over the six part pairs whose terms reach 2^-16, the 2 × 2
// accumulators over 2 steps of 16 pairs per 32 × 32 block. `fewest`: each pair changes one operand
// from the one before (14 tile loads a step), else A's parts once each (18).
// Vector work beside the products: `vectors` vectors of 16 floats read from `from` (16 KiB,
// wrapping), each split into three parts by SplitThreeBF16's arithmetic (a copy: the kernels'
// per-target header is not built into this probe) and stored into `to` (three 16 KiB parts),
// from vector `next` on.
struct SplitWork {
  const float* from = nullptr;
  uint32_t* to = nullptr;
  size_t next = 0;
};
constexpr size_t kWorkVectors = 256;  // 16 KiB of floats
ATTN_AMX_PROBE inline void DoSplitWork(SplitWork& work, size_t vectors) {
  const __m512i upper = _mm512_set1_epi32(static_cast<int>(0xFFFF0000U));
  for (size_t v = 0; v < vectors; ++v) {
    const size_t at = (work.next++ % kWorkVectors) * 16;
    const __m512 value = _mm512_load_ps(work.from + at);
    const __m512i hi = _mm512_and_si512(_mm512_castps_si512(value), upper);
    const __m512 rest = _mm512_sub_ps(value, _mm512_castsi512_ps(hi));
    const __m512i mid = _mm512_and_si512(
        _mm512_add_epi32(_mm512_castps_si512(rest), _mm512_set1_epi32(0x8000)), upper);
    const __m512i lo =
        _mm512_and_si512(_mm512_castps_si512(_mm512_sub_ps(rest, _mm512_castsi512_ps(mid))), upper);
    _mm512_store_si512(work.to + at, hi);
    _mm512_store_si512(work.to + kWorkVectors * 16 + at, mid);
    _mm512_store_si512(work.to + 2 * kWorkVectors * 16 + at, lo);
  }
}

ATTN_AMX_PROBE void SplitProduct(const SplitOperands& x, float* c, bool accumulate, bool fewest,
                                 SplitWork* work = nullptr, size_t work_per_dots = 0) {
  constexpr size_t kAStride = 32 * 4, kBStride = 64 * 4, kCStride = 64 * 4,
                   kPartBytes = kPartWords * 4;
  for (size_t row = 0; row < 64; row += 32) {
    for (size_t col = 0; col < 64; col += 32) {
      float* block = c + row * 64 + col;
      if (accumulate) {
        _tile_loadd(0, block, kCStride);
        _tile_loadd(1, block + 16, kCStride);
        _tile_loadd(2, block + 16 * 64, kCStride);
        _tile_loadd(3, block + 16 * 64 + 16, kCStride);
      } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      for (size_t step = 0; step < 2; ++step) {
        const auto* a = reinterpret_cast<const char*>(x.a + row * 32) + step * 64;
        const auto* b = reinterpret_cast<const char*>(x.b + col) + step * 16 * kBStride;
#define ATTN_LOAD_A(p)                          \
  _tile_loadd(4, a + (p)*kPartBytes, kAStride); \
  _tile_loadd(5, a + (p)*kPartBytes + 16 * kAStride, kAStride);
#define ATTN_LOAD_B(p)                          \
  _tile_loadd(6, b + (p)*kPartBytes, kBStride); \
  _tile_loadd(7, b + (p)*kPartBytes + 64, kBStride);
#define ATTN_DOTS          \
  _tile_dpbf16ps(0, 4, 6); \
  _tile_dpbf16ps(1, 4, 7); \
  _tile_dpbf16ps(2, 5, 6); \
  _tile_dpbf16ps(3, 5, 7); \
  if (work != nullptr) DoSplitWork(*work, work_per_dots);
        if (fewest) {
          ATTN_LOAD_A(0)
          ATTN_LOAD_B(2)
          ATTN_DOTS ATTN_LOAD_B(1) ATTN_DOTS ATTN_LOAD_A(1) ATTN_DOTS ATTN_LOAD_B(0)
              ATTN_DOTS ATTN_LOAD_A(0) ATTN_DOTS ATTN_LOAD_A(2) ATTN_DOTS
        } else {
          ATTN_LOAD_A(0)
          ATTN_LOAD_B(2)
          ATTN_DOTS ATTN_LOAD_B(1) ATTN_DOTS ATTN_LOAD_B(0) ATTN_DOTS ATTN_LOAD_A(1) ATTN_LOAD_B(1)
              ATTN_DOTS ATTN_LOAD_B(0) ATTN_DOTS ATTN_LOAD_A(2) ATTN_LOAD_B(0) ATTN_DOTS
        }
#undef ATTN_LOAD_A
#undef ATTN_LOAD_B
#undef ATTN_DOTS
      }
      _tile_stored(0, block, kCStride);
      _tile_stored(1, block + 16, kCStride);
      _tile_stored(2, block + 16 * 64, kCStride);
      _tile_stored(3, block + 16 * 64 + 16, kCStride);
    }
  }
}

// `sets` operand sets of zeros.
std::vector<SplitOperands> ZeroedOperands(size_t sets) {
  std::vector<SplitOperands> operands(sets);
  for (auto& x : operands) {
    std::fill(std::begin(x.a), std::end(x.a), 0U);
    std::fill(std::begin(x.b), std::end(x.b), 0U);
    std::fill(std::begin(x.c), std::end(x.c), 0.0F);
  }
  return operands;
}

// B's three parts rewritten by 512-bit stores (their values unchanged: zeros).
ATTN_AMX_PROBE void RewriteB(SplitOperands& x) {
  const __m512i zeros = _mm512_setzero_si512();
  for (size_t i = 0; i < 3 * kPartWords; i += 16) _mm512_store_si512(x.b + i, zeros);
}

// Args: fewest (1) or A-once (0) order, accumulate (1) or from zeros, operand sets (1: in L1; 16:
// 896 KiB, in L2), B rewritten before each product (1). Time per product includes the rewrite;
// the label gives ns per dot (192 a product).
void BM_SplitProduct(benchmark::State& state) {
  if (SkippedWithoutAmx(state)) return;
  const bool fewest = state.range(0) != 0, accumulate = state.range(1) != 0;
  const auto sets = static_cast<size_t>(state.range(2));
  const bool rewrite = state.range(3) != 0;
  std::vector<SplitOperands> operands = ZeroedOperands(sets);
  ConfigureTiles();
  size_t next = 0;
  for (auto _ : state) {
    SplitOperands& x = operands[next];
    next = next + 1 == sets ? 0 : next + 1;
    if (rewrite) RewriteB(x);
    SplitProduct(x, x.c, accumulate, fewest);
  }
  ReleaseTiles();
  state.counters["ns_per_dot"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * 192.0,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_SplitProduct)->ArgsProduct({{0, 1}, {0, 1}, {1, 16}, {0, 1}});

// The backward's dV product (fewest loads, accumulating, operands over L2) with vector work that
// splits `vectors` vectors of floats into three stored parts per group of four dots (48 groups a
// product): mode 0 the product alone, 1 the work spread between its dots, 2 the same work all
// before it, 3 the work alone.
void BM_SplitProductBesideWork(benchmark::State& state) {
  if (SkippedWithoutAmx(state)) return;
  const auto mode = static_cast<int>(state.range(0));
  const auto vectors = static_cast<size_t>(state.range(1));
  constexpr size_t kSets = 16;
  std::vector<SplitOperands> operands = ZeroedOperands(kSets);
  struct alignas(64) WorkBuffers {
    float from[kWorkVectors * 16];
    uint32_t to[3 * kWorkVectors * 16];
  };
  const auto buffers = std::make_unique<WorkBuffers>();  // 64-byte aligned (C++17 new)
  std::fill(std::begin(buffers->from), std::end(buffers->from), 1.0F);
  SplitWork work{buffers->from, buffers->to, 0};
  ConfigureTiles();
  size_t next = 0;
  for (auto _ : state) {
    SplitOperands& x = operands[next];
    next = next + 1 == kSets ? 0 : next + 1;
    if (mode == 2 || mode == 3) DoSplitWork(work, 48 * vectors);
    if (mode != 3) SplitProduct(x, x.c, true, true, mode == 1 ? &work : nullptr, vectors);
  }
  ReleaseTiles();
  benchmark::DoNotOptimize(buffers->to[0]);
  state.SetLabel(std::string(mode == 0   ? "product alone"
                             : mode == 1 ? "work between dots"
                             : mode == 2 ? "work before"
                                         : "work alone") +
                 ", " + std::to_string(48 * vectors) + " vectors");
}
BENCHMARK(BM_SplitProductBesideWork)->ArgsProduct({{0, 1, 2, 3}, {2, 4, 8}});

}  // namespace

BENCHMARK_MAIN();
