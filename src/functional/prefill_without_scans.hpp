// Prefill calls of the functional API on plain tensors (forward and backward), run
// without first scanning the inputs for NaN and ±∞: the kernel reports the largest magnitude of
// the rows it reads, and the call is checked from those after it.
#pragma once

#include <cstdint>
#include <span>

#include "attn/core/half.hpp"
#include "attn/core/strided_view.hpp"
#include "attn/functional/attention_options.hpp"

namespace attn::functional_detail {

// The float call of scaled_dot_product_attention on the fused forward kernel with its
// finiteness and magnitude checks taken from the rows the kernel read (flash_attention.hpp's
// ReadMagnitudes) instead of a scan of q, k and v before it — a second read of the inputs, about
// 5% of a pass at n = 1024 and 12% of a 256-key window at n = 4096 (Zen 5). Rows the kernel never
// reads (keys hidden from every query by lengths, a window or key ranges, beyond every tile it
// reads) are not checked, as decode_without_scans leaves them. Inputs whose last axis has a
// stride (which the scanned path copies first) are left to the scanned path. Returns true when
// the call is done; false, with nothing written but zeros (output and log-sum-exp), when it is not
// such a call, or when an input read is not finite, its scores could overflow or its values need
// scaling: the caller then takes the scanned path, which names the input or scales the values.
bool prefill_without_scans(ConstStridedView query, ConstStridedView key, ConstStridedView value,
                           const AttentionOptions& options, MutableStridedView output,
                           std::span<float> log_sum_exp);
// The same for half-precision q, k, v (the half kernel's magnitudes, of the floats they widen to):
// values that need scaling are left to the scanned path, which widens them.
// `output_residual` as the half scaled_dot_product_attention's.
bool prefill_without_scans(HalfType type, StridedView<const uint16_t> query,
                           StridedView<const uint16_t> key, StridedView<const uint16_t> value,
                           const AttentionOptions& options, StridedView<uint16_t> output,
                           std::span<float> log_sum_exp,
                           StridedView<uint16_t> output_residual = {});

// The float backward pass (scaled_dot_product_attention_backward's arguments) on the fused
// backward kernel, checked after the pass from the magnitudes of the rows it read (q, out and
// grad_out whole, the keys and values of the 64-key tiles it reads): finiteness, the scores'
// bound, and sums that need no scaling (PreparedAttention::gradient_shifts zero). Otherwise, or
// for inputs with a strided last axis, false with zeros in every gradient: the caller takes the
// scanned path. `rows` says where the pass takes each row's P and D = dO·O from (RowSource).
enum class RowSource {
  kGiven,  // the caller's log-sum-exp and output
  // Each row's base-2 log-sum-exp recounted from the pass's own scores
  // (flash_attention_recomputed_log_sum_exp, on the rows unscanned); the caller's output for D.
  kRecounted,
  // The same, and grad_output's rows divided by their totals where those stray from 1
  // (row_totals.hpp: rows whose float log-sum-exp lost log(sum)).
  kRecountedWithTotals,
  // The output and log-sum-exp of the prefill kernels run again (prefill_without_scans), whose
  // score tiles of more than kBackwardFewQueries queries the backward's Gemm computes alike: P sums
  // to 1 and D = dO·O is the backward's own P times V.
  kForwardAgain,
};
bool backward_without_scans(ConstStridedView query, ConstStridedView key, ConstStridedView value,
                            ConstStridedView output, ConstStridedView grad_output,
                            std::span<const float> log_sum_exp, const AttentionOptions& options,
                            MutableStridedView grad_query, MutableStridedView grad_key,
                            MutableStridedView grad_value, MutableStridedView grad_mask,
                            std::span<float> grad_sinks, RowSource rows);
// The same for the half backward pass (the half kernel's magnitudes, of the floats its inputs
// widen to): sums that need scaling are left to the scanned path, which widens the inputs.
bool backward_without_scans(HalfType type, StridedView<const uint16_t> query,
                            StridedView<const uint16_t> key, StridedView<const uint16_t> value,
                            StridedView<const uint16_t> output,
                            StridedView<const uint16_t> grad_output,
                            std::span<const float> log_sum_exp, const AttentionOptions& options,
                            StridedView<uint16_t> grad_query, StridedView<uint16_t> grad_key,
                            StridedView<uint16_t> grad_value, MutableStridedView grad_mask,
                            std::span<float> grad_sinks,
                            StridedView<const uint16_t> output_residual = {});

}  // namespace attn::functional_detail
