// A tile of rows transposed and scaled for the kernels whose tiles keep queries along the lanes
// (Qᵀ, dOᵀ), per SIMD target (a Highway "-inl.h" header): 4 × 4 blocks in registers.

#if defined(ATTN_KERNELS_TRANSPOSE_TILE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_TRANSPOSE_TILE_INL_H_
#undef ATTN_KERNELS_TRANSPOSE_TILE_INL_H_
#else
#define ATTN_KERNELS_TRANSPOSE_TILE_INL_H_
#endif

#include <hwy/highway.h>

#include <cstddef>

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// out[t · br + r] = scale · rows[r · stride + t] for r < count and t < cols, and 0 for the padding
// lanes count ≤ r < br. Blocks of 4 rows × 4 columns go through registers (two interleaving steps);
// element by element the transpose cost 4% of the forward at n = 1024, d = 64 (perf, Zen 5).
HWY_INLINE void TransposeScaledTile(const float* rows, size_t stride, size_t count, size_t cols,
                                    float scale, size_t br, float* HWY_RESTRICT out) {
  size_t r = 0;
#if HWY_TARGET != HWY_SCALAR
  const hn::CappedTag<float, 4> d4;
  const hn::Repartition<uint64_t, decltype(d4)> d64;
  const auto scale4 = hn::Set(d4, scale);
  const size_t full_columns = cols / 4 * 4;
  for (; r + 4 <= count; r += 4) {
    const float* row = rows + r * stride;
    for (size_t t = 0; t < full_columns; t += 4) {
      const auto a = hn::Mul(hn::LoadU(d4, row + t), scale4);
      const auto b = hn::Mul(hn::LoadU(d4, row + stride + t), scale4);
      const auto c = hn::Mul(hn::LoadU(d4, row + 2 * stride + t), scale4);
      const auto e = hn::Mul(hn::LoadU(d4, row + 3 * stride + t), scale4);
      // (a0 b0 a1 b1), (a2 b2 a3 b3), (c0 e0 c1 e1), (c2 e2 c3 e3), then pairs of those pairs.
      const auto ab_low = hn::BitCast(d64, hn::InterleaveLower(d4, a, b));
      const auto ab_high = hn::BitCast(d64, hn::InterleaveUpper(d4, a, b));
      const auto ce_low = hn::BitCast(d64, hn::InterleaveLower(d4, c, e));
      const auto ce_high = hn::BitCast(d64, hn::InterleaveUpper(d4, c, e));
      float* column = out + t * br + r;
      hn::StoreU(hn::BitCast(d4, hn::InterleaveLower(d64, ab_low, ce_low)), d4, column);
      hn::StoreU(hn::BitCast(d4, hn::InterleaveUpper(d64, ab_low, ce_low)), d4, column + br);
      hn::StoreU(hn::BitCast(d4, hn::InterleaveLower(d64, ab_high, ce_high)), d4, column + 2 * br);
      hn::StoreU(hn::BitCast(d4, hn::InterleaveUpper(d64, ab_high, ce_high)), d4, column + 3 * br);
    }
    for (size_t t = full_columns; t < cols; ++t) {
      for (size_t i = 0; i < 4; ++i) out[t * br + r + i] = row[i * stride + t] * scale;
    }
  }
#endif
  for (size_t t = 0; t < cols; ++t) {  // the rows left, and zeros in the padding lanes
    float* column = out + t * br;
    for (size_t i = r; i < br; ++i) column[i] = i < count ? rows[i * stride + t] * scale : 0.0F;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_TRANSPOSE_TILE_INL_H_
