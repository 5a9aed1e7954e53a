// PreparedAttention: one functional attention call's arguments checked and laid out for the fused
// kernels — the tensors' heads views per slice, the valid lengths, and AttentionOptions resolved
// into FlashAttentionOptions (the mask broadcast to the scores, per-slice dropout seeds).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "attn/core/strided_view.hpp"
#include "attn/core/tensor.hpp"
#include "attn/functional/attention_options.hpp"
#include "attn/kernels/fused_options.hpp"
#include "attn/kernels/heads_view.hpp"
#include "functional/attention_layout.hpp"

namespace attn::functional_detail {

// The output's shape: the query's with the value's last axis.
Shape output_shape(const Shape& query, const Shape& value);
inline Shape output_shape(const ConstStridedView& query, const ConstStridedView& value) {
  return output_shape(query.shape(), value.shape());
}

// New tensors for the float attn_mask's gradient (its shape) and the sinks' (H_q values) when
// asked for, empty otherwise; ValueError naming mask_gradient / sinks_gradient when there is no
// float attn_mask / no sinks to differentiate.
struct OptionGradients {
  Tensor attn_mask;
  Tensor sinks;
};
OptionGradients new_option_gradients(const AttentionOptions& options, bool mask_gradient,
                                     bool sinks_gradient);

// A backward pass's caller-given gradients of the float attn_mask (`grad_mask`, data null when not
// wanted) and the sinks (empty when not wanted), checked against the options (ValueError naming
// mask_gradient / sinks_gradient when there is nothing to differentiate, ShapeError naming
// grad_mask / grad_sinks for a wrong shape) and zeroed, as the kernels add into them.
void start_option_gradients(const AttentionOptions& options, const MutableStridedView& grad_mask,
                            std::span<float> grad_sinks);

class PreparedAttention {
 public:
  enum Family {
    kDotProduct,  // query and key scored by dot products: every option applies
    kAdditive,    // projected queries and keys of additive attention: no scale, softcap, ALiBi,
                  // sinks or grouped heads
    kShapesOnly,  // shapes and options only: the tensors' data is never read (not even copied),
                  // so views of half-precision data, or of none, may stand in for them
  };

  // The largest |element| of query and key, from the caller's own scan of these very tensors
  // (finite): additive attention's projections, which it scans as it projects.
  struct ScannedMagnitudes {
    float query = 0.0F;
    float key = 0.0F;
  };

  // Checks ranks, shapes, heads, options and finiteness (ShapeError / ValueError naming the
  // argument); `value` may be absent when only the scores are wanted. Copies an input only when
  // its last axis is not contiguous. With `scanned`, query and key are not scanned again.
  PreparedAttention(ConstStridedView query, ConstStridedView key,
                    std::optional<ConstStridedView> value, const AttentionOptions& options,
                    Family family, std::optional<ScannedMagnitudes> scanned = std::nullopt);

  size_t slices() const { return query_layout_.slice_offsets.size(); }
  ConstHeadsView query(size_t s) const { return query_layout_.slice(query_.data(), s); }
  ConstHeadsView key(size_t s) const { return key_layout_.slice(key_.data(), s); }
  ConstHeadsView value(size_t s) const { return value_layout_.slice(value_.data(), s); }
  // The inputs' layouts (in elements), for data that the float views only describe: the half-
  // precision inputs of a kShapesOnly preparation.
  const HeadsLayout& query_layout() const { return query_layout_; }
  const HeadsLayout& key_layout() const { return key_layout_; }
  const HeadsLayout& value_layout() const { return value_layout_; }
  const ValidLengths& valid_lens() const { return options_.valid_lens; }
  // The kernels' options for slice s (its mask and dropout seed): a mask whose every row is one
  // interval of keys (bool, or float of 0 and −∞: mask_intervals.hpp) as key ranges, read once
  // here, so that the kernels read no mask and skip tiles by the ranges; other masks, and every
  // mask with `mask_entries` (a backward pass that differentiates the float mask), as entries.
  FlashAttentionOptions kernel_options(size_t s, bool mask_entries = false) const;

  // The key rows the dot-product kernels read: those some query may see through is_causal and a
  // sliding window (every key without them), widened to the backward pass's key tiles
  // (kernels/score_masks.hpp keys_read_in_tiles). What lies outside enters no sum, so only these
  // rows are scanned: is_causal's top-left diagonal with L < S reads the first L keys of S,
  // rounded up to a tile.
  RowRange keys_read() const;

  // ValueError naming attn_mask unless a float mask's entries are finite or −∞ (no NaN, no +∞):
  // what the checked families check on construction, for a kShapesOnly caller that reads the
  // mask's entries.
  void require_mask_values() const;

  // The layout of an output-like tensor (the query's shape with the value's last axis), after
  // checking its shape and that its last axis is contiguous.
  template <class T>
  HeadsLayout output_layout(std::string_view name, const StridedView<T>& view) const {
    return checked_layout(name, view.shape(), view.strides(), output_shape_,
                          "query's shape with the value's last axis");
  }
  // The layout of a gradient shaped as an input (`shape`), after checking it as output_layout does.
  HeadsLayout input_layout(std::string_view name, const MutableStridedView& view,
                           const Shape& shape) const {
    return checked_layout(name, view.shape(), view.strides(), shape, "shape of its input");
  }
  // Layouts of new contiguous tensors shaped as the query, the key (or value), or the scores.
  HeadsLayout layout_like_query(const Tensor& tensor) const { return contiguous_layout(tensor); }
  HeadsLayout layout_like_key(const Tensor& tensor) const { return contiguous_layout(tensor); }
  HeadsLayout layout_like_scores(const Tensor& tensor) const { return contiguous_layout(tensor); }
  // (..., H_q, L, S).
  const Shape& scores_shape() const { return scores_shape_; }

  // ValueError unless `log_sum_exp` holds one value per query row (or is empty when `optional`).
  void require_log_sum_exp(size_t size, bool optional) const;
  template <class T>
  void require_log_sum_exp(std::span<T> values, bool optional) const {
    require_log_sum_exp(values.size(), optional);
  }
  // Slice s's part of the log-sum-exp buffer.
  template <class T>
  T* slice_log_sum_exp(std::span<T> values, size_t s) const {
    return values.data() + s * static_cast<size_t>(rows_per_slice_);
  }

  // Slice s of a float mask's gradient (contiguous floats of the mask's shape at `gradient`).
  ScoreMaskGradient mask_gradient(float* gradient, size_t s) const;

  // kDotProduct's remaining value checks (a float mask's values, the scores' bound) for inputs the
  // caller has scanned itself — half-precision data under kShapesOnly — given their largest
  // magnitudes (finite), which the accessors below then return.
  void check_scanned_values(float query_max, float key_max, float value_max);

  // The largest magnitudes of the inputs (0 for kShapesOnly until check_scanned_values), which
  // bound the kernels' sums.
  float query_max() const { return query_max_; }
  float key_max() const { return key_max_; }
  float value_max() const { return value_max_; }
  float scale() const { return scale_; }
  // The kernels then read value · 2^−shift (a scaled contiguous copy): finite_range.hpp says why.
  void scale_value(int shift);
  // What the forward kernel's unnormalised output sum can reach: S·max|v|, times 1/(1−p) with
  // dropout (for the inputs' max|v|, or for `value_max`).
  double value_sum_bound() const { return value_sum_bound(value_max_); }
  double value_sum_bound(float value_max) const;
  // Whether every dot-product score stays far within float's range for inputs of these largest
  // magnitudes (|scale|·E·max|q|·max|k| < 10³⁷): construction throws ValueError otherwise.
  bool scores_within_range(float query_max, float key_max) const;
  // The bound every score must stay under, dot-product or additive (far from float's limit).
  static constexpr double kScoreLimit = 1e37;
  // The powers of two a backward pass scales grad_output (by 2^−grad_output) and value and output
  // (by 2^−value) with, so that every sum stays below kSafeMagnitude: dV ≤ L·G·max|dO|,
  // dS ≤ 2·Ev·max|dO|·max(|v|, |o|), dQ ≤ S·dS·query_factor, dK ≤ L·G·dS·key_factor, and the
  // gradients summed over every score (mask, sinks, w_v) ≤ B·H·L·S·dS; G is the query heads per
  // key/value head, dropout multiplies each by 1/(1−p). dV carries the first shift only, the others
  // both.
  struct GradientShifts {
    int grad_output = 0;
    int value = 0;
  };
  GradientShifts gradient_shifts(double grad_output_max, double output_max, double query_factor,
                                 double key_factor, bool summed_gradients) const;
  // The same for a value magnitude found otherwise (the kernel's reads, prefill_without_scans).
  GradientShifts gradient_shifts(double grad_output_max, double output_max, double value_max,
                                 double query_factor, double key_factor,
                                 bool summed_gradients) const;

 private:
  HeadsLayout checked_layout(std::string_view name, const Shape& shape,
                             std::span<const int64_t> strides, const Shape& expected,
                             std::string_view expected_description) const;
  HeadsLayout contiguous_layout(const Tensor& tensor) const;
  void check_options(Family family) const;
  void check_values(Family family, std::optional<ScannedMagnitudes> scanned);
  void check_magnitudes(Family family, float query_max, float key_max, float value_max);
  double score_bound(float query_max, float key_max) const;
  void lay_out_mask();
  ScoreMask slice_mask(size_t s) const;
  // The kernels' options with is_causal, its diagonal and the window alone set.
  FlashAttentionOptions diagonal_bounds() const;

  const AttentionOptions& options_;
  AxisRoles roles_;
  // Inputs as the kernels read them: the caller's, or contiguous copies.
  ConstStridedView query_, key_, value_;
  Tensor query_copy_, key_copy_, value_copy_;
  HeadsLayout query_layout_, key_layout_, value_layout_;
  Shape output_shape_, scores_shape_;
  int64_t rows_per_slice_ = 0;  // batch · heads · L: the log-sum-exp values of one slice
  float scale_ = 1.0F;
  float query_max_ = 0.0F, key_max_ = 0.0F, value_max_ = 0.0F;
  // kAdditive: max(query_max_, key_max_), which the kernels' options carry
  // (FlashAttentionOptions::additive_input_bound) so that they choose their score form unscanned;
  // −1 for the other families.
  float additive_input_bound_ = -1.0F;
  // The mask read as a tensor of the scores' shape (stride 0 on broadcast axes).
  HeadsLayout mask_layout_;
  // The mask's gradient: a contiguous tensor of the mask's own shape, read the same way.
  HeadsLayout mask_gradient_layout_;
  // The mask's rows as key ranges (FlashAttentionOptions::key_ranges over the query heads), or
  // empty when there is no mask, it is not intervals, or the call has several slices.
  std::vector<int64_t> mask_key_ranges_;
};

}  // namespace attn::functional_detail
