// PendingRemoval and remove_pending_paths_on_signals: a signal that ends the process removes the
// files and then the (empty) folders still pending, leaves released and unregistered paths alone,
// and the process ends by that signal. Each case runs in a forked child, which raises the signal.
#include "attn/core/pending_removal.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>

namespace attn {
namespace {

namespace fs = std::filesystem;

class PendingRemovalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    directory_ =
        fs::temp_directory_path() / ("attn_pending_" + test + "_" + std::to_string(::getpid()));
    fs::remove_all(directory_);
    fs::create_directories(directory_);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(directory_, ignored);
  }
  fs::path directory_;
};

TEST_F(PendingRemovalTest, ASignalRemovesWhatIsPendingAndEndsTheProcessByIt) {
  for (const int signal_number : {SIGINT, SIGTERM, SIGHUP}) {
    const fs::path folder = directory_ / "made";
    const fs::path staged = folder / ".o.npy.staged";
    const fs::path kept = directory_ / "kept.npy";
    const fs::path released = directory_ / "released.tmp";
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      remove_pending_paths_on_signals();
      fs::create_directory(folder);
      const PendingRemoval pending_folder(folder, PendingRemoval::Kind::kFolder);
      std::ofstream(staged) << "half written";
      const PendingRemoval pending_file(staged, PendingRemoval::Kind::kFile);
      std::ofstream(kept) << "a finished output";
      std::ofstream(released) << "renamed into place";
      PendingRemoval done(released, PendingRemoval::Kind::kFile);
      done.release();
      std::raise(signal_number);
      ::_exit(0);  // not reached: the signal ends the child
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << signal_number;
    EXPECT_EQ(WTERMSIG(status), signal_number);
    EXPECT_FALSE(fs::exists(staged)) << signal_number;
    EXPECT_FALSE(fs::exists(folder)) << signal_number;
    EXPECT_TRUE(fs::exists(kept)) << signal_number;
    EXPECT_TRUE(fs::exists(released)) << signal_number;
    fs::remove(kept);
    fs::remove(released);
  }
}

// A folder that still holds a file nobody registered is left (rmdir removes empty ones only), and
// a moved-from registration is the new owner's.
TEST_F(PendingRemovalTest, FoldersWithOtherFilesStayAndMovesKeepTheRegistration) {
  const fs::path folder = directory_ / "made";
  const fs::path other = folder / "someone_elses.npy";
  const fs::path moved = directory_ / "moved.tmp";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    remove_pending_paths_on_signals();
    fs::create_directory(folder);
    const PendingRemoval pending_folder(folder, PendingRemoval::Kind::kFolder);
    std::ofstream(other) << "kept";
    std::ofstream(moved) << "pending";
    PendingRemoval first(moved, PendingRemoval::Kind::kFile);
    const PendingRemoval second = std::move(first);
    first.release();  // the moved-from one holds nothing
    std::raise(SIGINT);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_TRUE(fs::exists(other));
  EXPECT_FALSE(fs::exists(moved));
}

}  // namespace
}  // namespace attn
