// attn::gaussian_kernel_pooling: the Gaussian-kernel scores, masked softmax and weighted sum.
#include "attn/functional/gaussian_kernel_pooling.hpp"

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/kernels/masked_softmax.hpp"
#include "attn/kernels/matmul.hpp"

namespace attn {

namespace {

// Query rows whose scores a call without weights holds at once: O(rows · m) memory, not (B, n, m).
constexpr int64_t kRowBlock = 64;

void check_scores_arguments(ConstTensorView queries, ConstTensorView keys, float width) {
  require_rank("queries", queries.shape(), 3);
  require_rank("keys", keys.shape(), 3);
  require_dim("keys", keys.shape(), 0, queries.dim(0), "the batch size of queries");
  require_dim("keys", keys.shape(), 2, queries.dim(2), "the size of each query");
  if (!std::isfinite(width))
    throw ValueError("width: expected a finite number, got " + std::to_string(width));
  require_finite("queries", queries);
  require_finite("keys", keys);
}

// Scores of queries [first, first + rows) of batch b against every key, rows × m at `scores`,
// summed in double. `lengths` (one per row, or empty for all m keys): each row is shifted by its
// largest score over its valid keys, which softmax ignores; in float a row of keys all far from
// its query (or a large width) overflowed to −∞ everywhere, and the softmax gave zeros where the
// nearest key takes all the weight.
void score_rows(ConstTensorView queries, ConstTensorView keys, float width, int64_t b,
                int64_t first, int64_t rows, std::span<const int64_t> lengths, float* scores) {
  const int64_t m = keys.dim(1), d = queries.dim(2);
  std::vector<double> row(static_cast<size_t>(m));
  for (int64_t i = first; i < first + rows; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      double squared = 0.0;
      for (int64_t t = 0; t < d; ++t) {
        const double scaled = (static_cast<double>(queries(b, i, t)) - keys(b, j, t)) * width;
        squared += scaled * scaled;
      }
      row[static_cast<size_t>(j)] = -0.5 * squared;
    }
    const int64_t valid = lengths.empty() ? m : lengths[static_cast<size_t>(i - first)];
    const double shift = valid > 0 ? *std::max_element(row.begin(), row.begin() + valid) : 0.0;
    for (int64_t j = 0; j < m; ++j)
      *scores++ = static_cast<float>(row[static_cast<size_t>(j)] - shift);
  }
}

// Each row's valid length (empty for all keys), for rows [first, first + rows) of batch b.
std::vector<int64_t> row_lengths(const ValidLengths& valid_lens, int64_t b, int64_t first,
                                 int64_t rows, int64_t m) {
  std::vector<int64_t> lengths;
  if (valid_lens.is_all()) return lengths;
  for (int64_t i = first; i < first + rows; ++i) lengths.push_back(valid_lens.length(b, i, m));
  return lengths;
}

}  // namespace

Tensor gaussian_kernel_scores(ConstTensorView queries, ConstTensorView keys, float width) {
  check_scores_arguments(queries, keys, width);
  const int64_t batch = queries.dim(0), n = queries.dim(1), m = keys.dim(1), d = queries.dim(2);
  Tensor scores(Shape{batch, n, m});
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        double squared = 0.0;
        for (int64_t t = 0; t < d; ++t) {
          const double scaled = (static_cast<double>(queries(b, i, t)) - keys(b, j, t)) * width;
          squared += scaled * scaled;
        }
        scores(b, i, j) = static_cast<float>(-0.5 * squared);
      }
    }
  }
  return scores;
}

Tensor gaussian_kernel_shifted_scores(ConstTensorView queries, ConstTensorView keys, float width,
                                      const ValidLengths& valid_lens) {
  check_scores_arguments(queries, keys, width);
  const int64_t batch = queries.dim(0), n = queries.dim(1), m = keys.dim(1);
  valid_lens.check("valid_lens", batch, n, m);
  Tensor scores(Shape{batch, n, m});
  for (int64_t b = 0; b < batch; ++b) {
    score_rows(queries, keys, width, b, 0, n, row_lengths(valid_lens, b, 0, n, m),
               &scores(b, 0, 0));
  }
  return scores;
}

PoolingResult gaussian_kernel_pooling(ConstTensorView queries, ConstTensorView keys,
                                      ConstTensorView values, float width,
                                      const ValidLengths& valid_lens, bool need_weights) {
  check_scores_arguments(queries, keys, width);
  require_rank("values", values.shape(), 3);
  require_finite("values", values);
  require_dim("values", values.shape(), 0, queries.dim(0), "the batch size of queries");
  require_dim("values", values.shape(), 1, keys.dim(1), "the number of keys");
  const int64_t batch = queries.dim(0), n = queries.dim(1), m = keys.dim(1), dv = values.dim(2);
  valid_lens.check("valid_lens", batch, n, m);
  PoolingResult result;
  result.output = Tensor(Shape{batch, n, dv});
  if (need_weights) {
    result.weights = gaussian_kernel_shifted_scores(queries, keys, width, valid_lens);
    masked_softmax(result.weights, valid_lens, result.weights);
    batched_matmul(result.weights, values, result.output);
    return result;
  }
  // Blocks of query rows: each block's scores, softmax over its rows' valid keys, and product.
  Tensor block(Shape{1, std::min(n, kRowBlock), m});
  for (int64_t b = 0; b < batch; ++b) {
    const ConstTensorView batch_values(values.data() + b * m * dv, Shape{1, m, dv});
    for (int64_t first = 0; first < n; first += kRowBlock) {
      const int64_t rows = std::min(kRowBlock, n - first);
      const TensorView scores(block.data(), Shape{1, rows, m});
      const std::vector<int64_t> lengths = row_lengths(valid_lens, b, first, rows, m);
      score_rows(queries, keys, width, b, first, rows, lengths, scores.data());
      masked_softmax(scores,
                     lengths.empty() ? ValidLengths() : ValidLengths::per_query(lengths, 1, rows),
                     scores);
      batched_matmul(scores, batch_values,
                     TensorView(&result.output(b, first, 0), Shape{1, rows, dv}));
    }
  }
  return result;
}

}  // namespace attn
