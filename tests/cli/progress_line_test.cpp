// ProgressLine: what it reports of the kernels' task counts (attn::WorkProgress), in place and as
// lines, and that a short run, under its first delay, reports nothing.
#include "progress_line.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "attn/core/work_progress.hpp"

namespace attn::cli {
namespace {

using std::chrono::milliseconds;

TEST(ProgressText, GivesTheWorkItsShareAndTheSeconds) {
  EXPECT_EQ(progress_text("flash_attention_backward", 45, 100, 12.7),
            "flash_attention_backward 45% (12 s)");
  EXPECT_EQ(progress_text("", 0, 0, 0.5), "computing (0 s)");
  // More done than planned (a task noted after a count restarted) reads 100%, not more.
  EXPECT_EQ(progress_text("x", 7, 5, 1.0), "x 100% (1 s)");
}

// The reports a ProgressLine wrote, read while it runs.
class Reports {
 public:
  std::function<void(std::string_view)> writer() {
    return [this](std::string_view text) {
      const std::lock_guard lock(mutex_);
      texts_.emplace_back(text);
    };
  }
  std::vector<std::string> texts() {
    const std::lock_guard lock(mutex_);
    return texts_;
  }
  // Waits (up to 10 s, for a loaded machine) until some report contains `text`.
  bool wait_for(const std::string& text) {
    for (int i = 0; i < 1000; ++i) {
      for (const std::string& report : texts())
        if (report.find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(milliseconds(10));
    }
    return false;
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> texts_;
};

TEST(ProgressLine, ReportsTheKernelsTasksAsLines) {
  Reports reports;
  {
    const ProgressLine line("attn run", false, {milliseconds(0), milliseconds(5)},
                            reports.writer());
    core_detail::note_tasks_planned(4, "flash_attention_forward");
    core_detail::note_task_done();
    EXPECT_TRUE(reports.wait_for("attn run: flash_attention_forward 25% ("));
    // Another kernel's call starts the counts again.
    core_detail::note_tasks_planned(2, "flash_attention_backward");
    core_detail::note_task_done();
    core_detail::note_task_done();
    EXPECT_TRUE(reports.wait_for("attn run: flash_attention_backward 100% ("));
  }
  const std::vector<std::string> texts = reports.texts();
  ASSERT_FALSE(texts.empty());
  for (const std::string& text : texts) EXPECT_EQ(text.back(), '\n') << text;
  // Nothing counts once the line is gone.
  core_detail::note_tasks_planned(1, "after");
  core_detail::note_task_done();
  EXPECT_EQ(reports.texts().size(), texts.size());
}

TEST(ProgressLine, InPlaceRedrawsOneLineAndErasesIt) {
  Reports reports;
  {
    const ProgressLine line("attn run", true, {milliseconds(0), milliseconds(5)}, reports.writer());
    core_detail::note_tasks_planned(10, "flash_attention_forward");
    EXPECT_TRUE(reports.wait_for("\rattn run: flash_attention_forward 0% ("));
  }
  const std::vector<std::string> texts = reports.texts();
  // The last write blanks the line and returns to its start.
  ASSERT_GE(texts.size(), 2U);
  EXPECT_EQ(texts.back().front(), '\r');
  EXPECT_EQ(texts.back().back(), '\r');
  EXPECT_EQ(texts.back().find_first_not_of(" \r"), std::string::npos) << texts.back();
}

TEST(ProgressLine, AShortRunReportsNothing) {
  Reports reports;
  {
    const ProgressLine line("attn run", false, {std::chrono::seconds(60), milliseconds(5)},
                            reports.writer());
    core_detail::note_tasks_planned(1, "flash_attention_forward");
    core_detail::note_task_done();
  }
  EXPECT_TRUE(reports.texts().empty());
}

}  // namespace
}  // namespace attn::cli
