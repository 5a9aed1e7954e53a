// The FP32 FMA peak: a loop of independent fused multiply-adds on registers only, written once
// with Highway and compiled for every SIMD target (foreach_target), dispatched to the best one.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "bench/ceilings.hpp"

#ifndef ATTN_BENCH_FMA_PEAK_SHARED
#define ATTN_BENCH_FMA_PEAK_SHARED
namespace attn::bench {
// What one target's loop reports; one type for every target so that dispatch can return it.
struct FmaLoopResult {
  float checksum;
  int chains;
  int lanes;
  const char* target;
};
}  // namespace attn::bench
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/fma_peak.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// Highway's headers must follow foreach_target.h.
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace attn::bench {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Enough independent chains to hide the FMA latency on every pipe: Zen 4/5 and recent Intel
// cores issue 2 FMAs per cycle with a 4-cycle latency, so at least 8 chains must be in flight.
// 16 (plus the two operands) fits the 32 vector registers of AVX-512; targets with 16 registers
// get 12 so that nothing spills to memory inside the loop.
constexpr int kChains = HWY_TARGET <= HWY_AVX3 ? 16 : 12;

// `iterations` rounds of kChains FMAs; the checksum keeps the compiler from dropping the work.
HWY_NOINLINE FmaLoopResult FmaLoop(int64_t iterations) {
  const hn::ScalableTag<float> d;
  // acc ← acc·mul + add with mul just below 1 converges to add/(1−mul): no overflow, no
  // denormals, whatever the iteration count.
  const auto mul = hn::Set(d, 0.999999F);
  const auto add = hn::Set(d, 1e-6F);
  using V = decltype(hn::Zero(d));
  V acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = hn::Set(d, static_cast<float>(c));
  for (int64_t it = 0; it < iterations; ++it) {
    for (int c = 0; c < kChains; ++c) acc[c] = hn::MulAdd(acc[c], mul, add);
  }
  V sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = hn::Add(sum, acc[c]);
  return {hn::GetLane(hn::SumOfLanes(d, sum)), kChains, static_cast<int>(hn::Lanes(d)),
          hwy::TargetName(HWY_TARGET)};
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::bench
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::bench {

HWY_EXPORT(FmaLoop);

FmaPeak measure_fma_peak(int threads, double seconds, int repeats) {
  using Clock = std::chrono::steady_clock;
  // Calibrate on one thread: how many iterations fill `seconds`.
  int64_t iterations = 1 << 16;
  for (;;) {
    const auto start = Clock::now();
    HWY_DYNAMIC_DISPATCH(FmaLoop)(iterations);
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (elapsed > seconds / 8 || iterations > (int64_t{1} << 40)) {
      iterations =
          static_cast<int64_t>(static_cast<double>(iterations) * seconds / std::max(elapsed, 1e-9));
      break;
    }
    iterations *= 4;
  }
  FmaPeak peak;
  volatile float sink = 0.0F;
  for (int repeat = 0; repeat < std::max(repeats, 1); ++repeat) {
    std::vector<float> checksums(static_cast<size_t>(threads));
    const auto start = Clock::now();
#pragma omp parallel num_threads(threads)
    {
      const auto result = HWY_DYNAMIC_DISPATCH(FmaLoop)(iterations);
      checksums[static_cast<size_t>(omp_get_thread_num())] = result.checksum;
#pragma omp master
      {
        peak.simd_target = result.target;
        peak.accumulators = result.chains;
        peak.lanes = result.lanes;
      }
    }
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    for (const float checksum : checksums) sink = sink + checksum;
    const double flops =
        2.0 * threads * static_cast<double>(iterations) * peak.accumulators * peak.lanes;
    const double gflops = flops / elapsed * 1e-9;
    peak.gflops = std::max(peak.gflops, gflops);
    peak.lowest = repeat == 0 ? gflops : std::min(peak.lowest, gflops);
  }
  return peak;
}

}  // namespace attn::bench
#endif  // HWY_ONCE
