// Plain batched matrix products for the materialising (book-style) attention path.
// Layouts are row-major; accumulation is in float, in the order PyTorch's CPU bmm would use.
#pragma once

#include "attn/core/tensor.hpp"

namespace attn {

// out[b] = a[b] · rhs[b]: a (B, n, k), rhs (B, k, m) → out (B, n, m).
void batched_matmul(ConstTensorView a, ConstTensorView rhs, TensorView out);
// out[b] = a[b] · rhs[b]ᵀ: a (B, n, k), rhs (B, m, k) → out (B, n, m); the book's bmm(Q, Kᵀ).
void batched_matmul_transposed(ConstTensorView a, ConstTensorView rhs, TensorView out);
// out[b] = a[b]ᵀ · rhs[b]: a (B, k, n), rhs (B, k, m) → out (B, n, m); the backward passes' Pᵀ·dO.
void batched_transposed_matmul(ConstTensorView a, ConstTensorView rhs, TensorView out);

}  // namespace attn
