// The process-wide choice of how the bf16 forward gives P to P·V (split in two bf16 parts or
// rounded): each setting's decision for tiles and vdpbf16ps, and the status line benchmarks print
// (what runs under each product family).
#include "attn/kernels/bfloat16_probabilities.hpp"

#include <gtest/gtest.h>

#include <string>

#include "scoped_bf16_products.hpp"

namespace attn {
namespace {

using testing::ScopedAmxUse;
using testing::ScopedBf16DotUse;
using testing::ScopedBf16Probabilities;

TEST(Bf16Probabilities, EachSettingDecidesForTilesAndVectors) {
  {
    const ScopedBf16Probabilities rounded(Bf16Probabilities::kRounded);
    EXPECT_FALSE(bf16_probabilities_split(true));
    EXPECT_FALSE(bf16_probabilities_split(false));
  }
  {
    const ScopedBf16Probabilities split(Bf16Probabilities::kSplit);
    EXPECT_TRUE(bf16_probabilities_split(true));
    EXPECT_TRUE(bf16_probabilities_split(false));
  }
  const ScopedBf16Probabilities where_cheap(Bf16Probabilities::kWhereCheap);
  EXPECT_TRUE(bf16_probabilities_split(true));
  EXPECT_FALSE(bf16_probabilities_split(false));
}

// The status line says what runs: each choice on the tile model, on vdpbf16ps, and widened.
TEST(Bf16Probabilities, StatusSaysWhatRunsHere) {
  const auto status_under = [](AmxUse amx, Bf16DotUse dot, Bf16Probabilities choice) {
    const ScopedAmxUse tiles(amx);
    const ScopedBf16DotUse vectors(dot);
    const ScopedBf16Probabilities probabilities(choice);
    return bf16_probabilities_status();
  };
  EXPECT_EQ(status_under(AmxUse::kNever, Bf16DotUse::kNever, Bf16Probabilities::kRounded),
            "bf16 widened to fp32: P in fp32 for P·V");
  if (!bf16_dot_available()) GTEST_SKIP() << "no AVX512-BF16: bf16 always widens here";
  EXPECT_EQ(status_under(AmxUse::kModel, Bf16DotUse::kNever, Bf16Probabilities::kWhereCheap),
            "bf16 P in two bf16 parts for P·V on AMX tiles");
  EXPECT_EQ(status_under(AmxUse::kModel, Bf16DotUse::kNever, Bf16Probabilities::kRounded),
            "bf16 P rounded to bf16 for P·V on AMX tiles");
  EXPECT_EQ(status_under(AmxUse::kNever, Bf16DotUse::kAlways, Bf16Probabilities::kWhereCheap),
            "bf16 P rounded to bf16 for P·V on vdpbf16ps");
  EXPECT_EQ(status_under(AmxUse::kNever, Bf16DotUse::kAlways, Bf16Probabilities::kSplit),
            "bf16 P in two bf16 parts for P·V on vdpbf16ps");
}

}  // namespace
}  // namespace attn
