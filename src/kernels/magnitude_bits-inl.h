// The largest magnitude of the rows a kernel reads, taken as it reads them, per SIMD target (a
// Highway "-inl.h" header): for callers that let the kernel check its inputs instead of scanning
// them first (a second read of everything, as long as the kernel's own for short or windowed work).

#if defined(ATTN_KERNELS_MAGNITUDE_BITS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_MAGNITUDE_BITS_INL_H_
#undef ATTN_KERNELS_MAGNITUDE_BITS_INL_H_
#else
#define ATTN_KERNELS_MAGNITUDE_BITS_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "attn/core/half.hpp"
#include "core/magnitude_scan.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Running maxima of |x| as the bits of the float (bf16 and fp16 inputs as the floats they widen to)
// (core/magnitude_scan.hpp's order: NaN and ±∞ above every finite value), lane-wise while rows are
// added and reduced once by Largest(), so that a row of 64 floats costs four loads and four maxima,
// not a reduction of its own.
class MagnitudeBits {
 public:
  // Adds the `count` floats from `values` on.
  HWY_INLINE void Add(const float* values, size_t count) {
    const hn::ScalableTag<float> d;
    const hn::RebindToUnsigned<decltype(d)> du;
    const size_t lanes = hn::Lanes(d);
    const auto magnitude = hn::Set(du, core_detail::kMagnitudeBits);
    auto largest = hn::LoadU(du, lanes_);
    size_t i = 0;
    for (; i + lanes <= count; i += lanes)
      largest = hn::Max(largest, hn::And(hn::BitCast(du, hn::LoadU(d, values + i)), magnitude));
    hn::StoreU(largest, du, lanes_);
    for (; i < count; ++i)
      tail_ = std::max(tail_, std::bit_cast<uint32_t>(values[i]) & core_detail::kMagnitudeBits);
  }

  // Adds `rows` rows of `cols` floats, `stride` floats apart, from `first` on.
  HWY_INLINE void AddRows(const float* first, size_t stride, size_t rows, size_t cols) {
    if (stride == cols) return Add(first, rows * cols);
    for (size_t r = 0; r < rows; ++r) Add(first + r * stride, cols);
  }

  // Adds the `count` bf16 values from `values` on (their bits): a bf16's magnitude bits are the
  // top half of its float's, in the same order.
  HWY_INLINE void AddBFloat16(const uint16_t* values, size_t count) {
    const hn::ScalableTag<uint16_t> du16;
    const size_t lanes = hn::Lanes(du16);
    const auto magnitude = hn::Set(du16, static_cast<uint16_t>(core_detail::kMagnitudeBits >> 16));
    auto largest = hn::LoadU(du16, half_lanes_);
    size_t i = 0;
    for (; i + lanes <= count; i += lanes)
      largest = hn::Max(largest, hn::And(hn::LoadU(du16, values + i), magnitude));
    hn::StoreU(largest, du16, half_lanes_);
    for (; i < count; ++i)
      tail_ = std::max(tail_, (uint32_t{values[i]} << 16) & core_detail::kMagnitudeBits);
  }

  // Adds the `count` fp16 values from `values` on (their bits): an fp16's magnitude bits (the low
  // 15) order its magnitudes as a float's do, NaN and ∞ above every finite value, so their maximum
  // is kept as bits and widened once, in Largest().
  HWY_INLINE void AddFloat16(const uint16_t* values, size_t count) {
    const hn::ScalableTag<uint16_t> du16;
    const size_t lanes = hn::Lanes(du16);
    const auto magnitude = hn::Set(du16, uint16_t{0x7fff});
    auto largest = hn::LoadU(du16, float16_lanes_);
    size_t i = 0;
    for (; i + lanes <= count; i += lanes)
      largest = hn::Max(largest, hn::And(hn::LoadU(du16, values + i), magnitude));
    hn::StoreU(largest, du16, float16_lanes_);
    for (; i < count; ++i) float16_tail_ = std::max(float16_tail_, uint16_t(values[i] & 0x7fffU));
  }

  // Raises `shared` (a call's maximum, which several threads raise) to Largest().
  void RaiseTo(std::atomic<uint32_t>& shared) const {
    const uint32_t largest = Largest();
    uint32_t seen = shared.load(std::memory_order_relaxed);
    while (seen < largest &&
           !shared.compare_exchange_weak(seen, largest, std::memory_order_relaxed)) {
    }
  }

  uint32_t Largest() const {
    uint32_t largest = tail_;
    for (const uint32_t lane : lanes_) largest = std::max(largest, lane);
    for (const uint16_t lane : half_lanes_) largest = std::max(largest, uint32_t{lane} << 16);
    uint16_t float16 = float16_tail_;
    for (const uint16_t lane : float16_lanes_) float16 = std::max(float16, lane);
    const float widened = half_bits_to_float(HalfType::kFloat16, float16);
    return std::max(largest, std::bit_cast<uint32_t>(widened) & core_detail::kMagnitudeBits);
  }

 private:
  // The lane-wise maxima between calls (kept in memory: a class holds no vector on every target),
  // as wide as the widest target's vector.
  alignas(64) uint32_t lanes_[16] = {};
  alignas(64) uint16_t half_lanes_[32] = {};
  alignas(64) uint16_t float16_lanes_[32] = {};  // fp16 magnitude bits
  uint32_t tail_ = 0;
  uint16_t float16_tail_ = 0;
};

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_MAGNITUDE_BITS_INL_H_
