// Rng: the normal draw (Box–Muller), kept out of the header for <cmath>.
#include "attn/core/random.hpp"

#include <cmath>
#include <numbers>

namespace attn {

float Rng::normal() {
  // 53-bit uniforms in (0, 1] so the log never sees 0.
  const double u1 = (static_cast<double>(engine_() >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = static_cast<double>(engine_() >> 11) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

}  // namespace attn
