// attn::additive_attention: the projections W_q q and W_k k through attn::gemm (oneDNN), then the
// fused additive kernels over PreparedAttention's layout; the backward pass carries the projected
// gradients back through the projections.
#include "attn/functional/additive_attention.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/kernels/additive_attention.hpp"
#include "attn/kernels/gemm.hpp"
#include "functional/attention_layout.hpp"
#include "functional/finite_range.hpp"
#include "functional/prepared_attention.hpp"
#include "functional/row_totals.hpp"

namespace attn {

using functional_detail::PreparedAttention;

namespace {

// ShapeError unless W is a (hidden, input) matrix with a contiguous last axis.
void require_weight(std::string_view name, const ConstStridedView& weight, int64_t hidden,
                    std::string_view input_name, int64_t input_size) {
  if (weight.rank() != 2 || (hidden >= 0 && weight.dim(0) != hidden) ||
      weight.dim(1) != input_size) {
    throw ShapeError(std::string(name) + ": expected shape (" +
                     (hidden >= 0 ? std::to_string(hidden) : std::string("num_hiddens")) + ", " +
                     std::to_string(input_size) + ") (num_hiddens × the last axis of " +
                     std::string(input_name) + "), got " + weight.shape().str());
  }
}

void check_parameters(const ConstStridedView& queries, const ConstStridedView& keys,
                      const AdditiveParameters& parameters) {
  if (queries.rank() < 2 || keys.rank() < 2) {
    throw ShapeError("queries, keys: expected tensors of rank 2 to 8 shaped (..., L, D), got " +
                     queries.shape().str() + " and " + keys.shape().str());
  }
  require_weight("W_q", parameters.W_q, -1, "queries", queries.dim(-1));
  const int64_t hidden = parameters.W_q.dim(0);
  require_weight("W_k", parameters.W_k, hidden, "keys", keys.dim(-1));
  if (static_cast<int64_t>(parameters.w_v.size()) != hidden) {
    throw ShapeError("w_v: expected " + std::to_string(hidden) +
                     " weights (num_hiddens, as W_q), got " +
                     std::to_string(parameters.w_v.size()));
  }
  // An infinite w_v made every score infinite: a NaN output and weights of +∞ (W_q and W_k are
  // checked through their projections).
  for (size_t t = 0; t < parameters.w_v.size(); ++t) {
    if (!std::isfinite(parameters.w_v[t])) {
      throw ValueError("w_v: expected finite values, got " + std::to_string(parameters.w_v[t]) +
                       " at index " + std::to_string(t));
    }
  }
  // |score| ≤ Σ|w_v| (each tanh within ±1): bounded as the dot-product scores are
  // (PreparedAttention::kScoreLimit). Finite weights of 1e38 made scores of
  // ±∞ and a NaN output, named only as an output that "overflows float32".
  double score_bound = 0.0;
  for (const float weight : parameters.w_v) score_bound += std::fabs(static_cast<double>(weight));
  if (score_bound >= PreparedAttention::kScoreLimit) {
    std::ostringstream bound;
    bound << std::setprecision(3) << score_bound;
    throw ValueError("w_v: scores could overflow float32 (Σ|w_v| = " + bound.str() +
                     ", which bounds every score); scale w_v down");
  }
}

// The inputs' shapes against each other, named as the caller passed them, before any projection:
// found later, on the projections, the messages named "key" and "query" and shapes such as (2, 3,
// 7) of num_hiddens that the caller never passed. `values` may be null (the weights).
void check_input_shapes(const ConstStridedView& queries, const ConstStridedView& keys,
                        const ConstStridedView* values) {
  if (queries.rank() < 2 || keys.rank() < 2) {
    throw ShapeError("queries, keys: expected tensors of rank 2 to 8 shaped (..., L, D), got " +
                     queries.shape().str() + " and " + keys.shape().str());
  }
  const auto leading = [](const Shape& shape, int kept) {
    int64_t dims[Shape::kMaxRank];
    for (int axis = 0; axis + kept < shape.rank(); ++axis) dims[axis] = shape[axis];
    return Shape::from_dims(dims, shape.rank() - kept);
  };
  if (keys.rank() != queries.rank() || leading(keys.shape(), 2) != leading(queries.shape(), 2)) {
    throw ShapeError("keys: expected the axes before (S, key size) to be those of queries " +
                     leading(queries.shape(), 2).str() + ", got shape " + keys.shape().str() +
                     " (queries " + queries.shape().str() + ")");
  }
  if (values != nullptr &&
      (values->rank() != keys.rank() || leading(values->shape(), 1) != leading(keys.shape(), 1))) {
    throw ShapeError("values: expected the shape of keys " + leading(keys.shape(), 1).str() +
                     " up to the last axis, got shape " + values->shape().str());
  }
}

// A contiguous version of `view`: itself when it already is, else a copy kept in `copy`.
const float* contiguous_data(const ConstStridedView& view, Tensor& copy) {
  if (view.is_contiguous()) return view.data();
  copy = functional_detail::contiguous_copy(view);
  return copy.data();
}

// The shape of x Wᵀ for x (..., D) and a W of `hidden` rows: (..., hidden).
Shape projected_shape(const ConstStridedView& x, int64_t hidden) {
  int64_t dims[Shape::kMaxRank];
  for (int axis = 0; axis < x.rank(); ++axis) dims[axis] = x.dim(axis);
  dims[x.rank() - 1] = hidden;
  return Shape::from_dims(dims, x.rank());
}

// x W ᵀ over the last axis: (..., D) → (..., hidden).
Tensor project(const ConstStridedView& x, const ConstStridedView& weight) {
  Tensor copy, weight_copy;
  const float* data = contiguous_data(x, copy);
  const float* w = contiguous_data(weight, weight_copy);
  const int64_t in = x.dim(-1), hidden = weight.dim(0);
  // linear_product writes every element (an empty sum as 0): no fill first.
  Tensor y;
  y.assign_uninitialized(projected_shape(x, hidden));
  const int64_t rows = in == 0 ? 0 : x.numel() / in;
  linear_product(rows, in, hidden, data, w, nullptr, y.data());
  return y;
}

// The gradients through y = x Wᵀ: dx = dy W (x's shape) and dW = dyᵀ x (W's shape).
void project_backward(const ConstStridedView& x, const ConstStridedView& weight,
                      const Tensor& grad_y, Tensor& grad_x, Tensor& grad_weight) {
  Tensor copy, weight_copy;
  const float* data = contiguous_data(x, copy);
  const float* w = contiguous_data(weight, weight_copy);
  const int64_t in = x.dim(-1), hidden = weight.dim(0);
  const int64_t rows = in == 0 ? 0 : x.numel() / in;
  // gemm with β = 0 writes every element of both (an empty sum as 0): no fill first.
  grad_x.assign_uninitialized(x.shape());
  grad_weight.assign_uninitialized(weight.shape());
  gemm(Transpose::kNo, Transpose::kNo, rows, in, hidden, 1.0F, grad_y.data(), hidden, w, in, 0.0F,
       grad_x.data(), in);
  gemm(Transpose::kYes, Transpose::kNo, hidden, in, rows, 1.0F, grad_y.data(), hidden, data, in,
       0.0F, grad_weight.data(), in);
}

// W_q q and W_k k, after checking the parameters against the inputs. A projection of finite
// inputs that overflows is an error naming them (PreparedAttention would otherwise report an
// infinity in a "query" the caller never passed). The inputs themselves are scanned only where a
// projection is not finite or empty: a NaN or ±∞ among x's or W's elements makes every element
// of its row or column of x·Wᵀ NaN or ±∞ (0·∞ is NaN), so finite projections prove finite inputs
// (the book's decoder step, B = 64, 10 keys, 256 units, had scanned 310 thousand input floats a
// call for that). The scan's largest magnitudes go to PreparedAttention and the kernels, which
// scanned the projections twice more.
struct Projections {
  Tensor queries, keys;
  PreparedAttention::ScannedMagnitudes magnitudes;
};

Projections project_inputs(const ConstStridedView& queries, const ConstStridedView& keys,
                           const AdditiveParameters& parameters) {
  check_parameters(queries, keys, parameters);
  Projections projected{project(queries, parameters.W_q), project(keys, parameters.W_k), {}};
  projected.magnitudes = {max_magnitude(projected.queries), max_magnitude(projected.keys)};
  const auto proves_finite = [](const Tensor& projection, float magnitude) {
    return projection.numel() > 0 && std::isfinite(magnitude);
  };
  if (!proves_finite(projected.queries, projected.magnitudes.query) ||
      !proves_finite(projected.keys, projected.magnitudes.key)) {
    // Named as before: a non-finite input by name and index, else the overflow of finite ones.
    functional_detail::require_finite("queries", queries);
    functional_detail::require_finite("keys", keys);
    functional_detail::require_finite("W_q", parameters.W_q);
    functional_detail::require_finite("W_k", parameters.W_k);
    functional_detail::require_finite_result(projected.queries.data(), projected.queries.numel(),
                                             "queries·W_qᵀ", "queries and W_q");
    functional_detail::require_finite_result(projected.keys.data(), projected.keys.numel(),
                                             "keys·W_kᵀ", "keys and W_k");
  }
  return projected;
}

// ShapeError unless a kept projection of `input` (…, D) has the shape W x has: (…, hidden).
void require_projection(std::string_view name, const Tensor& projection,
                        const ConstStridedView& input, int64_t hidden) {
  const Shape expected = projected_shape(input, hidden);
  if (projection.shape() != expected) {
    throw ShapeError(std::string(name) + ": expected shape " + expected.str() +
                     " (the forward pass's projection), got " + projection.shape().str());
  }
}

// W_q q and W_k k for a pass after the forward: the caller's kept projections (checked against the
// shapes projecting gives), or computed again into `computed`, whose scan's magnitudes come with
// them (kept projections are the caller's to change: PreparedAttention scans those itself).
struct ProjectionViews {
  ConstStridedView queries, keys;
  std::optional<PreparedAttention::ScannedMagnitudes> scanned;
};

ProjectionViews projections_for(const ConstStridedView& queries, const ConstStridedView& keys,
                                const AdditiveParameters& parameters,
                                const AdditiveProjections* kept, Projections& computed) {
  if (kept == nullptr) {
    computed = project_inputs(queries, keys, parameters);
    return {computed.queries, computed.keys, computed.magnitudes};
  }
  check_parameters(queries, keys, parameters);
  require_projection("projections.queries", kept->queries, queries, parameters.W_q.dim(0));
  require_projection("projections.keys", kept->keys, keys, parameters.W_q.dim(0));
  return {kept->queries, kept->keys, std::nullopt};
}

}  // namespace

AttentionForward additive_attention(ConstStridedView queries, ConstStridedView keys,
                                    ConstStridedView values, const AdditiveParameters& parameters,
                                    const AttentionOptions& options,
                                    AdditiveProjections* projections) {
  check_input_shapes(queries, keys, &values);
  auto [projected_queries, projected_keys, magnitudes] = project_inputs(queries, keys, parameters);
  PreparedAttention prepared(projected_queries, projected_keys, values, options,
                             PreparedAttention::kAdditive, magnitudes);
  AttentionForward result;
  result.output = Tensor(functional_detail::output_shape(projected_queries, values));
  result.log_sum_exp.resize(static_cast<size_t>(log_sum_exp_size(queries.shape())));
  const auto out = prepared.layout_like_query(result.output);
  // As scaled_dot_product_attention: the unnormalised sum reaches S·max|v| (finite_range.hpp).
  const int shift = functional_detail::shift_for(prepared.value_sum_bound());
  prepared.scale_value(shift);
  for (size_t s = 0; s < prepared.slices(); ++s) {
    additive_attention_forward(prepared.query(s), prepared.key(s), parameters.w_v,
                               prepared.value(s), prepared.valid_lens(), prepared.kernel_options(s),
                               out.slice(result.output.data(), s),
                               prepared.slice_log_sum_exp(std::span<float>(result.log_sum_exp), s));
  }
  functional_detail::scale_values(result.output.data(), result.output.numel(), shift);
  if (shift > 0) {
    functional_detail::require_finite_result(result.output.data(), result.output.numel(), "output",
                                             "values and dropout");
  }
  if (projections != nullptr)
    *projections = {std::move(projected_queries), std::move(projected_keys)};
  return result;
}

AdditiveGradients additive_attention_backward(ConstStridedView queries, ConstStridedView keys,
                                              ConstStridedView values,
                                              const AdditiveParameters& parameters,
                                              ConstStridedView output, ConstStridedView grad_output,
                                              std::span<const float> log_sum_exp,
                                              const AttentionOptions& options,
                                              const AdditiveProjections* projections) {
  check_input_shapes(queries, keys, &values);
  Projections computed;
  const auto [projected_queries, projected_keys, scanned] =
      projections_for(queries, keys, parameters, projections, computed);
  PreparedAttention prepared(projected_queries, projected_keys, values, options,
                             PreparedAttention::kAdditive, scanned);
  prepared.output_layout("output", output);
  prepared.output_layout("grad_output", grad_output);
  prepared.require_log_sum_exp(log_sum_exp, false);
  // As scaled_dot_product_attention_backward: the projected queries' and keys' gradients sum
  // dS·w_v·(1 − tanh²) over keys or queries, w_v's over every score.
  // (check_parameters refused a w_v that is not finite.)
  double w_v_max = 0.0;
  for (const float w : parameters.w_v)
    w_v_max = std::max(w_v_max, static_cast<double>(std::fabs(w)));
  // Rows whose float log-sum-exp lost log(sum) (a row masked to −1e9): grad_output over the rows'
  // weight totals, which cancels the factor their P carries (row_totals.hpp).
  Tensor rescaled_grad_output;
  if (functional_detail::log_sum_exp_loses_precision(log_sum_exp, options)) {
    std::vector<float> totals(log_sum_exp.size(), 1.0F);
    for (size_t s = 0; s < prepared.slices(); ++s) {
      additive_attention_row_totals(prepared.query(s), prepared.key(s), parameters.w_v,
                                    prepared.slice_log_sum_exp(log_sum_exp, s),
                                    prepared.valid_lens(), prepared.kernel_options(s),
                                    prepared.slice_log_sum_exp(std::span<float>(totals), s));
    }
    rescaled_grad_output =
        functional_detail::grad_output_over_row_totals(prepared, grad_output, totals);
    grad_output = rescaled_grad_output;
  }
  const auto shifts = prepared.gradient_shifts(
      functional_detail::require_finite("grad_output", grad_output),
      functional_detail::require_finite("output", output), w_v_max, w_v_max, true);
  Tensor grad_output_copy, output_copy;
  if (shifts.grad_output > 0) {
    grad_output_copy = functional_detail::scaled_copy(grad_output, shifts.grad_output);
    grad_output = grad_output_copy;
  }
  if (shifts.value > 0) {
    output_copy = functional_detail::scaled_copy(output, shifts.value);
    output = output_copy;
    prepared.scale_value(shifts.value);
  }
  const auto out = prepared.output_layout("output", output);
  const auto grad_out = prepared.output_layout("grad_output", grad_output);
  // The kernel overwrites these three (additive_attention.hpp), slice by slice: no fill first
  // (the book's decoder step filled 340 thousand floats a call here).
  Tensor grad_projected_queries, grad_projected_keys;
  grad_projected_queries.assign_uninitialized(projected_queries.shape());
  grad_projected_keys.assign_uninitialized(projected_keys.shape());
  AdditiveGradients grads;
  grads.values.assign_uninitialized(values.shape());
  grads.w_v = Tensor(Shape{static_cast<int64_t>(parameters.w_v.size())});
  Tensor slice_grad_w_v(grads.w_v.shape());
  const auto grad_a = prepared.layout_like_query(grad_projected_queries);
  const auto grad_b = prepared.layout_like_key(grad_projected_keys);
  const auto grad_v = prepared.layout_like_key(grads.values);
  for (size_t s = 0; s < prepared.slices(); ++s) {
    additive_attention_backward(
        prepared.query(s), prepared.key(s), parameters.w_v, prepared.value(s),
        out.slice(output.data(), s), grad_out.slice(grad_output.data(), s),
        prepared.slice_log_sum_exp(log_sum_exp, s), prepared.valid_lens(),
        prepared.kernel_options(s), grad_a.slice(grad_projected_queries.data(), s),
        grad_b.slice(grad_projected_keys.data(), s), slice_grad_w_v.span(),
        grad_v.slice(grads.values.data(), s));
    for (int64_t t = 0; t < grads.w_v.numel(); ++t) grads.w_v.data()[t] += slice_grad_w_v.data()[t];
  }
  const int both = shifts.grad_output + shifts.value;
  functional_detail::scale_values(grads.values.data(), grads.values.numel(), shifts.grad_output);
  for (Tensor* gradient : {&grads.w_v, &grad_projected_queries, &grad_projected_keys}) {
    functional_detail::scale_values(gradient->data(), gradient->numel(), both);
  }
  project_backward(queries, parameters.W_q, grad_projected_queries, grads.queries, grads.W_q);
  project_backward(keys, parameters.W_k, grad_projected_keys, grads.keys, grads.W_k);
  // The projections' products can overflow too, and nothing bounds them without scanning their
  // inputs: they are checked. The kernel's own gradients, dV and w_v's, stay within the bounds
  // gradient_shifts took (finite_range.hpp) where it scaled nothing back up, and where no row's
  // P carried its total (rows over row totals above), so only then are they left unscanned.
  const bool kernel_gradients_bounded = both == 0 && rescaled_grad_output.numel() == 0;
  for (const auto& [gradient, name, bounded] :
       {std::tuple<const Tensor*, const char*, bool>{&grads.queries, "grad_queries", false},
        {&grads.keys, "grad_keys", false},
        {&grads.values, "grad_values", kernel_gradients_bounded},
        {&grads.W_q, "grad_W_q", false},
        {&grads.W_k, "grad_W_k", false},
        {&grads.w_v, "grad_w_v", kernel_gradients_bounded}}) {
    if (bounded) continue;
    functional_detail::require_finite_result(gradient->data(), gradient->numel(), name,
                                             "queries, keys, values, parameters and grad_output");
  }
  return grads;
}

Tensor additive_attention_weights(ConstStridedView queries, ConstStridedView keys,
                                  const AdditiveParameters& parameters,
                                  std::span<const float> log_sum_exp,
                                  const AttentionOptions& options,
                                  const AdditiveProjections* projections) {
  check_input_shapes(queries, keys, nullptr);
  Projections computed;
  const auto [projected_queries, projected_keys, scanned] =
      projections_for(queries, keys, parameters, projections, computed);
  const PreparedAttention prepared(projected_queries, projected_keys, std::nullopt, options,
                                   PreparedAttention::kAdditive, scanned);
  prepared.require_log_sum_exp(log_sum_exp, false);
  Tensor weights(prepared.scores_shape());
  const auto layout = prepared.layout_like_scores(weights);
  for (size_t s = 0; s < prepared.slices(); ++s) {
    additive_attention_weights(prepared.query(s), prepared.key(s), parameters.w_v,
                               prepared.slice_log_sum_exp(log_sum_exp, s), prepared.valid_lens(),
                               prepared.kernel_options(s), layout.slice(weights.data(), s));
  }
  return weights;
}

}  // namespace attn
