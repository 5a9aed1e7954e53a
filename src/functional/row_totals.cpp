// grad_output divided by the rows' weight totals where the float log-sum-exp lost precision.
#include "functional/row_totals.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "attn/functional/scaled_dot_product_attention.hpp"
#include "functional/finite_range.hpp"

namespace attn::functional_detail {

namespace {
constexpr double kStray = 1e-6;
}  // namespace

bool log_sum_exp_loses_precision(std::span<const float> log_sum_exp,
                                 const AttentionOptions& options) {
  return !options.log_sum_exp_spans_more_keys && !options.log_sum_exp_recomputed_base_two &&
         log_sum_exp_beyond_float_precision(log_sum_exp);
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
