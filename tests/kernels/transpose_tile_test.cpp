// The kernels' tile transpose (src/kernels/transpose_tile-inl.h) against the plain definition
// out[t·br + r] = scale·rows[r·stride + t], zeros in the padding lanes, on every SIMD target this
// machine runs: row counts and column counts that are and are not multiples of the 4 × 4 blocks;
// and the 16 × 16 word transpose on the AVX-512 targets.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tests/kernels/transpose_tile_test.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// Highway's headers must follow foreach_target.h.
#include <hwy/highway.h>

#include "kernels/transpose_tile-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {

void EvaluateTransposeScaledTile(const float* rows, size_t stride, size_t count, size_t cols,
                                 float scale, size_t br, size_t width, float* out) {
  TransposeScaledTile(rows, stride, count, cols, scale, br, width, out);
}

size_t EvaluateLanes() {
  return hn::Lanes(hn::ScalableTag<float>());
}

// False where TransposeWords16 is not compiled (below AVX-512).
bool EvaluateTransposeWords16(const uint32_t* in, size_t in_stride, uint32_t* out,
                              size_t out_stride) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  TransposeWords16(in, in_stride, out, out_stride);
  return true;
#else
  (void)in, (void)in_stride, (void)out, (void)out_stride;
  return false;
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "every_simd_target.hpp"

namespace attn {
HWY_EXPORT(EvaluateTransposeScaledTile);
HWY_EXPORT(EvaluateTransposeWords16);
HWY_EXPORT(EvaluateLanes);
namespace {

class TransposeTile : public testing::EverySimdTarget {};

// Exact equality: each output is one product of an input by the scale, as in the definition; tiles
// of one vector and of several (the kernels' 4 vectors: 64 lanes on AVX-512), padding lanes from
// part of a vector to several whole ones, zeros up to the given width (the vectors holding a query,
// or all of them) and nothing written past it.
TEST_P(TransposeTile, MatchesTheDefinitionForEveryShape) {
  constexpr size_t kGuard = 32;
  constexpr float kUntouched = -7.0F;
  const size_t lanes = HWY_DYNAMIC_DISPATCH(EvaluateLanes)();
  for (const size_t br : {size_t{16}, size_t{64}}) {
    for (const size_t count : {0, 1, 3, 4, 13, 16, 17, 33, 50, 64}) {
      if (count > br || br % lanes != 0) continue;
      const size_t holding = std::min(br, (count + lanes - 1) / lanes * lanes);
      for (const size_t width : {holding, br}) {
        for (const size_t cols : {size_t{1}, size_t{4}, size_t{7}, size_t{64}, size_t{65}}) {
          const size_t stride = cols + 3;  // rows apart by more than their length
          std::vector<float> rows(count * stride + 1);
          for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i % 97) - 48.5F;
          std::vector<float> out(cols * br + kGuard, kUntouched);
          const float scale = 0.125F;
          HWY_DYNAMIC_DISPATCH(EvaluateTransposeScaledTile)
          (rows.data(), stride, count, cols, scale, br, width, out.data());
          for (size_t t = 0; t < cols; ++t) {
            for (size_t r = 0; r < br; ++r) {
              const float expected = r < count   ? rows[r * stride + t] * scale
                                     : r < width ? 0.0F
                                                 : kUntouched;
              ASSERT_EQ(out[t * br + r], expected)
                  << "target " << hwy::TargetName(GetParam()) << ", " << count << " rows × " << cols
                  << " columns in a tile of " << br << " lanes, zeros to lane " << width
                  << ", element (" << r << ", " << t << ")";
            }
          }
          for (size_t i = cols * br; i < out.size(); ++i)
            ASSERT_EQ(out[i], kUntouched) << "written past the tile: " << count << " rows × "
                                          << cols << " columns, " << br << " lanes";
        }
      }
    }
  }
}

// Exact: a 16 × 16 block of words moved, strides longer than the block, nothing written past it.
TEST_P(TransposeTile, WordsBlockMatchesTheDefinition) {
  std::vector<uint32_t> in(16 * 21), out(16 * 19, 7U);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint32_t>(i * 2654435761U);
  if (!HWY_DYNAMIC_DISPATCH(EvaluateTransposeWords16)(in.data(), 21, out.data(), 19))
    GTEST_SKIP() << "the word transpose is compiled for the AVX-512 targets only";
  for (size_t r = 0; r < 16; ++r) {
    for (size_t c = 0; c < 16; ++c) ASSERT_EQ(out[c * 19 + r], in[r * 21 + c]) << r << ", " << c;
    for (size_t c = 16; c < 19; ++c) ASSERT_EQ(out[r * 19 + c], 7U) << "past the block: " << c;
  }
}

ATTN_INSTANTIATE_FOR_EVERY_SIMD_TARGET(TransposeTile);

}  // namespace
}  // namespace attn
#endif  // HWY_ONCE
