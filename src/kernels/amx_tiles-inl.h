// The bf16 forward's two tile products on AMX tiles (Sᵀ = K·Qᵀ and Oᵀ += Vᵀ·P), for the AVX-512
// targets (a Highway "-inl.h" header); the tile instructions either run (AmxHardwareTiles) or are
// carried out by a C++ model of each (AmxTileModel), which tests use on CPUs without AMX.
//
// Every tile is 16 rows of 64 bytes: 16 × 16 fp32, or 16 rows of 16 bf16 pairs. TDPBF16PS adds to
// C (16 × 16 fp32) the products of A (16 rows of 16 bf16 pairs) and B (16 rows of 16 pairs, row p
// holding pair p of each of the 16 columns): C[i][j] += Σ_p A[i][p]·B[p][j] over both halves of
// each pair — the pair layouts the vdpbf16ps path already packs (tile_gemm_bf16-inl.h).

#if defined(ATTN_KERNELS_AMX_TILES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_KERNELS_AMX_TILES_INL_H_
#undef ATTN_KERNELS_AMX_TILES_INL_H_
#else
#define ATTN_KERNELS_AMX_TILES_INL_H_
#endif

#include <hwy/highway.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
#ifndef ATTN_AMX_TARGET
#define ATTN_AMX_TARGET __attribute__((target(HWY_TARGET_STR ",avx512bf16,amx-tile,amx-bf16")))
#endif

namespace amx {

constexpr size_t kRows = 16;      // rows of every tile
constexpr size_t kRowBytes = 64;  // bytes of every tile row
constexpr size_t kPairs = 16;     // bf16 pairs (or floats) per tile row
constexpr size_t kTileCount = 8;

// LDTILECFG's 64-byte operand (palette 1): each tile's rows and bytes per row.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// The one shape the products here use: tiles 0–7 all 16 × 64 bytes. A constant in memory, so that
// LDTILECFG reads all 64 bytes from there (GCC's intrinsic tells the compiler of 8 of them).
constexpr TileConfig FullTileConfig() {
  TileConfig config;
  for (size_t t = 0; t < kTileCount; ++t) {
    config.bytes_per_row[t] = kRowBytes;
    config.rows[t] = kRows;
  }
  return config;
}
inline constexpr TileConfig kFullTiles = FullTileConfig();

// The tile registers as the products below name them: four accumulators C (tiles 0–3), two A
// operands (4, 5) and two B operands (6, 7); C(2i + j) += A(4 + i) · B(6 + j).
enum Tile : int { kC00 = 0, kC01 = 1, kC10 = 2, kC11 = 3, kA0 = 4, kA1 = 5, kB0 = 6, kB1 = 7 };

// The instructions themselves. GCC's tile intrinsics name the register by pasting the argument's
// text into the assembly (so it must be a literal) and tell the compiler nothing of the memory
// they read or write: each load, store and configuration is fenced for the compiler.
class AmxHardwareTiles {
 public:
  ATTN_AMX_TARGET HWY_INLINE void Configure(const TileConfig& config) {
    __asm__ volatile("" ::: "memory");
    _tile_loadconfig(&config);
  }
  ATTN_AMX_TARGET HWY_INLINE void Release() { _tile_release(); }

  template <int kTile>
  ATTN_AMX_TARGET HWY_INLINE void Load(const void* source, size_t stride_bytes) {
    __asm__ volatile("" ::: "memory");
    const auto stride = static_cast<long>(stride_bytes);  // NOLINT(google-runtime-int)
    if constexpr (kTile == 0) _tile_loadd(0, source, stride);
    if constexpr (kTile == 1) _tile_loadd(1, source, stride);
    if constexpr (kTile == 2) _tile_loadd(2, source, stride);
    if constexpr (kTile == 3) _tile_loadd(3, source, stride);
    if constexpr (kTile == 4) _tile_loadd(4, source, stride);
    if constexpr (kTile == 5) _tile_loadd(5, source, stride);
    if constexpr (kTile == 6) _tile_loadd(6, source, stride);
    if constexpr (kTile == 7) _tile_loadd(7, source, stride);
  }
  template <int kTile>
  ATTN_AMX_TARGET HWY_INLINE void Store(void* destination, size_t stride_bytes) {
    const auto stride = static_cast<long>(stride_bytes);  // NOLINT(google-runtime-int)
    if constexpr (kTile == 0) _tile_stored(0, destination, stride);
    if constexpr (kTile == 1) _tile_stored(1, destination, stride);
    if constexpr (kTile == 2) _tile_stored(2, destination, stride);
    if constexpr (kTile == 3) _tile_stored(3, destination, stride);
    static_assert(kTile <= 3, "only the accumulators are stored");
    __asm__ volatile("" ::: "memory");
  }
  template <int kTile>
  ATTN_AMX_TARGET HWY_INLINE void Zero() {
    if constexpr (kTile == 0) _tile_zero(0);
    if constexpr (kTile == 1) _tile_zero(1);
    if constexpr (kTile == 2) _tile_zero(2);
    if constexpr (kTile == 3) _tile_zero(3);
    static_assert(kTile <= 3, "only the accumulators are zeroed");
  }
  // C += A · B on bf16 pairs.
  template <int kC, int kA, int kB>
  ATTN_AMX_TARGET HWY_INLINE void DotBF16() {
    if constexpr (kC == kC00 && kA == kA0 && kB == kB0) _tile_dpbf16ps(0, 4, 6);
    if constexpr (kC == kC01 && kA == kA0 && kB == kB1) _tile_dpbf16ps(1, 4, 7);
    if constexpr (kC == kC10 && kA == kA1 && kB == kB0) _tile_dpbf16ps(2, 5, 6);
    if constexpr (kC == kC11 && kA == kA1 && kB == kB1) _tile_dpbf16ps(3, 5, 7);
    static_assert(kC == 2 * (kA - kA0) + (kB - kB0), "C(2i + j) += A(4 + i) · B(6 + j) only");
  }
};

// What each instruction does, written out (Intel's pseudocode for LDTILECFG, TILELOADD,
// TILESTORED, TILEZERO and TDPBF16PS), with the checks by which the CPU would fault: a tile used
// before a configuration, or a product whose shapes disagree, throws std::logic_error.
class AmxTileModel {
 public:
  void Configure(const TileConfig& config) {
    if (config.palette != 1) throw std::logic_error("AMX model: palette must be 1");
    for (size_t t = 0; t < kTileCount; ++t) {
      if (config.rows[t] > kRows || config.bytes_per_row[t] > kRowBytes ||
          config.bytes_per_row[t] % 4 != 0) {
        throw std::logic_error("AMX model: tile " + std::to_string(t) +
                               " configured beyond 16 × 64");
      }
    }
    config_ = config;
    configured_ = true;
    std::memset(tiles_, 0, sizeof tiles_);
  }
  void Release() { configured_ = false; }

  template <int kTile>
  void Load(const void* source, size_t stride_bytes) {
    Require(kTile);
    for (size_t r = 0; r < config_.rows[kTile]; ++r) {
      std::memcpy(tiles_[kTile][r], static_cast<const char*>(source) + r * stride_bytes,
                  config_.bytes_per_row[kTile]);
    }
  }
  template <int kTile>
  void Store(void* destination, size_t stride_bytes) {
    Require(kTile);
    for (size_t r = 0; r < config_.rows[kTile]; ++r) {
      std::memcpy(static_cast<char*>(destination) + r * stride_bytes, tiles_[kTile][r],
                  config_.bytes_per_row[kTile]);
    }
  }
  template <int kTile>
  void Zero() {
    Require(kTile);
    std::memset(tiles_[kTile], 0, sizeof tiles_[kTile]);
  }
  // C[m][n] += A.bf16[m][2k]·B.bf16[k][2n] + A.bf16[m][2k + 1]·B.bf16[k][2n + 1], in that order,
  // for k over A's pairs; each product is exact in fp32. As the hardware (probed on a Sapphire
  // Rapids-class core, AmxTiles.ModelFlushesDenormalsAsTheHardwareDoes), a denormal C read, product
  // or sum is ±0: 32 products of 2^-128 give 0, not 2^-123.
  template <int kC, int kA, int kB>
  void DotBF16() {
    Require(kC);
    Require(kA);
    Require(kB);
    const size_t rows = config_.rows[kC], columns = config_.bytes_per_row[kC] / 4;
    const size_t pairs = config_.bytes_per_row[kA] / 4;
    if (config_.rows[kA] != rows || config_.rows[kB] != pairs ||
        config_.bytes_per_row[kB] != config_.bytes_per_row[kC]) {
      throw std::logic_error("AMX model: TDPBF16PS operand shapes disagree");
    }
    for (size_t m = 0; m < rows; ++m) {
      for (size_t n = 0; n < columns; ++n) {
        float sum = Flushed(Float(kC, m, n));
        for (size_t k = 0; k < pairs; ++k) {
          sum = Flushed(sum + Flushed(Half(kA, m, 2 * k) * Half(kB, k, 2 * n)));
          sum = Flushed(sum + Flushed(Half(kA, m, 2 * k + 1) * Half(kB, k, 2 * n + 1)));
        }
        std::memcpy(tiles_[kC][m] + 4 * n, &sum, sizeof sum);
      }
    }
  }

 private:
  void Require(int tile) const {
    if (!configured_ || config_.rows[tile] == 0)
      throw std::logic_error("AMX model: tile " + std::to_string(tile) + " used unconfigured");
  }
  float Float(int tile, size_t row, size_t column) const {
    float value;
    std::memcpy(&value, tiles_[tile][row] + 4 * column, sizeof value);
    return value;
  }
  // x, or ±0 where x is denormal.
  static float Flushed(float x) {
    return std::fabs(x) < std::numeric_limits<float>::min() ? std::copysign(0.0F, x) : x;
  }
  // A bf16 operand as TDPBF16PS reads it: denormals as ±0 (measured on a Sapphire Rapids-class
  // core: fp32 in three parts lost the parts under 2^-126, split_parts_range.hpp).
  float Half(int tile, size_t row, size_t index) const {
    uint16_t bits;
    std::memcpy(&bits, tiles_[tile][row] + 2 * index, sizeof bits);
    if ((bits & 0x7F80U) == 0) bits &= 0x8000U;
    const uint32_t widened = static_cast<uint32_t>(bits) << 16;
    float value;
    std::memcpy(&value, &widened, sizeof value);
    return value;
  }

  TileConfig config_;
  bool configured_ = false;
  unsigned char tiles_[kTileCount][kRows][kRowBytes];
};

// The 2 × 2 block of accumulators over `steps` pairs of A and B tiles: A(i) at a_rows[i] + step ·
// a_step, B(j) at b_rows[j] + step · b_step (bytes), rows a_stride / b_stride bytes apart.
template <class Tiles>
ATTN_AMX_TARGET HWY_INLINE void DotBlock(Tiles& tiles, const char* a0, const char* a1,
                                         size_t a_step, size_t a_stride, const char* b0,
                                         const char* b1, size_t b_step, size_t b_stride,
                                         size_t steps) {
  for (size_t step = 0; step < steps; ++step) {
    tiles.template Load<kA0>(a0 + step * a_step, a_stride);
    tiles.template Load<kB0>(b0 + step * b_step, b_stride);
    tiles.template Load<kB1>(b1 + step * b_step, b_stride);
    tiles.template DotBF16<kC00, kA0, kB0>();
    tiles.template Load<kA1>(a1 + step * a_step, a_stride);
    tiles.template DotBF16<kC01, kA0, kB1>();
    tiles.template DotBF16<kC10, kA1, kB0>();
    tiles.template DotBF16<kC11, kA1, kB1>();
  }
}

// The 2 × 2 accumulators to or from a float matrix (32 × 32 at `c`, rows `stride` floats apart).
template <class Tiles>
ATTN_AMX_TARGET HWY_INLINE void StoreBlock(Tiles& tiles, float* c, size_t stride) {
  const size_t bytes = stride * sizeof(float);
  tiles.template Store<kC00>(c, bytes);
  tiles.template Store<kC01>(c + kPairs, bytes);
  tiles.template Store<kC10>(c + kRows * stride, bytes);
  tiles.template Store<kC11>(c + kRows * stride + kPairs, bytes);
}
template <class Tiles>
ATTN_AMX_TARGET HWY_INLINE void LoadBlock(Tiles& tiles, const float* c, size_t stride) {
  const size_t bytes = stride * sizeof(float);
  tiles.template Load<kC00>(c, bytes);
  tiles.template Load<kC01>(c + kPairs, bytes);
  tiles.template Load<kC10>(c + kRows * stride, bytes);
  tiles.template Load<kC11>(c + kRows * stride + kPairs, bytes);
}

// The 2 × 2 accumulators' starting sums: the block of C (kAccumulate) or zeros.
template <bool kAccumulate, class Tiles>
ATTN_AMX_TARGET HWY_INLINE void StartBlock(Tiles& tiles, const float* c, size_t stride) {
  if constexpr (kAccumulate) {
    LoadBlock(tiles, c, stride);
  } else {
    tiles.template Zero<kC00>();
    tiles.template Zero<kC01>();
    tiles.template Zero<kC10>();
    tiles.template Zero<kC11>();
  }
}

// C (rows × cols floats, rows c_stride floats apart) = A·B, or += with kAccumulate, over `pairs`
// bf16 pairs (a multiple of 16): A as rows of pairs (a_stride words apart), each row's next 16
// pairs a_step words on (16: rows of consecutive pairs), B as `pairs` rows of cols pairs
// (b_stride words apart), one pair per column. rows and cols are multiples of 32. The forward's
// two products (below) and the backward's five (flash_attention_backward.cpp) take this form.
template <bool kAccumulate, class Tiles>
ATTN_AMX_TARGET HWY_NOINLINE void ProductOnTiles(Tiles& tiles, const uint32_t* a, size_t a_stride,
                                                 const uint32_t* b, size_t b_stride, size_t pairs,
                                                 float* c, size_t c_stride, size_t rows,
                                                 size_t cols, size_t a_step = kPairs) {
  const size_t a_bytes = a_stride * sizeof(uint32_t), b_bytes = b_stride * sizeof(uint32_t);
  for (size_t row = 0; row < rows; row += 2 * kRows) {
    const auto* a0 = reinterpret_cast<const char*>(a + row * a_stride);
    const char* a1 = a0 + kRows * a_bytes;
    for (size_t col = 0; col < cols; col += 2 * kPairs) {
      float* block = c + row * c_stride + col;
      StartBlock<kAccumulate>(tiles, block, c_stride);
      const auto* b0 = reinterpret_cast<const char*>(b + col);
      DotBlock(tiles, a0, a1, a_step * sizeof(uint32_t), a_bytes, b0,
               b0 + kPairs * sizeof(uint32_t), kPairs * b_bytes, b_bytes, pairs / kPairs);
      StoreBlock(tiles, block, c_stride);
    }
  }
}

// ProductOnTiles on operands split into three bf16 parts each (the fp32 forward on tiles,
// SplitThreeBF16): A's parts hi, mid, lo at a, a + a_part, a + 2·a_part (words), B's likewise at
// b_part apart. C gets the six products whose terms reach 2^-16 of A·B: hi·lo, hi·mid, hi·hi,
// mid·mid, mid·hi, lo·hi; mid·lo, lo·mid and lo·lo, each under 2^-23 of it, are left out. The
// accumulators stay in their tiles across the six, and each step loads an A part once for all the
// B parts it meets (A, the keys or Vᵀ, comes from L2 or beyond; B, Qᵀ or P, from L1): 6 A tiles
// a step instead of 12, and 12 B tiles. kFewestLoads (the backward, whose B operands come from L2
// as well) orders the six so that each changes one operand: 8 A tiles and 6 B tiles a step, 14
// loads instead of 18: the fp32 backward 1.08–1.10× faster at n = 1024 and 4096, 1 and 2 threads,
// on a Sapphire Rapids-class core; the forward, whose B stays in L1, read 1.00× / 0.98× in that
// order. The terms' order differs, so the sums round differently.
// `parts` says how many of each operand's parts may be nonzero, and the products that read a zero
// part are left out, with the same sums: an fp16 value is a bf16 hi and mid exactly, its lo 0
// (NaN where mid is NaN): two parts; a bf16 value is its hi alone: one. The fp16 backward's K, V,
// Q and dO, unscaled, take five or four of the six (1.09 / 1.12× at n = 1024 / 4096, 1 thread,
// Sapphire Rapids-class); the fp16 forward's K and V read 0.99–1.00× with it, and do not pass it.
// The bf16 forward's P·V takes Vᵀ in one part and P in three: hi·lo, hi·mid, hi·hi.
struct SplitPartCounts {
  size_t a = 3, b = 3;
};
template <bool kAccumulate, bool kFewestLoads = false, class Tiles>
ATTN_AMX_TARGET HWY_NOINLINE void SplitProductOnTiles(
    Tiles& tiles, const uint32_t* a, size_t a_stride, size_t a_part, const uint32_t* b,
    size_t b_stride, size_t b_part, size_t pairs, float* c, size_t c_stride, size_t rows,
    size_t cols, size_t a_step = kPairs, SplitPartCounts parts = {}) {
  const size_t a_bytes = a_stride * sizeof(uint32_t), b_bytes = b_stride * sizeof(uint32_t);
  const size_t a_part_bytes = a_part * sizeof(uint32_t), b_part_bytes = b_part * sizeof(uint32_t);
  const size_t a_step_bytes = a_step * sizeof(uint32_t), b_step_bytes = kPairs * b_bytes;
  for (size_t row = 0; row < rows; row += 2 * kRows) {
    const auto* a_rows = reinterpret_cast<const char*>(a + row * a_stride);
    for (size_t col = 0; col < cols; col += 2 * kPairs) {
      float* block = c + row * c_stride + col;
      StartBlock<kAccumulate>(tiles, block, c_stride);
      const auto* b_cols = reinterpret_cast<const char*>(b + col);
      for (size_t step = 0; step < pairs / kPairs; ++step) {
        const char* a_here = a_rows + step * a_step_bytes;
        const char* b_here = b_cols + step * b_step_bytes;
        // The A tiles loaded times the B tiles loaded, into the four accumulators.
        const auto times_loaded_b = [&] {
          tiles.template DotBF16<kC00, kA0, kB0>();
          tiles.template DotBF16<kC01, kA0, kB1>();
          tiles.template DotBF16<kC10, kA1, kB0>();
          tiles.template DotBF16<kC11, kA1, kB1>();
        };
        // B part `part` loaded, times the A tiles loaded.
        const auto times_b = [&](size_t part) {
          const char* b0 = b_here + part * b_part_bytes;
          tiles.template Load<kB0>(b0, b_bytes);
          tiles.template Load<kB1>(b0 + kPairs * sizeof(uint32_t), b_bytes);
          times_loaded_b();
        };
        const auto load_a = [&](size_t part) {
          const char* a0 = a_here + part * a_part_bytes;
          tiles.template Load<kA0>(a0, a_bytes);
          tiles.template Load<kA1>(a0 + kRows * a_bytes, a_bytes);
        };
        if constexpr (kFewestLoads) {
          // Each pair changes one operand from the one before: 7 loads of a part's two tiles.
          if (parts.b > 1) {
            load_a(0);  // hi · lo, hi · mid
            if (parts.b > 2) times_b(2);
            times_b(1);
          }
          if (parts.a > 1) {
            load_a(1);  // mid · mid, mid · hi
            if (parts.b > 1) times_loaded_b();
            times_b(0);
            load_a(0);  // hi · hi
            times_loaded_b();
          } else {
            if (parts.b == 1) load_a(0);
            times_b(0);  // hi · hi
          }
          if (parts.a > 2) {
            load_a(2);  // lo · hi
            times_loaded_b();
          }
        } else {
          load_a(0);  // hi · (lo, mid, hi)
          if (parts.b > 2) times_b(2);
          if (parts.b > 1) times_b(1);
          times_b(0);
          if (parts.a > 1) {
            load_a(1);  // mid · (mid, hi)
            if (parts.b > 1) times_b(1);
            times_b(0);
          }
          if (parts.a > 2) {
            load_a(2);  // lo · hi
            times_b(0);
          }
        }
      }
      StoreBlock(tiles, block, c_stride);
    }
  }
}

// data[0, count) ⊙= scale, count a multiple of 16: the tiles' sums of products scaled as the
// vdpbf16ps path scales them on storing (the forward's and the backward's scores).
HWY_INLINE void ScaleInPlace(float* data, size_t count, float scale) {
  const hwy::HWY_NAMESPACE::FixedTag<float, 16> d;
  const auto factor = hwy::HWY_NAMESPACE::Set(d, scale);
  for (size_t e = 0; e < count; e += 16) {
    hwy::HWY_NAMESPACE::Store(
        hwy::HWY_NAMESPACE::Mul(hwy::HWY_NAMESPACE::Load(d, data + e), factor), d, data + e);
  }
}

// Sᵀ (key_rows × br floats, rows br apart) = K·Qᵀ, unscaled: K's rows as bf16 pairs (depth_pairs
// per row, a multiple of 16; rows key_stride words apart, depth_pairs unless given), Qᵀ as
// depth_pairs rows of br pairs. key_rows and br are multiples of 32; every row read must be
// readable (the caller pads).
template <class Tiles>
ATTN_AMX_TARGET HWY_INLINE void ScoresOnTiles(Tiles& tiles, const uint32_t* key_pairs,
                                              size_t depth_pairs, size_t key_rows,
                                              const uint32_t* query_pairs, size_t br, float* scores,
                                              size_t key_stride = 0) {
  ProductOnTiles<false>(tiles, key_pairs, key_stride == 0 ? depth_pairs : key_stride, query_pairs,
                        br, depth_pairs, scores, br, key_rows, br);
}

// Oᵀ (value_rows × br floats, rows br apart) += Vᵀ·P over `pairs` key pairs (a multiple of 16), or
// = Vᵀ·P where `kAccumulate` is false (Oᵀ's first sums): Vᵀ in blocks of 16 pairs (32 keys),
// `block_words` apart, each block value_rows rows of its 16 bf16 pairs of adjacent keys, 64 bytes
// a row; P as `pairs` rows of br pairs. value_rows and br are multiples of 32.
template <bool kAccumulate = true, class Tiles>
ATTN_AMX_TARGET HWY_INLINE void ValuesOnTiles(Tiles& tiles, const uint32_t* value_blocks,
                                              size_t block_words, size_t value_rows, size_t pairs,
                                              const uint32_t* probability_pairs, size_t br,
                                              float* out_transposed) {
  ProductOnTiles<kAccumulate>(tiles, value_blocks, kPairs, probability_pairs, br, pairs,
                              out_transposed, br, value_rows, br, block_words);
}

}  // namespace amx
#endif  // HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#endif  // include guard
