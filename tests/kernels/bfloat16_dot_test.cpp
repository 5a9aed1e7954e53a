// The process-wide choice between vdpbf16ps and widening bf16 to fp32: each setting's effect, the
// CPU property it rests on (against /proc/cpuinfo's vendor), and the status line benchmarks print.
#include "attn/kernels/bfloat16_dot.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "scoped_bf16_products.hpp"

namespace attn {
namespace {

using testing::ScopedBf16DotUse;

// The first "vendor_id" line of /proc/cpuinfo ("AuthenticAMD", "GenuineIntel"), or "" without one.
std::string vendor_from_cpuinfo() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("vendor_id", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "";
}

TEST(Bf16Dot, EachSettingDecidesWhereTheCpuHasTheInstruction) {
  {
    const ScopedBf16DotUse never(Bf16DotUse::kNever);
    EXPECT_FALSE(bf16_dot_in_use());
    if (bf16_dot_available()) {
      EXPECT_NE(bf16_dot_status().find("turned off"), std::string::npos);
    }
  }
  {
    const ScopedBf16DotUse always(Bf16DotUse::kAlways);
    EXPECT_EQ(bf16_dot_in_use(), bf16_dot_available());
  }
  const ScopedBf16DotUse where_faster(Bf16DotUse::kWhereFaster);
  EXPECT_EQ(bf16_dot_in_use(), bf16_dot_outpaces_fma());
  const std::string status = bf16_dot_status();
  if (!bf16_dot_available()) {
    EXPECT_EQ(status, "no AVX512-BF16: bf16 widened to fp32");
  } else if (bf16_dot_outpaces_fma()) {
    EXPECT_EQ(status, "bf16 products on vdpbf16ps");
  } else {
    EXPECT_NE(status.find("slower than fp32 FMAs here"), std::string::npos) << status;
  }
}

// Only AMD's cores run vdpbf16ps faster than fp32 FMAs (bfloat16_dot.hpp); Intel's widen.
TEST(Bf16Dot, OutpacesFmaOnlyOnAmdCpusWithTheInstruction) {
  const std::string vendor = vendor_from_cpuinfo();
  if (vendor.empty()) GTEST_SKIP() << "no vendor_id in /proc/cpuinfo on this system";
  EXPECT_EQ(bf16_dot_outpaces_fma(), bf16_dot_available() && vendor == "AuthenticAMD") << vendor;
}

}  // namespace
}  // namespace attn
