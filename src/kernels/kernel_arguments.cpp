// The fused kernels' shared argument checks.
#include "kernels/kernel_arguments.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "attn/core/error.hpp"
#include "core/magnitude_scan.hpp"

namespace attn {

void require_matrices(const ConstHeadsView& view, std::string_view name, int64_t batch,
                      int64_t heads, int64_t rows, int64_t cols, std::string_view expected) {
  if (view.batch != batch || view.heads != heads || view.rows != rows || view.cols != cols) {
    throw ShapeError(std::string(name) + ": expected " + std::to_string(batch) + " × " +
                     std::to_string(heads) + " heads of " + std::to_string(rows) + " × " +
                     std::to_string(cols) + " (" + std::string(expected) + "), got " +
                     std::to_string(view.batch) + " × " + std::to_string(view.heads) + " of " +
                     std::to_string(view.rows) + " × " + std::to_string(view.cols));
  }
}

void require_diagonal_offset(int64_t diagonal_offset) {
  if (diagonal_offset <= -Shape::kMaxElements || diagonal_offset >= Shape::kMaxElements) {
    throw ValueError(
        "diagonal_offset: expected an offset within ±" + std::to_string(Shape::kMaxElements - 1) +
        " (past any tensor's keys either way), got " + std::to_string(diagonal_offset));
  }
}

bool check_attention_arguments(const ConstHeadsView& q, const ConstHeadsView& k,
                               const ConstHeadsView& v, const ConstHeadsView& out,
                               const ValidLengths& valid_lens,
                               const FlashAttentionOptions& options) {
  if (k.cols != q.cols) {
    throw ShapeError("keys: expected size " + std::to_string(q.cols) + " (that of queries), got " +
                     std::to_string(k.cols));
  }
  // Grouped-query heads: H_kv divides H (no heads at all on either side is an empty problem).
  const bool heads_divide = k.heads > 0 ? q.heads % k.heads == 0 : q.heads == 0;
  if (k.batch != q.batch || !heads_divide) {
    throw ShapeError("keys: expected " + std::to_string(q.batch) +
                     " batch elements and a number of heads dividing the queries' " +
                     std::to_string(q.heads) + ", got " + std::to_string(k.batch) + " × " +
                     std::to_string(k.heads));
  }
  require_matrices(v, "values", k.batch, k.heads, k.rows, v.cols, "one row per key");
  require_matrices(out, "out", q.batch, q.heads, q.rows, v.cols,
                   "one row per query, as wide as values");
  if (k.rows > std::numeric_limits<int32_t>::max()) {
    throw ValueError("keys: expected at most 2^31 − 1 keys, got " + std::to_string(k.rows));
  }
  if (!(options.dropout >= 0.0F && options.dropout < 1.0F)) {
    throw ValueError("dropout: expected a probability in [0, 1) for the fused kernel, got " +
                     number_text(options.dropout));
  }
  if (!std::isfinite(options.scale)) {
    throw ValueError("scale: expected a finite number, got " + number_text(options.scale));
  }
  if (!(options.softcap >= 0.0F && std::isfinite(options.softcap))) {
    throw ValueError("softcap: expected a positive number (0 for none), got " +
                     number_text(options.softcap));
  }
  require_diagonal_offset(options.diagonal_offset);
  if (options.window_left < -1 || options.window_right < -1) {
    throw ValueError("window: expected sizes ≥ 0 (−1 for unbounded), got (" +
                     std::to_string(options.window_left) + ", " +
                     std::to_string(options.window_right) + ")");
  }
  // (An empty batch, head or query axis, or no keys, leaves the mask no entries: a mask of no
  // entries, such as an empty vector's null data, is then what PyTorch takes, and never read.)
  const bool reads_mask = q.batch > 0 && q.heads > 0 && q.rows > 0 && k.rows > 0;
  if (options.mask.kind != MaskKind::kNone && options.mask.data == nullptr && reads_mask) {
    throw ValueError("attn_mask: expected the mask's entries, got a null pointer");
  }
  if (options.key_ranges != nullptr && options.key_range_heads != q.heads) {
    throw ValueError("key_ranges: expected rows for the " + std::to_string(q.heads) +
                     " query heads, got " + std::to_string(options.key_range_heads));
  }
  valid_lens.check("valid_lens", q.batch, q.rows, k.rows);
  return q.batch > 0 && q.heads > 0 && q.rows > 0 && v.cols > 0;
}

void require_additive_arguments(std::span<const float> w_v, const FlashAttentionOptions& options,
                                const ConstHeadsView& projected_queries,
                                const ConstHeadsView& projected_keys) {
  if (static_cast<int64_t>(w_v.size()) != projected_queries.cols) {
    throw ShapeError("w_v: expected " + std::to_string(projected_queries.cols) +
                     " weights (the hidden size), got " + std::to_string(w_v.size()));
  }
  if (options.softcap != 0.0F || options.alibi_slopes != nullptr || options.sinks != nullptr) {
    throw ValueError(
        "options: additive attention takes no softcap, alibi_slopes or sinks (they belong to "
        "dot-product scores), got " +
        std::string(options.softcap != 0.0F ? "softcap"
                    : options.alibi_slopes  ? "alibi_slopes"
                                            : "sinks"));
  }
  if (projected_keys.heads != projected_queries.heads) {
    throw ShapeError("projected_keys: expected " + std::to_string(projected_queries.heads) +
                     " heads (those of projected_queries: additive attention has no grouped "
                     "heads), got " +
                     std::to_string(projected_keys.heads));
  }
}

void require_log_sum_exp(const float* log_sum_exp, int64_t query_rows) {
  if (log_sum_exp == nullptr && query_rows > 0)
    throw ValueError("log_sum_exp: expected the forward pass's values, got a null pointer");
}

namespace {
// The bits of the largest |element| of `view` (NaN and ±∞ compare above every finite limit).
uint32_t largest_magnitude_bits(const ConstHeadsView& view) {
  uint32_t largest = 0;
  for (int64_t b = 0; b < view.batch; ++b) {
    for (int64_t h = 0; h < view.heads; ++h) {
      const float* matrix = view.matrix(b, h);
      for (int64_t r = 0; r < view.rows; ++r) {
        largest = std::max(
            largest, core_detail::largest_magnitude_bits(matrix + r * view.row_stride, view.cols));
      }
    }
  }
  return largest;
}

uint32_t bits_of(float limit) {
  uint32_t bits = 0;
  std::memcpy(&bits, &limit, sizeof bits);
  return bits;
}

// Each exponential form with the largest |input| and |weight| it takes, fewest reciprocals first.
struct FormLimits {
  AdditiveScoreForm form;
  float input, weight;
};
constexpr FormLimits kFormLimits[] = {
    {AdditiveScoreForm::kExponentialEights, kAdditiveEightLimit, kAdditiveEightWeightLimit},
    {AdditiveScoreForm::kExponentialQuads, kAdditiveQuadLimit, kAdditiveQuadWeightLimit},
    {AdditiveScoreForm::kExponentialPairs, kAdditiveExponentialLimit,
     kAdditiveExponentialWeightLimit}};
}  // namespace

AdditiveScoreForm additive_score_form(const ConstHeadsView& projected_queries,
                                      const ConstHeadsView& projected_keys,
                                      std::span<const float> w_v, float input_bound) {
  const auto count = static_cast<int64_t>(w_v.size());
  const ConstHeadsView weights{w_v.data(), 1, 1, 1, count, count, count, count};
  // (A bound ≥ 0 compares as its bits, as the scan's magnitudes do; NaN is not ≥ 0.)
  const uint32_t inputs = input_bound >= 0.0F ? bits_of(input_bound)
                                              : std::max(largest_magnitude_bits(projected_queries),
                                                         largest_magnitude_bits(projected_keys));
  const uint32_t weight = largest_magnitude_bits(weights);
  for (const FormLimits& limits : kFormLimits) {
    if (inputs <= bits_of(limits.input) && weight <= bits_of(limits.weight)) return limits.form;
  }
  return AdditiveScoreForm::kTanh;
}

}  // namespace attn
