// Masked softmax: the plain single-pass-per-row kernel used by the materialising layers.
#include "attn/kernels/masked_softmax.hpp"

#include <cmath>
#include <limits>

#include "attn/core/error.hpp"

namespace attn {

void masked_softmax(ConstTensorView scores, const ValidLengths& valid_lens, TensorView weights) {
  require_rank("scores", scores.shape(), 3);
  if (weights.shape() != scores.shape()) {
    throw ShapeError("weights: expected shape " + scores.shape().str() +
                     " (that of scores), got shape " + weights.shape().str());
  }
  const int64_t batch = scores.dim(0);
  const int64_t queries = scores.dim(1);
  const int64_t keys = scores.dim(2);
  valid_lens.check("valid_lens", batch, queries, keys);

  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < queries; ++i) {
      const float* row = &scores(b, i, 0);
      float* out = &weights(b, i, 0);
      const int64_t length = valid_lens.length(b, i, keys);
      float row_max = -std::numeric_limits<float>::infinity();
      bool has_nan = false;
      for (int64_t j = 0; j < length; ++j) {
        has_nan |= std::isnan(row[j]);
        row_max = row[j] > row_max ? row[j] : row_max;
      }
      if (has_nan || row_max == std::numeric_limits<float>::infinity()) {
        // The first entry at fault, found only on this path.
        int64_t j = 0;
        while (!std::isnan(row[j]) && row[j] != std::numeric_limits<float>::infinity()) ++j;
        throw ValueError("scores[" + std::to_string(b) + ", " + std::to_string(i) + ", " +
                             std::to_string(j) + "]: expected a finite score, got " +
                             (std::isnan(row[j]) ? "NaN" : "+inf") +
                             " (check the inputs for NaN, infinity or overflow)",
                         "scores");
      }
      if (row_max == -std::numeric_limits<float>::infinity()) {
        for (int64_t j = 0; j < keys; ++j) out[j] = 0.0F;
        continue;
      }
      float sum = 0.0F;
      for (int64_t j = 0; j < length; ++j) {
        out[j] = std::exp(row[j] - row_max);
        sum += out[j];
      }
      // sum ≥ 1 because the maximum contributes exp(0).
      const float inverse = 1.0F / sum;
      for (int64_t j = 0; j < length; ++j) out[j] *= inverse;
      for (int64_t j = length; j < keys; ++j) out[j] = 0.0F;
    }
  }
}

Tensor masked_softmax(ConstTensorView scores, const ValidLengths& valid_lens) {
  Tensor weights(scores.shape());
  masked_softmax(scores, valid_lens, weights);
  return weights;
}

}  // namespace attn
