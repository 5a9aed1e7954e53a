// Rng: attn's seeded random generator, so that initialisation and dropout reproduce bit for bit on
// every platform (std:: distributions are implementation-defined, so we draw from raw bits).
#pragma once

#include <cstdint>
#include <random>

namespace attn {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) : engine_(seed) {}

  // Uniform in [0, 1) with 24 random bits: every float32 it returns is exact.
  float uniform() { return static_cast<float>(engine_() >> 40) * 0x1.0p-24F; }
  // Uniform in [low, high).
  float uniform(float low, float high) { return low + (high - low) * uniform(); }
  // Standard normal by Box–Muller, in double before rounding.
  float normal();
  uint64_t next_u64() { return engine_(); }

 private:
  std::mt19937_64 engine_;
};

}  // namespace attn
