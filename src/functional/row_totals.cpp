// grad_output divided by the rows' weight totals where the float log-sum-exp lost precision.
#include "functional/row_totals.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attn/functional/scaled_dot_product_attention.hpp"
#include "functional/decode_route.hpp"
#include "functional/finite_range.hpp"

namespace attn::functional_detail {

namespace {
constexpr double kStray = 1e-6;
// Scores within this of 0 (past the log of the keys' count, which a row of equal scores reaches)
// round alike in both passes to 2e−6 of P (gradients as PyTorch's, measured): no recount.
constexpr double kFarFromZero = 8.0;
}  // namespace

bool log_sum_exp_loses_precision(std::span<const float> log_sum_exp,
                                 const AttentionOptions& options) {
  return !options.log_sum_exp_spans_more_keys && !options.log_sum_exp_recomputed_base_two &&
         log_sum_exp_beyond_float_precision(log_sum_exp);
}

bool few_queries_far_from_zero(const Shape& query, const Shape& key,
                               std::span<const float> log_sum_exp,
                               const AttentionOptions& options) {
  if (options.log_sum_exp_spans_more_keys || options.log_sum_exp_recomputed_base_two) return false;
  if (query.rank() < 2 || key.rank() < 2) return false;
  const int64_t queries = query[query.rank() - 2], keys = key[key.rank() - 2];
  if (queries > kMaxDecodeQueries || keys < 1) return false;
  const double far = kFarFromZero + std::log(static_cast<double>(keys));
  return std::any_of(log_sum_exp.begin(), log_sum_exp.end(), [far](float value) {
    return std::isfinite(value) && std::fabs(static_cast<double>(value)) > far;
  });
}

bool rows_stray(std::span<const float> totals) {
  return std::any_of(totals.begin(), totals.end(), [](float total) {
    return total > 0.0F && std::fabs(static_cast<double>(total) - 1.0) > kStray;
  });
}

Tensor grad_output_over_row_totals(const PreparedAttention& prepared, ConstStridedView grad_output,
                                   std::span<const float> totals) {
  Tensor copy = scaled_copy(grad_output, 0);
  const HeadsLayout layout = prepared.output_layout("grad_output", ConstStridedView(copy));
  for (size_t s = 0; s < prepared.slices(); ++s) {
    const HeadsView rows = layout.slice(copy.data(), s);
    const float* slice_total = prepared.slice_log_sum_exp(totals, s);
    for (int64_t b = 0; b < rows.batch; ++b) {
      for (int64_t h = 0; h < rows.heads; ++h) {
        for (int64_t i = 0; i < rows.rows; ++i) {
          const double total = slice_total[(b * rows.heads + h) * rows.rows + i];
          if (!(total > 0.0) || std::fabs(total - 1.0) <= kStray) continue;
          float* row = rows.matrix(b, h) + i * rows.row_stride;
          for (int64_t e = 0; e < rows.cols; ++e)
            row[e] = static_cast<float>(static_cast<double>(row[e]) / total);
        }
      }
    }
  }
  return copy;
}

}  // namespace attn::functional_detail
