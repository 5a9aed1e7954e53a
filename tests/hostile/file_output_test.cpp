// Outputs that never destroy the previous file: every writer (save_npy, save_safetensors,
// save_heatmaps, attn::write_file) writes a temporary file in the same folder and renames it over
// the target, so a write that fails midway — here a file-size limit (RLIMIT_FSIZE) met in a child
// process — leaves the old file byte for byte, and no temporary file behind.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "attn/core/error.hpp"
#include "attn/io/files.hpp"
#include "attn/io/npy.hpp"
#include "attn/io/safetensors.hpp"
#include "attn/viz/heatmap.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

namespace fs = std::filesystem;

class OutputDirectory : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = fs::temp_directory_path() /
                 ("attn_output_" +
                  std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
                  "_" + std::to_string(::getpid()));
    fs::remove_all(directory_);
    fs::create_directories(directory_);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(directory_, ignored);
  }
  static std::string read(const fs::path& path) {
    std::ifstream file(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
  }
  // The names in the directory: no temporary file may be left behind.
  std::vector<std::string> names() const {
    std::vector<std::string> found;
    for (const auto& entry : fs::directory_iterator(directory_)) {
      found.push_back(entry.path().filename().string());
    }
    std::sort(found.begin(), found.end());
    return found;
  }
  // Runs `write` in a child process whose files may not grow beyond `limit` bytes (SIGXFSZ
  // ignored, so that write() fails with EFBIG instead of killing it); the child exits 0 when
  // `write` threw a FileError whose message names the reason, 1 when it did not throw, 2 for
  // another message.
  static int write_under_size_limit(rlim_t limit, const std::function<void()>& write) {
    const pid_t child = ::fork();
    if (child == 0) {
      std::signal(SIGXFSZ, SIG_IGN);
      const rlimit size{limit, limit};
      ::setrlimit(RLIMIT_FSIZE, &size);
      try {
        write();
      } catch (const FileError& error) {
        ::_exit(std::strstr(error.what(), "File too large") != nullptr ? 0 : 2);
      }
      ::_exit(1);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  fs::path directory_;
};

TEST_F(OutputDirectory, AWriteThatFailsMidwayKeepsTheOldNpy) {
  const fs::path target = directory_ / "out.npy";
  save_npy(target, Tensor::full(Shape{4}, 1.0F));
  const std::string before = read(target);
  // 1 MiB of output under a 64 KiB limit: the write fails after 64 KiB.
  EXPECT_EQ(write_under_size_limit(64 << 10,
                                   [&] { save_npy(target, Tensor::full(Shape{1 << 18}, 2.0F)); }),
            0);
  EXPECT_EQ(read(target), before);
  EXPECT_EQ(names(), std::vector<std::string>{"out.npy"});
}

TEST_F(OutputDirectory, AWriteThatFailsMidwayKeepsTheOldSafetensorsAndPicture) {
  const fs::path weights = directory_ / "w.safetensors";
  StateDict small;
  small.emplace("w", Tensor::full(Shape{2}, 1.0F));
  save_safetensors(weights, small);
  const std::string before = read(weights);
  StateDict large;
  large.emplace("w", Tensor::full(Shape{1 << 18}, 3.0F));
  EXPECT_EQ(write_under_size_limit(64 << 10, [&] { save_safetensors(weights, large); }), 0);
  EXPECT_EQ(read(weights), before);

  const fs::path picture = directory_ / "h.svg";
  save_heatmaps(Tensor::full(Shape{2, 2}, 0.5F), picture);
  const std::string drawn = read(picture);
  // Cairo reports its own write error; the message still names the picture.
  const pid_t child = ::fork();
  if (child == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit size{1024, 1024};
    ::setrlimit(RLIMIT_FSIZE, &size);
    try {
      save_heatmaps(Tensor::full(Shape{60, 60}, 0.5F), picture);
    } catch (const FileError& error) {
      ::_exit(std::strstr(error.what(), picture.c_str()) != nullptr ? 0 : 2);
    }
    ::_exit(1);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(read(picture), drawn);
  EXPECT_EQ(names(), (std::vector<std::string>{"h.svg", "w.safetensors"}));
}

TEST_F(OutputDirectory, FailuresNameThePathAndTheSystemsReason) {
  EXPECT_THROW_MESSAGE(save_npy(directory_ / "missing" / "o.npy", Tensor(Shape{1})), FileError,
                       "o.npy: cannot write the file (No such file or directory)");
  fs::create_directories(directory_ / "folder.npy");
  EXPECT_THROW_MESSAGE(save_npy(directory_ / "folder.npy", Tensor(Shape{1})), FileError,
                       "folder.npy: cannot write the file (expected a regular file or a new name, "
                       "got a directory)");
  if (::geteuid() != 0) {  // root writes anywhere
    const fs::path locked = directory_ / "locked";
    fs::create_directories(locked);
    fs::permissions(locked, fs::perms::owner_read | fs::perms::owner_exec);
    EXPECT_THROW_MESSAGE(write_file(locked / "x.json", "{}"), FileError, "Permission denied");
    fs::permissions(locked, fs::perms::owner_all);
  }
}

TEST_F(OutputDirectory, ReplacingKeepsPermissionsAndLeavesNoTemporaryFile) {
  const fs::path target = directory_ / "report.json";
  write_file(target, "old");
  fs::permissions(target, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  write_file(target, std::string_view("new"));
  EXPECT_EQ(read(target), "new");
  EXPECT_EQ(fs::status(target).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  EXPECT_EQ(names(), std::vector<std::string>{"report.json"});
}

}  // namespace
}  // namespace attn
