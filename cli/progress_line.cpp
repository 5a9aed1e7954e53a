// ProgressLine's watcher thread and the text it writes.
#include "progress_line.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <system_error>
#include <utility>

namespace attn::cli {

std::string progress_text(std::string_view work, int64_t done, int64_t planned, double seconds) {
  std::string text(work.empty() ? std::string_view("computing") : work);
  if (planned > 0) {
    const double share =
        100.0 * static_cast<double>(std::min(done, planned)) / static_cast<double>(planned);
    text += " " + std::to_string(static_cast<int>(std::floor(share))) + "%";
  }
  return text + " (" + std::to_string(static_cast<int64_t>(seconds)) + " s)";
}

ProgressLine::ProgressLine(std::string command)
    : ProgressLine(std::move(command), isatty(STDERR_FILENO) != 0,
                   isatty(STDERR_FILENO) != 0 ? terminal_timing() : log_timing(),
                   [](std::string_view text) {
                     std::fwrite(text.data(), 1, text.size(), stderr);
                     std::fflush(stderr);
                   }) {}

ProgressLine::ProgressLine(std::string command, bool in_place, Timing timing,
                           std::function<void(std::string_view)> write)
    : command_(std::move(command)), in_place_(in_place), timing_(timing), write_(std::move(write)) {
  // Progress never fails a run (nor leaves a ring's other ranks waiting for this one).
  try {
    watcher_ = std::thread([this] { watch(); });
  } catch (const std::system_error&) {
  }
}

ProgressLine::~ProgressLine() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  stop_signal_.notify_all();
  if (watcher_.joinable()) watcher_.join();
  // The result's own lines (or an error) follow on a clean line.
  if (in_place_ && drawn_width_ > 0) {
    try {
      write_("\r" + std::string(drawn_width_, ' ') + "\r");
    } catch (const std::exception&) {
    }
  }
}

void ProgressLine::watch() {
  std::unique_lock lock(mutex_);
  auto next = start_ + timing_.first;
  while (!stop_signal_.wait_until(lock, next, [this] { return stopping_; })) {
    // After a stop (Ctrl-Z, then fg), one report, not every one missed.
    next = std::max(next + timing_.every, std::chrono::steady_clock::now());
    try {
      report();
    } catch (const std::exception&) {
      return;  // out of memory for a line of text: the run goes on unreported
    }
  }
}

void ProgressLine::report() {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const std::string text =
      command_ + ": " +
      progress_text(progress_.work(), progress_.done(), progress_.planned(), seconds);
  if (in_place_) {
    // Padded over a longer previous line, so that no tail of it stays on screen.
    std::string line = "\r" + text;
    if (text.size() < drawn_width_) line += std::string(drawn_width_ - text.size(), ' ');
    drawn_width_ = std::max(drawn_width_, text.size());
    write_(line);
  } else {
    write_(text + "\n");
  }
}

}  // namespace attn::cli
