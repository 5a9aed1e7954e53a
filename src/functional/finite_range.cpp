// Power-of-two scalings that keep the fused kernels' accumulators finite (finite_range.hpp).
#include "functional/finite_range.hpp"

#include <cmath>
#include <string>

#include "attn/core/error.hpp"
#include "core/magnitude_scan.hpp"
#include "functional/attention_layout.hpp"

namespace attn::functional_detail {

int shift_for(double bound) {
  if (!(bound > kSafeMagnitude)) return 0;
  // frexp: bound / kSafeMagnitude = m · 2^e with m in [0.5, 1), so 2^e ≥ the ratio.
  int exponent = 0;
  std::frexp(bound / kSafeMagnitude, &exponent);
  return exponent;
}

Tensor scaled_copy(const ConstStridedView& view, int shift) {
  Tensor copy = contiguous_copy(view);
  scale_values(copy.data(), copy.numel(), -shift);
  return copy;
}

void scale_values(float* data, int64_t count, int shift) {
  if (shift == 0) return;
  for (int64_t index = 0; index < count; ++index) data[index] = std::ldexp(data[index], shift);
}

void scale_heads(const HeadsView& view, int shift) {
  if (shift == 0) return;
  for (int64_t b = 0; b < view.batch; ++b) {
    for (int64_t h = 0; h < view.heads; ++h) {
      float* matrix = view.matrix(b, h);
      for (int64_t i = 0; i < view.rows; ++i)
        scale_values(matrix + i * view.row_stride, view.cols, shift);
    }
  }
}

namespace {

[[noreturn]] void overflow(std::string_view name, std::string_view inputs) {
  throw ValueError(std::string(name) +
                   ": the exact result overflows float32 (beyond ±3.4e38) for these " +
                   std::string(inputs) + "; scale them down");
}

}  // namespace

// Row by row through the vectorised magnitude scan (core/magnitude_scan.hpp): an isfinite test
// per element with an exit on the first failure does not vectorise, and took 6% of the additive
// layer's step at the book's decoder shape.
bool heads_finite(const ConstHeadsView& view) {
  for (int64_t b = 0; b < view.batch; ++b) {
    for (int64_t h = 0; h < view.heads; ++h) {
      const float* matrix = view.matrix(b, h);
      for (int64_t i = 0; i < view.rows; ++i) {
        if (core_detail::largest_magnitude_bits(matrix + i * view.row_stride, view.cols) >=
            core_detail::kFirstNonFinite) {
          return false;
        }
      }
    }
  }
  return true;
}

void require_finite_result(const ConstHeadsView& view, std::string_view name,
                           std::string_view inputs) {
  if (!heads_finite(view)) overflow(name, inputs);
}

void require_finite_result(const float* data, int64_t count, std::string_view name,
                           std::string_view inputs) {
  if (core_detail::largest_magnitude_bits(data, count) >= core_detail::kFirstNonFinite)
    overflow(name, inputs);
}

}  // namespace attn::functional_detail
