// The kernels' SIMD target and its cap (limit_simd_target): the cap reaches the kernels' dispatch,
// "best" lifts it, and any other name is a clear error.
#include "attn/kernels/simd_target.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/kernels/flash_attention.hpp"
#include "scoped_bf16_products.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

class SimdTarget : public ::testing::Test {
 protected:
  void TearDown() override { limit_simd_target("best"); }
};

TEST_F(SimdTarget, TheKernelsRunTheBestAvailableTargetUntilCapped) {
  const std::vector<std::string> available = available_simd_targets();
  ASSERT_FALSE(available.empty());
  EXPECT_EQ(simd_target(), available.front());
}

TEST_F(SimdTarget, EveryAvailableTargetCanBeChosenAndBestLiftsTheCap) {
  const std::vector<std::string> available = available_simd_targets();
  for (const std::string& name : available) {
    limit_simd_target(name);
    EXPECT_EQ(simd_target(), name);
    // The cap leaves the list of what this CPU runs alone, so a better target can be chosen next.
    EXPECT_EQ(available_simd_targets(), available);
  }
  std::string lower = available.back();
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  limit_simd_target(lower);
  EXPECT_EQ(simd_target(), available.back());
  limit_simd_target("BeSt");
  EXPECT_EQ(simd_target(), available.front());
}

// The bf16 kernel's dot-product instructions exist only on the AVX-512 targets: under an AVX2 cap
// the kernels must not reach them (Highway caches its dispatch; the cap has to reset it).
TEST_F(SimdTarget, TheCapReachesTheKernelsDispatch) {
  const std::vector<std::string> available = available_simd_targets();
  const testing::ScopedBf16DotUse dot(Bf16DotUse::kAlways);  // vdpbf16ps wherever the CPU has it
  if (!flash_attention_bfloat16_native(20)) {
    GTEST_SKIP() << "this CPU has no AVX512-BF16: the kernels' choice is not observable here";
  }
  ASSERT_NE(std::find(available.begin(), available.end(), "AVX2"), available.end());
  limit_simd_target("AVX2");
  EXPECT_FALSE(flash_attention_bfloat16_native(20));
  limit_simd_target("best");
  EXPECT_TRUE(flash_attention_bfloat16_native(20));
}

TEST_F(SimdTarget, UnknownNamesAreRefusedWithTheChoices) {
  const std::string first = available_simd_targets().front();
  EXPECT_THROW_MESSAGE(limit_simd_target("avx9"), ValueError,
                       "simd target name: expected one of " + first);
  EXPECT_THROW_MESSAGE(limit_simd_target(""), ValueError, "got ''");
  EXPECT_EQ(simd_target(), first);  // a refused name leaves the kernels as they were
}

}  // namespace
}  // namespace attn
