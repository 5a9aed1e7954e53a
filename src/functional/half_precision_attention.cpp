// attn::scaled_dot_product_attention and its backward pass on fp16 and bf16 tensors: the float
// overloads' checks through PreparedAttention, then the half kernels per slice, or, for values
// whose sums could pass float's range, the float overloads on widened copies, rounded once.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/functional/scaled_dot_product_attention.hpp"
#include "attn/kernels/flash_attention.hpp"
#include "functional/attention_layout.hpp"
#include "functional/decode_route.hpp"
#include "functional/dominant_sinks.hpp"
#include "functional/finite_range.hpp"
#include "functional/memory_overlap.hpp"
#include "functional/prefill_without_scans.hpp"
#include "functional/prepared_attention.hpp"
#include "functional/row_totals.hpp"

namespace attn {

using functional_detail::ConstHalfStridedView;
using functional_detail::MutableHalfStridedView;
using functional_detail::PreparedAttention;

namespace {

// A half-precision input as the kernel reads it: in place when its last axis is contiguous (or
// has at most one element), else a contiguous copy, as the float path copies.
class HalfInput {
 public:
  explicit HalfInput(const ConstHalfStridedView& given) : view_(given) {
    if (functional_detail::rows_contiguous(given)) return;
    copy_ = functional_detail::contiguous_copy(given);
    view_ = ConstHalfStridedView(copy_.data(), given.shape());
  }
  HalfInput(const HalfInput&) = delete;
  HalfInput& operator=(const HalfInput&) = delete;

  const ConstHalfStridedView& view() const { return view_; }
  const uint16_t* data() const { return view_.data(); }
  // Its shape and strides as the float view PreparedAttention's kShapesOnly checks, which never
  // reads the data: the layouts it computes (in elements) then address these bits.
  ConstStridedView shape_only() const {
    return ConstStridedView(nullptr, view_.shape(), view_.strides());
  }

 private:
  ConstHalfStridedView view_;
  std::vector<uint16_t> copy_;
};

// Half-precision q, k, v checked as the float overloads check theirs, in their order: shapes and
// options (PreparedAttention's kShapesOnly, which never reads the data), each input's finiteness
// scanned here, then the mask's values and the scores' bound from the magnitudes found.
struct CheckedHalfInputs {
  CheckedHalfInputs(HalfType type, const ConstHalfStridedView& query,
                    const ConstHalfStridedView& key, const ConstHalfStridedView& value,
                    const AttentionOptions& options)
      : q(query),
        k(key),
        v(value),
        prepared(q.shape_only(), k.shape_only(), v.shape_only(), options,
                 PreparedAttention::kShapesOnly) {
    const float query_max = functional_detail::require_finite("query", type, q.view());
    const float key_max =
        functional_detail::require_finite("key", type, k.view(), prepared.keys_read());
    const float value_max =
        functional_detail::require_finite("value", type, v.view(), prepared.keys_read());
    prepared.check_scanned_values(query_max, key_max, value_max);
  }
  const HalfInput q, k, v;
  PreparedAttention prepared;
};

// ShapeError unless a half gradient has the shape of its input.
void require_gradient_shape(std::string_view name, const MutableHalfStridedView& gradient,
                            const ConstHalfStridedView& input) {
  if (gradient.shape() != input.shape()) {
    throw ShapeError(std::string(name) + ": expected shape " + input.shape().str() +
                     " (the shape of its input), got " + gradient.shape().str());
  }
}

// ShapeError unless output_residual has the output's shape (forward and backward alike).
void require_residual_shape(const Shape& residual, const Shape& output) {
  if (residual != output) {
    throw ShapeError("output_residual: expected shape " + output.str() + " (that of output), got " +
                     residual.str());
  }
}

// The forward's output_residual checked: output's shape, each element its own memory, and apart
// from everything the call reads or writes (ValueError naming it otherwise: a residual is a new
// buffer of a training call, never a view that computing apart would have to cover too).
void require_residual_apart(const MutableHalfStridedView& residual,
                            const MutableHalfStridedView& output, std::span<float> log_sum_exp,
                            const ConstHalfStridedView& query, const ConstHalfStridedView& key,
                            const ConstHalfStridedView& value, const AttentionOptions& options) {
  require_residual_shape(residual.shape(), output.shape());
  functional_detail::require_own_elements("output_residual", residual);
  const functional_detail::OptionRegions regions = functional_detail::option_regions(options);
  using functional_detail::region_of;
  if (functional_detail::writes_over_reads(
          {region_of(residual)},
          {region_of(output), region_of(log_sum_exp.data(), log_sum_exp.size()), region_of(query),
           region_of(key), region_of(value), regions.mask, regions.slopes, regions.sinks})) {
    throw ValueError(
        "output_residual: expected memory of its own, apart from the inputs, the output and the "
        "log-sum-exp, got a view that shares some of theirs");
  }
}

}  // namespace

void scaled_dot_product_attention(HalfType type, StridedView<const uint16_t> query,
                                  StridedView<const uint16_t> key,
                                  StridedView<const uint16_t> value,
                                  const AttentionOptions& options, StridedView<uint16_t> output,
                                  std::span<float> log_sum_exp,
                                  StridedView<uint16_t> output_residual) {
  functional_detail::require_half_type(type);
  functional_detail::require_own_elements("output", output);
  const bool residual = output_residual.data() != nullptr;
  if (residual)
    require_residual_apart(output_residual, output, log_sum_exp, query, key, value, options);
  if (functional_detail::forward_writes_over_inputs<uint16_t>(output, log_sum_exp, query, key,
                                                              value, options)) {
    // An output over an input: computed apart, then stored (as the float overload).
    functional_detail::forward_apart(
        output, log_sum_exp, [&](StridedView<uint16_t> apart, std::span<float> apart_log_sum_exp) {
          scaled_dot_product_attention(type, query, key, value, options, apart, apart_log_sum_exp,
                                       output_residual);
        });
    return;
  }
  // Decoding shapes: the decode kernel, which checks what it reads (decode_route.hpp).
  if (functional_detail::decode_without_scans(type, query, key, value, options, output, log_sum_exp,
                                              output_residual)) {
    return;
  }
  // Other calls on plain rows: the half kernel, which reports what it read, checked after.
  if (functional_detail::prefill_without_scans(type, query, key, value, options, output,
                                               log_sum_exp, output_residual)) {
    return;
  }
  CheckedHalfInputs inputs(type, query, key, value, options);
  const HalfInput &q = inputs.q, &k = inputs.k, &v = inputs.v;
  PreparedAttention& prepared = inputs.prepared;
  const auto out = prepared.output_layout("output", output);
  const auto residual_layout =
      residual ? prepared.output_layout("output_residual", output_residual) : out;
  prepared.require_log_sum_exp(log_sum_exp, true);
  if (functional_detail::shift_for(prepared.value_sum_bound()) > 0) {
    // bf16 values near float's maximum: the float path scales them down by a power of two for its
    // sums (finite_range.hpp), which the half kernel, reading the bits in place, cannot. Rare
    // enough to pay for widened copies; the result is the float path's, rounded once.
    const Tensor wide_query = functional_detail::widened_copy(type, q.view());
    const Tensor wide_key = functional_detail::widened_copy(type, k.view());
    const Tensor wide_value = functional_detail::widened_copy(type, v.view());
    Tensor wide_output(functional_detail::output_shape(wide_query, wide_value));
    scaled_dot_product_attention(wide_query, wide_key, wide_value, options, wide_output,
                                 log_sum_exp);
    if (residual) {
      functional_detail::store_rounded(type, wide_output, output, output_residual);
    } else {
      functional_detail::store_rounded(type, wide_output, output);
    }
    return;
  }
  for (size_t s = 0; s < prepared.slices(); ++s) {
    flash_attention_forward(
        type, prepared.query_layout().slice(q.data(), s), prepared.key_layout().slice(k.data(), s),
        prepared.value_layout().slice(v.data(), s), prepared.valid_lens(),
        prepared.kernel_options(s), out.slice(output.data(), s),
        log_sum_exp.empty() ? nullptr : prepared.slice_log_sum_exp(log_sum_exp, s), nullptr,
        residual ? residual_layout.slice(output_residual.data(), s) : HalfHeadsView{});
  }
}

HalfAttentionForward scaled_dot_product_attention(HalfType type, StridedView<const uint16_t> query,
                                                  StridedView<const uint16_t> key,
                                                  StridedView<const uint16_t> value,
                                                  const AttentionOptions& options,
                                                  bool output_residual) {
  HalfAttentionForward result;
  const Shape shape = functional_detail::output_shape(query.shape(), value.shape());
  // Unwritten until the kernel's threads write every element (no serial zero-fill first).
  result.output = {type, shape, HalfTensor::Storage(static_cast<size_t>(shape.numel()))};
  result.log_sum_exp.resize(static_cast<size_t>(log_sum_exp_size(query.shape())));
  StridedView<uint16_t> residual;
  if (output_residual) {
    result.output_residual = {type, shape, HalfTensor::Storage(static_cast<size_t>(shape.numel()))};
    residual = StridedView<uint16_t>(result.output_residual.bits.data(), shape);
  }
  scaled_dot_product_attention(type, query, key, value, options,
                               StridedView<uint16_t>(result.output.bits.data(), shape),
                               result.log_sum_exp, residual);
  return result;
}

void scaled_dot_product_attention_backward(
    HalfType type, StridedView<const uint16_t> query, StridedView<const uint16_t> key,
    StridedView<const uint16_t> value, StridedView<const uint16_t> output,
    StridedView<const uint16_t> grad_output, std::span<const float> log_sum_exp,
    const AttentionOptions& options, StridedView<uint16_t> grad_query,
    StridedView<uint16_t> grad_key, StridedView<uint16_t> grad_value, MutableStridedView grad_mask,
    std::span<float> grad_sinks, StridedView<const uint16_t> output_residual) {
  functional_detail::require_half_type(type);
  const bool residual = output_residual.data() != nullptr;
  if (residual) {
    require_residual_shape(output_residual.shape(), output.shape());
    functional_detail::require_finite("output_residual", type, output_residual);
  }
  require_gradient_shape("grad_query", grad_query, query);
  require_gradient_shape("grad_key", grad_key, key);
  require_gradient_shape("grad_value", grad_value, value);
  if (options.log_sum_exp_recomputed_base_two) {
    throw ValueError(
        "options.log_sum_exp_recomputed_base_two: expected false in a half-precision backward "
        "pass (a base-2 log-sum-exp is the float pass's), got true");
  }
  functional_detail::require_own_elements("grad_query", grad_query);
  functional_detail::require_own_elements("grad_key", grad_key);
  functional_detail::require_own_elements("grad_value", grad_value);
  if (functional_detail::backward_writes_over_inputs<uint16_t>(
          grad_query, grad_key, grad_value, grad_mask, grad_sinks, query, key, value, output,
          grad_output, log_sum_exp, options, output_residual)) {
    // Gradients over an input: computed apart, then stored (as the float overload).
    functional_detail::backward_apart<uint16_t>(
        {grad_query, grad_key, grad_value}, grad_mask, grad_sinks,
        [&](StridedView<uint16_t> gq, StridedView<uint16_t> gk, StridedView<uint16_t> gv,
            MutableStridedView gm, std::span<float> gs) {
          scaled_dot_product_attention_backward(type, query, key, value, output, grad_output,
                                                log_sum_exp, options, gq, gk, gv, gm, gs,
                                                output_residual);
        });
    return;
  }
  // Rows whose float log-sum-exp lost log(sum) (a row masked to −1e9, row_totals.hpp) take the
  // widened route below, whose float pass recomputes their log-sum-exp from its own scores.
  // Rows whose sink outweighs every score likewise (dominant_sinks.hpp).
  const bool imprecise_rows =
      functional_detail::log_sum_exp_loses_precision(log_sum_exp, options) ||
      functional_detail::sinks_outweigh_scores(log_sum_exp, output, options);
  // Plain rows: the kernel, which reports what it read, checked after (prefill_without_scans.hpp).
  if (!imprecise_rows &&
      functional_detail::backward_without_scans(
          type, query, key, value, output, grad_output, log_sum_exp, options, grad_query, grad_key,
          grad_value, grad_mask, grad_sinks, output_residual)) {
    return;
  }
  // The float overload's checks, in its order.
  CheckedHalfInputs inputs(type, query, key, value, options);
  const HalfInput &q = inputs.q, &k = inputs.k, &v = inputs.v;
  PreparedAttention& prepared = inputs.prepared;
  functional_detail::start_option_gradients(options, grad_mask, grad_sinks);
  const auto out = prepared.output_layout("output", output);
  const auto grad_out = prepared.output_layout("grad_output", grad_output);
  const HalfInput residual_rows(output_residual);  // its rows contiguous
  const auto residual_layout =
      residual ? prepared.output_layout("output_residual", residual_rows.view()) : out;
  prepared.require_log_sum_exp(log_sum_exp, false);
  const auto shape_of = [](const MutableHalfStridedView& gradient) {
    return MutableStridedView(nullptr, gradient.shape(), gradient.strides());
  };
  const auto grad_q = prepared.input_layout("grad_query", shape_of(grad_query), query.shape());
  const auto grad_k = prepared.input_layout("grad_key", shape_of(grad_key), key.shape());
  const auto grad_v = prepared.input_layout("grad_value", shape_of(grad_value), value.shape());
  const double scale = std::fabs(static_cast<double>(prepared.scale()));
  const bool summed_gradients = grad_mask.data() != nullptr || !grad_sinks.empty();
  const auto shifts = prepared.gradient_shifts(
      functional_detail::require_finite("grad_output", type, grad_output),
      functional_detail::require_finite("output", type, output), scale * prepared.key_max(),
      scale * prepared.query_max(), summed_gradients);
  if (shifts.grad_output > 0 || shifts.value > 0 || imprecise_rows) {
    // Sums that could pass float's range (finite_range.hpp): the float overload scales its copies
    // by powers of two, which the half kernel, reading the bits in place, cannot; and rows that
    // need their totals, which the float overload computes as its own pass computes P. Rare
    // enough to pay for widened copies; the gradients are the float path's, rounded once.
    const Tensor wide_query = functional_detail::widened_copy(type, query);
    const Tensor wide_key = functional_detail::widened_copy(type, key);
    const Tensor wide_value = functional_detail::widened_copy(type, value);
    const Tensor wide_output = residual
                                   ? functional_detail::widened_copy(type, output, output_residual)
                                   : functional_detail::widened_copy(type, output);
    const Tensor wide_grad_output = functional_detail::widened_copy(type, grad_output);
    Tensor wide_grad_query(query.shape()), wide_grad_key(key.shape()),
        wide_grad_value(value.shape());
    scaled_dot_product_attention_backward(wide_query, wide_key, wide_value, wide_output,
                                          wide_grad_output, log_sum_exp, options, wide_grad_query,
                                          wide_grad_key, wide_grad_value, grad_mask, grad_sinks);
    functional_detail::store_rounded(type, wide_grad_query, grad_query);
    functional_detail::store_rounded(type, wide_grad_key, grad_key);
    functional_detail::store_rounded(type, wide_grad_value, grad_value);
    return;
  }
  // The kernel widens each row as it packs it and rounds each gradient once: the float pass on
  // the widened inputs, without copies of them.
  for (size_t s = 0; s < prepared.slices(); ++s) {
    flash_attention_backward(
        type, prepared.query_layout().slice(q.data(), s), prepared.key_layout().slice(k.data(), s),
        prepared.value_layout().slice(v.data(), s), out.slice(output.data(), s),
        grad_out.slice(grad_output.data(), s), prepared.slice_log_sum_exp(log_sum_exp, s),
        prepared.valid_lens(), prepared.kernel_options(s, grad_mask.data() != nullptr),
        grad_q.slice(grad_query.data(), s), grad_k.slice(grad_key.data(), s),
        grad_v.slice(grad_value.data(), s),
        grad_mask.data() != nullptr ? prepared.mask_gradient(grad_mask.data(), s)
                                    : ScoreMaskGradient{},
        grad_sinks.empty() ? nullptr : grad_sinks.data(), nullptr,
        residual ? residual_layout.slice(residual_rows.data(), s) : ConstHalfHeadsView{});
  }
}

HalfAttentionBackward scaled_dot_product_attention_backward(
    HalfType type, StridedView<const uint16_t> query, StridedView<const uint16_t> key,
    StridedView<const uint16_t> value, StridedView<const uint16_t> output,
    StridedView<const uint16_t> grad_output, std::span<const float> log_sum_exp,
    const AttentionOptions& options, bool mask_gradient, bool sinks_gradient,
    StridedView<const uint16_t> output_residual) {
  functional_detail::OptionGradients option_gradients =
      functional_detail::new_option_gradients(options, mask_gradient, sinks_gradient);
  // Unwritten until the kernel's threads write every element (TensorAllocator leaves new ones
  // unwritten): no serial zero-fill first.
  const auto new_half = [type](const Shape& shape) {
    return HalfTensor{type, shape, HalfTensor::Storage(static_cast<size_t>(shape.numel()))};
  };
  HalfAttentionBackward grads{new_half(query.shape()), new_half(key.shape()),
                              new_half(value.shape()), std::move(option_gradients.attn_mask),
                              std::move(option_gradients.sinks)};
  scaled_dot_product_attention_backward(
      type, query, key, value, output, grad_output, log_sum_exp, options,
      StridedView<uint16_t>(grads.query.bits.data(), grads.query.shape),
      StridedView<uint16_t>(grads.key.bits.data(), grads.key.shape),
      StridedView<uint16_t>(grads.value.bits.data(), grads.value.shape),
      mask_gradient ? MutableStridedView(grads.attn_mask) : MutableStridedView(),
      grads.sinks.span(), output_residual);
  return grads;
}

Tensor attention_weights(HalfType type, StridedView<const uint16_t> query,
                         StridedView<const uint16_t> key, std::span<const float> log_sum_exp,
                         const AttentionOptions& options) {
  // Weights are asked for rarely (need_weights) and cost L·S anyway: widened copies are fine.
  return attention_weights(functional_detail::widened_copy(type, query),
                           functional_detail::widened_copy(type, key), log_sum_exp, options);
}

}  // namespace attn
