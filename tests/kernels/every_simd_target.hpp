// The fixture of the kernel tests that run on every SIMD target: each target Highway compiled and
// this CPU supports, forced in turn, so every target's code is checked against the reference.
#pragma once

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cstdint>
#include <string>

namespace attn::testing {

class EverySimdTarget : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override { hwy::SetSupportedTargetsForTest(GetParam()); }
  void TearDown() override { hwy::SetSupportedTargetsForTest(0); }
};

inline std::string simd_target_name(const ::testing::TestParamInfo<int64_t>& target_info) {
  return hwy::TargetName(target_info.param);
}

}  // namespace attn::testing

// Runs the tests of `suite`, a fixture derived from EverySimdTarget, once per target.
#define ATTN_INSTANTIATE_FOR_EVERY_SIMD_TARGET(suite)                                \
  INSTANTIATE_TEST_SUITE_P(EveryTarget, suite,                                       \
                           ::testing::ValuesIn(hwy::SupportedAndGeneratedTargets()), \
                           ::attn::testing::simd_target_name)
