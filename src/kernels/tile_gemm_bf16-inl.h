// The tile GEMM of tile_gemm-inl.h on bf16 pairs with vdpbf16ps, for the AVX-512 targets of CPUs
// with AVX512-BF16 (the callers check at run time), per SIMD target (a Highway "-inl.h" header).
// vdpbf16ps multiplies pairs of bf16 (exact products) and adds both to an fp32 lane: twice the work
// of an fp32 FMA per instruction at the same throughput.

#if defined(ATTN_KERNELS_TILE_GEMM_BF16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_TILE_GEMM_BF16_INL_H_
#undef ATTN_KERNELS_TILE_GEMM_BF16_INL_H_
#else
#define ATTN_KERNELS_TILE_GEMM_BF16_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/tile_gemm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {

// Words a row of `cols` bf16 takes as pairs of adjacent elements: (cols + 1) / 2, or for AMX
// tiles rounded up to whole tiles of 16 pairs (zeros past cols), so that every head size takes
// them.
HWY_INLINE size_t PairsOfRow(size_t cols, bool on_tiles) {
  const size_t pairs = (cols + 1) / 2;
  return on_tiles ? (pairs + 15) / 16 * 16 : pairs;
}

// A row of `cols` bf16 as `pairs` ≥ (cols + 1) / 2 words of pairs: adjacent bf16 already are a
// pair in memory; the words past cols 0 (an odd count's last one half 0).
HWY_INLINE void CopyRowAsPairs(const uint16_t* row, size_t cols, size_t pairs, uint32_t* out) {
  std::fill(out + cols / 2, out + pairs, 0U);
  // (Rows of depth 0, PyTorch's E = 0, may have no storage: memcpy's null source is undefined.)
  if (cols != 0) std::memcpy(out, row, cols * sizeof(uint16_t));
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// The target's own features plus AVX512-BF16: clang's target attribute replaces the one Highway's
// pragma gives every function here rather than adding to it.
#ifndef ATTN_BF16_TARGET
#define ATTN_BF16_TARGET __attribute__((target(HWY_TARGET_STR ",avx512bf16")))
#endif

// C[r, v·16 …] (= or +=) Σ_p A(r, p) · B[p, v·16 …] over bf16 pairs: A(r, p) is the pair
// a[r·a_row + p·a_col] (broadcast), B's rows are ldb pairs apart. Without kAccumulate the sums are
// multiplied by `product_scale` as they are stored; with it, row r of C is first multiplied by
// c_scale[r] as MicroKernel does.
template <size_t MR, size_t NR, bool kAccumulate>
ATTN_BF16_TARGET HWY_INLINE void MicroKernelBF16(const uint32_t* HWY_RESTRICT a, size_t a_row,
                                                 size_t a_col, const uint32_t* HWY_RESTRICT b,
                                                 size_t ldb, size_t pairs, float* HWY_RESTRICT c,
                                                 size_t ldc, const float* c_scale,
                                                 float product_scale) {
  __m512 acc[MR][NR];
  for (size_t r = 0; r < MR; ++r) {
    for (size_t v = 0; v < NR; ++v) {
      if constexpr (kAccumulate) {
        acc[r][v] = _mm512_loadu_ps(c + r * ldc + v * 16);
        if (c_scale != nullptr) acc[r][v] = _mm512_mul_ps(acc[r][v], _mm512_set1_ps(c_scale[r]));
      } else {
        acc[r][v] = _mm512_setzero_ps();
      }
    }
  }
  for (size_t p = 0; p < pairs; ++p) {
    __m512bh b_vectors[NR];
    for (size_t v = 0; v < NR; ++v)
      b_vectors[v] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + p * ldb + v * 16));
    for (size_t r = 0; r < MR; ++r) {
      const auto a_pair =
          reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(a[r * a_row + p * a_col])));
      for (size_t v = 0; v < NR; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a_pair, b_vectors[v]);
    }
  }
  for (size_t r = 0; r < MR; ++r) {
    for (size_t v = 0; v < NR; ++v) {
      if constexpr (!kAccumulate)
        acc[r][v] = _mm512_mul_ps(acc[r][v], _mm512_set1_ps(product_scale));
      _mm512_storeu_ps(c + r * ldc + v * 16, acc[r][v]);
    }
  }
}

// MicroKernelBF16 for MR rows and 1 to 4 vectors.
template <size_t MR, bool kAccumulate>
ATTN_BF16_TARGET HWY_INLINE void RowBlockBF16(size_t vectors, const uint32_t* a, size_t a_row,
                                              size_t a_col, const uint32_t* b, size_t ldb,
                                              size_t pairs, float* c, size_t ldc,
                                              const float* c_scale, float product_scale) {
  switch (vectors) {
    case 1:
      return MicroKernelBF16<MR, 1, kAccumulate>(a, a_row, a_col, b, ldb, pairs, c, ldc, c_scale,
                                                 product_scale);
    case 2:
      return MicroKernelBF16<MR, 2, kAccumulate>(a, a_row, a_col, b, ldb, pairs, c, ldc, c_scale,
                                                 product_scale);
    case 3:
      return MicroKernelBF16<MR, 3, kAccumulate>(a, a_row, a_col, b, ldb, pairs, c, ldc, c_scale,
                                                 product_scale);
    default:
      return MicroKernelBF16<MR, 4, kAccumulate>(a, a_row, a_col, b, ldb, pairs, c, ldc, c_scale,
                                                 product_scale);
  }
}

// The pairs [begin / 2, ⌈end / 2⌉) that hold elements [begin, end) of a sequence whose elements
// 2p and 2p + 1 form pair p (adjacent keys or queries): the banded products' range of pairs.
inline std::pair<size_t, size_t> PairsHolding(size_t begin, size_t end) {
  return {begin / 2, (end + 1) / 2};
}

// MicroKernelBF16 over any rows (blocks of kMaxRows) and vectors (blocks of kMaxVectors).
template <bool kAccumulate>
ATTN_BF16_TARGET HWY_NOINLINE void GemmBF16(size_t rows, size_t vectors, const uint32_t* a,
                                            size_t a_row, size_t a_col, const uint32_t* b,
                                            size_t ldb, size_t pairs, float* c, size_t ldc,
                                            const float* c_scale, float product_scale = 1.0F) {
  for (size_t v = 0; v < vectors; v += kMaxVectors) {
    const size_t block_vectors = std::min(kMaxVectors, vectors - v);
    for (size_t r = 0; r < rows; r += kMaxRows) {
      const uint32_t* a_block = a + r * a_row;
      const uint32_t* b_block = b + v * 16;
      float* c_block = c + r * ldc + v * 16;
      const float* scale_block = c_scale != nullptr ? c_scale + r : nullptr;
#define ATTN_ROW_BLOCK(MR)                                                                 \
  RowBlockBF16<MR, kAccumulate>(block_vectors, a_block, a_row, a_col, b_block, ldb, pairs, \
                                c_block, ldc, scale_block, product_scale)
      switch (std::min(kMaxRows, rows - r)) {
        case 1:
          ATTN_ROW_BLOCK(1);
          break;
        case 2:
          ATTN_ROW_BLOCK(2);
          break;
        case 3:
          ATTN_ROW_BLOCK(3);
          break;
        case 4:
          ATTN_ROW_BLOCK(4);
          break;
        case 5:
          ATTN_ROW_BLOCK(5);
          break;
        default:
          ATTN_ROW_BLOCK(6);
          break;
      }
#undef ATTN_ROW_BLOCK
    }
  }
}
// Words 0–15 of a vector from the even key, 16–31 from the odd one, in the order that makes each
// 32-bit lane one query's (even, odd) pair.
alignas(64) constexpr uint16_t kPairInterleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                      21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                      11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

alignas(64) constexpr uint16_t kRowInterleave[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                     37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                     11, 43, 12, 44, 13, 45, 14, 46, 15, 47};

// Two rows of `cols` bf16 as one row of pairs (first[t], second[t]) in 32-bit words, `padded` words
// long (0 past cols); a null `second` reads as zeros. 32 columns at a time by vpermt2w: an index
// below 32 picks that word of the first row, 32 + i word i of the second; columns t + i, then
// t + 16 + i.
ATTN_BF16_TARGET HWY_INLINE void InterleaveRowPairs(const uint16_t* first, const uint16_t* second,
                                                    size_t cols, size_t padded, uint32_t* pairs) {
  const __m512i low_half = _mm512_load_si512(kRowInterleave);
  const __m512i high_half = _mm512_add_epi16(low_half, _mm512_set1_epi16(16));
  size_t t = 0;
  for (; t + 32 <= cols; t += 32) {
    const __m512i a = _mm512_loadu_si512(first + t);
    const __m512i b = second != nullptr ? _mm512_loadu_si512(second + t) : _mm512_setzero_si512();
    _mm512_storeu_si512(pairs + t, _mm512_permutex2var_epi16(a, low_half, b));
    _mm512_storeu_si512(pairs + t + 16, _mm512_permutex2var_epi16(a, high_half, b));
  }
  for (; t < cols; ++t)
    pairs[t] = first[t] | (second != nullptr ? static_cast<uint32_t>(second[t]) << 16 : 0U);
  std::fill(pairs + cols, pairs + padded, 0U);
}

// Probabilities of an even key and the next (16 queries each) as their bf16 pairs (rounded to
// nearest even), one 32-bit lane per query, stored at `pairs`.
ATTN_BF16_TARGET HWY_INLINE void StoreProbabilityPairs(__m512 even, __m512 odd, uint32_t* pairs) {
  // Words 0–15 the even key's, 16–31 the odd key's; interleaved into one pair per query.
  const auto both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(odd, even));
  _mm512_storeu_si512(pairs, _mm512_permutexvar_epi16(_mm512_load_si512(kPairInterleave), both));
}

// Pᵀ (bc × Br floats, bc ≤ Bc) as bf16 pairs of adjacent keys per query (Bc/2 × Br); a key past
// bc is 0. The queries [0, width) of each row (width a multiple of 16).
ATTN_BF16_TARGET HWY_INLINE void PackProbabilityPairs(const float* probabilities, size_t bc,
                                                      size_t br, size_t width, uint32_t* pairs) {
  for (size_t j = 0; j < bc; j += 2) {
    for (size_t r = 0; r < width; r += 16) {
      const __m512 odd =
          j + 1 < bc ? _mm512_loadu_ps(probabilities + (j + 1) * br + r) : _mm512_setzero_ps();
      StoreProbabilityPairs(_mm512_loadu_ps(probabilities + j * br + r), odd,
                            pairs + j / 2 * br + r);
    }
  }
}

// A row of `count` floats (a multiple of 32) rounded to bf16 (nearest even) in place order: word
// pair p holds elements 2p and 2p + 1, the pairs of adjacent lanes a transposed tile's row gives.
ATTN_BF16_TARGET HWY_INLINE void RowToPairs(const float* row, size_t count, uint32_t* pairs) {
  for (size_t r = 0; r < count; r += 32) {
    const auto both = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(row + r + 16), _mm512_loadu_ps(row + r));
    _mm512_storeu_si512(pairs + r / 2, reinterpret_cast<__m512i>(both));
  }
}

// RowToPairs as two bf16 parts, hi = each element rounded to nearest even (as RowToPairs) and lo =
// the remainder rounded likewise, lo's pairs `part_words` after hi's. hi as floats comes from its
// rounded words widened back (a shuffle and a shift per 16 elements), not from a second rounding.
ATTN_BF16_TARGET HWY_INLINE void RowToPairParts(const float* row, size_t count, uint32_t* pairs,
                                                size_t part_words) {
  for (size_t r = 0; r < count; r += 32) {
    const __m512 low = _mm512_loadu_ps(row + r), high = _mm512_loadu_ps(row + r + 16);
    const __m512bh hi = _mm512_cvtne2ps_pbh(high, low);
    _mm512_storeu_si512(pairs + r / 2, reinterpret_cast<__m512i>(hi));
    const __m512i hi_bits = reinterpret_cast<__m512i>(hi);
    const __m512 low_hi = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(hi_bits)), 16));
    const __m512 high_hi = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(hi_bits, 1)), 16));
    const __m512bh lo =
        _mm512_cvtne2ps_pbh(_mm512_sub_ps(high, high_hi), _mm512_sub_ps(low, low_hi));
    _mm512_storeu_si512(pairs + part_words + r / 2, reinterpret_cast<__m512i>(lo));
  }
}

// fp32 on bf16 products (the fp32 forward on AMX tiles): x = hi + mid + lo exactly, each part a
// float whose low 16 bits are 0, so a bf16 as it stands. hi keeps x's top 16 bits (truncation:
// never rounds past the largest float to ∞); mid is the remainder x − hi (exact, at most 16
// significant bits) rounded to nearest at 8 bits, ties away from zero (one integer add, where ties
// to even took four: the split's nine operations become six, and the fp32 forward on tiles ran
// 1.03–1.10× faster, Xeon dev 2026-12-05); lo = the remainder − mid, exact, at most 8 significant
// bits. |mid| < 2^-7 |x|, |lo| ≤ 2^-16 |x|. Parts below the smallest normal float
// (|x| under about 2^-110) are cut to bf16 or lost: the tiles read denormal inputs as 0.
struct SplitParts {
  __m512 hi, mid, lo;
};
ATTN_BF16_TARGET HWY_INLINE SplitParts SplitThreeBF16(__m512 x) {
  const __m512i upper = _mm512_set1_epi32(static_cast<int>(0xFFFF0000U));
  const __m512 hi = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), upper));
  const __m512 rest = _mm512_sub_ps(x, hi);
  const __m512i bits = _mm512_castps_si512(rest);
  // Round the magnitude to nearest at bit 16 (ties up): add half of bit 16, drop the low half.
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_set1_epi32(0x8000));
  const __m512 mid = _mm512_castsi512_ps(_mm512_and_si512(rounded, upper));
  // (Cut to bf16 too: exact where lo is a normal float; a denormal one keeps low bits the pairs'
  // OR would carry into the neighbouring bf16.)
  const __m512 lo =
      _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(_mm512_sub_ps(rest, mid)), upper));
  return {hi, mid, lo};
}

// Two parts of 16 lanes each as 16 bf16 pairs (the even key's part low, the odd key's high): the
// parts' low halves are 0, so a shift and an OR.
ATTN_BF16_TARGET HWY_INLINE __m512i PartPairs(__m512 even, __m512 odd) {
  return _mm512_or_si512(_mm512_srli_epi32(_mm512_castps_si512(even), 16),
                         _mm512_castps_si512(odd));
}

// P of an even key and the next (16 queries each) as `kParts` bf16 parts' pairs, each part
// `part_words` after the one before: one, rounded (StoreProbabilityPairs); two, hi and lo each
// rounded to nearest even (hi + lo within 2^-16 of P: hi within 2^-8 of it, lo of the rest);
// three, SplitThreeBF16's (P exactly).
template <size_t kParts>
ATTN_BF16_TARGET HWY_INLINE void StoreProbabilityParts(__m512 even, __m512 odd, uint32_t* pairs,
                                                       size_t part_words) {
  static_assert(kParts >= 1 && kParts <= 3);
  if constexpr (kParts == 1) {
    StoreProbabilityPairs(even, odd, pairs);
  } else if constexpr (kParts == 2) {
    const __m512i interleave = _mm512_load_si512(kPairInterleave);
    const __m512i hi = _mm512_permutexvar_epi16(
        interleave, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(odd, even)));
    _mm512_storeu_si512(pairs, hi);
    // The parts as floats: the even key's in the low half of each pair, the odd key's high.
    const __m512 even_hi = _mm512_castsi512_ps(_mm512_slli_epi32(hi, 16));
    const __m512 odd_hi =
        _mm512_castsi512_ps(_mm512_and_si512(hi, _mm512_set1_epi32(static_cast<int>(0xFFFF0000U))));
    const __m512i lo = _mm512_permutexvar_epi16(
        interleave, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_sub_ps(odd, odd_hi),
                                                                  _mm512_sub_ps(even, even_hi))));
    _mm512_storeu_si512(pairs + part_words, lo);
  } else {
    const SplitParts even_parts = SplitThreeBF16(even);
    const SplitParts odd_parts = SplitThreeBF16(odd);
    _mm512_storeu_si512(pairs, PartPairs(even_parts.hi, odd_parts.hi));
    _mm512_storeu_si512(pairs + part_words, PartPairs(even_parts.mid, odd_parts.mid));
    _mm512_storeu_si512(pairs + 2 * part_words, PartPairs(even_parts.lo, odd_parts.lo));
  }
}

// PackProbabilityPairs in `parts` bf16 parts (StoreProbabilityParts), each part's pairs
// `part_words` after the one before (the dropout step).
ATTN_BF16_TARGET HWY_INLINE void PackProbabilityParts(const float* probabilities, size_t bc,
                                                      size_t br, size_t width, uint32_t* pairs,
                                                      size_t part_words, size_t parts) {
  for (size_t j = 0; j < bc; j += 2) {
    for (size_t r = 0; r < width; r += 16) {
      const __m512 even = _mm512_loadu_ps(probabilities + j * br + r);
      const __m512 odd =
          j + 1 < bc ? _mm512_loadu_ps(probabilities + (j + 1) * br + r) : _mm512_setzero_ps();
      uint32_t* out = pairs + j / 2 * br + r;
      if (parts == 1) {
        StoreProbabilityParts<1>(even, odd, out, part_words);
      } else if (parts == 2) {
        StoreProbabilityParts<2>(even, odd, out, part_words);
      } else {
        StoreProbabilityParts<3>(even, odd, out, part_words);
      }
    }
  }
}

// A row of `count` floats times `scale` as three bf16 rows (SplitThreeBF16), the elements from
// count to `padded` (≥ count) 0 in each.
ATTN_BF16_TARGET HWY_INLINE void SplitRowBF16x3(const float* row, size_t count, size_t padded,
                                                float scale, uint16_t* hi, uint16_t* mid,
                                                uint16_t* lo) {
  const __m512 factor = _mm512_set1_ps(scale);
  uint16_t* parts[3] = {hi, mid, lo};
  for (size_t t = 0; t < padded; t += 32) {
    const size_t left = count > t ? count - t : 0;
    const auto low_mask = static_cast<__mmask16>(left >= 16 ? 0xFFFFU : (1U << left) - 1U);
    const auto high_mask = static_cast<__mmask16>(left >= 32  ? 0xFFFFU
                                                  : left > 16 ? (1U << (left - 16)) - 1U
                                                              : 0U);
    const SplitParts low =
        SplitThreeBF16(_mm512_mul_ps(_mm512_maskz_loadu_ps(low_mask, row + t), factor));
    const SplitParts high =
        SplitThreeBF16(_mm512_mul_ps(_mm512_maskz_loadu_ps(high_mask, row + t + 16), factor));
    const size_t stored = std::min<size_t>(32, padded - t);
    const auto store_mask =
        static_cast<__mmask32>(stored >= 32 ? 0xFFFFFFFFU : (1U << stored) - 1U);
    const __m512 low_parts[3] = {low.hi, low.mid, low.lo};
    const __m512 high_parts[3] = {high.hi, high.mid, high.lo};
    for (size_t p = 0; p < 3; ++p) {
      // Exact: each part is a bf16 already.
      const auto both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(high_parts[p], low_parts[p]));
      _mm512_mask_storeu_epi16(parts[p] + t, store_mask, both);
    }
  }
}

#endif  // HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_TILE_GEMM_BF16_INL_H_
