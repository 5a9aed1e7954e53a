// quantize_rows_int8: each row's largest magnitude, then x / scale rounded half away from zero, in
// vectors (Highway, dispatched once per call to the CPU's best target) with a scalar tail.
#include "attn/kernels/int8_quantization.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/parallel_tasks.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/int8_quantization.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// Highway's headers must follow foreach_target.h.
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The scalar definition, for the tails: std::lround rounds halves away from zero.
inline int8_t QuantiseOne(float value, float scale) {
  return static_cast<int8_t>(std::clamp<long>(std::lround(value / scale), -127, 127));
}

void QuantiseRows(const float* from, size_t from_stride, size_t rows, size_t cols, int8_t* to,
                  float* scales) {
  const hn::ScalableTag<float> d;
  const hn::Rebind<int32_t, decltype(d)> di;
  const hn::Rebind<int8_t, decltype(d)> d8;
  const size_t lanes = hn::Lanes(d);
  const size_t full = cols - cols % lanes;
  const auto half = hn::Set(d, 0.5F), one = hn::Set(d, 1.0F);
  const auto low = hn::Set(d, -127.0F), high = hn::Set(d, 127.0F);
  for (size_t r = 0; r < rows; ++r) {
    const float* row = from + r * from_stride;
    int8_t* out = to + r * cols;
    auto largest_lanes = hn::Zero(d);
    for (size_t c = 0; c < full; c += lanes) {
      largest_lanes = hn::Max(largest_lanes, hn::Abs(hn::LoadU(d, row + c)));
    }
    float largest = full > 0 ? hn::GetLane(hn::MaxOfLanes(d, largest_lanes)) : 0.0F;
    for (size_t c = full; c < cols; ++c) largest = std::max(largest, std::fabs(row[c]));
    float scale = largest > 0.0F ? largest / 127.0F : 1.0F;
    // Rows at float's ends: 127·scale rounded up past FLT_MAX for a row holding it (read back as
    // ∞), and largest / 127 rounded to 0 under 1.8e-43 (every element read back as 0).
    while (std::isinf(scale * 127.0F)) scale = std::nextafter(scale, 0.0F);
    scale = std::max(scale, std::numeric_limits<float>::denorm_min());
    scales[r] = scale;
    const auto scale_lanes = hn::Set(d, scale);
    for (size_t c = 0; c < full; c += lanes) {
      const auto q = hn::Div(hn::LoadU(d, row + c), scale_lanes);
      // Round() goes to even at halves; a half (exact: |q| < 2^23) goes away from zero instead.
      const auto toward_zero = hn::Trunc(q);
      const auto is_half = hn::Eq(hn::Abs(hn::Sub(q, toward_zero)), half);
      const auto rounded =
          hn::IfThenElse(is_half, hn::Add(toward_zero, hn::CopySign(one, q)), hn::Round(q));
      const auto clamped = hn::Min(hn::Max(rounded, low), high);
      hn::StoreU(hn::DemoteTo(d8, hn::ConvertTo(di, clamped)), d8, out + c);
    }
    for (size_t c = full; c < cols; ++c) out[c] = QuantiseOne(row[c], scale);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {

HWY_EXPORT(QuantiseRows);

void quantize_rows_int8(const float* from, size_t from_stride, size_t rows, size_t cols, int8_t* to,
                        float* scales) {
  // Blocks of rows on the OpenMP threads once the whole is a million values or more (a prompt's
  // keys appended to a cache), in the calling thread below (a decode step's few rows).
  constexpr size_t kRowsPerBlock = 64;
  const auto blocks = static_cast<int64_t>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  for_each_index(blocks, rows * cols >= (size_t{1} << 20), [&](int64_t block) {
    const size_t first = static_cast<size_t>(block) * kRowsPerBlock;
    HWY_DYNAMIC_DISPATCH(QuantiseRows)
    (from + first * from_stride, from_stride, std::min(kRowsPerBlock, rows - first), cols,
     to + first * cols, scales + first);
  });
}

}  // namespace attn
#endif  // HWY_ONCE
