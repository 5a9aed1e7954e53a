// The fixture of the attn executable's end-to-end tests: each test runs `attn ...` through the
// shell in its own temporary directory and reads back exit code, output and files.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "attn/core/random.hpp"
#include "attn/core/tensor.hpp"
#include "attn/core/valid_lengths.hpp"
#include "attn/io/npy.hpp"
#include "test_support.hpp"

namespace attn {

namespace fs = std::filesystem;

inline std::string read_text(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

inline size_t count_occurrences(const std::string& text, const std::string& needle) {
  size_t count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++count;
  }
  return count;
}

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Random inputs for B = 2, n = 3, m = 5 and per-query valid lengths.
struct RunInputs {
  Tensor queries;
  Tensor keys;
  Tensor values;
  ValidLengths valid_lens;
};

// Each test runs the executable in its own empty directory, removed afterwards.
class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    directory_ = fs::temp_directory_path() /
                 ("attn_cli_test_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(directory_);
    fs::create_directories(directory_);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(directory_, ignored);
  }

  fs::path path(const std::string& name) const { return directory_ / name; }

  // Runs `attn <arguments>` in the test directory; arguments are passed through the shell, so
  // file names in them are relative to that directory.
  CommandResult attn(const std::string& arguments) const {
    const std::string command = "cd '" + directory_.string() + "' && '" ATTN_CLI_PATH "' " +
                                arguments + " > stdout.txt 2> stderr.txt";
    const int status = std::system(command.c_str());
    CommandResult result;
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    result.out = read_text(path("stdout.txt"));
    result.err = read_text(path("stderr.txt"));
    return result;
  }

  // Asserts a clean failure: exit code 1 and one "attn: error: ..." message naming `substring`.
  void expect_error(const std::string& arguments, const std::string& substring) const {
    const CommandResult result = attn(arguments);
    EXPECT_EQ(result.exit_code, 1) << "attn " << arguments << "\nstderr: " << result.err;
    EXPECT_TRUE(result.err.starts_with("attn: error: ")) << result.err;
    EXPECT_NE(result.err.find(substring), std::string::npos)
        << "attn " << arguments << "\nstderr: " << result.err
        << "\nexpected to contain: " << substring;
  }

  void save(const std::string& name, const Tensor& tensor) const { save_npy(path(name), tensor); }

  // Writes q.npy, k.npy, v.npy and lens.npy.
  RunInputs write_inputs(int64_t query_size, int64_t key_size, int64_t value_size,
                         uint64_t seed) const {
    Rng rng(seed);
    RunInputs inputs{testing::random_tensor(Shape{2, 3, query_size}, rng),
                     testing::random_tensor(Shape{2, 5, key_size}, rng),
                     testing::random_tensor(Shape{2, 5, value_size}, rng),
                     ValidLengths::per_query({5, 1, 3, 2, 4, 5}, 2, 3)};
    save("q.npy", inputs.queries);
    save("k.npy", inputs.keys);
    save("v.npy", inputs.values);
    save_npy(path("lens.npy"), inputs.valid_lens.values(), Shape{2, 3});
    return inputs;
  }

  fs::path directory_;
};

inline bool starts_with_bytes(const fs::path& path, const std::string& prefix) {
  return read_text(path).starts_with(prefix);
}

// The inputs write_inputs() leaves in the test directory.
inline const std::string kInputArguments = "--queries q.npy --keys k.npy --values v.npy";

inline const std::string kPngSignature = "\x89PNG\r\n\x1a\n";

}  // namespace attn
