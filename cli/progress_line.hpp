// ProgressLine: "attn run: flash_attention_backward 45% (12 s)" on standard error while a long
// computation runs (attn::WorkProgress's counts), in place on a terminal, as lines elsewhere.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "attn/core/work_progress.hpp"

namespace attn::cli {

// "flash_attention_forward 45% (12 s)": the text of one report (planned 0: no percentage).
std::string progress_text(std::string_view work, int64_t done, int64_t planned, double seconds);

class ProgressLine {
 public:
  struct Timing {
    std::chrono::milliseconds first;  // nothing before this much time: short runs stay quiet
    std::chrono::milliseconds every;  // then a report this often
  };
  // On a terminal: redrawn from 1 s on, 4 times a second, erased at the end. Elsewhere: a line
  // from 10 s on, every 10 s (kept).
  static Timing terminal_timing() {
    return {std::chrono::seconds(1), std::chrono::milliseconds(250)};
  }
  static Timing log_timing() { return {std::chrono::seconds(10), std::chrono::seconds(10)}; }

  // Reports `command`'s progress to standard error (in place when it is a terminal).
  explicit ProgressLine(std::string command);
  // Reports through `write` (each call one report, with "\r" or a newline as `in_place` says).
  ProgressLine(std::string command, bool in_place, Timing timing,
               std::function<void(std::string_view)> write);
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

 private:
  void watch();
  void report();  // one report, under mutex_

  WorkProgress progress_;
  std::string command_;
  bool in_place_;
  Timing timing_;
  std::function<void(std::string_view)> write_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::mutex mutex_;
  std::condition_variable stop_signal_;
  bool stopping_ = false;
  size_t drawn_width_ = 0;  // of the line drawn in place, to erase it
  std::thread watcher_;     // none where the system refused a thread: the run goes on unreported
};

}  // namespace attn::cli
