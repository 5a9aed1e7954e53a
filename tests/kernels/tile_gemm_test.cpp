// The fused kernels' register-tiled products (src/kernels/tile_gemm-inl.h) against a double
// reference, on every SIMD target this machine runs: C (=|+=) A·B with A broadcast through any
// strides, row counts that fill whole register tiles and leave each remainder, column counts that
// fill whole column blocks and leave one, two or three vectors, the online softmax's row rescale,
// and the zero-padded columns of a short query tile.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tests/kernels/tile_gemm_test.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// Highway's headers must follow foreach_target.h.
#include <hwy/highway.h>

#include "kernels/tile_gemm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {

// Gemm<kAccumulate> on this target (c_scale null: no rescale).
void EvaluateGemm(bool accumulate, size_t rows, size_t vectors, const float* a, size_t a_row,
                  size_t a_col, const float* b, size_t ldb, size_t depth, float* c, size_t ldc,
                  const float* c_scale) {
  const hn::ScalableTag<float> d;
  if (accumulate) {
    Gemm<true>(d, rows, vectors, a, a_row, a_col, b, ldb, depth, c, ldc, c_scale);
  } else {
    Gemm<false>(d, rows, vectors, a, a_row, a_col, b, ldb, depth, c, ldc);
  }
}

void EvaluateGemmZeroPaddedColumns(size_t rows, size_t vectors, size_t columns, const float* a,
                                   size_t a_row, size_t a_col, const float* b, size_t ldb,
                                   size_t depth, float* c, size_t ldc) {
  GemmZeroPaddedColumns(hn::ScalableTag<float>(), rows, vectors, columns, a, a_row, a_col, b, ldb,
                        depth, c, ldc);
}

// The target's lanes and the rows of its widest register tile (kTileRows<kMaxVectors>).
size_t EvaluateTileLanes() {
  return hn::Lanes(hn::ScalableTag<float>());
}
size_t EvaluateTileRows() {
  return kTileRows<kMaxVectors>;
}

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "every_simd_target.hpp"

namespace attn {
HWY_EXPORT(EvaluateGemm);
HWY_EXPORT(EvaluateGemmZeroPaddedColumns);
HWY_EXPORT(EvaluateTileLanes);
HWY_EXPORT(EvaluateTileRows);
namespace {

class TileGemm : public testing::EverySimdTarget {};

constexpr float kUntouched = -7.0F;  // C's elements past the product's columns keep it

// One product's operands: A (rows × depth, read as a[r·a_row + k·a_col]), B (depth rows of ldb,
// the first `columns` used), C (rows of ldc, filled with `start` where it accumulates).
struct Product {
  size_t rows, columns, depth, a_row, a_col, ldb, ldc;
  std::vector<float> a, b, c, c_scale;
};

// Random operands of magnitude up to `magnitude`; A transposed (a_col > 1) when `a_transposed`, as
// P·V reads Pᵀ; rows of B and C longer than the product's columns.
Product make_product(size_t rows, size_t columns, size_t depth, bool a_transposed, float magnitude,
                     std::mt19937& rng) {
  Product p{rows, columns, depth, 0, 0, columns + 5, columns + 3, {}, {}, {}, {}};
  p.a_row = a_transposed ? 1 : depth + 2;
  p.a_col = a_transposed ? rows + 1 : 1;
  std::uniform_real_distribution<float> value(-magnitude, magnitude);
  p.a.resize(rows * p.a_row + depth * p.a_col + 1);
  for (float& x : p.a) x = value(rng);
  p.b.resize(depth * p.ldb + 1);
  for (float& x : p.b) x = value(rng);
  p.c.resize(rows * p.ldc + 1, kUntouched);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t j = 0; j < columns; ++j) p.c[r * p.ldc + j] = value(rng);
  }
  std::uniform_real_distribution<float> factor(0.0F, 1.0F);  // exp(old max − new max) ∈ [0, 1]
  p.c_scale.resize(rows);
  for (float& x : p.c_scale) x = factor(rng);
  return p;
}

// Each element of the product against the double sum (plus, when accumulating, C's start times
// the row's scale): the float32 result of a chain of `depth` multiply-adds lies within
// (depth + 2)·2⁻²⁴ of the sum of the terms' magnitudes (each step rounds once, to a value no
// larger than that sum); elements past the columns keep their value.
void expect_product(const Product& p, const std::vector<float>& start, bool accumulate, bool scaled,
                    const std::string& what) {
  const double unit = std::ldexp(1.0, -24);
  for (size_t r = 0; r < p.rows; ++r) {
    for (size_t j = 0; j < p.ldc; ++j) {
      const float got = p.c[r * p.ldc + j];
      if (j >= p.columns) {
        ASSERT_EQ(got, start[r * p.ldc + j])
            << what << ": written past the columns, (" << r << ", " << j << ")";
        continue;
      }
      double sum = 0.0, magnitude = 0.0;
      if (accumulate) {
        const double kept = static_cast<double>(start[r * p.ldc + j]) *
                            (scaled ? static_cast<double>(p.c_scale[r]) : 1.0);
        sum = kept;
        magnitude = std::abs(kept);
      }
      for (size_t k = 0; k < p.depth; ++k) {
        const double term = static_cast<double>(p.a[r * p.a_row + k * p.a_col]) *
                            static_cast<double>(p.b[k * p.ldb + j]);
        sum += term;
        magnitude += std::abs(term);
      }
      const double bound = static_cast<double>(p.depth + 2) * unit * magnitude;
      ASSERT_LE(std::abs(static_cast<double>(got) - sum), bound)
          << what << ": element (" << r << ", " << j << ") is " << got << ", the sum " << sum;
    }
  }
}

// Every row count from one to past two register tiles (each remainder block), column counts of
// one to nine vectors (whole column blocks of four and one, two or three left), depths of 0, 1,
// odd and the kernels' key tile, A read directly and transposed; assigning and accumulating, with
// and without the rescale.
TEST_P(TileGemm, MatchesTheDoubleReferenceForEveryShape) {
  const size_t lanes = HWY_DYNAMIC_DISPATCH(EvaluateTileLanes)();
  const size_t tile_rows = HWY_DYNAMIC_DISPATCH(EvaluateTileRows)();
  std::mt19937 rng(14);
  for (size_t rows = 1; rows <= 2 * tile_rows + 1; ++rows) {
    for (const size_t vectors :
         {size_t{1}, size_t{2}, size_t{3}, size_t{4}, size_t{5}, size_t{9}}) {
      for (const size_t depth : {size_t{0}, size_t{1}, size_t{7}, size_t{64}}) {
        for (const bool a_transposed : {false, true}) {
          for (const int mode : {0, 1, 2}) {  // assign, accumulate, accumulate rescaled
            Product p = make_product(rows, vectors * lanes, depth, a_transposed, 1.0F, rng);
            const std::vector<float> start = p.c;
            const bool accumulate = mode > 0, scaled = mode == 2;
            HWY_DYNAMIC_DISPATCH(EvaluateGemm)
            (accumulate, rows, vectors, p.a.data(), p.a_row, p.a_col, p.b.data(), p.ldb, depth,
             p.c.data(), p.ldc, scaled ? p.c_scale.data() : nullptr);
            expect_product(p, start, accumulate, scaled,
                           std::string("target ") + hwy::TargetName(GetParam()) + ", " +
                               std::to_string(rows) + " rows × " + std::to_string(vectors) +
                               " vectors, depth " + std::to_string(depth) +
                               (a_transposed ? ", A transposed" : "") +
                               (mode == 0   ? ", assigned"
                                : mode == 1 ? ", accumulated"
                                            : ", accumulated and rescaled"));
          }
        }
      }
    }
  }
}

// Large magnitudes (scores near float's range before the softmax) keep the same relative bound:
// nothing is scaled or summed in an order that overflows first.
TEST_P(TileGemm, KeepsItsBoundAtLargeMagnitudes) {
  const size_t lanes = HWY_DYNAMIC_DISPATCH(EvaluateTileLanes)();
  std::mt19937 rng(3);
  Product p = make_product(7, 4 * lanes, 64, false, 1.0e17F, rng);  // terms up to 1e34
  const std::vector<float> start = p.c;
  HWY_DYNAMIC_DISPATCH(EvaluateGemm)
  (true, p.rows, 4, p.a.data(), p.a_row, p.a_col, p.b.data(), p.ldb, p.depth, p.c.data(), p.ldc,
   p.c_scale.data());
  expect_product(p, start, true, true,
                 std::string("target ") + hwy::TargetName(GetParam()) + ", |terms| ≤ 1e34");
  for (size_t r = 0; r < p.rows; ++r) {
    for (size_t j = 0; j < p.columns; ++j) ASSERT_TRUE(std::isfinite(p.c[r * p.ldc + j]));
  }
}

// A short query tile: only the vectors holding one of the first `columns` columns are multiplied
// (B's later columns are zero padding), the others of the tile's `vectors` get zeros, and nothing
// past them is written.
TEST_P(TileGemm, ZeroPaddedColumnsGiveTheWholeProduct) {
  const size_t lanes = HWY_DYNAMIC_DISPATCH(EvaluateTileLanes)();
  std::mt19937 rng(5);
  const size_t vectors = 4, width = vectors * lanes;
  for (const size_t columns : {size_t{1}, lanes - 1, lanes, lanes + 1, 3 * lanes + 2, width}) {
    if (columns == 0 || columns > width) continue;
    Product p = make_product(13, width, 9, false, 1.0F, rng);
    for (size_t k = 0; k < p.depth; ++k) {
      for (size_t j = columns; j < width; ++j) p.b[k * p.ldb + j] = 0.0F;  // the padding lanes
    }
    for (float& x : p.c) x = x == kUntouched ? kUntouched : std::numeric_limits<float>::quiet_NaN();
    std::vector<float> start = p.c;
    HWY_DYNAMIC_DISPATCH(EvaluateGemmZeroPaddedColumns)
    (p.rows, vectors, columns, p.a.data(), p.a_row, p.a_col, p.b.data(), p.ldb, p.depth, p.c.data(),
     p.ldc);
    // Assigned, so the NaNs that C held before are gone from every column of the tile.
    expect_product(p, start, false, false,
                   std::string("target ") + hwy::TargetName(GetParam()) + ", " +
                       std::to_string(columns) + " of " + std::to_string(width) + " columns");
  }
}

ATTN_INSTANTIATE_FOR_EVERY_SIMD_TARGET(TileGemm);

}  // namespace
}  // namespace attn
#endif  // HWY_ONCE
