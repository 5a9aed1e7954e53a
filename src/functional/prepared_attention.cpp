// PreparedAttention: the functional API's argument checks and layouts.
#include "functional/prepared_attention.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "attn/core/error.hpp"
#include "functional/finite_range.hpp"
#include "functional/mask_intervals.hpp"
#include "kernels/dropout_hash.hpp"
#include "kernels/kernel_arguments.hpp"
#include "kernels/score_masks.hpp"

namespace attn::functional_detail {

namespace {

Shape with_last(const Shape& shape, int64_t last) {
  int64_t dims[Shape::kMaxRank];
  for (int axis = 0; axis < shape.rank(); ++axis) dims[axis] = shape[axis];
  dims[shape.rank() - 1] = last;
  return Shape::from_dims(dims, shape.rank());
}

// The input as the kernels read it: itself when its last axis is contiguous (or has at most one
// element), else a contiguous copy kept in `copy`.
ConstStridedView readable(const ConstStridedView& view, Tensor& copy) {
  if (view.dim(-1) <= 1 || view.stride(-1) == 1) return view;
  copy = contiguous_copy(view);
  return copy;
}

void require_same_rank(std::string_view name, const ConstStridedView& view, int rank) {
  if (view.rank() != rank) {
    throw ShapeError(std::string(name) + ": expected rank " + std::to_string(rank) +
                     " (that of query), got shape " + view.shape().str());
  }
}

}  // namespace

Shape output_shape(const Shape& query, const Shape& value) {
  return with_last(query, value.dim(-1));
}

namespace {
// ValueError unless the options have what mask_gradient / sinks_gradient ask to differentiate.
void require_differentiable_options(const AttentionOptions& options, bool mask_gradient,
                                    bool sinks_gradient) {
  if (mask_gradient && options.attn_mask.kind() != MaskKind::kFloat) {
    throw ValueError(
        std::string("mask_gradient: expected a float attn_mask to differentiate, got ") +
        (options.attn_mask.kind() == MaskKind::kBool ? "a bool attn_mask" : "no attn_mask"));
  }
  if (sinks_gradient && options.sinks.empty()) {
    throw ValueError("sinks_gradient: expected sinks to differentiate, got none");
  }
}
}  // namespace

OptionGradients new_option_gradients(const AttentionOptions& options, bool mask_gradient,
                                     bool sinks_gradient) {
  require_differentiable_options(options, mask_gradient, sinks_gradient);
  OptionGradients gradients;
  if (mask_gradient) gradients.attn_mask = Tensor(options.attn_mask.shape());
  if (sinks_gradient) gradients.sinks = Tensor(Shape{static_cast<int64_t>(options.sinks.size())});
  return gradients;
}

void start_option_gradients(const AttentionOptions& options, const MutableStridedView& grad_mask,
                            std::span<float> grad_sinks) {
  const bool mask_gradient = grad_mask.data() != nullptr;
  require_differentiable_options(options, mask_gradient, !grad_sinks.empty());
  if (mask_gradient) {
    if (grad_mask.shape() != options.attn_mask.shape() || !grad_mask.is_contiguous()) {
      throw ShapeError("grad_mask: expected a contiguous tensor of the attn_mask's shape " +
                       options.attn_mask.shape().str() + ", got shape " + grad_mask.shape().str());
    }
    std::fill_n(grad_mask.data(), grad_mask.numel(), 0.0F);
  }
  if (!grad_sinks.empty()) {
    if (grad_sinks.size() != options.sinks.size()) {
      throw ShapeError("grad_sinks: expected " + std::to_string(options.sinks.size()) +
                       " values (one per query head), got " + std::to_string(grad_sinks.size()));
    }
    std::fill(grad_sinks.begin(), grad_sinks.end(), 0.0F);
  }
}

PreparedAttention::PreparedAttention(ConstStridedView query, ConstStridedView key,
                                     std::optional<ConstStridedView> value,
                                     const AttentionOptions& options, Family family,
                                     std::optional<ScannedMagnitudes> scanned)
    : options_(options) {
  const int rank = query.rank();
  if (rank < 2) {
    throw ShapeError("query: expected a tensor of rank 2 to 8 shaped (..., L, E), got shape " +
                     query.shape().str());
  }
  require_same_rank("key", key, rank);
  if (value) require_same_rank("value", *value, rank);
  if (key.dim(-1) != query.dim(-1)) {
    throw ShapeError("key: expected the last axis " + std::to_string(query.dim(-1)) +
                     " (that of query), got shape " + key.shape().str());
  }
  const bool rank3_heads = options.enable_gqa && rank == 3 && query.dim(0) != key.dim(0);
  roles_ = axis_roles(rank, rank3_heads);
  for (int axis = 0; axis < rank - 2; ++axis) {
    if (axis == roles_.heads) continue;
    if (key.dim(axis) != query.dim(axis)) {
      throw ShapeError("key: expected the leading axes of query " + query.shape().str() +
                       " (all but the heads, L and E), got shape " + key.shape().str());
    }
  }
  const int64_t query_heads = roles_.heads >= 0 ? query.dim(roles_.heads) : 1;
  const int64_t kv_heads = roles_.heads >= 0 ? key.dim(roles_.heads) : 1;
  if (kv_heads != query_heads) {
    if (!options.enable_gqa) {
      throw ShapeError("key: expected " + std::to_string(query_heads) +
                       " heads (those of query; set enable_gqa for grouped-query attention), got " +
                       std::to_string(kv_heads));
    }
    if (kv_heads == 0 || query_heads % kv_heads != 0) {
      throw ShapeError("enable_gqa: expected the key/value heads to divide the query's " +
                       std::to_string(query_heads) + " heads, got " + std::to_string(kv_heads));
    }
  }
  if (value) {
    for (int axis = 0; axis < rank - 1; ++axis) {
      if (value->dim(axis) != key.dim(axis)) {
        throw ShapeError("value: expected the shape of key " + key.shape().str() +
                         " up to the last axis, got " + value->shape().str());
      }
    }
  }
  // kShapesOnly never reads the data, so a strided last axis is not copied either: only the
  // layouts below are wanted, and no kernel reads through them.
  const bool reads = family != kShapesOnly;
  query_ = reads ? readable(query, query_copy_) : query;
  key_ = reads ? readable(key, key_copy_) : key;
  value_ = !value ? key_ : reads ? readable(*value, value_copy_) : *value;
  query_layout_ = heads_layout(roles_, query_.shape(), query_.strides());
  key_layout_ = heads_layout(roles_, key_.shape(), key_.strides());
  value_layout_ = heads_layout(roles_, value_.shape(), value_.strides());
  output_shape_ = with_last(query.shape(), value ? value->dim(-1) : 1);
  scores_shape_ = with_last(query.shape(), key.dim(-2));
  rows_per_slice_ = query_layout_.batch * query_layout_.heads * query_layout_.rows;
  const int64_t depth = query_layout_.cols;
  scale_ = family == kAdditive ? 1.0F
           : options.scale     ? *options.scale
                               : (depth > 0 ? 1.0F / std::sqrt(static_cast<float>(depth)) : 1.0F);
  check_options(family);
  lay_out_mask();
  if (family != kShapesOnly) check_values(family, scanned);
  // A mask of intervals becomes the kernels' key ranges (one slice: the ranges are per call).
  if (options_.attn_mask.has_value() && slices() == 1 &&
      !mask_intervals(slice_mask(0), query_layout_.batch, query_layout_.heads, query_layout_.rows,
                      key_layout_.rows, mask_key_ranges_)) {
    mask_key_ranges_.clear();
  }
}

void PreparedAttention::check_options(Family family) const {
  const int64_t heads = query_layout_.heads;
  if (options_.alignment != DiagonalAlignment::kTopLeft &&
      options_.alignment != DiagonalAlignment::kBottomRight &&
      options_.alignment != DiagonalAlignment::kOffset) {
    throw ValueError(
        "alignment: expected DiagonalAlignment::kTopLeft, kBottomRight or kOffset, got the "
        "value " +
        std::to_string(static_cast<int>(options_.alignment)));
  }
  require_diagonal_offset(options_.diagonal_offset);
  if (!(options_.dropout >= 0.0F && options_.dropout < 1.0F)) {
    throw ValueError("dropout: expected a probability in [0, 1), got " +
                     number_text(options_.dropout));
  }
  if (family == kAdditive) {
    const char* refused = options_.scale                   ? "scale"
                          : options_.softcap               ? "softcap"
                          : !options_.alibi_slopes.empty() ? "alibi_slopes"
                          : !options_.sinks.empty()        ? "sinks"
                          : options_.enable_gqa            ? "enable_gqa"
                                                           : nullptr;
    if (refused != nullptr) {
      throw ValueError(std::string(refused) +
                       ": additive attention takes no scale, softcap, alibi_slopes, sinks or "
                       "enable_gqa (they belong to dot-product scores; w_v carries any scale)");
    }
  }
  if (options_.scale && !std::isfinite(*options_.scale)) {
    throw ValueError("scale: expected a finite number, got " + number_text(*options_.scale));
  }
  if (options_.window && (options_.window->left < -1 || options_.window->right < -1)) {
    throw ValueError("window: expected sizes ≥ 0 (−1 for unbounded), got (" +
                     std::to_string(options_.window->left) + ", " +
                     std::to_string(options_.window->right) + ")");
  }
  if (options_.softcap && !(*options_.softcap > 0.0F && std::isfinite(*options_.softcap))) {
    throw ValueError("softcap: expected a positive finite number, got " +
                     number_text(*options_.softcap));
  }
  functional_detail::require_alibi_slopes(options_.alibi_slopes, heads,
                                          query_layout_.rows + key_layout_.rows);
  functional_detail::require_sinks(options_.sinks, heads);
  if (!options_.valid_lens.is_all()) {
    if (roles_.batch < 0) {
      throw ValueError(
          roles_.heads >= 0
              ? "valid_lens: not available with enable_gqa on rank-3 inputs, whose first axis "
                "holds heads; give (N, H, L, E) inputs instead"
              : "valid_lens: expected inputs of rank 3 or more (their first axis is the batch), "
                "got rank 2");
    }
    options_.valid_lens.check("valid_lens", query_layout_.batch, query_layout_.rows,
                              key_layout_.rows);
  }
}

void PreparedAttention::check_values(Family family, std::optional<ScannedMagnitudes> scanned) {
  const RowRange keys = family == kDotProduct ? keys_read() : RowRange{};
  const float query_max = scanned ? scanned->query : require_finite("query", query_);
  const float key_max = scanned ? scanned->key : require_finite("key", key_, keys);
  const float value_max = require_finite("value", value_, keys);
  check_magnitudes(family, query_max, key_max, value_max);
  if (family == kAdditive) additive_input_bound_ = std::max(query_max, key_max);
}

RowRange PreparedAttention::keys_read() const {
  const int64_t queries = query_layout_.rows, keys = key_layout_.rows;
  if (!options_.causal && !options_.window) return {0, keys};
  // The backward pass reads whole key tiles around the keys seen.
  const KeyRange read = keys_read_in_tiles(
      keys_seen(ValidLengths(), diagonal_bounds(), 0, 0, 1, queries, keys), keys);
  return {read.begin, read.end};
}

void PreparedAttention::check_scanned_values(float query_max, float key_max, float value_max) {
  check_magnitudes(kDotProduct, query_max, key_max, value_max);
}

void PreparedAttention::check_magnitudes(Family family, float query_max, float key_max,
                                         float value_max) {
  query_max_ = query_max;
  key_max_ = key_max;
  value_max_ = value_max;
  require_mask_values();
  if (family == kDotProduct && !scores_within_range(query_max, key_max)) {
    throw ValueError("query, key: scores could overflow float32 (|scale|·E·max|q|·max|k| = " +
                     number_text(score_bound(query_max, key_max)) + "); scale the inputs down");
  }
}

double PreparedAttention::score_bound(float query_max, float key_max) const {
  return std::fabs(static_cast<double>(scale_)) * static_cast<double>(query_layout_.cols) *
         query_max * key_max;
}

bool PreparedAttention::scores_within_range(float query_max, float key_max) const {
  // The kernels never hold a score to check it: bound them all through |s| ≤ |scale|·E·max|q|·
  // max|k| instead, far from float's limit.
  return score_bound(query_max, key_max) < kScoreLimit;
}

void PreparedAttention::require_mask_values() const {
  const AttentionMask& mask = options_.attn_mask;
  if (mask.holds_halves()) {
    ::attn::functional_detail::require_mask_values("attn_mask", mask.half_type(), mask.halves());
  } else if (mask.kind() == MaskKind::kFloat) {
    ::attn::functional_detail::require_mask_values("attn_mask", mask.floats());
  }
}

void PreparedAttention::scale_value(int shift) {
  if (shift == 0) return;
  value_copy_ = scaled_copy(value_, shift);
  value_ = value_copy_;
  value_layout_ = heads_layout(roles_, value_.shape(), value_.strides());
}

double PreparedAttention::value_sum_bound(float value_max) const {
  const double dropout = 1.0 / (1.0 - static_cast<double>(options_.dropout));
  return static_cast<double>(value_max) * static_cast<double>(key_layout_.rows) * dropout;
}

PreparedAttention::GradientShifts PreparedAttention::gradient_shifts(double grad_output_max,
                                                                     double output_max,
                                                                     double query_factor,
                                                                     double key_factor,
                                                                     bool summed_gradients) const {
  return gradient_shifts(grad_output_max, output_max, value_max_, query_factor, key_factor,
                         summed_gradients);
}

PreparedAttention::GradientShifts PreparedAttention::gradient_shifts(
    double grad_output_max, double output_max, double value_max, double query_factor,
    double key_factor, bool summed_gradients) const {
  const double dropout = 1.0 / (1.0 - static_cast<double>(options_.dropout));
  const auto rows = static_cast<double>(query_layout_.rows);
  const auto keys = static_cast<double>(key_layout_.rows);
  const double group =
      key_layout_.heads > 0 ? static_cast<double>(query_layout_.heads / key_layout_.heads) : 1.0;
  const double grad_value = rows * group * grad_output_max * dropout;
  const double grad_scores = 2.0 * static_cast<double>(value_layout_.cols) * grad_output_max *
                             std::max(value_max, output_max) * dropout;
  double others =
      std::max(keys * grad_scores * query_factor, rows * group * grad_scores * key_factor);
  if (summed_gradients) {
    others = std::max(others, static_cast<double>(scores_shape_.numel()) * grad_scores);
  }
  GradientShifts shifts;
  shifts.grad_output = shift_for(grad_value);
  shifts.value = std::max(0, shift_for(others) - shifts.grad_output);
  return shifts;
}

void PreparedAttention::lay_out_mask() {
  const AttentionMask& mask = options_.attn_mask;
  if (!mask.has_value()) return;
  // PyTorch reads a 3-d query (N, L, E) as one batch of N heads when it broadcasts the mask: a 4-d
  // mask whose first axis is 1, (1, N or 1, L or 1, S or 1), is accepted there (no other rank
  // above the scores' is). That axis is dropped here; the mask's gradient keeps its shape.
  const Shape& full = mask.shape();
  // The kernels refuse a null mask too, but the mask's key ranges are read before they run.
  if (mask.data() == nullptr && scores_shape_.numel() > 0 && full.numel() > 0) {
    throw ValueError("attn_mask: expected the mask's entries, got a null pointer");
  }
  const bool batch_of_heads = scores_shape_.rank() == 3 && full.rank() == 4 && full[0] == 1 &&
                              broadcasts_to(Shape::from_dims(full.data() + 1, 3), scores_shape_);
  const size_t dropped = batch_of_heads ? 1 : 0;
  const Shape shape =
      Shape::from_dims(full.data() + dropped, full.rank() - static_cast<int>(dropped));
  const auto lay_out = [&](std::span<const int64_t> strides) {
    return heads_layout(roles_, scores_shape_,
                        broadcast_strides("attn_mask", shape, strides.subspan(dropped),
                                          scores_shape_, "the scores (..., H_q, L, S)"));
  };
  mask_layout_ = lay_out(mask.strides());
  if (mask.kind() == MaskKind::kFloat) {
    // The gradient is a contiguous tensor of the mask's own shape.
    const ConstStridedView gradient(nullptr, mask.shape());
    mask_gradient_layout_ = lay_out(gradient.strides());
  }
}

ScoreMask PreparedAttention::slice_mask(size_t s) const {
  const AttentionMask& mask = options_.attn_mask;
  const int64_t offset = mask_layout_.slice_offsets[s];
  return {mask.kind(),
          mask.kind() == MaskKind::kBool ? static_cast<const void*>(mask.bools().data() + offset)
          : mask.holds_halves()          ? static_cast<const void*>(mask.halves().data() + offset)
                                         : static_cast<const void*>(mask.floats().data() + offset),
          mask_layout_.batch_stride,
          mask_layout_.head_stride,
          mask_layout_.row_stride,
          mask_layout_.col_stride,
          mask.entries()};
}

FlashAttentionOptions PreparedAttention::diagonal_bounds() const {
  FlashAttentionOptions bounds;
  bounds.causal = options_.causal;
  bounds.alignment = options_.alignment;
  bounds.diagonal_offset = options_.diagonal_offset;
  if (options_.window) {
    const SlidingWindow window = options_.window->bounded();
    bounds.window_left = window.left;
    bounds.window_right = window.right;
  }
  return bounds;
}

FlashAttentionOptions PreparedAttention::kernel_options(size_t s, bool mask_entries) const {
  FlashAttentionOptions kernel = diagonal_bounds();
  kernel.scale = scale_;
  kernel.softcap = options_.softcap.value_or(0.0F);
  kernel.alibi_slopes = options_.alibi_slopes.empty() ? nullptr : options_.alibi_slopes.data();
  kernel.sinks = options_.sinks.empty() ? nullptr : options_.sinks.data();
  if (!mask_key_ranges_.empty() && !mask_entries) {
    kernel.key_ranges = mask_key_ranges_.data();
    kernel.key_range_heads = query_layout_.heads;
  } else if (options_.attn_mask.has_value()) {
    kernel.mask = slice_mask(s);
  }
  kernel.dropout = options_.dropout;
  kernel.additive_input_bound = additive_input_bound_;
  // Each slice is its own kernel call, with heads numbered from 0: give it its own seed.
  kernel.seed =
      s == 0 ? options_.seed : dropout_hash::mix64(options_.seed ^ dropout_hash::mix64(s));
  return kernel;
}

HeadsLayout PreparedAttention::checked_layout(std::string_view name, const Shape& shape,
                                              std::span<const int64_t> strides,
                                              const Shape& expected,
                                              std::string_view expected_description) const {
  if (shape != expected) {
    throw ShapeError(std::string(name) + ": expected shape " + expected.str() + " (the " +
                     std::string(expected_description) + "), got " + shape.str());
  }
  if (shape.rank() > 0 && shape[shape.rank() - 1] > 1 && strides.back() != 1) {
    throw ShapeError(std::string(name) +
                     ": expected a contiguous last axis (stride 1), got stride " +
                     std::to_string(strides.back()));
  }
  return heads_layout(roles_, shape, strides);
}

HeadsLayout PreparedAttention::contiguous_layout(const Tensor& tensor) const {
  const ConstStridedView view(tensor);
  return heads_layout(roles_, view.shape(), view.strides());
}

void PreparedAttention::require_log_sum_exp(size_t size, bool optional) const {
  const auto expected = static_cast<size_t>(rows_per_slice_) * slices();
  if ((optional && size == 0) || size == expected) return;
  throw ShapeError("log_sum_exp: expected " + std::to_string(expected) +
                   " values (one per query row), got " + std::to_string(size));
}

ScoreMaskGradient PreparedAttention::mask_gradient(float* gradient, size_t s) const {
  const HeadsLayout& layout = mask_gradient_layout_;
  return {MaskKind::kFloat,    gradient + layout.slice_offsets[s],
          layout.batch_stride, layout.head_stride,
          layout.row_stride,   layout.col_stride};
}

}  // namespace attn::functional_detail
