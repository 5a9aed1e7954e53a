// Google Benchmark targets for the fused forward's register-tiled products (src/kernels/
// tile_gemm-inl.h) on this CPU's best SIMD target, against the FMA peak of the same run: Q·Kᵀ
// (Sᵀ = K Qᵀ, Bc keys × Br queries at depth d) and P·V (O = O·rescale + P V, Br queries × dv at
// depth Bc) with their operands in L1, and both over one head's packed keys and values of n rows
// with the 4 query tiles of a block, in FlashForwardTiles's order: the tile's own rate, and what
// its context (K and V from L2, the slots' buffers) costs it, without the softmax. The buffers are
// not the kernel's scratch: where they lie relative to each other moves these figures (Zen 3,
// d = 128: P·V 0.56-0.60 of the peak here became 0.73 with V's rows one line apart more, and the
// kernel with the same padding stayed level), so confirm a finding in the kernel itself.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/tile_gemm_benchmarks.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// Highway's headers must follow foreach_target.h.
#include <hwy/highway.h>

#include "kernels/tile_gemm-inl.h"

#ifndef ATTN_BENCH_TILE_BUFFERS_DEFINED
#define ATTN_BENCH_TILE_BUFFERS_DEFINED
namespace attn {
// The products' operands, allocated and written once per benchmark (fresh pages would fault
// inside the timed passes): K and V (keys × d), Qᵀ and O per slot, Sᵀ (64 × Br), the rescale (Br).
struct TileBuffers {
  float *keys, *values, *q_transposed, *output, *scores, *rescale;
};
}  // namespace attn
#endif

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {

// The forward's tile: Br = kMaxVectors query vectors (flash_detail::kQueryVectors), Bc = 64 keys
// (flash_detail::kKeyTile); `slots` query tiles (Qᵀ d × Br and O Br × dv each, dv = d) share Sᵀ,
// and K, V hold `keys` packed rows of d. One pass over the keys: QK products when `qk`, PV
// products when `pv` (Oᵀ = Vᵀ Pᵀ instead, O kept dv × Br, when `transposed`: V's elements
// broadcast and Pᵀ's rows the vectors, the shape of Q·Kᵀ). Returns the flops done.
double RunForwardTiles(const TileBuffers& buffers, size_t depth, size_t keys, size_t slots, bool qk,
                       bool pv, bool transposed) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d), br = kMaxVectors * lanes, bc = 64;
  double flops = 0.0;
  for (size_t key0 = 0; key0 + bc <= keys; key0 += bc) {
    for (size_t slot = 0; slot < slots; ++slot) {
      if (qk) {
        Gemm<false>(d, bc, kMaxVectors, buffers.keys + key0 * depth, depth, 1,
                    buffers.q_transposed + slot * depth * br, br, depth, buffers.scores, br);
        flops += 2.0 * static_cast<double>(bc * br * depth);
      }
      if (pv && transposed) {
        Gemm<true>(d, depth, kMaxVectors, buffers.values + key0 * depth, 1, depth, buffers.scores,
                   br, bc, buffers.output + slot * br * depth, br, nullptr);
      } else if (pv) {
        Gemm<true>(d, br, depth / lanes, buffers.scores, 1, br, buffers.values + key0 * depth,
                   depth, bc, buffers.output + slot * br * depth, depth, buffers.rescale);
      }
      if (pv) flops += 2.0 * static_cast<double>(bc * br * depth);
    }
  }
  return flops;
}

// The query tile's lanes on this target (Br = kMaxVectors of them).
size_t TileLanes() {
  return kMaxVectors * hn::Lanes(hn::ScalableTag<float>());
}

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <benchmark/benchmark.h>

#include <hwy/aligned_allocator.h>

#include <algorithm>
#include <cstdio>
#include <new>
#include <string>
#include <string_view>

#include "attn/core/error.hpp"
#include "attn/kernels/simd_target.hpp"
#include "bench/ceilings.hpp"

namespace attn {
HWY_EXPORT(RunForwardTiles);
HWY_EXPORT(TileLanes);
namespace {

double fma_peak_gflops = 0.0;  // one thread, measured once before the products

// The products at head size d (dv = d): in L1 (one key tile, one slot) when keys is 64, else over
// `keys` packed rows with the 4 slots of a query block.
void run_tiles(benchmark::State& state, size_t depth, size_t keys, bool qk, bool pv,
               bool transposed) {
  const size_t slots = keys == 64 ? 1 : 4, br = HWY_DYNAMIC_DISPATCH(TileLanes)();
  // Each buffer from a cache line's start, as the kernel's scratch: with malloc's 16-byte
  // alignment, AVX2's 32-byte loads could straddle lines, and P·V's share of the peak read 0.70 in
  // one process and 0.93 in the next (Zen 4 capped at AVX2).
  const auto buffer = [](size_t count, float value) {
    hwy::AlignedFreeUniquePtr<float[]> memory = hwy::AllocateAligned<float>(count);
    if (!memory) throw std::bad_alloc();
    std::fill_n(memory.get(), count, value);
    return memory;
  };
  auto keys_rows = buffer(keys * depth, 0.0F), values = buffer(keys * depth, 0.0F);
  auto q_transposed = buffer(slots * depth * br, 1e-2F), output = buffer(slots * br * depth, 0.0F);
  auto scores = buffer(64 * br, 1e-2F), rescale = buffer(br, 1.0F);
  for (size_t i = 0; i < keys * depth; ++i) keys_rows[i] = static_cast<float>(i % 7) * 1e-3F;
  for (size_t i = 0; i < keys * depth; ++i) values[i] = static_cast<float>(i % 5) * 1e-3F;
  const TileBuffers buffers{keys_rows.get(), values.get(), q_transposed.get(),
                            output.get(),    scores.get(), rescale.get()};
  double flops = 0.0;
  for (auto _ : state)
    flops = HWY_DYNAMIC_DISPATCH(RunForwardTiles)(buffers, depth, keys, slots, qk, pv, transposed);
  benchmark::DoNotOptimize(output.get());
  state.counters["Gflop"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  // The share of the same run's FMA peak, as a rate counter of the same kind.
  state.counters["peak_share"] = benchmark::Counter(flops * 1e-9 / fma_peak_gflops,
                                                    benchmark::Counter::kIsIterationInvariantRate);
}

void register_benchmarks() {
  struct Products {
    const char* name;
    bool qk, pv, transposed;
  };
  const Products products[] = {{"qk", true, false, false},
                               {"pv", false, true, false},
                               {"qk+pv", true, true, false},
                               {"pvt", false, true, true},
                               {"qk+pvt", true, true, true}};
  for (const size_t depth : {size_t{64}, size_t{128}}) {
    for (const size_t keys : {size_t{64}, size_t{1024}, size_t{4096}}) {
      for (const Products& product : products) {
        const std::string name =
            std::string("tile/") + product.name + "/d:" + std::to_string(depth) +
            (keys == 64 ? std::string("/in_l1") : "/packed_keys:" + std::to_string(keys));
        benchmark::RegisterBenchmark(name.c_str(), run_tiles, depth, keys, product.qk, product.pv,
                                     product.transposed)
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
}

}  // namespace
}  // namespace attn

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  // --simd-target=NAME caps the tiles' dispatch and the FMA peak's (as `attn bench --simd-target`):
  // AVX2's 16-register tiles measured on an AVX-512 machine.
  constexpr std::string_view kTargetFlag = "--simd-target=";
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view argument(argv[i]);
    if (!argument.starts_with(kTargetFlag)) {
      argv[kept++] = argv[i];
      continue;
    }
    try {
      attn::limit_simd_target(argument.substr(kTargetFlag.size()));
    } catch (const attn::Error& error) {
      std::fprintf(stderr, "attn_tile_benchmarks: %s\n", error.what());
      return 2;
    }
  }
  argc = kept;
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  const attn::bench::FmaPeak peak = attn::bench::measure_fma_peak(1, 0.2, 3);
  attn::fma_peak_gflops = peak.gflops;
  benchmark::AddCustomContext("fma_peak_1_thread_gflops", std::to_string(peak.gflops));
  benchmark::AddCustomContext("simd_target", peak.simd_target);
  attn::register_benchmarks();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
#endif  // HWY_ONCE
