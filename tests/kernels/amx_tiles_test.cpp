// The AMX tile products of the bf16 forward and backward (src/kernels/amx_tiles-inl.h) against
// their definition in double: on the C++ model of the tile instructions wherever the CPU has
// AVX512-BF16, and on the instructions themselves where it has AMX (skipped, saying so, elsewhere),
// and the model's faults for tiles it was not configured for.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tests/kernels/amx_tiles_test.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// Highway's headers must follow foreach_target.h.
#include <hwy/highway.h>

#include "kernels/amx_tiles-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn {
namespace HWY_NAMESPACE {

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
template <class Tiles>
ATTN_AMX_TARGET void RunTileProducts(Tiles& tiles, const uint32_t* key_pairs, size_t depth_pairs,
                                     size_t key_rows, const uint32_t* query_pairs, size_t br,
                                     float* scores, const uint32_t* value_blocks,
                                     size_t block_words, size_t value_rows, size_t pairs,
                                     const uint32_t* probability_pairs, float* out_transposed) {
  tiles.Configure(amx::kFullTiles);
  amx::ScoresOnTiles(tiles, key_pairs, depth_pairs, key_rows, query_pairs, br, scores);
  amx::ValuesOnTiles(tiles, value_blocks, block_words, value_rows, pairs, probability_pairs, br,
                     out_transposed);
  tiles.Release();
}

template <class Tiles>
ATTN_AMX_TARGET void RunGeneralProduct(Tiles& tiles, bool accumulate, const uint32_t* a,
                                       size_t a_stride, const uint32_t* b, size_t b_stride,
                                       size_t pairs, float* c, size_t c_stride, size_t rows,
                                       size_t cols) {
  tiles.Configure(amx::kFullTiles);
  if (accumulate) {
    amx::ProductOnTiles<true>(tiles, a, a_stride, b, b_stride, pairs, c, c_stride, rows, cols);
  } else {
    amx::ProductOnTiles<false>(tiles, a, a_stride, b, b_stride, pairs, c, c_stride, rows, cols);
  }
  tiles.Release();
}
#endif

// amx::ProductOnTiles (the backward's products), on the hardware's tiles or the model's; false
// where this target has no AMX path.
bool EvaluateGeneralProduct(bool hardware, bool accumulate, const uint32_t* a, size_t a_stride,
                            const uint32_t* b, size_t b_stride, size_t pairs, float* c,
                            size_t c_stride, size_t rows, size_t cols) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (hardware) {
    amx::AmxHardwareTiles tiles;
    RunGeneralProduct(tiles, accumulate, a, a_stride, b, b_stride, pairs, c, c_stride, rows, cols);
  } else {
    amx::AmxTileModel tiles;
    RunGeneralProduct(tiles, accumulate, a, a_stride, b, b_stride, pairs, c, c_stride, rows, cols);
  }
  return true;
#else
  (void)hardware, (void)accumulate, (void)a, (void)a_stride, (void)b, (void)b_stride, (void)pairs;
  (void)c, (void)c_stride, (void)rows, (void)cols;
  return false;
#endif
}

// Both products, on the hardware's tiles or the model's; false where this target has no AMX path.
bool EvaluateTileProducts(bool hardware, const uint32_t* key_pairs, size_t depth_pairs,
                          size_t key_rows, const uint32_t* query_pairs, size_t br, float* scores,
                          const uint32_t* value_blocks, size_t block_words, size_t value_rows,
                          size_t pairs, const uint32_t* probability_pairs, float* out_transposed) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (hardware) {
    amx::AmxHardwareTiles tiles;
    RunTileProducts(tiles, key_pairs, depth_pairs, key_rows, query_pairs, br, scores, value_blocks,
                    block_words, value_rows, pairs, probability_pairs, out_transposed);
  } else {
    amx::AmxTileModel tiles;
    RunTileProducts(tiles, key_pairs, depth_pairs, key_rows, query_pairs, br, scores, value_blocks,
                    block_words, value_rows, pairs, probability_pairs, out_transposed);
  }
  return true;
#else
  (void)hardware, (void)key_pairs, (void)depth_pairs, (void)key_rows, (void)query_pairs, (void)br;
  (void)scores, (void)value_blocks, (void)block_words, (void)value_rows, (void)pairs;
  (void)probability_pairs, (void)out_transposed;
  return false;
#endif
}

// A product on a model tile that Configure never set up; false where this target has no model.
bool UseUnconfiguredModelTile() {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  amx::AmxTileModel tiles;
  tiles.DotBF16<amx::kC00, amx::kA0, amx::kB0>();
  return true;
#else
  return false;
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace attn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/core/half.hpp"
#include "attn/kernels/amx.hpp"
#include "every_simd_target.hpp"
#include "test_support.hpp"

namespace attn {
HWY_EXPORT(EvaluateTileProducts);
HWY_EXPORT(EvaluateGeneralProduct);
HWY_EXPORT(UseUnconfiguredModelTile);
namespace {

class AmxTiles : public testing::EverySimdTarget {};

bool cpu_has_avx512_bf16() {
  return __builtin_cpu_supports("avx512bf16") != 0;
}

// A pair of random normal bf16 values in one word (low half first), and its two values.
uint32_t random_pair(Rng& rng, float magnitude) {
  const auto low = float_to_half_bits(HalfType::kBFloat16, rng.normal() * magnitude);
  const auto high = float_to_half_bits(HalfType::kBFloat16, rng.normal() * magnitude);
  return low | static_cast<uint32_t>(high) << 16;
}
double half_of(uint32_t pair, int which) {
  return half_bits_to_float(HalfType::kBFloat16, static_cast<uint16_t>(pair >> (16 * which)));
}

// Σ_p a(p)·b(p) over both halves of each pair against the fp32 result: fp32 accumulation of `terms`
// exact products errs by at most terms·2⁻²⁴ times the sum of their magnitudes (plus the start
// value's magnitude).
void expect_dot(float got, double start, const std::vector<uint32_t>& a, size_t a_first,
                size_t a_step, const std::vector<uint32_t>& b, size_t b_first, size_t b_step,
                size_t pairs, const std::string& where) {
  double want = start, magnitude = std::abs(start);
  for (size_t p = 0; p < pairs; ++p) {
    for (int half = 0; half < 2; ++half) {
      const double product =
          half_of(a[a_first + p * a_step], half) * half_of(b[b_first + p * b_step], half);
      want += product;
      magnitude += std::abs(product);
    }
  }
  const double bound = static_cast<double>(2 * pairs + 1) * 0x1p-24 * magnitude;
  ASSERT_NEAR(got, want, bound) << where;
}

void check_tile_products(bool hardware, const std::string& which) {
  Rng rng(hardware ? 41 : 40);
  for (const size_t depth_pairs : {size_t{16}, size_t{32}, size_t{64}}) {
    // Vᵀ in blocks of 16 pairs, each value_rows rows of 64 bytes, block_words apart (wider than a
    // block's data, whose padding must not be read).
    const size_t key_rows = 64, br = 64, value_rows = 32, pairs = 48;
    const size_t block_words = (value_rows + 2) * 16, blocks = pairs / 16 + 1;
    std::vector<uint32_t> keys(key_rows * depth_pairs), queries(depth_pairs * br);
    std::vector<uint32_t> values(blocks * block_words), probabilities(pairs * br);
    for (uint32_t& pair : keys) pair = random_pair(rng, 1.0F);
    for (uint32_t& pair : queries) pair = random_pair(rng, 1.0F);
    for (uint32_t& pair : values) pair = random_pair(rng, 1.0F);
    for (uint32_t& pair : probabilities) pair = random_pair(rng, 0.25F);
    std::vector<float> scores(key_rows * br, -1.0F), out(value_rows * br);
    for (float& value : out) value = rng.normal();
    const std::vector<float> out_before = out;
    // The values' first block is skipped: the product starts at an offset as the kernel's does.
    ASSERT_TRUE(HWY_DYNAMIC_DISPATCH(EvaluateTileProducts)(
        hardware, keys.data(), depth_pairs, key_rows, queries.data(), br, scores.data(),
        values.data() + block_words, block_words, value_rows, pairs, probabilities.data(),
        out.data()));
    for (size_t j = 0; j < key_rows; ++j) {
      for (size_t r = 0; r < br; ++r) {
        expect_dot(scores[j * br + r], 0.0, keys, j * depth_pairs, 1, queries, r, br, depth_pairs,
                   which + " scores (" + std::to_string(j) + ", " + std::to_string(r) +
                       "), depth pairs " + std::to_string(depth_pairs));
      }
    }
    for (size_t c = 0; c < value_rows; ++c) {
      std::vector<uint32_t> column(pairs);  // column c's pairs, gathered from the blocks
      for (size_t p = 0; p < pairs; ++p)
        column[p] = values[(p / 16 + 1) * block_words + c * 16 + p % 16];
      for (size_t r = 0; r < br; ++r) {
        expect_dot(out[c * br + r], out_before[c * br + r], column, 0, 1, probabilities, r, br,
                   pairs, which + " output (" + std::to_string(c) + ", " + std::to_string(r) + ")");
      }
    }
  }
}

// C = A·B and C += A·B (amx::ProductOnTiles) over 2 × 2 blocks of tiles in both directions, with
// strides wider than the data (rows of A, B and C padded by 16 words) as the backward's operands.
void check_general_products(bool hardware, const std::string& which) {
  Rng rng(hardware ? 43 : 42);
  const size_t rows = 64, cols = 64, pairs = 48;
  const size_t a_stride = pairs + 16, b_stride = cols + 16, c_stride = cols + 16;
  std::vector<uint32_t> a(rows * a_stride), b(pairs * b_stride);
  for (uint32_t& pair : a) pair = random_pair(rng, 1.0F);
  for (uint32_t& pair : b) pair = random_pair(rng, 1.0F);
  for (const bool accumulate : {false, true}) {
    std::vector<float> c(rows * c_stride);
    for (float& value : c) value = rng.normal();
    const std::vector<float> before = c;
    ASSERT_TRUE(HWY_DYNAMIC_DISPATCH(EvaluateGeneralProduct)(hardware, accumulate, a.data(),
                                                             a_stride, b.data(), b_stride, pairs,
                                                             c.data(), c_stride, rows, cols));
    for (size_t i = 0; i < rows; ++i) {
      for (size_t j = 0; j < c_stride; ++j) {
        const std::string where = which + (accumulate ? " C += A·B (" : " C = A·B (") +
                                  std::to_string(i) + ", " + std::to_string(j) + ")";
        if (j >= cols) {  // the padding columns are not written
          ASSERT_EQ(c[i * c_stride + j], before[i * c_stride + j]) << where;
          continue;
        }
        expect_dot(c[i * c_stride + j], accumulate ? before[i * c_stride + j] : 0.0, a,
                   i * a_stride, 1, b, j, b_stride, pairs, where);
      }
    }
  }
}

TEST_P(AmxTiles, ModelProductsMatchTheirDefinition) {
  if (!cpu_has_avx512_bf16()) GTEST_SKIP() << "the AMX path's code needs AVX512-BF16";
  if (GetParam() != HWY_AVX3 && GetParam() != HWY_AVX3_DL)
    GTEST_SKIP() << "the AMX path is compiled for the AVX-512 targets only";
  check_tile_products(false, "model");
  check_general_products(false, "model");
}

TEST_P(AmxTiles, HardwareProductsMatchTheirDefinition) {
  if (!amx_available())
    GTEST_SKIP() << "no AMX-BF16 on this CPU, or Linux refused this process the tile state";
  if (GetParam() != HWY_AVX3 && GetParam() != HWY_AVX3_DL)
    GTEST_SKIP() << "the AMX path is compiled for the AVX-512 targets only";
  check_tile_products(true, "hardware");
  check_general_products(true, "hardware");
}

// C += A·B on 32 × 32 tiles over 16 pairs where products, sums or C's start fall under 2^-126:
// TDPBF16PS reads a denormal C as 0 and flushes each denormal product and sum (probed on a
// Sapphire Rapids-class core), and so must the model the tests run in its place on CPUs without
// AMX (it kept them: 32 products of 2^-128 summed to 2^-123 where the hardware gives 0). C[0][0]
// of each case, on the model and, where the CPU has AMX, on the hardware.
void check_denormals(bool hardware, const std::string& which) {
  struct Case {
    const char* name;
    float a_low, b_low, a_high, b_high;  // each row's pairs and each column's
    bool every_pair;                     // all 16 pairs, or the first alone
    float start, want;
  };
  const Case cases[] = {
      {"one product of 2^-128", 0x1p-64F, 0x1p-64F, 0.0F, 0.0F, false, 0.0F, 0.0F},
      {"32 products of 2^-128", 0x1p-64F, 0x1p-64F, 0x1p-64F, 0x1p-64F, true, 0.0F, 0.0F},
      {"C of 2^-130", 0.0F, 0.0F, 0.0F, 0.0F, false, 0x1p-130F, 0.0F},
      {"C of 2^-126", 0.0F, 0.0F, 0.0F, 0.0F, false, 0x1p-126F, 0x1p-126F},
      {"2^-120 less 2^-120 (1 - 2^-8)", 0x1p-60F, 0x1p-60F, -0x1p-60F, 0x1p-60F - 0x1p-68F, false,
       0.0F, 0.0F},
      {"1.5 · 2^-126 less 2^-126", 0x1p-63F, -0x1p-63F, 0.0F, 0.0F, false, 0x1.8p-126F, 0.0F},
      {"2^-100 plus 32 products of 2^-128", 0x1p-64F, 0x1p-64F, 0x1p-64F, 0x1p-64F, true, 0x1p-100F,
       0x1p-100F},
  };
  const size_t rows = 32, cols = 32, pairs = 16;
  const auto pair_of = [](float low, float high) {
    return float_to_half_bits(HalfType::kBFloat16, low) |
           static_cast<uint32_t>(float_to_half_bits(HalfType::kBFloat16, high)) << 16;
  };
  for (const Case& c : cases) {
    std::vector<uint32_t> a(rows * pairs, 0U), b(pairs * cols, 0U);
    const size_t used = c.every_pair ? pairs : 1;
    for (size_t i = 0; i < rows; ++i)
      for (size_t k = 0; k < used; ++k) a[i * pairs + k] = pair_of(c.a_low, c.a_high);
    for (size_t k = 0; k < used; ++k)
      for (size_t j = 0; j < cols; ++j) b[k * cols + j] = pair_of(c.b_low, c.b_high);
    std::vector<float> out(rows * cols, c.start);
    ASSERT_TRUE(HWY_DYNAMIC_DISPATCH(EvaluateGeneralProduct)(
        hardware, true, a.data(), pairs, b.data(), cols, pairs, out.data(), cols, rows, cols));
    EXPECT_EQ(out[0], c.want) << which << ": " << c.name;
  }
}

TEST_P(AmxTiles, ModelFlushesDenormalsAsTheHardwareDoes) {
  if (!cpu_has_avx512_bf16()) GTEST_SKIP() << "the AMX path's code needs AVX512-BF16";
  if (GetParam() != HWY_AVX3 && GetParam() != HWY_AVX3_DL)
    GTEST_SKIP() << "the AMX path is compiled for the AVX-512 targets only";
  check_denormals(false, "model");
  if (amx_available()) check_denormals(true, "hardware");
}

TEST_P(AmxTiles, ModelFaultsOnUnconfiguredTiles) {
  if (GetParam() != HWY_AVX3 && GetParam() != HWY_AVX3_DL)
    GTEST_SKIP() << "the AMX path is compiled for the AVX-512 targets only";
  EXPECT_THROW(HWY_DYNAMIC_DISPATCH(UseUnconfiguredModelTile)(), std::logic_error);
}

ATTN_INSTANTIATE_FOR_EVERY_SIMD_TARGET(AmxTiles);

TEST(AmxUse, SetAndStatusAgree) {
  const AmxUse before = amx_use();
  set_amx_use(AmxUse::kModel);
  EXPECT_EQ(amx_use(), AmxUse::kModel);
  EXPECT_NE(amx_status().find("modelled"), std::string::npos) << amx_status();
  EXPECT_TRUE(amx_tiles_in_use());
  set_amx_use(AmxUse::kNever);
  EXPECT_EQ(amx_status().find("in use"), std::string::npos) << amx_status();
  EXPECT_FALSE(amx_tiles_in_use());
  set_amx_use(AmxUse::kWhereAvailable);
  EXPECT_EQ(amx_tiles_in_use(), amx_available());
  set_amx_use(before);
}

// Without ATTN_AMX the tiles are used where the CPU offers them; ATTN_AMX=0 turns them off.
TEST(AmxUse, TilesAreUsedByDefault) {
  const char* setting = std::getenv("ATTN_AMX");
  if (setting != nullptr && std::strcmp(setting, "0") == 0) {
    EXPECT_EQ(amx_use(), AmxUse::kNever);
  } else {
    EXPECT_EQ(amx_use(), AmxUse::kWhereAvailable);
    EXPECT_EQ(amx_status().find("in use") != std::string::npos, amx_available()) << amx_status();
  }
}

// ATTN_AMX is read as "0" (do not use) or anything else (use); a value other than 0 or 1 is named.
TEST(AmxUse, StatusNamesAnEnvironmentValueItDoesNotUnderstand) {
  const char* before = std::getenv("ATTN_AMX");
  const std::string saved = before != nullptr ? before : "";
  ASSERT_EQ(setenv("ATTN_AMX", "on", 1), 0);
  EXPECT_EQ(amx_status().rfind("ATTN_AMX='on' not understood (expected 0 or 1); ", 0), 0U)
      << amx_status();
  ASSERT_EQ(setenv("ATTN_AMX", "0", 1), 0);
  EXPECT_EQ(amx_status().find("not understood"), std::string::npos) << amx_status();
  if (before != nullptr) {
    setenv("ATTN_AMX", saved.c_str(), 1);
  } else {
    unsetenv("ATTN_AMX");
  }
}

}  // namespace
}  // namespace attn
#endif  // HWY_ONCE
