// AMX availability (CPUID, XCR0 and Linux's per-process permission for the tile state) and the
// process-wide choice of whether the bf16 kernels use it (include/attn/kernels/amx.hpp).
#include "attn/kernels/amx.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>

#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace attn {
namespace {

#if defined(__x86_64__)
// CPUID leaf 7 EDX: AMX-BF16 is bit 22, AMX-TILE bit 24. XCR0: bits 17 (XTILECFG) and 18
// (XTILEDATA) say the OS saves the tile state.
bool cpu_and_os_offer_amx() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  __asm__("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(0));
  if (eax < 7) return false;
  __asm__("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(7), "c"(0));
  const bool tile = (edx >> 24 & 1U) != 0, bf16 = (edx >> 22 & 1U) != 0;
  if (!tile || !bf16) return false;
  __asm__("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(1));
  if ((ecx >> 27 & 1U) == 0) return false;  // OSXSAVE: xgetbv may run
  unsigned xcr0_low = 0, xcr0_high = 0;
  __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  constexpr unsigned kTileState = (1U << 17) | (1U << 18);
  return (xcr0_low & kTileState) == kTileState;
}

// Linux (5.16 on) hands the 8 KiB tile data state to a process only after it asks; a thread that
// runs a tile instruction without it is killed (SIGILL). The permission covers the whole process.
bool linux_grants_tile_state() {
#if defined(__linux__)
  constexpr long kArchRequestPermission = 0x1023;  // ARCH_REQ_XCOMP_PERM
  constexpr long kTileDataFeature = 18;            // XFEATURE_XTILEDATA
  return syscall(SYS_arch_prctl, kArchRequestPermission, kTileDataFeature) == 0;
#else
  return false;
#endif
}
#endif

// The tiles by default: on the Xeon (Emerald Rapids) the bf16 forward ran 2.3-2.6x faster on them
// than its fp32 forward, and 0.4-0.75x without them (vdpbf16ps there does no more products per
// cycle than fp32 FMAs); docs/benchmarks.md "AMX on the Xeon". ATTN_AMX=0 turns them off.
AmxUse use_from_environment() {
  const char* value = std::getenv("ATTN_AMX");
  return value != nullptr && std::strcmp(value, "0") == 0 ? AmxUse::kNever
                                                          : AmxUse::kWhereAvailable;
}

std::atomic<AmxUse>& current_use() {
  static std::atomic<AmxUse> use{use_from_environment()};
  return use;
}

}  // namespace

bool amx_available() {
#if defined(__x86_64__)
  static const bool available = cpu_and_os_offer_amx() && linux_grants_tile_state();
  return available;
#else
  return false;
#endif
}

AmxUse amx_use() {
  return current_use().load();
}

void set_amx_use(AmxUse use) {
  current_use().store(use);
}

namespace {
std::atomic<bool>& current_fp32_use() {
  static std::atomic<bool> on{[] {
    const char* value = std::getenv("ATTN_AMX_FP32");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }()};
  return on;
}
}  // namespace

bool fp32_on_amx() {
  return current_fp32_use().load();
}

void set_fp32_on_amx(bool on) {
  current_fp32_use().store(on);
}

bool amx_tiles_in_use() {
  const AmxUse use = amx_use();
  return use == AmxUse::kModel || (use == AmxUse::kWhereAvailable && amx_available());
}

namespace {
// amx_status() for the current choice.
std::string status_of_use() {
  switch (amx_use()) {
    case AmxUse::kModel:
      return "AMX-BF16 modelled in C++ (tests only)";
    case AmxUse::kWhereAvailable:
      if (!amx_available()) return "no AMX";
      return fp32_on_amx() ? "AMX-BF16 in use (bf16 forward and backward, any head size; the fp32 "
                             "forward and backward as three bf16 parts, ATTN_AMX_FP32=0 turns that off)"
                           : "AMX-BF16 in use (bf16 forward and backward, any head size)";
    case AmxUse::kNever:
      break;
  }
  return amx_available() ? "AMX-BF16 available, turned off (ATTN_AMX=0 or set_amx_use)" : "no AMX";
}
}  // namespace

std::string amx_status() {
  // A value of ATTN_AMX other than 0 or 1 (read as "use where available") is said.
  const char* setting = std::getenv("ATTN_AMX");
  if (setting != nullptr && std::strcmp(setting, "0") != 0 && std::strcmp(setting, "1") != 0) {
    return "ATTN_AMX='" + std::string(setting) + "' not understood (expected 0 or 1); " +
           status_of_use();
  }
  return status_of_use();
}

}  // namespace attn
