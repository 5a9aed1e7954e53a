// The process-wide choice of how the bf16 forward gives P to P·V (split in two bf16 parts or
// rounded): each setting's decision for tiles and vdpbf16ps, and the status line benchmarks print.
#include "attn/kernels/bfloat16_probabilities.hpp"

#include <gtest/gtest.h>

#include <string>

#include "scoped_bf16_products.hpp"

namespace attn {
namespace {

using testing::ScopedBf16Probabilities;

TEST(Bf16Probabilities, EachSettingDecidesForTilesAndVectors) {
  {
    const ScopedBf16Probabilities rounded(Bf16Probabilities::kRounded);
    EXPECT_FALSE(bf16_probabilities_split(true));
    EXPECT_FALSE(bf16_probabilities_split(false));
    EXPECT_NE(bf16_probabilities_status().find("P rounded to bf16 for P·V"), std::string::npos)
        << bf16_probabilities_status();
  }
  {
    const ScopedBf16Probabilities split(Bf16Probabilities::kSplit);
    EXPECT_TRUE(bf16_probabilities_split(true));
    EXPECT_TRUE(bf16_probabilities_split(false));
    EXPECT_NE(bf16_probabilities_status().find("P in two bf16 parts for P·V"), std::string::npos)
        << bf16_probabilities_status();
  }
  const ScopedBf16Probabilities where_cheap(Bf16Probabilities::kWhereCheap);
  EXPECT_TRUE(bf16_probabilities_split(true));
  EXPECT_FALSE(bf16_probabilities_split(false));
  EXPECT_NE(bf16_probabilities_status().find("two bf16 parts for P·V on AMX tiles, rounded on "
                                             "vdpbf16ps"),
            std::string::npos)
      << bf16_probabilities_status();
}

}  // namespace
}  // namespace attn
