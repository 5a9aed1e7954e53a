// End-to-end test of `attn bench`: a smoke run at tiny sizes measures its ceilings and every
// case, prints one table row per case, and writes the same figures as JSON; the decode cases read
// the bytes their caches hold.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>

#include "attn/kernels/amx.hpp"
#include "attn/kernels/bfloat16_dot.hpp"
#include "cli_fixture.hpp"

namespace attn {
namespace {

// Decode cases at tiny sizes too: B = 2, 4 query heads over 2 key/value heads of 8, m = 50.
const std::string kTinyDecode =
    " --decode-batch 2 --decode-queries 1,3 --decode-lengths 50 --decode-heads 4 "
    "--decode-kv-heads 2 --decode-head-dim 8 --decode-repeats 1 --stream-mib 8";
const std::string kTinyBench =
    "bench --sizes 40 --threads 1 --batch 2 --heads 2 --head-dim 8 --repeats 1 --json-out b.json" +
    kTinyDecode;

TEST_F(CliTest, BenchMeasuresEveryCaseAndWritesTheSameFiguresAsJson) {
  const CommandResult result = attn(kTinyBench);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json report = nlohmann::json::parse(read_text(path("b.json")));
  ASSERT_EQ(report["fma_peak"].size(), 1U);
  const nlohmann::json& peak = report["fma_peak"][0];
  EXPECT_GT(peak["gflops"].get<double>(), 0.0);
  // The worst repeat of the peak's loop, and the lowest probe of the same loop after the cases:
  // both measured, the first never above the best repeat.
  EXPECT_GT(peak["lowest_repeat"].get<double>(), 0.0);
  EXPECT_LE(peak["lowest_repeat"].get<double>(), peak["gflops"].get<double>());
  EXPECT_GT(peak["probe_lowest"].get<double>(), 0.0);
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
    // The half-precision cases compare with fused, fused-causal or fused-backward, the same work
    // in fp32.
    if (workload == "dot-bf16" || workload == "dot-fp16" || workload == "dot-causal-bf16" ||
        workload == "dot-backward-bf16" || workload == "dot-backward-fp16") {
      EXPECT_GT(row["speedup_vs_fp32"].get<double>(), 0.0) << name;
    } else {
      EXPECT_TRUE(row["speedup_vs_fp32"].is_null()) << name;
    }
  }
  for (const char* name : {"fused",
                           "plain",
                           "fused-padded",
                           "plain-padded",
                           "fused-causal",
                           "plain-causal",
                           "fused-backward",
                           "plain-backward",
                           "fused-bf16",
                           "fused-fp16",
                           "fused-bf16-causal",
                           "fused-bf16-backward",
                           "fused-fp16-backward",
                           "fused-mha",
                           "fused-sdpa",
                           "fused-window",
                           "fused-mask-bool",
                           "fused-mask-causal",
                           "fused-mask-float",
                           "fused-gqa",
                           "fused-additive",
                           "plain-additive",
                           "fused-add-backward",
                           "plain-add-backward"})
    EXPECT_TRUE(cases.contains(name)) << name;
  EXPECT_NE(result.out.find("functional API: fused-sdpa's time"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("half precision: the fp32 case's time"), std::string::npos)
      << result.out;
  EXPECT_NE(result.out.find("FMA peak, 1 thread(s):"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("FMA probe after each case, 1 thread(s): lowest"), std::string::npos)
      << result.out;
  // Every decode case ran, by default, after the attention cases.
  EXPECT_EQ(report["decode"].size(), 8U);  // 4 dtypes × n = 1, 3
  EXPECT_NE(result.out.find("stream read, 1 thread(s):"), std::string::npos) << result.out;
}

// With two thread counts, each threaded case gets its scaling, time at the first count / time at
// the second, printed in its own table and written to the JSON; the serial plain cases run at the
// first count only and get none.
TEST_F(CliTest, BenchReportsThreadScalingAgainstTheFirstThreadCount) {
  const CommandResult result = attn(
      "bench --sizes 40 --threads 1,2 --batch 2 --heads 2 --head-dim 8 --repeats 1 "
      "--cases fused,plain,fused-causal --no-ceilings --json-out s.json");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json report = nlohmann::json::parse(read_text(path("s.json")));
  std::map<std::pair<std::string, int>, double> milliseconds;
  for (const nlohmann::json& row : report["cases"])
    milliseconds[{row["case"].get<std::string>(), row["threads"].get<int>()}] = row["ms"];
  int scaled = 0;
  for (const nlohmann::json& row : report["cases"]) {
    const std::string name = row["case"];
    if (row["threads"] == 2) {
      ASSERT_FALSE(row["thread_scaling"].is_null()) << name;
      EXPECT_DOUBLE_EQ(row["thread_scaling"].get<double>(),
                       milliseconds.at({name, 1}) / row["ms"].get<double>())
          << name;
      ++scaled;
    } else {
      EXPECT_TRUE(row["thread_scaling"].is_null()) << name;
    }
  }
  EXPECT_EQ(scaled, 2);  // fused and fused-causal; plain is serial
  EXPECT_NE(result.out.find("thread scaling: time at 1 thread(s) / time at T threads"),
            std::string::npos)
      << result.out;
  EXPECT_NE(result.out.find("T=2"), std::string::npos) << result.out;
}

// Bytes read per decode step: Σ lengths × bytes per token = 2 sequences × 50 tokens × 2 key/value
// heads × (8 + 8) entries × the element size, plus two float scales per head and token for int8.
// fp32 is the base of the speedups; % read is against the stream read of the same run.
TEST_F(CliTest, BenchDecodeCasesCountTheBytesOfTheCache) {
  const CommandResult result = attn(
      "bench --threads 1 --cases decode-float32,decode-float16,decode-bfloat16,decode-int8 "
      "--json-out d.json" +
      kTinyDecode);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json report = nlohmann::json::parse(read_text(path("d.json")));
  EXPECT_TRUE(report["cases"].empty());  // no attention case selected: nor their ceilings
  EXPECT_TRUE(report["fma_peak"].empty());
  ASSERT_EQ(report["stream_read"].size(), 1U);
  EXPECT_GT(report["stream_read"][0]["gbytes_per_second"].get<double>(), 0.0);
  EXPECT_EQ(report["decode_shape"]["kv_heads"], 2);
  EXPECT_EQ(report["decode_shape"]["query_dtype"], "cache");
  const std::map<std::string, double> bytes = {{"float32", 12800.0},
                                               {"float16", 6400.0},
                                               {"bfloat16", 6400.0},
                                               {"int8", 2.0 * 50 * 2 * (16 + 8)}};
  ASSERT_EQ(report["decode"].size(), 8U);
  for (const nlohmann::json& row : report["decode"]) {
    const std::string dtype = row["dtype"];
    EXPECT_EQ(row["case"], "decode-" + dtype);
    EXPECT_EQ(row["batch"], 2);
    EXPECT_EQ(row["m"], 50);
    EXPECT_TRUE(row["n"] == 1 || row["n"] == 3) << row;
    EXPECT_DOUBLE_EQ(row["bytes_read"].get<double>(), bytes.at(dtype)) << dtype;
    const double ms = row["ms"].get<double>();
    EXPECT_GT(ms, 0.0);
    EXPECT_NEAR(row["gbytes_per_second"].get<double>(), bytes.at(dtype) / ms * 1e-6, 1e-9);
    EXPECT_GT(row["read_fraction"].get<double>(), 0.0);
    if (dtype == "float32") {
      EXPECT_DOUBLE_EQ(row["speedup_vs_float32"].get<double>(), 1.0);
    }
    EXPECT_GT(row["speedup_vs_float32"].get<double>(), 0.0);
    EXPECT_NE(result.out.find("decode-" + dtype + " "), std::string::npos) << result.out;
  }
  EXPECT_NE(result.out.find("stream read, 1 thread(s):"), std::string::npos) << result.out;
  EXPECT_EQ(result.out.find("GFLOP/s"), std::string::npos) << result.out;
}

// --decode-query-dtype: the queries' dtype, named in the table's header and the JSON.
TEST_F(CliTest, BenchDecodeCasesTakeTheQueriesDtypeTheyAreGiven) {
  const CommandResult result = attn(
      "bench --threads 1 --cases decode-int8 --decode-query-dtype bfloat16 --no-ceilings "
      "--json-out q.json" +
      kTinyDecode);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json report = nlohmann::json::parse(read_text(path("q.json")));
  EXPECT_EQ(report["decode_shape"]["query_dtype"], "bfloat16");
  EXPECT_EQ(report["decode"].size(), 2U);
  EXPECT_NE(result.out.find("queries: bfloat16;"), std::string::npos) << result.out;
}

// Useful flops count only the pairs a window or mask lets through: at n = 40 and a window of 7,
// fused-window does Σ_i min(i + 1, 8) of fused-sdpa's 40 · 40 pairs, and the causal mask
// 40 · 41 / 2 of them. --no-ceilings leaves the FMA peak and sgemm out.
TEST_F(CliTest, BenchCountsOnlyThePairsAWindowOrMaskLetsThrough) {
  const CommandResult result = attn(
      "bench --sizes 40 --threads 1 --batch 2 --heads 4 --head-dim 8 --repeats 1 --window 7 "
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

// Beside the median pass, the fastest one: its rate against the highest FMA rate of the run (the
// peak's best repeat or a probe's, never below the peak), in the JSON and the table.
TEST_F(CliTest, BenchReportsTheFastestPassAgainstTheHighestFmaRate) {
  const CommandResult result = attn(
      "bench --cases fused,fused-backward --sizes 40 --threads 1 --batch 1 --heads 2 "
      "--head-dim 8 --repeats 3 --quick --json-out b.json");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json report = nlohmann::json::parse(read_text(path("b.json")));
  ASSERT_EQ(report["fma_peak"].size(), 1U);
  const double peak = report["fma_peak"][0]["gflops"].get<double>();
  const double best_rate = report["fma_peak"][0]["best_rate"].get<double>();
  EXPECT_GE(best_rate, peak);
  EXPECT_GE(best_rate, report["fma_peak"][0]["probe_lowest"].get<double>());
  ASSERT_EQ(report["cases"].size(), 2U);
  for (const nlohmann::json& row : report["cases"]) {
    const double ms = row["ms"].get<double>(), best_ms = row["best_ms"].get<double>();
    EXPECT_GT(best_ms, 0.0) << row;
    EXPECT_LE(best_ms, ms) << row;
    // The same useful flops over either time.
    EXPECT_NEAR(row["best_gflops"].get<double>() * best_ms, row["gflops"].get<double>() * ms,
                1e-9 * row["gflops"].get<double>() * ms)
        << row;
    EXPECT_NEAR(row["best_peak_fraction"].get<double>(),
                row["best_gflops"].get<double>() / best_rate, 1e-12)
        << row;
    EXPECT_NEAR(row["peak_fraction"].get<double>(), row["gflops"].get<double>() / peak, 1e-12)
        << row;
  }
  EXPECT_NE(result.out.find("best ms"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("median and best of 2 passes"), std::string::npos) << result.out;
}

TEST_F(CliTest, BenchRejectsUnknownCasesAndBadSizes) {
  expect_error("bench --cases nope", "--cases: expected one of fused, plain");
  expect_error("bench --sizes 0", "--sizes");
  expect_error("bench --threads 0", "--threads");
  expect_error("bench --threads 1000000", "--threads: expected a thread count in [1, 1024]");
  expect_error("bench --json-out missing/b.json", "--json-out missing/b.json: the folder");
  expect_error("bench --window -1", "--window");
  expect_error("bench --cases decode-float8", "decode-int8, got 'decode-float8'");
  expect_error("bench --cases decode-int8 --decode-kv-heads 3", "--decode-kv-heads");
  // 17 queries × 4 query heads per key/value head are more rows than the decode kernel takes.
  expect_error("bench --cases decode-int8 --decode-queries 17", "--decode-queries");
  // 64 is in the range --help gives, and refused saying why: 64 x 4 rows are more than 64.
  expect_error("bench --cases decode-int8 --decode-queries 64",
               "--decode-queries: expected at most 16 new queries with --decode-heads 32 over "
               "--decode-kv-heads 8 (n x 4 query heads per key/value head must be at most 64");
  EXPECT_NE(attn("bench --help").out.find("n x (heads / kv-heads) at most 64"), std::string::npos);
  // Options under which every chosen case is skipped: an error naming why, before any measuring
  // (it printed a header without a row and exited 0).
  const CommandResult skipped = attn("bench --cases plain-additive --sizes 2048 --no-ceilings");
  EXPECT_EQ(skipped.exit_code, 1) << skipped.err;
  EXPECT_NE(
      skipped.err.find("attn: error: --cases: expected at least one case that runs with "
                       "these options, got none: plain-additive n=2048: it runs up to n=1024"),
      std::string::npos)
      << skipped.err;
  EXPECT_EQ(skipped.out, "");
  expect_error("bench --cases plain --sizes 1024 --max-working-set-mib 1",
               "plain n=1024: its working set exceeds --max-working-set-mib");
  // A decode cache of 4096 x 2^24 tokens of 8 key/value heads is past any machine's memory.
  expect_error("bench --cases decode-float32 --decode-batch 4096 --decode-lengths 16777216",
               "got none: decode-float32 B=4096 m=16777216: its cache (");
  expect_error("bench --cases decode-int8 --decode-lengths 0", "--decode-lengths");
  expect_error("bench --cases decode-int8 --decode-query-dtype bf16",
               "--decode-query-dtype: bf16 not in {bfloat16,cache,float16,float32}");
  expect_error("bench --simd-target avx9", "--simd-target: simd target name: expected one of");
}

// SSE4 is on every x86-64 CPU attn supports: the kernels and the FMA peak both run it when asked.
TEST_F(CliTest, BenchRunsTheKernelsOnTheSimdTargetItIsGiven) {
  const CommandResult result = attn(
      "bench --cases fused --sizes 40 --threads 1 --batch 1 --heads 1 --head-dim 8 --repeats 1 "
      "--simd-target sse4 --json-out s.json");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json report = nlohmann::json::parse(read_text(path("s.json")));
  EXPECT_EQ(report["simd_target"], "SSE4");
  ASSERT_EQ(report["fma_peak"].size(), 1U);
  EXPECT_EQ(report["fma_peak"][0]["simd_target"], "SSE4");
  EXPECT_NE(result.out.find("kernels on Highway target SSE4"), std::string::npos) << result.out;
  // Whether the bf16 forward runs on AMX tiles: this machine's answer, in the text and the JSON.
  EXPECT_EQ(report["amx"], amx_status());
  EXPECT_NE(result.out.find("; " + amx_status()), std::string::npos) << result.out;
  // And whether bf16 multiplies on vdpbf16ps or widens to fp32: under the SSE4 cap, widened.
  const std::string widened = "bf16 widened to fp32 (no bf16 products below AVX-512)";
  EXPECT_EQ(report["bf16_dot"], widened);
  EXPECT_NE(result.out.find("; " + widened + "\n"), std::string::npos) << result.out;
}

}  // namespace
}  // namespace attn
