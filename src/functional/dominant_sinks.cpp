// The backward pass's rows whose sink outweighs every score: found from the log-sum-exp, and
// grad_output and the sinks' gradient rewritten for a pass over the scores alone.
#include "functional/dominant_sinks.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <type_traits>

#include "functional/finite_range.hpp"

namespace attn::functional_detail {

namespace {

// Whether the log-sum-exp `lse` of a row lies within the bound of its sink's logit.
bool near_sink(float lse, float sink) {
  const double distance = static_cast<double>(lse) - static_cast<double>(sink);
  return std::isfinite(lse) &&
         distance <= std::ldexp(std::max(1.0, std::fabs(static_cast<double>(sink))), -16);
}

// The scores' share w of a row beside its sink and the sink's 1 − w, each from the smaller side:
// x = log2 e · sink − lse₂ (base 2); w = 1 / (1 + 2^x).
struct Shares {
  double scores, sink;
};
Shares shares_of(float sink, float scores_log_sum_exp_base_two) {
  const double x = std::numbers::log2e * static_cast<double>(sink) -
                   static_cast<double>(scores_log_sum_exp_base_two);
  if (x > 0.0) {
    const double small = std::exp2(-x);
    return {small / (1.0 + small), 1.0 / (1.0 + small)};
  }
  const double small = std::exp2(x);
  return {1.0 / (1.0 + small), small / (1.0 + small)};
}

// Calls visit(row, lse index) for each output-shaped row of `view` laid out by `prepared`.
template <class T, class Visit>
void for_each_row(const PreparedAttention& prepared, StridedView<T> view, const Visit& visit) {
  const HeadsLayout layout = prepared.output_layout("output", view);
  for (size_t s = 0; s < prepared.slices(); ++s) {
    const auto rows = layout.slice(view.data(), s);
    // (Slice s's rows start at s times a slice's rows in the log-sum-exp's order.)
    const size_t first = s * static_cast<size_t>(rows.batch * rows.heads * rows.rows);
    for (int64_t b = 0; b < rows.batch; ++b) {
      for (int64_t h = 0; h < rows.heads; ++h) {
        for (int64_t i = 0; i < rows.rows; ++i) {
          visit(rows.matrix(b, h) + i * rows.row_stride, rows.cols, h,
                first + static_cast<size_t>((b * rows.heads + h) * rows.rows + i));
        }
      }
    }
  }
}

}  // namespace

template <class T>
bool sinks_outweigh_scores(std::span<const float> log_sum_exp, StridedView<const T> output,
                           const AttentionOptions& options) {
  if (options.sinks.empty() || options.log_sum_exp_spans_more_keys ||
      options.log_sum_exp_recomputed_base_two || output.rank() < 2) {
    return false;
  }
  const Shape& shape = output.shape();
  const std::span<const int64_t> strides = output.strides();
  const int last = output.rank() - 1;
  int64_t rows = 1;
  for (int axis = 0; axis < last; ++axis) rows *= shape[axis];
  // (A log-sum-exp of another size is refused by the pass this check precedes.)
  if (rows != static_cast<int64_t>(log_sum_exp.size()) || rows == 0) return false;
  const int64_t queries = shape[last - 1], heads = static_cast<int64_t>(options.sinks.size());
  for (int64_t r = 0; r < rows; ++r) {
    if (!near_sink(log_sum_exp[static_cast<size_t>(r)],
                   options.sinks[static_cast<size_t>((r / queries) % heads)])) {
      continue;
    }
    int64_t offset = 0;
    for (int64_t axis = last - 1, rest = r; axis >= 0; --axis) {
      offset += (rest % shape[static_cast<int>(axis)]) * strides[static_cast<size_t>(axis)];
      rest /= shape[static_cast<int>(axis)];
    }
    for (int64_t e = 0; e < shape[last]; ++e) {
      const T value = output.data()[offset + e * strides[static_cast<size_t>(last)]];
      if constexpr (std::is_same_v<T, float>) {
        if (value != 0.0F) return true;
      } else if ((value & 0x7FFFU) != 0) {  // a half's bits other than the sign
        return true;
      }
    }
  }
  return false;
}

template bool sinks_outweigh_scores<float>(std::span<const float>, StridedView<const float>,
                                           const AttentionOptions&);
template bool sinks_outweigh_scores<uint16_t>(std::span<const float>, StridedView<const uint16_t>,
                                              const AttentionOptions&);

Tensor grad_output_beside_sinks(const PreparedAttention& prepared, ConstStridedView grad_output,
                                std::span<const float> scores_log_sum_exp,
                                std::span<const float> totals, std::span<const float> sinks) {
  Tensor copy = scaled_copy(grad_output, 0);
  for_each_row(prepared, StridedView<float>(copy),
               [&](float* row, int64_t cols, int64_t h, size_t r) {
                 if (!(totals[r] > 0.0F)) return;
                 const double factor =
                     shares_of(sinks[static_cast<size_t>(h)], scores_log_sum_exp[r]).scores /
                     static_cast<double>(totals[r]);
                 for (int64_t e = 0; e < cols; ++e)
                   row[e] = static_cast<float>(static_cast<double>(row[e]) * factor);
               });
  return copy;
}

void sinks_gradient_beside_scores(const PreparedAttention& prepared, ConstStridedView output,
                                  ConstStridedView grad_output,
                                  std::span<const float> scores_log_sum_exp,
                                  std::span<const float> sinks, std::span<float> grad_sinks) {
  std::vector<const float*> output_rows(scores_log_sum_exp.size(), nullptr);
  for_each_row(prepared, output,
               [&](const float* row, int64_t, int64_t, size_t r) { output_rows[r] = row; });
  std::vector<double> sums(sinks.size(), 0.0);
  for_each_row(prepared, grad_output, [&](const float* row, int64_t cols, int64_t h, size_t r) {
    double dot = 0.0;  // D_i = dO_i·O_i
    for (int64_t e = 0; e < cols; ++e)
      dot += static_cast<double>(row[e]) * static_cast<double>(output_rows[r][e]);
    if (dot == 0.0) return;
    sums[static_cast<size_t>(h)] -=
        shares_of(sinks[static_cast<size_t>(h)], scores_log_sum_exp[r]).sink * dot;
  });
  for (size_t h = 0; h < sinks.size(); ++h) grad_sinks[h] = static_cast<float>(sums[h]);
}

}  // namespace attn::functional_detail
