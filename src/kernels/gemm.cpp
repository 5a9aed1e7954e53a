// gemm: a thin, checked wrapper over oneDNN's dnnl_sgemm (row-major, 64-bit sizes, its OpenMP
// threads), and the name of the library and instruction set it runs.
#include "attn/kernels/gemm.hpp"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <string>

#include "attn/core/error.hpp"

namespace attn {

namespace {
std::string isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41:
      return "SSE4.1";
    case dnnl_cpu_isa_avx:
      return "AVX";
    case dnnl_cpu_isa_avx2:
      return "AVX2";
    case dnnl_cpu_isa_avx2_vnni:
      return "AVX2-VNNI";
    case dnnl_cpu_isa_avx512_core:
      return "AVX-512";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "AVX-512 VNNI";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "AVX-512 BF16";
    case dnnl_cpu_isa_avx512_core_amx:
      return "AVX-512 AMX";
    default:
      return "ISA code " + std::to_string(static_cast<int>(isa));
  }
}
}  // namespace

void gemm(Transpose transpose_a, Transpose transpose_b, int64_t rows, int64_t cols, int64_t depth,
          float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
          float* c, int64_t ldc) {
  if (rows == 0 || cols == 0) return;
  if (depth == 0) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j)
        c[r * ldc + j] = beta == 0.0F ? 0.0F : beta * c[r * ldc + j];
    return;
  }
  const dnnl_status_t status = dnnl_sgemm(transpose_a == Transpose::kYes ? 'T' : 'N',
                                          transpose_b == Transpose::kYes ? 'T' : 'N', rows, cols,
                                          depth, alpha, a, lda, b, ldb, beta, c, ldc);
  if (status != dnnl_success) {
    throw ValueError("gemm: oneDNN's sgemm refused rows = " + std::to_string(rows) +
                     ", cols = " + std::to_string(cols) + ", depth = " + std::to_string(depth) +
                     ", lda = " + std::to_string(lda) + ", ldb = " + std::to_string(ldb) +
                     ", ldc = " + std::to_string(ldc) + " (dnnl status " +
                     std::to_string(static_cast<int>(status)) + ")");
  }
}

void gemm_plus_bias(Transpose transpose_a, Transpose transpose_b, int64_t rows, int64_t cols,
                    int64_t depth, const float* a, int64_t lda, const float* b, int64_t ldb,
                    const float* bias, float* c, int64_t ldc) {
#pragma omp parallel for if (rows * cols > (int64_t{1} << 16))
  for (int64_t r = 0; r < rows; ++r) std::copy_n(bias, cols, c + r * ldc);
  gemm(transpose_a, transpose_b, rows, cols, depth, 1.0F, a, lda, b, ldb, 1.0F, c, ldc);
}

std::string gemm_library() {
  const dnnl_version_t* version = dnnl_version();
  return "oneDNN " + std::to_string(version->major) + "." + std::to_string(version->minor) + "." +
         std::to_string(version->patch) + " (" + isa_name(dnnl_get_effective_cpu_isa()) + ")";
}

}  // namespace attn
