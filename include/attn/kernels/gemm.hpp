// General matrix product C = α·op(A)·op(B) + β·C on row-major float32 matrices, through OpenBLAS's
// CBLAS sgemm: the projections of the layers (Linear) are large GEMMs where a tuned BLAS wins.
#pragma once

#include <cstdint>

namespace attn {

enum class Transpose { kNo, kYes };

// op(A) is rows × depth, op(B) is depth × cols, C is rows × cols; lda, ldb, ldc are the row
// strides of A, B and C as stored. Does nothing when rows or cols is 0; with depth 0, C = β·C.
void gemm(Transpose transpose_a, Transpose transpose_b, int64_t rows, int64_t cols, int64_t depth,
          float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
          float* c, int64_t ldc);

}  // namespace attn
