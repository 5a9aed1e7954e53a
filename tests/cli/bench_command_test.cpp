// End-to-end test of `attn bench`: a smoke run at tiny sizes measures its ceilings and every
// case, prints one table row per case, and writes the same figures as JSON.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "cli_fixture.hpp"

namespace attn {
namespace {

const std::string kTinyBench =
    "bench --sizes 40 --threads 1 --batch 2 --heads 2 --head-dim 8 --repeats 1 --json-out b.json";

TEST_F(CliTest, BenchMeasuresEveryCaseAndWritesTheSameFiguresAsJson) {
  const CommandResult result = attn(kTinyBench);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json report = nlohmann::json::parse(read_text(path("b.json")));
  ASSERT_EQ(report["fma_peak"].size(), 1U);
  EXPECT_GT(report["fma_peak"][0]["gflops"].get<double>(), 0.0);
  EXPECT_EQ(report["shape"]["batch"], 2);
  EXPECT_EQ(report["shape"]["window"], 256);
  std::set<std::string> cases;
  for (const nlohmann::json& row : report["cases"]) {
    const std::string name = row["case"];
    cases.insert(name);
    EXPECT_EQ(row["n"], 40) << name;
    EXPECT_EQ(row["threads"], 1) << name;
    EXPECT_GT(row["ms"].get<double>(), 0.0) << name;
    EXPECT_GT(row["gflops"].get<double>(), 0.0) << name;
    EXPECT_GE(row["extra_bytes"].get<double>(), 0.0) << name;
    EXPECT_NE(result.out.find(name + " "), std::string::npos) << name << " missing from\n"
                                                              << result.out;
    if (name.find("padded") != std::string::npos || name == "fused-mask-bool") {
      ASSERT_EQ(row["padding_lengths"].size(), 2U) << name;  // one valid length per batch element
      for (const nlohmann::json& length : row["padding_lengths"]) {
        EXPECT_GE(length.get<int>(), 1);
        EXPECT_LE(length.get<int>(), 40);
      }
    }
    if (row["path"] == "plain") {
      EXPECT_DOUBLE_EQ(row["speedup_vs_plain"].get<double>(), 1.0) << name;
    }
    // The functional API's cases compare with its unmasked one, fused-sdpa.
    const std::string workload = row["workload"];
    if (workload.rfind("sdpa-", 0) == 0) {
      EXPECT_GT(row["speedup_vs_sdpa"].get<double>(), 0.0) << name;
    } else {
      EXPECT_TRUE(row["speedup_vs_sdpa"].is_null()) << name;
    }
  }
  for (const char* name :
       {"fused", "plain", "fused-padded", "plain-padded", "fused-causal", "plain-causal",
        "fused-backward", "plain-backward", "fused-mha", "fused-sdpa", "fused-window",
        "fused-mask-bool", "fused-mask-causal", "fused-mask-float", "fused-gqa", "fused-additive",
        "plain-additive", "fused-add-backward", "plain-add-backward"})
    EXPECT_TRUE(cases.contains(name)) << name;
  EXPECT_NE(result.out.find("functional API: fused-sdpa's time"), std::string::npos)
      << result.out;
  EXPECT_NE(result.out.find("FMA peak, 1 thread(s):"), std::string::npos) << result.out;
}

// Useful flops count only the pairs a window or mask lets through: at n = 40 and a window of 7,
// fused-window does Σ_i min(i + 1, 8) of fused-sdpa's 40 · 40 pairs, and the causal mask
// 40 · 41 / 2 of them. --no-ceilings leaves the FMA peak and sgemm out.
TEST_F(CliTest, BenchCountsOnlyThePairsAWindowOrMaskLetsThrough) {
  const CommandResult result =
      attn("bench --sizes 40 --threads 1 --batch 2 --heads 4 --head-dim 8 --repeats 1 --window 7 "
           "--cases fused-sdpa,fused-window,fused-mask-causal,fused-mask-float,fused-gqa --json "
           "--no-ceilings");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json report = nlohmann::json::parse(result.out);
  EXPECT_EQ(report["shape"]["window"], 7);
  EXPECT_TRUE(report["fma_peak"].empty());
  EXPECT_TRUE(report["sgemm"].empty());
  std::map<std::string, double> flops;  // GFLOP/s · ms: the useful flops, up to a constant
  for (const nlohmann::json& row : report["cases"]) {
    flops[row["case"]] = row["gflops"].get<double>() * row["ms"].get<double>();
    EXPECT_TRUE(row["peak_fraction"].is_null()) << row["case"];
  }
  ASSERT_EQ(flops.size(), 5U);
  double window_pairs = 0.0;
  for (int i = 0; i < 40; ++i) window_pairs += std::min(i + 1, 8);
  EXPECT_NEAR(flops["fused-window"] / flops["fused-sdpa"], window_pairs / 1600.0, 1e-9);
  EXPECT_NEAR(flops["fused-mask-causal"] / flops["fused-sdpa"], 820.0 / 1600.0, 1e-9);
  EXPECT_NEAR(flops["fused-mask-float"] / flops["fused-sdpa"], 1.0, 1e-9);
  EXPECT_NEAR(flops["fused-gqa"] / flops["fused-sdpa"], 1.0, 1e-9);
}

TEST_F(CliTest, BenchRejectsUnknownCasesAndBadSizes) {
  expect_error("bench --cases nope", "--cases: expected one of fused, plain");
  expect_error("bench --sizes 0", "--sizes");
  expect_error("bench --threads 0", "--threads");
  expect_error("bench --window -1", "--window");
}

}  // namespace
}  // namespace attn
