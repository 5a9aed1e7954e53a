// Register-tiled matrix products for the fused attention kernels, per SIMD target (a Highway
// "-inl.h" header: included once per target from a foreach_target translation unit).
//
// Every product the forward and backward passes need has the form C (=|+=) A·B where B's rows are
// contiguous vectors (packed Qᵀ, dOᵀ, or K, V, Q, dO rows) and A's elements are broadcast from any
// strides — so transposes of A cost nothing and only B ever needs packing.

#if defined(ATTN_KERNELS_TILE_GEMM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_TILE_GEMM_INL_H_
#undef ATTN_KERNELS_TILE_GEMM_INL_H_
#else
#define ATTN_KERNELS_TILE_GEMM_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Register tile for this target: MR rows of broadcast scalars × NR vectors of columns. AVX-512 has
// 32 vector registers: 6 × 4 accumulators, the 4 B vectors of a step and a broadcast. AVX2 has 16:
// 3 × 4 accumulators, the 3 broadcasts of a step and one B vector at a time (kBroadcastFirst),
// where loading all 4 B vectors would spill (1.18-1.26x the 2 × 4 tile on Zen 5 capped at AVX2).
// SSE4 has no FMA: each multiply-add needs a temporary register, so it keeps 2 × 4 (3 × 4 was 15%
// slower).
constexpr size_t kMaxRows = HWY_MAX_BYTES >= 64 ? 6 : HWY_MAX_BYTES == 32 ? 3 : 2;
constexpr size_t kMaxVectors = 4;
constexpr bool kBroadcastFirst = HWY_MAX_BYTES == 32;
// Rows of the tile for NR vectors: a product one vector wide (a short tile's scores, a head size
// of one vector) takes twice the rows, so that as many multiply-adds as with two vectors are in
// flight: at kMaxRows its 6 accumulators' chains (and a remainder block's fewer) left the FMA
// units idle for most of their 4-cycle latency (a (1, 8, 8, 64) forward and backward call, whose
// score products are one vector wide: 12.2 → 11.6 µs, Zen 5).
template <size_t NR>
constexpr size_t kTileRows = NR == 1 ? 2 * kMaxRows : kMaxRows;
// Rows that the fused kernels' products over a key tile crossed by key ranges (the causal
// diagonal, a window's edge) take a band at a time, each band multiplying only what its rows see:
// four register tiles' rows.
constexpr size_t kVisibleBand = 4 * kMaxRows;

// Makes the compiler hold these vectors in registers from here on, so that it does not fold a
// vector's load into each instruction that uses it (a memory operand per multiply-add: GCC 12
// does, and x86 cores load at most two or three vectors a cycle).
template <class V>
HWY_INLINE void KeepInRegister(V& vector) {
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128 && \
    (defined(__GNUC__) || defined(__clang__))
  asm("" : "+v"(vector.raw));
#else
  (void)vector;
#endif
}
template <class... V>
HWY_INLINE void KeepInRegisters(V&... vectors) {
  (KeepInRegister(vectors), ...);
}

// C[r, v·N …] (= or +=) Σ_k A(r, k) · B[k, v·N …] for r < MR, v < NR, where A(r, k) is the scalar
// a[r·a_row + k·a_col] (broadcast) and B's rows are ldb apart; C's rows are ldc apart. When
// accumulating with `c_scale`, row r of C is first multiplied by c_scale[r] (the online softmax's
// rescaling, folded into the load C needs anyway).
template <size_t MR, size_t NR, bool kAccumulate, class D>
HWY_INLINE void MicroKernel(D d, const float* HWY_RESTRICT a, size_t a_row, size_t a_col,
                            const float* HWY_RESTRICT b, size_t ldb, size_t depth,
                            float* HWY_RESTRICT c, size_t ldc, const float* c_scale) {
  using V = hn::Vec<D>;
  const size_t lanes = hn::Lanes(d);
  V acc[MR][NR];
  for (size_t r = 0; r < MR; ++r) {
    for (size_t v = 0; v < NR; ++v) {
      if constexpr (kAccumulate) {
        acc[r][v] = hn::LoadU(d, c + r * ldc + v * lanes);
        if (c_scale != nullptr) acc[r][v] = hn::Mul(acc[r][v], hn::Set(d, c_scale[r]));
      } else {
        acc[r][v] = hn::Zero(d);
      }
    }
  }
  for (size_t k = 0; k < depth; ++k) {
    const float* HWY_RESTRICT b_row = b + k * ldb;
    if constexpr (kBroadcastFirst) {
      V a_scalars[MR];
      for (size_t r = 0; r < MR; ++r) a_scalars[r] = hn::Set(d, a[r * a_row + k * a_col]);
      for (size_t v = 0; v < NR; ++v) {
        V b_vector = hn::LoadU(d, b_row + v * lanes);
        // One load for the MR multiply-adds: GCC 12 folded it into each of a 2-row remainder's
        // multiply-adds, two 256-bit loads a pair that Zen 4's two load pipes could not keep up
        // with (P·V's 2-row block of a 32-query tile: 8.1 → 6.5% of its samples for 6.25% of its
        // multiply-adds, Zen 4 capped at AVX2).
        if constexpr (MR >= 2) KeepInRegister(b_vector);
        for (size_t r = 0; r < MR; ++r) acc[r][v] = hn::MulAdd(a_scalars[r], b_vector, acc[r][v]);
      }
    } else {
      V b_vectors[NR];
      for (size_t v = 0; v < NR; ++v) b_vectors[v] = hn::LoadU(d, b_row + v * lanes);
      for (size_t r = 0; r < MR; ++r) {
        const V a_scalar = hn::Set(d, a[r * a_row + k * a_col]);
        for (size_t v = 0; v < NR; ++v) acc[r][v] = hn::MulAdd(a_scalar, b_vectors[v], acc[r][v]);
      }
    }
  }
  for (size_t r = 0; r < MR; ++r) {
    for (size_t v = 0; v < NR; ++v) hn::StoreU(acc[r][v], d, c + r * ldc + v * lanes);
  }
}

// MicroKernel for the `rows` < kTileRows<NR> rows a block of kTileRows<NR> leaves, rows ≥ kRows.
template <size_t kRows, size_t NR, bool kAccumulate, class D>
HWY_INLINE void RemainderRows(D d, size_t rows, const float* a, size_t a_row, size_t a_col,
                              const float* b, size_t ldb, size_t depth, float* c, size_t ldc,
                              const float* c_scale) {
  if constexpr (kRows < kTileRows<NR>) {
    if (rows == kRows) {
      MicroKernel<kRows, NR, kAccumulate>(d, a, a_row, a_col, b, ldb, depth, c, ldc, c_scale);
    } else {
      RemainderRows<kRows + 1, NR, kAccumulate>(d, rows, a, a_row, a_col, b, ldb, depth, c, ldc,
                                                c_scale);
    }
  }
}

// The same for any number of rows (< kTileRows<NR> after the full blocks) and NR vectors.
template <size_t NR, bool kAccumulate, class D>
HWY_INLINE void RowBlocks(D d, size_t rows, const float* a, size_t a_row, size_t a_col,
                          const float* b, size_t ldb, size_t depth, float* c, size_t ldc,
                          const float* c_scale) {
  constexpr size_t kRows = kTileRows<NR>;
  size_t r = 0;
  for (; r + kRows <= rows; r += kRows) {
    MicroKernel<kRows, NR, kAccumulate>(d, a + r * a_row, a_row, a_col, b, ldb, depth, c + r * ldc,
                                        ldc, c_scale ? c_scale + r : nullptr);
  }
  const size_t left = rows - r;
  const float* a_left = a + r * a_row;
  float* c_left = c + r * ldc;
  const float* scale_left = c_scale ? c_scale + r : nullptr;
  if (left > 0)
    RemainderRows<1, NR, kAccumulate>(d, left, a_left, a_row, a_col, b, ldb, depth, c_left, ldc,
                                      scale_left);
}

// C (rows × vectors·N) (= or +=) A · B for any vector count, in column blocks of kMaxVectors;
// `c_scale` (rows values, or null) as in MicroKernel.
template <bool kAccumulate, class D>
HWY_NOINLINE void Gemm(D d, size_t rows, size_t vectors, const float* a, size_t a_row, size_t a_col,
                       const float* b, size_t ldb, size_t depth, float* c, size_t ldc,
                       const float* c_scale = nullptr) {
  const size_t lanes = hn::Lanes(d);
  size_t v = 0;
  for (; v + kMaxVectors <= vectors; v += kMaxVectors) {
    RowBlocks<kMaxVectors, kAccumulate>(d, rows, a, a_row, a_col, b + v * lanes, ldb, depth,
                                        c + v * lanes, ldc, c_scale);
  }
  const size_t left = vectors - v;
  const float* b_left = b + v * lanes;
  float* c_left = c + v * lanes;
  if (left == 1)
    RowBlocks<1, kAccumulate>(d, rows, a, a_row, a_col, b_left, ldb, depth, c_left, ldc, c_scale);
  if (left == 2)
    RowBlocks<2, kAccumulate>(d, rows, a, a_row, a_col, b_left, ldb, depth, c_left, ldc, c_scale);
  if (left == 3)
    RowBlocks<3, kAccumulate>(d, rows, a, a_row, a_col, b_left, ldb, depth, c_left, ldc, c_scale);
}

// Of a row of `vectors` vectors, those holding one of its first `columns` elements: the query
// vectors of a tile with `columns` real queries (and padding lanes after them).
template <class D>
HWY_INLINE size_t VectorsHolding(D d, size_t columns, size_t vectors) {
  return std::min(vectors, (columns + hn::Lanes(d) - 1) / hn::Lanes(d));
}

// Gemm<false> for a B whose columns from `columns` on are zero (the padding lanes of a query
// tile's Qᵀ or dOᵀ): only the vectors holding one of the first `columns` are multiplied, and C's
// other vectors get the zeros they would have summed. A tile of n ≤ 16 queries, or the last tile of
// a ragged n, skips up to 3/4 of its score products (n = 16, 8 heads of 64: the forward 21 → 15 µs,
// Zen 4).
template <class D>
HWY_INLINE void GemmZeroPaddedColumns(D d, size_t rows, size_t vectors, size_t columns,
                                      const float* a, size_t a_row, size_t a_col, const float* b,
                                      size_t ldb, size_t depth, float* c, size_t ldc) {
  const size_t lanes = hn::Lanes(d);
  const size_t used = VectorsHolding(d, columns, vectors);
  Gemm<false>(d, rows, used, a, a_row, a_col, b, ldb, depth, c, ldc);
  if (used == vectors) return;
  // A fill per row: whole zero vectors per row (as TransposeScaledTile stores its padding) measured
  // slower here (n = 16, 8 heads: forward 13.6 → 14.8 µs, backward 31.5 → 33.6 µs, Zen 4).
  for (size_t r = 0; r < rows; ++r)
    std::fill(c + r * ldc + used * lanes, c + r * ldc + vectors * lanes, 0.0F);
}

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#endif  // ATTN_KERNELS_TILE_GEMM_INL_H_
