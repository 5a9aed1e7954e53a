// Dense row-major matrix products for the recurrent layers' hot loops (internal to libattn).
// Each inner loop runs over contiguous output elements (axpy form), so the compiler vectorises it
// without reassociating a float reduction, and the results do not depend on the build flags.
#pragma once

#include <cstdint>

namespace attn::detail {

// c (rows, cols) += a (rows, inner) · b (inner, cols).
inline void add_product(const float* __restrict a, const float* __restrict b, float* __restrict c,
                        int64_t rows, int64_t inner, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i) {
    float* __restrict c_row = c + i * cols;
    const float* a_row = a + i * inner;
    for (int64_t k = 0; k < inner; ++k) {
      const float scale = a_row[k];
      if (scale == 0.0F) continue;  // one-hot rows and masked gradients cost nothing
      const float* __restrict b_row = b + k * cols;
      for (int64_t j = 0; j < cols; ++j) c_row[j] += scale * b_row[j];
    }
  }
}

// c (rows, cols) += aᵀ · b for a (inner, rows) and b (inner, cols): the weight gradients Σ gᵀ x.
// Blocks of output rows stay in cache while every input row passes over them.
inline void add_transposed_product(const float* __restrict a, const float* __restrict b,
                                   float* __restrict c, int64_t inner, int64_t rows, int64_t cols) {
  constexpr int64_t kBlock = 32;
  for (int64_t first = 0; first < rows; first += kBlock) {
    const int64_t last = first + kBlock < rows ? first + kBlock : rows;
    for (int64_t k = 0; k < inner; ++k) {
      const float* a_row = a + k * rows;
      const float* __restrict b_row = b + k * cols;
      for (int64_t i = first; i < last; ++i) {
        const float scale = a_row[i];
        if (scale == 0.0F) continue;
        float* __restrict c_row = c + i * cols;
        for (int64_t j = 0; j < cols; ++j) c_row[j] += scale * b_row[j];
      }
    }
  }
}

// out (cols, rows) = in (rows, cols)ᵀ.
inline void transpose(const float* __restrict in, float* __restrict out, int64_t rows,
                      int64_t cols) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out[j * rows + i] = in[i * cols + j];
}

// Adds each row of `values` (rows, cols) into `sums` (cols): the bias gradients.
inline void add_row_sums(const float* __restrict values, float* __restrict sums, int64_t rows,
                         int64_t cols) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) sums[j] += values[i * cols + j];
}

}  // namespace attn::detail
