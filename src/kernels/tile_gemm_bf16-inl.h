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

#include "kernels/tile_gemm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {

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
#endif  // HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_TILE_GEMM_BF16_INL_H_
