// widen_half and narrow_to_half: half_rows-inl.h's conversions, dispatched once per call to the
// best SIMD target of the CPU, in chunks over the OpenMP threads from a million elements on.
#include "attn/kernels/half_conversion.hpp"

#include <algorithm>

#include "kernels/parallel_tasks.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/half_conversion.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// Highway's headers must follow foreach_target.h.
#include <hwy/highway.h>

#include "kernels/half_rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {

void WidenHalf(HalfType type, const uint16_t* from, float* to, size_t count) {
  WidenRow(hn::ScalableTag<float>(), type, from, count, to);
}

void NarrowToHalf(HalfType type, const float* from, uint16_t* to, size_t count) {
  NarrowRow(hn::ScalableTag<float>(), type, from, count, to);
}

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {
namespace {

HWY_EXPORT(WidenHalf);
HWY_EXPORT(NarrowToHalf);

// Runs convert(begin, size) over [0, count) in chunks, on the OpenMP threads when count is large.
template <class Convert>
void in_chunks(size_t count, const Convert& convert) {
  constexpr size_t kChunk = size_t{1} << 16;
  const auto chunks = static_cast<int64_t>((count + kChunk - 1) / kChunk);
  for_each_index(chunks, count >= (size_t{1} << 20), [&](int64_t chunk) {
    const size_t begin = static_cast<size_t>(chunk) * kChunk;
    convert(begin, std::min(kChunk, count - begin));
  });
}

}  // namespace

void widen_half(HalfType type, const uint16_t* from, float* to, size_t count) {
  in_chunks(count, [&](size_t begin, size_t size) {
    HWY_DYNAMIC_DISPATCH(WidenHalf)(type, from + begin, to + begin, size);
  });
}

void narrow_to_half(HalfType type, const float* from, uint16_t* to, size_t count) {
  in_chunks(count, [&](size_t begin, size_t size) {
    HWY_DYNAMIC_DISPATCH(NarrowToHalf)(type, from + begin, to + begin, size);
  });
}

}  // namespace attn
#endif  // HWY_ONCE
