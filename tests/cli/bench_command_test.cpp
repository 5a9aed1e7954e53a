// End-to-end test of `attn bench`: a smoke run at tiny sizes measures its ceilings and every
// case, prints one table row per case, and writes the same figures as JSON.
#include <gtest/gtest.h>

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
    if (name.find("padded") != std::string::npos) {
      ASSERT_EQ(row["padding_lengths"].size(), 2U) << name;  // one valid length per batch element
      for (const nlohmann::json& length : row["padding_lengths"]) {
        EXPECT_GE(length.get<int>(), 1);
        EXPECT_LE(length.get<int>(), 40);
      }
    }
    if (row["path"] == "plain") {
      EXPECT_DOUBLE_EQ(row["speedup_vs_plain"].get<double>(), 1.0) << name;
    }
  }
  for (const char* name :
       {"fused", "plain", "fused-padded", "plain-padded", "fused-causal", "plain-causal",
        "fused-backward", "plain-backward", "fused-mha", "fused-additive", "plain-additive",
        "fused-add-backward", "plain-add-backward"})
    EXPECT_TRUE(cases.contains(name)) << name;
  EXPECT_NE(result.out.find("FMA peak, 1 thread(s):"), std::string::npos) << result.out;
}

TEST_F(CliTest, BenchRejectsUnknownCasesAndBadSizes) {
  expect_error("bench --cases nope", "--cases: expected one of fused, plain");
  expect_error("bench --sizes 0", "--sizes");
  expect_error("bench --threads 0", "--threads");
}

}  // namespace
}  // namespace attn
