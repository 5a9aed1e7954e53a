// Peak-RSS probing through /proc/self/status and /proc/self/clear_refs (Linux only).
#include "bench/memory_probe.hpp"

#include <malloc.h>

#include <fstream>
#include <string>

#include "attn/core/tensor_allocator.hpp"

namespace attn::bench {

namespace {

// A "VmRSS:" or "VmHWM:" line of /proc/self/status in bytes; nullopt if absent.
std::optional<int64_t> status_bytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) != 0) continue;
    try {
      return std::stoll(line.substr(field.size() + 1)) * 1024;  // reported in kB
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

bool reset_peak() {
  std::ofstream clear_refs("/proc/self/clear_refs");
  clear_refs << "5";  // 5: reset the peak resident set to the current one
  clear_refs.flush();
  return static_cast<bool>(clear_refs);
}

}  // namespace

std::optional<int64_t> peak_extra_bytes(const std::function<void()>& action) {
  // Blocks kept for reuse (TensorAllocator) would serve the pass's allocations from pages already
  // resident and hide them: freed first, as malloc_trim hands back malloc's.
  release_cached_tensor_storage();
  malloc_trim(0);
  if (!reset_peak()) {
    action();
    return std::nullopt;
  }
  const std::optional<int64_t> before = status_bytes("VmRSS");
  action();
  const std::optional<int64_t> peak = status_bytes("VmHWM");
  if (!before || !peak) return std::nullopt;
  return *peak > *before ? *peak - *before : 0;
}

}  // namespace attn::bench
