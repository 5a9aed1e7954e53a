// attn::gaussian_kernel_pooling: Nadaraya–Watson kernel regression as attention pooling, as a
// function — the scores −½‖(q − k)·w‖², masked softmax over valid lengths, the weighted sum.
// The (B, n, m) weights are built only when asked for; otherwise blocks of query rows at a time.
#pragma once

#include "attn/core/tensor.hpp"
#include "attn/core/valid_lengths.hpp"

namespace attn {

// Scores S_ij = −½ ‖(q_i − k_j)·w‖² for queries (B, n, d) and keys (B, m, d): (B, n, m), summed
// in double (−∞ where a score is beyond float). ShapeError for inconsistent shapes, ValueError for
// a width that is not finite or queries or keys that are not.
Tensor gaussian_kernel_scores(ConstTensorView queries, ConstTensorView keys, float width);

// The same scores, each row shifted by its largest over its valid keys (in double, before rounding
// to float): softmax gives the same weights, and a row whose every score is beyond float (keys far
// from the query, a large width) still gives its nearest key all the weight, where −∞ throughout
// would give none. What the pooling below and GaussianKernelPooling take their weights from.
Tensor gaussian_kernel_shifted_scores(ConstTensorView queries, ConstTensorView keys, float width,
                                      const ValidLengths& valid_lens = {});

struct PoolingResult {
  Tensor output;   // (B, n, v)
  Tensor weights;  // (B, n, m)
};

// softmax(S) over each query's valid keys, then weights · values (B, m, v) (ValueError for values
// that are not finite). Without
// `need_weights` the weights are left empty and never held whole: scores of 64 query rows at a
// time, O(64·m) memory.
PoolingResult gaussian_kernel_pooling(ConstTensorView queries, ConstTensorView keys,
                                      ConstTensorView values, float width,
                                      const ValidLengths& valid_lens = {},
                                      bool need_weights = true);

}  // namespace attn
