// attn::gaussian_kernel_pooling: the Gaussian-kernel scores, masked softmax and weighted sum.
#include "attn/functional/gaussian_kernel_pooling.hpp"

#include <cmath>
#include <string>

#include "attn/core/error.hpp"
#include "attn/kernels/masked_softmax.hpp"
#include "attn/kernels/matmul.hpp"

namespace attn {

Tensor gaussian_kernel_scores(ConstTensorView queries, ConstTensorView keys, float width) {
  require_rank("queries", queries.shape(), 3);
  require_rank("keys", keys.shape(), 3);
  require_dim("keys", keys.shape(), 0, queries.dim(0), "the batch size of queries");
  require_dim("keys", keys.shape(), 2, queries.dim(2), "the size of each query");
  if (!std::isfinite(width))
    throw ValueError("width: expected a finite number, got " + std::to_string(width));
  const int64_t batch = queries.dim(0), n = queries.dim(1), m = keys.dim(1), d = queries.dim(2);
  Tensor scores(Shape{batch, n, m});
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        float squared = 0.0F;
        for (int64_t t = 0; t < d; ++t) {
          const float scaled = (queries(b, i, t) - keys(b, j, t)) * width;
          squared += scaled * scaled;
        }
        scores(b, i, j) = -0.5F * squared;
      }
    }
  }
  return scores;
}

PoolingResult gaussian_kernel_pooling(ConstTensorView queries, ConstTensorView keys,
                                      ConstTensorView values, float width,
                                      const ValidLengths& valid_lens) {
  require_rank("values", values.shape(), 3);
  require_dim("values", values.shape(), 0, queries.dim(0), "the batch size of queries");
  require_dim("values", values.shape(), 1, keys.dim(1), "the number of keys");
  PoolingResult result;
  result.weights = gaussian_kernel_scores(queries, keys, width);
  valid_lens.check("valid_lens", queries.dim(0), queries.dim(1), keys.dim(1));
  masked_softmax(result.weights, valid_lens, result.weights);
  result.output = Tensor(Shape{queries.dim(0), queries.dim(1), values.dim(2)});
  batched_matmul(result.weights, values, result.output);
  return result;
}

}  // namespace attn
