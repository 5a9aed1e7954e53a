// Rows of fp16 / bf16 bits widened to floats and floats rounded to them, per SIMD target (a
// Highway "-inl.h" header: included once per target from a foreach_target translation unit).

#if defined(ATTN_KERNELS_HALF_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_HALF_ROWS_INL_H_
#undef ATTN_KERNELS_HALF_ROWS_INL_H_
#else
#define ATTN_KERNELS_HALF_ROWS_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "attn/core/half.hpp"
#include "attn/kernels/flash_attention.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// `count` half-precision elements widened to floats.
template <class D>
HWY_INLINE void WidenRow(D d, HalfType type, const uint16_t* HWY_RESTRICT from, size_t count,
                         float* HWY_RESTRICT to) {
  const size_t lanes = hn::Lanes(d);
  size_t i = 0;
  if (type == HalfType::kFloat16) {
    // F16C on AVX2 and AVX-512. Highway's emulation on the older targets widens ±∞ to ±65536: the
    // scalar conversion below serves them instead.
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    const hn::Rebind<hwy::float16_t, D> dh;
    const auto* halves = reinterpret_cast<const hwy::float16_t*>(from);
    for (; i + lanes <= count; i += lanes)
      hn::StoreU(hn::PromoteTo(d, hn::LoadU(dh, halves + i)), d, to + i);
#endif
  } else {
    const hn::Rebind<hwy::bfloat16_t, D> dh;
    const auto* halves = reinterpret_cast<const hwy::bfloat16_t*>(from);
    for (; i + lanes <= count; i += lanes)
      hn::StoreU(hn::PromoteTo(d, hn::LoadU(dh, halves + i)), d, to + i);
  }
  for (; i < count; ++i) to[i] = half_bits_to_float(type, from[i]);
}

// `count` floats times `scale` rounded to nearest even in `type`: bf16 by integer rounding in
// vectors, fp16 by the CPU's conversion (F16C rounds to nearest even) where the target has it.
// With `stream`, whole vectors go out in streaming stores, for rows no thread reads again soon:
// only where a vector of halves is 16 bytes or more (AVX2, AVX-512; a narrower one would be a
// partial store) and `to` is aligned to it; the caller flushes them (hwy::FlushStream).
template <class D>
HWY_INLINE void NarrowScaledRow(D d, HalfType type, const float* HWY_RESTRICT from, size_t count,
                                float scale, bool stream, uint16_t* HWY_RESTRICT to) {
  const size_t lanes = hn::Lanes(d);
  const hn::Rebind<uint16_t, D> d16;
  const auto factor = hn::Set(d, scale);
  const auto store = [&](auto halves, size_t i) {
    if (stream) {
      hn::Stream(halves, d16, to + i);
    } else {
      hn::StoreU(halves, d16, to + i);
    }
  };
  size_t i = 0;
  if (type == HalfType::kBFloat16) {
    const hn::RebindToUnsigned<D> du;
    for (; i + lanes <= count; i += lanes) {
      // bits + 0x7fff + (bit 16), then the upper half; NaN (never an output here) is not special.
      const auto bits = hn::BitCast(du, hn::Mul(hn::LoadU(d, from + i), factor));
      const auto odd = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1U));
      const auto rounded = hn::ShiftRight<16>(hn::Add(bits, hn::Add(hn::Set(du, 0x7fffU), odd)));
      store(hn::DemoteTo(d16, hn::BitCast(hn::RebindToSigned<D>(), rounded)), i);
    }
  }
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (type == HalfType::kFloat16) {
    const hn::Rebind<hwy::float16_t, D> dh;
    for (; i + lanes <= count; i += lanes)
      store(hn::BitCast(d16, hn::DemoteTo(dh, hn::Mul(hn::LoadU(d, from + i), factor))), i);
  }
#endif
  for (; i < count; ++i) to[i] = float_to_half_bits(type, from[i] * scale);
}

// `count` floats rounded as NarrowScaledRow rounds them (times 1, which changes no value).
template <class D>
HWY_INLINE void NarrowRow(D d, HalfType type, const float* HWY_RESTRICT from, size_t count,
                          uint16_t* HWY_RESTRICT to) {
  NarrowScaledRow(d, type, from, count, 1.0F, false, to);
}

// The rounding residuals (output_residual) of `count` floats that `rounded` holds rounded to
// `type`, into `residual`, in vectors: chunks of the rounded row widened on the stack, the scaled
// differences rounded by NarrowRow, as output_residual rounds them (one scalar conversion each
// way had cost fp16 forward passes 80% more time at n = 1024, d = 64).
template <class D>
HWY_INLINE void StoreResidualRow(D d, HalfType type, const float* HWY_RESTRICT exact,
                                 const uint16_t* HWY_RESTRICT rounded, size_t count,
                                 uint16_t* HWY_RESTRICT residual) {
  constexpr size_t kChunk = 256;
  HWY_ALIGN float difference[kChunk];
  const auto scale = hn::Set(d, output_residual_scale(type));
  const size_t lanes = hn::Lanes(d);
  for (size_t first = 0; first < count; first += kChunk) {
    const size_t n = std::min(kChunk, count - first);
    WidenRow(d, type, rounded + first, n, difference);
    size_t i = 0;
    for (; i + lanes <= n; i += lanes) {
      const auto kept = hn::Load(d, difference + i);
      const auto scaled = hn::Mul(hn::Sub(hn::LoadU(d, exact + first + i), kept), scale);
      hn::Store(hn::IfThenElseZero(hn::IsFinite(kept), scaled), d, difference + i);
    }
    for (; i < n; ++i) {
      const float kept = difference[i];
      difference[i] =
          std::isfinite(kept) ? (exact[first + i] - kept) * output_residual_scale(type) : 0.0F;
    }
    NarrowRow(d, type, difference, n, residual + first);
  }
}

// `row`, `count` floats widened from a rounded output, plus the residuals StoreResidualRow wrote
// for it (output_with_residual), in vectors.
template <class D>
HWY_INLINE void AddResidualRow(D d, HalfType type, const uint16_t* HWY_RESTRICT residual,
                               size_t count, float* HWY_RESTRICT row) {
  constexpr size_t kChunk = 256;
  HWY_ALIGN float widened[kChunk];
  const float unscale = 1.0F / output_residual_scale(type);
  const auto unscale_vector = hn::Set(d, unscale);
  const size_t lanes = hn::Lanes(d);
  for (size_t first = 0; first < count; first += kChunk) {
    const size_t n = std::min(kChunk, count - first);
    WidenRow(d, type, residual + first, n, widened);
    size_t i = 0;
    for (; i + lanes <= n; i += lanes) {
      hn::StoreU(
          hn::MulAdd(hn::Load(d, widened + i), unscale_vector, hn::LoadU(d, row + first + i)), d,
          row + first + i);
    }
    for (; i < n; ++i) row[first + i] += widened[i] * unscale;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_HALF_ROWS_INL_H_
