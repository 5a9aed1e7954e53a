// The ceilings attention kernels are measured against: the machine's FP32 FMA peak (a
// register-only FMA loop on every thread), oneDNN sgemm on the attention shapes, and the memory
// read bandwidth (a streaming read on every thread) for decoding.
#pragma once

#include <cstdint>
#include <string>

namespace attn::bench {

struct FmaPeak {
  double gflops = 0.0;      // best of the repeats: noise only ever lowers a ceiling
  double lowest = 0.0;      // worst repeat: how much of the cores other work took meanwhile
  std::string simd_target;  // the Highway target the loop ran on, e.g. "AVX3"
  int accumulators = 0;     // independent FMA chains per thread
  int lanes = 0;            // floats per vector
};

// Runs the FMA loop on `threads` OpenMP threads at once for about `seconds` per repeat.
FmaPeak measure_fma_peak(int threads, double seconds, int repeats);

// The two products of the book's code for one head, (n×d)·(d×m) then (n×m)·(m×d), as attn::gemm
// (oneDNN sgemm) calls over batch·heads matrices on `threads` OpenMP threads; median time.
struct SgemmCeiling {
  double milliseconds = 0.0;
  double gflops = 0.0;  // 4·B·H·n·m·d / time
};
std::string sgemm_library();  // e.g. "oneDNN 2.6.3 (AVX-512 BF16)"
SgemmCeiling measure_sgemm(int64_t batch_heads, int64_t queries, int64_t keys, int64_t head_dim,
                           int threads, int repeats);

// The memory read bandwidth: `threads` OpenMP threads each sum their own slice of a `bytes`
// buffer (written first, then read once untimed), `repeats` times; the best pass counts.
struct StreamRead {
  double gbytes_per_second = 0.0;  // 10⁹ bytes per second
  int64_t bytes = 0;               // the buffer actually read (slices rounded to 4 KiB)
  std::string simd_target;
};
StreamRead measure_stream_read(int threads, int64_t bytes, int repeats);
// "MemAvailable:" of /proc/meminfo in bytes; 0 when unknown.
int64_t available_memory();
// The L3 size in bytes (sysfs, else sysconf); 0 when unknown.
int64_t l3_cache_bytes();
// The buffer measure_stream_read should read: 4× the L3 (32 MiB assumed when unknown) for a quick
// run, else 1 GiB; never more than the larger of 4× the L3 and a quarter of the available memory.
int64_t default_stream_read_bytes(bool quick);

}  // namespace attn::bench
