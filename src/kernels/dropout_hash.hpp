// The counter-based generator behind the fused kernels' dropout: a keep/drop decision for every
// (seed, batch·head, query, key) computed from those numbers alone, so the backward pass
// regenerates the forward pass's mask instead of storing it. Scalar form here; the SIMD kernels
// compute the same integers lane-wise (dropout-inl.h's DropoutBits).
#pragma once

#include <cstdint>

namespace attn::dropout_hash {

// Chris Wellons' "lowbias32" integer hash: a bijection on 32 bits with near-ideal avalanche.
constexpr uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

// SplitMix64's finaliser, to fold the 64-bit seed and the row's coordinates into one key.
constexpr uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The key of query `query` of matrix `head_index` (b·heads + h).
constexpr uint32_t row_key(uint64_t seed, int64_t head_index, int64_t query) {
  return static_cast<uint32_t>(
      mix64(mix64(seed ^ mix64(static_cast<uint64_t>(head_index))) + static_cast<uint64_t>(query)));
}

constexpr uint32_t kKeyStride = 0x9e3779b9U;  // odd, so distinct keys give distinct inputs

// 24 uniform bits for key `key` of that row.
constexpr uint32_t bits(uint32_t row, int64_t key) {
  return mix32(row + static_cast<uint32_t>(key) * kKeyStride) >> 8;
}

// Dropped when bits < threshold, where threshold = round(p · 2^24).
constexpr uint32_t threshold(float p) {
  return static_cast<uint32_t>(static_cast<double>(p) * 16777216.0 + 0.5);
}

}  // namespace attn::dropout_hash
