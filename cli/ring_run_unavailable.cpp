// `attn run --ring` in a build without MPI (attn::dist not built): a clear error instead.
#include "attn/core/error.hpp"
#include "ring_run.hpp"

namespace attn::cli {

void run_ring(const RingRunRequest& /*request*/) {
  throw ValueError(
      "--ring: this attn was built without MPI (install an MPI implementation, e.g. Debian's "
      "libopenmpi-dev and openmpi-bin, and rebuild)");
}

bool ring_started() {
  return false;
}

}  // namespace attn::cli
