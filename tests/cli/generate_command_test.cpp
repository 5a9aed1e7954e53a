// End-to-end test of `attn generate`: a tiny run prints one row of tokens/s per cache dtype and the
// greedy tokens, which agree across dtypes on a short run; bad flags are refused.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "cli_fixture.hpp"

namespace attn {
namespace {

// "tokens <dtype>: a b c" lines of the output, by dtype.
std::map<std::string, std::vector<int>> generated_tokens(const std::string& out) {
  std::map<std::string, std::vector<int>> tokens;
  const std::regex line("^tokens ([a-z0-9]+):((?: [0-9]+)+)$");
  std::istringstream lines(out);
  std::string text;
  while (std::getline(lines, text)) {
    std::smatch match;
    if (!std::regex_match(text, match, line)) continue;
    std::istringstream numbers(match[2].str());
    for (int token = 0; numbers >> token;) tokens[match[1].str()].push_back(token);
  }
  return tokens;
}

// OMP_NUM_THREADS above 1024 is capped to 1024, as the Python module caps it (docs/reliability.md):
// at 100000 GNU OpenMP crashed at the first projection's parallel region (exit by SIGSEGV after the
// banner, which read "100000 thread(s)").
TEST_F(CliTest, AHugeOmpNumThreadsIsCapped) {
  ASSERT_EQ(setenv("OMP_NUM_THREADS", "100000", 1), 0);
  const CommandResult result = attn("generate --layers 1 --prompt 4 --tokens 1 --dtype float32");
  unsetenv("OMP_NUM_THREADS");
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find(", 1024 thread(s)"), std::string::npos) << result.out;
  EXPECT_EQ(generated_tokens(result.out).count("float32"), 1U) << result.out;
}

// A prompt of 20 tokens is prefilled through the prefill kernel (20 new queries × 4 query heads per
// key/value head > 64 rows), the 5 decode passes run the decode kernel. Over these 6 tokens the
// caches' roundings move the logits (the "max change" column: about 1e-4 for float16, 4e-4 for
// bfloat16, 1.5e-3 for int8) by less than half the gap between the two largest ones ("min margin",
// 5e-3 here), so every dtype picks the same tokens. Longer runs need not agree: over 64 tokens the
// smallest gap falls to 5e-4, below int8's change — the table shows when a flip is a rounding, not
// a bug.
TEST_F(CliTest, GenerateRunsEveryDtypeAndTheyPickTheSameTokens) {
  const CommandResult result =
      attn("generate --layers 2 --prompt 20 --tokens 6 --seed 3 --threads 1");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("attn generate: 2 layers, hidden 512, 8 query heads over 2 key/value "
                            "heads of 64"),
            std::string::npos)
      << result.out;
  const std::map<std::string, std::vector<int>> tokens = generated_tokens(result.out);
  ASSERT_EQ(tokens.size(), 4U) << result.out;
  for (const char* dtype : {"float32", "float16", "bfloat16", "int8"}) {
    // dtype, cache MiB, prefill tok/s, decode tok/s, min margin, max change ("-" for float32).
    const std::regex row(std::string("(^|\n)") + dtype +
                         " +[0-9]+\\.[0-9]+ +[0-9]+\\.[0-9] +[0-9]+\\.[0-9] +[0-9]+\\.[0-9]+ "
                         "+(-|[0-9]+\\.[0-9]+)\n");
    EXPECT_TRUE(std::regex_search(result.out, row)) << dtype << " row missing from\n" << result.out;
    ASSERT_EQ(tokens.at(dtype).size(), 6U) << dtype;
    for (const int token : tokens.at(dtype)) {
      EXPECT_GE(token, 0);
      EXPECT_LT(token, 256);
    }
    EXPECT_EQ(tokens.at(dtype), tokens.at("float32")) << dtype << "\n" << result.out;
  }
  EXPECT_EQ(count_occurrences(result.out, ": the same tokens as float32"), 3U) << result.out;
}

// One dtype runs alone; a single token needs no decode pass ("-" for its rate).
TEST_F(CliTest, GenerateOneDtypeAndOneToken) {
  const CommandResult result = attn("generate --dtype int8 --layers 1 --prompt 3 --tokens 1");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::map<std::string, std::vector<int>> tokens = generated_tokens(result.out);
  ASSERT_EQ(tokens.size(), 1U) << result.out;
  EXPECT_EQ(tokens.at("int8").size(), 1U);
  EXPECT_TRUE(std::regex_search(result.out, std::regex("\nint8 +[0-9.]+ +[0-9.]+ +- +")))
      << result.out;
}

TEST_F(CliTest, GenerateRejectsBadFlags) {
  expect_error("generate --dtype float8", "--dtype: expected all, float32");
  expect_error("generate --tokens 0", "--tokens");
  expect_error("generate --prompt 0", "--prompt");
  expect_error("generate --layers 0", "--layers");
  expect_error("generate --threads 0", "--threads");
}

}  // namespace
}  // namespace attn
