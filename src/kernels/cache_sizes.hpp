// The running CPU's cache sizes, for the kernels' blocks chosen at run time rather than tuned to
// one machine.
#pragma once

#include <unistd.h>

#include <cstddef>

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

}  // namespace attn
