// The memory read bandwidth: every thread streams through its own slice of a buffer much larger
// than the L3, summing it (Highway, compiled for every SIMD target and dispatched to the best),
// the ceiling of memory-bound work such as decoding against a KV cache.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "attn/core/error.hpp"
#include "bench/ceilings.hpp"

#ifndef ATTN_BENCH_STREAM_READ_SHARED
#define ATTN_BENCH_STREAM_READ_SHARED
namespace attn::bench {
// What one target's loop reports; one type for every target so that dispatch can return it.
struct StreamSumResult {
  float sum;
  const char* target;
};
}  // namespace attn::bench
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/stream_read.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// Highway's headers must follow foreach_target.h.
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace attn::bench {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The sum of `count` floats (a multiple of 8 vectors), with 8 independent chains so that the adds'
// latency never limits the loads: the loop is as fast as memory delivers. The sum is returned so
// that the compiler cannot drop the reads.
HWY_NOINLINE StreamSumResult StreamSum(const float* HWY_RESTRICT data, size_t count) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  auto a4 = hn::Zero(d), a5 = hn::Zero(d), a6 = hn::Zero(d), a7 = hn::Zero(d);
  for (size_t i = 0; i + 8 * lanes <= count; i += 8 * lanes) {
    a0 = hn::Add(a0, hn::Load(d, data + i));
    a1 = hn::Add(a1, hn::Load(d, data + i + lanes));
    a2 = hn::Add(a2, hn::Load(d, data + i + 2 * lanes));
    a3 = hn::Add(a3, hn::Load(d, data + i + 3 * lanes));
    a4 = hn::Add(a4, hn::Load(d, data + i + 4 * lanes));
    a5 = hn::Add(a5, hn::Load(d, data + i + 5 * lanes));
    a6 = hn::Add(a6, hn::Load(d, data + i + 6 * lanes));
    a7 = hn::Add(a7, hn::Load(d, data + i + 7 * lanes));
  }
  const auto sum =
      hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)));
  return {hn::GetLane(hn::SumOfLanes(d, sum)), hwy::TargetName(HWY_TARGET)};
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::bench
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::bench {

HWY_EXPORT(StreamSum);

namespace {

// Slices of every thread start on a 4 KiB boundary and hold whole groups of 8 AVX-512 vectors.
constexpr int64_t kSliceAlignment = 4096;

}  // namespace

int64_t available_memory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string field;
  int64_t kib = 0;
  while (meminfo >> field) {
    if (field == "MemAvailable:") {
      meminfo >> kib;
      return kib * 1024;
    }
    meminfo.ignore(256, '\n');
  }
  return 0;
}

int64_t l3_cache_bytes() {
  // sysfs is the kernel's view of this machine (a VM's share); sysconf reads CPUID, which a
  // hypervisor may fill with the host's total (384 MiB where sysfs says 32 MiB) or leave empty.
  std::ifstream size("/sys/devices/system/cpu/cpu0/cache/index3/size");
  int64_t value = 0;
  char unit = 'K';
  if (size >> value && value > 0) {
    size >> unit;
    return value * (unit == 'M' ? 1024 * 1024 : 1024);
  }
  const long from_sysconf = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return from_sysconf > 0 ? from_sysconf : 0;
}

int64_t default_stream_read_bytes(bool quick) {
  const int64_t l3 = l3_cache_bytes() > 0 ? l3_cache_bytes() : int64_t{32} << 20;
  // 4× the L3 is enough for no read to hit it (STREAM's rule); a full run takes 1 GiB, further
  // from any cache, when a quarter of the available memory allows it.
  int64_t bytes = quick ? 4 * l3 : std::max(4 * l3, int64_t{1} << 30);
  const int64_t available = available_memory();
  if (available > 0) bytes = std::min(bytes, std::max(4 * l3, available / 4));
  return bytes;
}

StreamRead measure_stream_read(int threads, int64_t bytes, int repeats) {
  if (threads < 1 || bytes < kSliceAlignment * threads) {
    throw ValueError("stream read: expected at least 1 thread and " +
                     std::to_string(kSliceAlignment) + " bytes per thread, got " +
                     std::to_string(threads) + " thread(s) and " + std::to_string(bytes) +
                     " bytes");
  }
  const int64_t slice = bytes / threads / kSliceAlignment * kSliceAlignment;
  const auto slice_floats = static_cast<size_t>(slice / static_cast<int64_t>(sizeof(float)));
  auto buffer = hwy::AllocateAligned<float>(slice_floats * static_cast<size_t>(threads));
  if (!buffer) throw ValueError("stream read: cannot allocate " + std::to_string(bytes) + " bytes");
  std::vector<float> sums(static_cast<size_t>(threads));
  StreamRead result;
  result.bytes = slice * threads;
  // Each thread writes its own slice first (the pages exist and are its own), then reads it:
  // once untimed (page tables, TLB), then `repeats` timed passes; the best pass is the ceiling.
  double start = 0.0;
  const auto now = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  for (int pass = -1; pass < std::max(repeats, 1); ++pass) {
#pragma omp parallel num_threads(threads)
    {
      const auto thread = static_cast<size_t>(omp_get_thread_num());
      float* mine = buffer.get() + thread * slice_floats;
      if (pass < 0) std::fill(mine, mine + slice_floats, 1.0F);
#pragma omp barrier
#pragma omp master
      start = now();
#pragma omp barrier
      const StreamSumResult sum = HWY_DYNAMIC_DISPATCH(StreamSum)(mine, slice_floats);
      sums[thread] = sum.sum;
#pragma omp master
      result.simd_target = sum.target;
    }
    const double elapsed = now() - start;
    if (pass >= 0) {
      result.gbytes_per_second =
          std::max(result.gbytes_per_second, static_cast<double>(result.bytes) / elapsed * 1e-9);
    }
  }
  // The sums leave through a volatile, so the reads cannot be optimised away.
  volatile float checksum = 0.0F;
  for (const float sum : sums) checksum = checksum + sum;
  return result;
}

}  // namespace attn::bench
#endif  // HWY_ONCE
