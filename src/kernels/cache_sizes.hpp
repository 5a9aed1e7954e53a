// The running CPU's cache sizes, for the kernels' blocks chosen at run time rather than tuned to
// one machine.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <fstream>
#include <string>

namespace attn {

// Bytes of one core's L2 as the system reports it (glibc reads it from CPUID); 512 KiB, the
// smallest L2 among the x86 cores attn is measured on (Zen 3), when the system does not say.
inline size_t l2_cache_bytes() {
  static const size_t bytes = [] {
    const long reported = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return reported > 0 ? static_cast<size_t>(reported) : size_t{512} * 1024;
  }();
  return bytes;
}

// Bytes of one instance of the L3 (shared by a group of cores: a Zen CCD, a Xeon socket), from
// Linux's sysfs: glibc's sysconf gives the whole socket's on AMD (384 MiB on a 12-CCD EPYC whose
// cores each reach 32). 16 MiB, a Zen 3 CCD's, when neither says.
inline size_t l3_cache_bytes() {
  static const size_t bytes = [] {
    for (int index = 0; index < 8; ++index) {
      const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index);
      std::ifstream level_file(dir + "/level"), size_file(dir + "/size");
      int level = 0;
      size_t kib = 0;
      std::string unit;
      if (level_file >> level && level == 3 && size_file >> kib >> unit && kib > 0)
        return kib * 1024;
    }
    return size_t{16} * 1024 * 1024;
  }();
  return bytes;
}

// Whether a kernel writes an output of `bytes` with streaming stores (past the caches): only one
// larger than the L2s of the `threads` threads that write it, which it would leave anyway, and
// whose stores otherwise wait on a read for ownership per line; an output that fits them stays
// there for the operation that reads it next.
inline bool streams_output(double bytes, int threads) {
  return bytes > static_cast<double>(l2_cache_bytes()) * static_cast<double>(threads);
}

}  // namespace attn
