// gemm: a thin, checked wrapper over cblas_sgemm.
#include "attn/kernels/gemm.hpp"

#include <cblas.h>

#include <limits>
#include <string>

#include "attn/core/error.hpp"

namespace attn {

namespace {
blasint to_blas(int64_t value, const char* name) {
  if (value < 0 || value > std::numeric_limits<blasint>::max()) {
    throw ValueError(std::string("gemm: ") + name + " = " + std::to_string(value) +
                     " is outside BLAS's integer range");
  }
  return static_cast<blasint>(value);
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
  cblas_sgemm(CblasRowMajor, transpose_a == Transpose::kYes ? CblasTrans : CblasNoTrans,
              transpose_b == Transpose::kYes ? CblasTrans : CblasNoTrans, to_blas(rows, "rows"),
              to_blas(cols, "cols"), to_blas(depth, "depth"), alpha, a, to_blas(lda, "lda"), b,
              to_blas(ldb, "ldb"), beta, c, to_blas(ldc, "ldc"));
}

}  // namespace attn
