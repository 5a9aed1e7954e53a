// The two ceilings attention kernels are measured against: the machine's FP32 FMA peak (a
// register-only FMA loop on every thread) and OpenBLAS sgemm on the attention shapes.
#pragma once

#include <cstdint>
#include <string>

namespace attn::bench {

struct FmaPeak {
  double gflops = 0.0;      // best of the repeats: noise only ever lowers a ceiling
  std::string simd_target;  // the Highway target the loop ran on, e.g. "AVX3"
  int accumulators = 0;     // independent FMA chains per thread
  int lanes = 0;            // floats per vector
};

// Runs the FMA loop on `threads` OpenMP threads at once for about `seconds` per repeat.
FmaPeak measure_fma_peak(int threads, double seconds, int repeats);

// The two products of the book's code for one head, (n×d)·(d×m) then (n×m)·(m×d), as
// cblas_sgemm calls over batch·heads matrices on `threads` OpenBLAS threads; median time.
struct SgemmCeiling {
  double milliseconds = 0.0;
  double gflops = 0.0;  // 4·B·H·n·m·d / time
};
// False when attn was built without OpenBLAS (then measure_sgemm throws ValueError).
bool have_sgemm();
std::string sgemm_library();  // e.g. "OpenBLAS 0.3.21 ... (core Haswell)"
SgemmCeiling measure_sgemm(int64_t batch_heads, int64_t queries, int64_t keys, int64_t head_dim,
                           int threads, int repeats);

}  // namespace attn::bench
