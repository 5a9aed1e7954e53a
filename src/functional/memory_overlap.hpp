// Whether a call's outputs may share memory with its inputs (an output view over the values, a
// cache appending rows of its own storage), and the copies that keep such calls exact.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/core/strided_view.hpp"
#include "attn/functional/attention_options.hpp"
#include "functional/attention_layout.hpp"

namespace attn::functional_detail {

// The bytes from a view's first element to its farthest one (span_elements), or a plain array's.
struct MemoryRegion {
  const void* begin = nullptr;
  uint64_t bytes = 0;  // UINT64_MAX where the span overflows
};
template <class T>
MemoryRegion region_of(const StridedView<T>& view) {
  const int64_t elements = view.span_elements();
  const uint64_t bytes = static_cast<uint64_t>(elements) > UINT64_MAX / sizeof(T)
                             ? UINT64_MAX
                             : static_cast<uint64_t>(elements) * sizeof(T);
  return {view.data(), bytes};
}
template <class T>
MemoryRegion region_of(const T* data, size_t count) {
  return {data, static_cast<uint64_t>(count) * sizeof(T)};
}

// Whether two regions share a byte (never when either is empty); compared as addresses and
// distances, so that no region's end can wrap.
bool regions_overlap(MemoryRegion a, MemoryRegion b);

// Whether some region of `written` overlaps some region of `read`.
bool writes_over_reads(std::initializer_list<MemoryRegion> written,
                       std::initializer_list<MemoryRegion> read);

// The regions an attention call reads through its options: the mask, ALiBi slopes and sinks.
struct OptionRegions {
  MemoryRegion mask, slopes, sinks;
};
OptionRegions option_regions(const AttentionOptions& options);

// Whether a forward pass's output or log-sum-exp may share memory with what it reads (query, key,
// value, the mask, ALiBi slopes, sinks): written over the values, or over key rows a later tile
// still reads, the kernels would read what they wrote. Such calls compute apart, then store.
template <class T>
bool forward_writes_over_inputs(const StridedView<T>& output, std::span<const float> log_sum_exp,
                                const StridedView<const T>& query, const StridedView<const T>& key,
                                const StridedView<const T>& value,
                                const AttentionOptions& options) {
  const OptionRegions regions = option_regions(options);
  return writes_over_reads({region_of(output), region_of(log_sum_exp.data(), log_sum_exp.size())},
                           {region_of(query), region_of(key), region_of(value), regions.mask,
                            regions.slopes, regions.sinks});
}

// The same for a backward pass: its gradients against its inputs, output, grad_output,
// log-sum-exp and the output's rounding residuals (half passes).
template <class T>
bool backward_writes_over_inputs(
    const StridedView<T>& grad_query, const StridedView<T>& grad_key,
    const StridedView<T>& grad_value, const MutableStridedView& grad_mask,
    std::span<const float> grad_sinks, const StridedView<const T>& query,
    const StridedView<const T>& key, const StridedView<const T>& value,
    const StridedView<const T>& output, const StridedView<const T>& grad_output,
    std::span<const float> log_sum_exp, const AttentionOptions& options,
    const StridedView<const T>& output_residual = {}) {
  const OptionRegions regions = option_regions(options);
  return writes_over_reads(
      {region_of(grad_query), region_of(grad_key), region_of(grad_value), region_of(grad_mask),
       region_of(grad_sinks.data(), grad_sinks.size())},
      {region_of(query), region_of(key), region_of(value), region_of(output),
       region_of(grad_output), region_of(log_sum_exp.data(), log_sum_exp.size()),
       region_of(output_residual), regions.mask, regions.slopes, regions.sinks});
}

// ValueError naming `name` unless each element of an output view is its own memory: an axis of
// more than one element with stride 0 would have several results written to one place, the
// last one winning (PyTorch refuses such out= tensors too), and so would strides that make rows
// overlap (a row stride below the row's length): the kernels' threads would race on them. The
// test is the usual sufficient one: the axes of more than one element sorted by |stride|, each
// stride past the span of the smaller ones (a view interleaving two axes without sharing an
// element fails it too, and is refused with the same words).
template <class T>
void require_own_elements(std::string_view name, const StridedView<T>& view) {
  if (view.numel() == 0) return;
  for (int axis = 0; axis < view.rank(); ++axis) {
    if (view.dim(axis) > 1 && view.stride(axis) == 0) {
      throw ValueError(std::string(name) +
                       ": expected a view whose elements are each their own memory (no stride 0 "
                       "on an axis of more than one element), got stride 0 on axis " +
                       std::to_string(axis) + " of shape " + view.shape().str());
    }
  }
  std::vector<int> axes;
  for (int axis = 0; axis < view.rank(); ++axis)
    if (view.dim(axis) > 1) axes.push_back(axis);
  const auto magnitude = [&](int axis) {
    const int64_t stride = view.stride(axis);
    return stride < 0 ? -static_cast<uint64_t>(stride) : static_cast<uint64_t>(stride);
  };
  std::stable_sort(axes.begin(), axes.end(),
                   [&](int a, int b) { return magnitude(a) < magnitude(b); });
  uint64_t span = 0;  // the farthest element of the smaller axes, in elements
  for (const int axis : axes) {
    if (magnitude(axis) <= span) {
      std::string strides;
      for (int a = 0; a < view.rank(); ++a)
        strides += (a == 0 ? "" : ", ") + std::to_string(view.stride(a));
      throw ValueError(std::string(name) +
                       ": expected a view whose elements are each their own memory, got strides (" +
                       strides + ") for shape " + view.shape().str() + ": axis " +
                       std::to_string(axis) + "'s stride reaches elements of the axes below it");
    }
    span += magnitude(axis) * static_cast<uint64_t>(view.dim(axis) - 1);
  }
}

// A forward call whose output or log-sum-exp may overlap its inputs: `call(output, log_sum_exp)`
// into fresh storage of their shapes, then stored into `output` and `log_sum_exp`.
template <class T, class Call>
void forward_apart(const StridedView<T>& output, std::span<float> log_sum_exp, const Call& call) {
  std::vector<T> apart(static_cast<size_t>(output.numel()));
  std::vector<float> apart_log_sum_exp(log_sum_exp.size());
  call(StridedView<T>(apart.data(), output.shape()), std::span<float>(apart_log_sum_exp));
  store_elements(apart.data(), output);
  std::copy(apart_log_sum_exp.begin(), apart_log_sum_exp.end(), log_sum_exp.begin());
}

// The same for a backward call: `call(grad_query, grad_key, grad_value, grad_mask, grad_sinks)`
// into fresh storage (no mask gradient where `grad_mask` has no data), then stored.
template <class T, class Call>
void backward_apart(const StridedView<T> (&gradients)[3], const MutableStridedView& grad_mask,
                    std::span<float> grad_sinks, const Call& call) {
  std::vector<T> apart[3];
  for (int g = 0; g < 3; ++g) apart[g].resize(static_cast<size_t>(gradients[g].numel()));
  const bool mask = grad_mask.data() != nullptr;
  std::vector<float> apart_mask(mask ? static_cast<size_t>(grad_mask.numel()) : 0);
  std::vector<float> apart_sinks(grad_sinks.size());
  call(StridedView<T>(apart[0].data(), gradients[0].shape()),
       StridedView<T>(apart[1].data(), gradients[1].shape()),
       StridedView<T>(apart[2].data(), gradients[2].shape()),
       mask ? MutableStridedView(apart_mask.data(), grad_mask.shape()) : MutableStridedView(),
       std::span<float>(apart_sinks));
  for (int g = 0; g < 3; ++g) store_elements(apart[g].data(), gradients[g]);
  if (mask) store_elements(apart_mask.data(), grad_mask);
  std::copy(apart_sinks.begin(), apart_sinks.end(), grad_sinks.begin());
}

}  // namespace attn::functional_detail
