// The kernels' tile transpose (src/kernels/transpose_tile-inl.h) against the plain definition
// out[t·br + r] = scale·rows[r·stride + t], zeros in the padding lanes, on every SIMD target this
// machine runs: row counts and column counts that are and are not multiples of the 4 × 4 blocks.
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
                                 float scale, size_t br, float* out) {
  TransposeScaledTile(rows, stride, count, cols, scale, br, out);
}

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <vector>

#include "every_simd_target.hpp"

namespace attn {
HWY_EXPORT(EvaluateTransposeScaledTile);
namespace {

class TransposeTile : public testing::EverySimdTarget {};

// Exact equality: each output is one product of an input by the scale, as in the definition.
TEST_P(TransposeTile, MatchesTheDefinitionForEveryShape) {
  const size_t br = 16;
  for (const size_t count : {size_t{0}, size_t{1}, size_t{3}, size_t{4}, size_t{13}, size_t{16}}) {
    for (const size_t cols : {size_t{1}, size_t{4}, size_t{7}, size_t{64}, size_t{65}}) {
      const size_t stride = cols + 3;  // rows apart by more than their length
      std::vector<float> rows(count * stride + 1);
      for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i % 97) - 48.5F;
      std::vector<float> out(cols * br, -7.0F);
      const float scale = 0.125F;
      HWY_DYNAMIC_DISPATCH(EvaluateTransposeScaledTile)
      (rows.data(), stride, count, cols, scale, br, out.data());
      for (size_t t = 0; t < cols; ++t) {
        for (size_t r = 0; r < br; ++r) {
          const float expected = r < count ? rows[r * stride + t] * scale : 0.0F;
          ASSERT_EQ(out[t * br + r], expected)
              << "target " << hwy::TargetName(GetParam()) << ", " << count << " rows × " << cols
              << " columns, element (" << r << ", " << t << ")";
        }
      }
    }
  }
}

ATTN_INSTANTIATE_FOR_EVERY_SIMD_TARGET(TransposeTile);

}  // namespace
}  // namespace attn
#endif  // HWY_ONCE
