// Masked softmax over the last axis of scores (B, n, m): the book's masked_softmax, except that a
// row with valid length 0 gets all-zero weights (the book's -1e6 trick gives uniform weights and
// PyTorch's -inf gives NaN; attn lets padding contribute nothing and never produces NaN).
#pragma once

#include "attn/core/tensor.hpp"
#include "attn/core/valid_lengths.hpp"

namespace attn {

// weights[b, i, j] = exp(s[b,i,j] - max) / Σ_{j' < len} exp(s[b,i,j'] - max) for j < len(b, i), and
// exactly 0 for j ≥ len(b, i); the maximum is taken over the valid scores, so any finite magnitude
// is stable. A row whose valid scores are all -inf is treated as fully masked (all zeros).
// Throws ShapeError for a scores tensor that is not (B, n, m) or lengths that do not fit it,
// ValueError for a length outside [0, m] or a valid score that is NaN or +inf.
// `weights` may alias `scores`.
void masked_softmax(ConstTensorView scores, const ValidLengths& valid_lens, TensorView weights);
Tensor masked_softmax(ConstTensorView scores, const ValidLengths& valid_lens = {});

}  // namespace attn
