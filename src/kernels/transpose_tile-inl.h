// Tiles transposed for the kernels whose tiles keep queries along the lanes (Qᵀ, dOᵀ), per SIMD
// target (a Highway "-inl.h" header): fp32 rows scaled in 4 × 4 register blocks (16 × 16 on
// AVX-512), and 16 × 16 blocks of 32-bit words (bf16 pairs, fp32) on AVX-512.

#if defined(ATTN_KERNELS_TRANSPOSE_TILE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_TRANSPOSE_TILE_INL_H_
#undef ATTN_KERNELS_TRANSPOSE_TILE_INL_H_
#else
#define ATTN_KERNELS_TRANSPOSE_TILE_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR
// Four 4-float rows a, b, c, e turned into their four columns, by two interleaving steps:
// (a0 b0 a1 b1), (a2 b2 a3 b3), (c0 e0 c1 e1), (c2 e2 c3 e3), then pairs of those pairs.
// column(t, vector) receives column t.
template <class D4, class Column>
HWY_INLINE void Transpose4x4(D4 d4, hn::Vec<D4> a, hn::Vec<D4> b, hn::Vec<D4> c, hn::Vec<D4> e,
                             const Column& column) {
  const hn::Repartition<uint64_t, D4> d64;
  const auto ab_low = hn::BitCast(d64, hn::InterleaveLower(d4, a, b));
  const auto ab_high = hn::BitCast(d64, hn::InterleaveUpper(d4, a, b));
  const auto ce_low = hn::BitCast(d64, hn::InterleaveLower(d4, c, e));
  const auto ce_high = hn::BitCast(d64, hn::InterleaveUpper(d4, c, e));
  column(0, hn::BitCast(d4, hn::InterleaveLower(d64, ab_low, ce_low)));
  column(1, hn::BitCast(d4, hn::InterleaveUpper(d64, ab_low, ce_low)));
  column(2, hn::BitCast(d4, hn::InterleaveLower(d64, ab_high, ce_high)));
  column(3, hn::BitCast(d4, hn::InterleaveUpper(d64, ab_high, ce_high)));
}
#endif

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// A 16 × 16 block of 32-bit words transposed: out[c · out_stride + r] = in[r · in_stride + c]
// (strides in words), by the unpack and lane-shuffle steps of a 16 × 16 transpose: bf16 pairs
// (Qᵀ's for the bf16 forward; Vᵀ and Oᵀ on AMX tiles) and fp32 rows (TransposeScaledTile).
// AVX-512 only.
HWY_INLINE void TransposeWords16(const uint32_t* in, size_t in_stride, uint32_t* out,
                                 size_t out_stride) {
  __m512i row[16], step[16];
  for (size_t r = 0; r < 16; ++r) row[r] = _mm512_loadu_si512(in + r * in_stride);
  // Pairs of rows: 2 × 2 blocks of words.
  for (size_t r = 0; r < 16; r += 2) {
    step[r] = _mm512_unpacklo_epi32(row[r], row[r + 1]);
    step[r + 1] = _mm512_unpackhi_epi32(row[r], row[r + 1]);
  }
  // Quads of rows: 4 × 4 blocks within each 128-bit lane.
  for (size_t r = 0; r < 16; r += 4) {
    row[r] = _mm512_unpacklo_epi64(step[r], step[r + 2]);
    row[r + 1] = _mm512_unpackhi_epi64(step[r], step[r + 2]);
    row[r + 2] = _mm512_unpacklo_epi64(step[r + 1], step[r + 3]);
    row[r + 3] = _mm512_unpackhi_epi64(step[r + 1], step[r + 3]);
  }
  // 128-bit lanes across groups of four rows, then of eight.
  for (size_t r = 0; r < 4; ++r) {
    step[r] = _mm512_shuffle_i32x4(row[r], row[r + 4], 0x88);
    step[r + 4] = _mm512_shuffle_i32x4(row[r], row[r + 4], 0xDD);
    step[r + 8] = _mm512_shuffle_i32x4(row[r + 8], row[r + 12], 0x88);
    step[r + 12] = _mm512_shuffle_i32x4(row[r + 8], row[r + 12], 0xDD);
  }
  for (size_t r = 0; r < 4; ++r) {
    row[r] = _mm512_shuffle_i32x4(step[r], step[r + 8], 0x88);
    row[r + 8] = _mm512_shuffle_i32x4(step[r], step[r + 8], 0xDD);
    row[r + 4] = _mm512_shuffle_i32x4(step[r + 4], step[r + 12], 0x88);
    row[r + 12] = _mm512_shuffle_i32x4(step[r + 4], step[r + 12], 0xDD);
  }
  for (size_t r = 0; r < 16; ++r) _mm512_storeu_si512(out + r * out_stride, row[r]);
}
#endif  // HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL

// Pairs of adjacent bf16 of `count` (≤ br) rows of `cols` elements, `stride` apart, transposed:
// out[p · br + r] = pair p of row r, the layout of Qᵀ and dOᵀ in pairs (an odd count's last pair
// holds the last element and 0); the lanes from count to br are left as they are. A row's
// adjacent bf16 already are its pairs in memory (little-endian). Blocks of 16 rows × 16 pairs go
// through registers on AVX-512 where the rows hold whole aligned pairs; word by word, with a store
// per word 4·br bytes from the last, the transpose took 2% of the bf16 forward (Zen 5) and 3.4% of
// the bf16 backward (Zen 4) at n = 1024, d = 64.
HWY_INLINE void TransposeRowPairs(const uint16_t* rows, size_t stride, size_t count, size_t cols,
                                  size_t br, uint32_t* out) {
  const size_t full_pairs = cols / 2;
  size_t block_rows = 0, block_pairs = 0;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (stride % 2 == 0 && reinterpret_cast<uintptr_t>(rows) % 4 == 0) {
    block_rows = count / 16 * 16;
    block_pairs = full_pairs / 16 * 16;
    const auto* pairs = reinterpret_cast<const uint32_t*>(rows);
    const size_t pair_stride = stride / 2;
    for (size_t r = 0; r < block_rows; r += 16) {
      for (size_t t = 0; t < block_pairs; t += 16)
        TransposeWords16(pairs + r * pair_stride + t, pair_stride, out + t * br + r, br);
    }
  }
#endif
  for (size_t r = 0; r < count; ++r) {
    const uint16_t* row = rows + r * stride;
    for (size_t t = r < block_rows ? block_pairs : 0; t < full_pairs; ++t)
      std::memcpy(out + t * br + r, row + 2 * t, sizeof(uint32_t));
    if (cols % 2 != 0) out[full_pairs * br + r] = row[cols - 1];
  }
}

// out[t · br + r] = scale · rows[r · stride + t] for r < count and t < cols, 0 for the padding
// lanes count ≤ r < width, and the lanes from width to br left as they are: width (a multiple of
// the target's vector lanes, count ≤ width ≤ br) spans the vectors the tile's readers multiply,
// those holding a query (VectorsHolding, or AdditiveScoreVectors), so a tile of 8 queries stores
// one vector of each column instead of four (zeros to br were a tenth of a (1, 8, 8, 64) backward
// pass, Zen 5). Blocks of 4 rows × 4 columns (16 × 16 on AVX-512) go through registers;
// element by element the transpose cost 4% of the forward at n = 1024, d = 64 (perf, Zen 5).
HWY_INLINE void TransposeScaledTile(const float* rows, size_t stride, size_t count, size_t cols,
                                    float scale, size_t br, size_t width, float* HWY_RESTRICT out) {
  if (count < width) {
    // Zeros in the padding lanes, stored first in whole vectors (the one holding lane `count` too:
    // the rows below overwrite its real lanes); a fill per column (rep stos) or a store per lane
    // cost more than the products of a tile of n = 16 queries. The columns are the inner loop:
    // with the lanes inner, GCC made each column's stores a call of memset (a (1, 8, 8, 64)
    // forward and backward call 13.8 → 12.2 µs without them, Zen 5).
    const hn::ScalableTag<float> d;
    const size_t lanes = hn::Lanes(d);
    for (size_t i = count / lanes * lanes; i < width; i += lanes) {
      for (size_t t = 0; t < cols; ++t) hn::StoreU(hn::Zero(d), d, out + t * br + i);
    }
  }
#if HWY_TARGET != HWY_SCALAR
  const hn::CappedTag<float, 4> d4;
  const auto scale4 = hn::Set(d4, scale);
  const size_t full_columns = cols / 4 * 4;
  // Rows [r, r + 4), columns from `first` on: 4 × 4 blocks, the last columns one by one.
  const auto four_rows = [&](size_t r, size_t first) {
    const float* row = rows + r * stride;
    for (size_t t = first; t < full_columns; t += 4) {
      const auto a = hn::Mul(hn::LoadU(d4, row + t), scale4);
      const auto b = hn::Mul(hn::LoadU(d4, row + stride + t), scale4);
      const auto c = hn::Mul(hn::LoadU(d4, row + 2 * stride + t), scale4);
      const auto e = hn::Mul(hn::LoadU(d4, row + 3 * stride + t), scale4);
      float* column = out + t * br + r;
      Transpose4x4(d4, a, b, c, e,
                   [&](size_t i, auto values) { hn::StoreU(values, d4, column + i * br); });
    }
    for (size_t t = std::max(first, full_columns); t < cols; ++t) {
      for (size_t i = 0; i < 4; ++i) out[t * br + r + i] = row[i * stride + t] * scale;
    }
  };
#endif
  size_t r = 0;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // Blocks of 16 rows × 16 columns through the word transpose, scaled in the output's vectors
  // after it: the 4 × 4 blocks' 128-bit steps were about 1.2% of the backward's samples at
  // n = 1024, d = 64, and these take 0.35 points fewer (perf, Zen 5).
  const hn::ScalableTag<float> d;  // 16 lanes on these targets
  const auto scale_vector = hn::Set(d, scale);
  const size_t wide_columns = cols / 16 * 16;
  for (; wide_columns > 0 && r + 16 <= count; r += 16) {
    const float* row = rows + r * stride;
    for (size_t t = 0; t < wide_columns; t += 16) {
      float* block = out + t * br + r;
      TransposeWords16(reinterpret_cast<const uint32_t*>(row + t), stride,
                       reinterpret_cast<uint32_t*>(block), br);
      if (scale == 1.0F) continue;
      for (size_t i = 0; i < 16; ++i) {
        float* column = block + i * br;
        hn::StoreU(hn::Mul(hn::LoadU(d, column), scale_vector), d, column);
      }
    }
    for (size_t q = r; q < r + 16; q += 4) four_rows(q, wide_columns);
  }
#endif
#if HWY_TARGET != HWY_SCALAR
  for (; r + 4 <= count; r += 4) four_rows(r, 0);
#endif
  for (size_t t = 0; t < cols; ++t) {  // the rows left
    float* column = out + t * br;
    for (size_t i = r; i < count; ++i) column[i] = rows[i * stride + t] * scale;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_TRANSPOSE_TILE_INL_H_
