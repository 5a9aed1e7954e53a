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

// y = x·Wᵀ + bias, a Linear layer's forward product: x is rows × in, W is out × in as PyTorch
// stores a layer's weight, bias has out floats or is null (no bias), y is rows × out; all
// contiguous. From 16 rows of a 256 × 256 weight up on oneDNN's matmul primitive, which reads W
// through its strides and adds the bias itself: sgemm on the transposed W measured 1.2× slower on
// two threads at 1024 rows of 512, 3× at 16 rows (Zen 4, docs/gemm.md); below, on sgemm, where
// the primitive's fixed cost per call outweighs it. With in = 0, y is the bias rows (or 0).
void linear_product(int64_t rows, int64_t in, int64_t out, const float* x, const float* weight,
                    const float* bias, float* y);

// The GEMM library, its version and the instruction set it runs here, e.g.
// "oneDNN 2.6.3 (AVX-512 BF16)". Its threads are the OpenMP runtime's (omp_set_num_threads).
std::string gemm_library();

}  // namespace attn
