// General matrix product C = α·op(A)·op(B) + β·C on row-major float32 matrices, through oneDNN's
// sgemm: the projections of the layers (Linear) are large GEMMs where a tuned library wins.
// docs/gemm.md says why oneDNN (it picks its kernels by instruction set, not by CPU model).
#pragma once

#include <cstdint>
#include <string>

namespace attn {

enum class Transpose { kNo, kYes };

// op(A) is rows × depth, op(B) is depth × cols, C is rows × cols; lda, ldb, ldc are the row
// strides of A, B and C as stored. Does nothing when rows or cols is 0; with depth 0, C = β·C.
void gemm(Transpose transpose_a, Transpose transpose_b, int64_t rows, int64_t cols, int64_t depth,
          float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
          float* c, int64_t ldc);

// C = op(A)·op(B) + 1·biasᵀ: `bias` (cols floats) added to every row, as a Linear layer does. C
// starts as the bias rows (written on the OpenMP threads) and the GEMM accumulates onto them, so
// no serial pass over C follows the parallel product.
void gemm_plus_bias(Transpose transpose_a, Transpose transpose_b, int64_t rows, int64_t cols,
                    int64_t depth, const float* a, int64_t lda, const float* b, int64_t ldb,
                    const float* bias, float* c, int64_t ldc);

// The GEMM library, its version and the instruction set it runs here, e.g.
// "oneDNN 2.6.3 (AVX-512 BF16)". Its threads are the OpenMP runtime's (omp_set_num_threads).
std::string gemm_library();

}  // namespace attn
