// The fused flash-attention forward kernel against the double reference, on every SIMD target this
// machine runs: random shapes with tails that do not divide the tiles, n = 1, m = 1, n ≠ m, valid
// lengths 0 and m, per-query lengths, causal masks with n < m and n > m, multi-head strided views,
// large score magnitudes, query tiles in blocks (and a head's blocks in runs per task on two
// threads), scores rising across key tiles, outputs past the threads' L2s (streamed); fp32 on AMX
// tiles in three bf16 parts (hardware and the tile model).
#include "attn/kernels/flash_attention.hpp"

#include <gtest/gtest.h>
#include <hwy/targets.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/kernels/amx.hpp"
#include "every_simd_target.hpp"
#include "kernels/cache_sizes.hpp"
#include "scoped_bf16_products.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

using testing::close_to;
using testing::random_tensor;

// Each output is a convex combination of values (|v| ≲ 4) with float32 weights; the float32
// exponentials and sums differ from the double reference by a few ulps per term, so 1e-5 relative
// to the output's magnitude bounds them (the bound).
constexpr double kTolerance = 1e-5;

class FlashAttention : public testing::EverySimdTarget {};

struct Case {
  int64_t batch, heads, queries, keys, depth, value_depth;
  int mask_kind;  // 0 none, 1 per batch, 2 per query
  bool causal;
  float magnitude;
  // Powers of two the queries, keys and values are multiplied by after drawing (the output, and
  // its tolerance, then in units of the values' factor).
  float query_factor = 1.0F, key_factor = 1.0F, value_factor = 1.0F;
};

ValidLengths mask_for(const Case& c, Rng& rng) {
  const auto random_length = [&] {
    return static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(c.keys + 1));
  };
  if (c.mask_kind == 1) {
    std::vector<int64_t> lengths;
    for (int64_t b = 0; b < c.batch; ++b)
      lengths.push_back(b == 0 ? c.keys : b == 1 ? 0 : random_length());
    return ValidLengths::per_batch(lengths);
  }
  if (c.mask_kind == 2) {
    std::vector<int64_t> lengths;
    for (int64_t index = 0; index < c.batch * c.queries; ++index) {
      lengths.push_back(index == 0 ? 0 : index == 1 ? c.keys : random_length());
    }
    return ValidLengths::per_query(lengths, c.batch, c.queries);
  }
  return {};
}

// Runs the kernel on (B, n, heads·d) tensors viewed head by head, and the reference head by head.
void check_case(const Case& c, Rng& rng, int64_t target) {
  const auto times = [](Tensor tensor, float factor) {
    for (float& value : tensor.span()) value *= factor;
    return tensor;
  };
  const Tensor q =
      times(random_tensor(Shape{c.batch, c.queries, c.heads * c.depth}, rng, c.magnitude),
            c.query_factor);
  const Tensor k = times(random_tensor(Shape{c.batch, c.keys, c.heads * c.depth}, rng, c.magnitude),
                         c.key_factor);
  const Tensor v =
      times(random_tensor(Shape{c.batch, c.keys, c.heads * c.value_depth}, rng), c.value_factor);
  const ValidLengths mask = mask_for(c, rng);
  Tensor out = Tensor::full(Shape{c.batch, c.queries, c.heads * c.value_depth}, std::nanf(""));
  std::vector<float> lse(static_cast<size_t>(c.batch * c.heads * c.queries));
  const float scale = 1.0F / std::sqrt(static_cast<float>(c.depth));
  flash_attention_forward(
      split_heads(q, c.heads, "q"), split_heads(k, c.heads, "k"), split_heads(v, c.heads, "v"),
      mask, testing::kernel_options(scale, c.causal), split_heads(out, c.heads, "out"), lse.data());

  const ValidLengths effective =
      c.causal ? mask.with_causal_mask(c.batch, c.queries, c.keys) : mask;
  const auto lengths = testing::expand(effective, c.batch, c.queries, c.keys);
  std::vector<double> expected(static_cast<size_t>(out.numel()));
  for (int64_t h = 0; h < c.heads; ++h) {
    reference::Array<double> qh({c.batch, c.queries, c.depth}), kh({c.batch, c.keys, c.depth}),
        vh({c.batch, c.keys, c.value_depth});
    for (int64_t b = 0; b < c.batch; ++b) {
      for (int64_t i = 0; i < c.queries; ++i)
        for (int64_t t = 0; t < c.depth; ++t) qh.at(b, i, t) = q(b, i, h * c.depth + t);
      for (int64_t j = 0; j < c.keys; ++j) {
        for (int64_t t = 0; t < c.depth; ++t) kh.at(b, j, t) = k(b, j, h * c.depth + t);
        for (int64_t t = 0; t < c.value_depth; ++t) vh.at(b, j, t) = v(b, j, h * c.value_depth + t);
      }
    }
    const auto result = reference::dot_product_attention(qh, kh, vh, lengths, scale);
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t i = 0; i < c.queries; ++i) {
        for (int64_t t = 0; t < c.value_depth; ++t) {
          expected[static_cast<size_t>((b * c.queries + i) * c.heads * c.value_depth +
                                       h * c.value_depth + t)] = result.output.at(b, i, t);
        }
        // The log-sum-exp, the reference's.
        const float actual_lse = lse[static_cast<size_t>((b * c.heads + h) * c.queries + i)];
        const double expected_lse = result.log_sum_exp[static_cast<size_t>(b * c.queries + i)];
        if (expected_lse == -INFINITY) {  // a query that sees no key
          EXPECT_EQ(actual_lse, -std::numeric_limits<float>::infinity());
          continue;
        }
        // The lse carries the score's own float32 rounding: relative 1e-6 of its magnitude, plus
        // 1e-5.
        EXPECT_NEAR(actual_lse, expected_lse, 1e-5 + 1e-6 * std::abs(expected_lse));
      }
  }
  // Scores of magnitude s carry float32 rounding ~s·2⁻²⁴ into the exponent: scale the bound.
  const double tolerance = kTolerance * std::max(1.0F, c.magnitude * c.magnitude);
  const double unit = 1.0 / static_cast<double>(c.value_factor);
  for (double& value : expected) value *= unit;
  EXPECT_TRUE(close_to(times(out, static_cast<float>(unit)), expected, tolerance))
      << "target " << hwy::TargetName(target) << " B=" << c.batch << " H=" << c.heads
      << " n=" << c.queries << " m=" << c.keys << " d=" << c.depth << " dv=" << c.value_depth
      << " mask=" << c.mask_kind << " causal=" << c.causal;
}

TEST_P(FlashAttention, MatchesReferenceOnRandomShapes) {
  Rng rng(77);
  const Case cases[] = {
      {1, 1, 1, 1, 1, 1, 0, false, 1.0F},      {2, 1, 1, 5, 3, 2, 1, false, 1.0F},
      {1, 1, 7, 1, 4, 4, 2, false, 1.0F},      {3, 1, 37, 45, 16, 16, 1, false, 1.0F},
      {2, 2, 70, 130, 8, 5, 2, false, 1.0F},   {2, 3, 65, 300, 64, 64, 1, false, 1.0F},
      {1, 2, 129, 257, 32, 17, 0, true, 1.0F}, {2, 1, 50, 20, 8, 8, 1, true, 1.0F},
      {2, 2, 20, 90, 8, 8, 2, true, 1.0F},     {1, 1, 33, 200, 16, 16, 0, false, 4.0F},
      {2, 1, 17, 19, 5, 3, 2, false, 30.0F},
  };
  for (const Case& c : cases) check_case(c, rng, GetParam());
}

// The fp32 forward on AMX tiles (each operand as three bf16 parts, six tile products): the random
// shapes above plus depths off the tiles' 32 columns (80, 17), values of another depth, causal
// masks over several key tiles, per-query lengths past 32-key blocks, and score magnitudes up to
// 30 (P's parts then reach the denormal range, where they are cut to bf16), held to the fp32 path's
// own tolerance.
const Case kTileCases[] = {
    {1, 1, 1, 1, 1, 1, 0, false, 1.0F},      {2, 1, 1, 5, 3, 2, 1, false, 1.0F},
    {3, 1, 37, 45, 16, 16, 1, false, 1.0F},  {2, 2, 70, 130, 8, 5, 2, false, 1.0F},
    {2, 3, 65, 300, 64, 64, 1, false, 1.0F}, {1, 2, 129, 257, 32, 17, 0, true, 1.0F},
    {2, 2, 20, 90, 8, 8, 2, true, 1.0F},     {1, 1, 33, 200, 16, 16, 0, false, 8.0F},
    {2, 1, 17, 19, 5, 3, 2, false, 30.0F},   {1, 2, 100, 333, 80, 48, 2, true, 1.0F},
    {1, 1, 64, 160, 17, 80, 0, false, 4.0F}, {1, 1, 150, 150, 128, 128, 0, true, 2.0F},
};

// The C++ model of each tile instruction, where the target has AVX512-BF16 (the parts' packing
// uses it); on any CPU.
TEST_P(FlashAttention, FloatOnAmxTileModelMatchesReference) {
  const testing::ScopedAmxUse model(AmxUse::kModel);
  const testing::ScopedFp32OnAmx on(true);
  if (!flash_attention_float_on_tiles())
    GTEST_SKIP() << "no AVX512-BF16 on this target: fp32 does not take the tiles";
  Rng rng(91);
  for (const Case& c : kTileCases) check_case(c, rng, GetParam());
}

// On the hardware the tiles take heads of at least 384 queries and keys; shorter ones stay on
// FMAs.
TEST_P(FlashAttention, FloatOnAmxMatchesReference) {
  if (!amx_available())
    GTEST_SKIP() << "no AMX-BF16 on this CPU, or Linux refused this process the tile state";
  const testing::ScopedAmxUse hardware(AmxUse::kWhereAvailable);
  const testing::ScopedFp32OnAmx on(true);
  if (!flash_attention_float_on_tiles())
    GTEST_SKIP() << "no AVX512-BF16 on this target: fp32 does not take the tiles";
  Rng rng(92);
  for (const Case& c :
       {Case{1, 2, 400, 700, 64, 64, 2, false, 1.0F}, Case{2, 1, 500, 390, 128, 96, 1, false, 4.0F},
        Case{1, 1, 1100, 1030, 80, 48, 0, true, 1.0F}}) {
    check_case(c, rng, GetParam());
  }
}

// Keys whose three bf16 parts outgrow half the L2 (3 × 2 × (64 + 64) bytes a key: 3030 keys on a
// 2 MiB L2) send a head's query tiles through the tiles in blocks (FlashForwardTileBF16's `count`):
// on one thread 2 or 3 heads of 9 query tiles (550 queries) make two full blocks of 4 and a partial
// one.
// Per-query lengths and causal masks end a block's tiles at different keys; per-batch lengths of 0
// leave a block's tiles with no key at all. On the hardware, and in the tile model (where CI has no
// AMX).
std::vector<Case> float_on_amx_block_cases() {
  const auto keys = static_cast<int64_t>(l2_cache_bytes() / (3 * 2 * 128) + 300);
  return {Case{1, 2, 550, keys, 64, 64, 2, false, 1.0F},
          Case{2, 1, 550, keys, 64, 64, 0, true, 1.0F},
          Case{3, 1, 550, keys, 64, 64, 1, true, 1.0F}};
}

TEST_P(FlashAttention, FloatOnAmxMatchesReferenceInQueryBlocks) {
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const bool ran = testing::for_each_float_tiles_use([&] {
    Rng rng(93);
    for (const Case& c : float_on_amx_block_cases()) check_case(c, rng, GetParam());
  });
  omp_set_num_threads(saved_threads);
  if (!ran) GTEST_SKIP() << "no AVX512-BF16 on this target: fp32 does not take the tiles";
}

// The tiles read the bf16 parts under 2^-126 as 0: queries of 2^-118 against keys of 2^118 (scores
// of 1) read 0.6% off the reference, values of 2^-120 0.4% of the output's magnitude (1e-37 ·
// 1e37: 47%). Such calls run on FMAs, to the fp32 path's tolerance; q·c or k past 2^64 likewise.
// On the hardware (heads of 384) and in the tile model.
TEST_P(FlashAttention, FloatOnAmxKeepsItsAccuracyAtExtremeMagnitudes) {
  const bool ran = testing::for_each_float_tiles_use([&] {
    Rng rng(94);
    for (const Case& c : {Case{1, 2, 400, 390, 64, 64, 0, false, 1.0F, 0x1p-118F, 0x1p118F},
                          Case{1, 1, 390, 400, 64, 32, 2, true, 1.0F, 0x1p118F, 0x1p-118F},
                          Case{2, 1, 384, 384, 32, 64, 1, false, 1.0F, 0x1p-60F, 0x1p60F},
                          Case{1, 1, 400, 400, 64, 64, 0, false, 1.0F, 1.0F, 1.0F, 0x1p-120F}}) {
      check_case(c, rng, GetParam());
    }
  });
  if (!ran) GTEST_SKIP() << "no AVX512-BF16 on this target: fp32 does not take the tiles";
}

// Turned off (ATTN_AMX_FP32=0, set_fp32_on_amx(false)) or with the tiles off, fp32 stays on FMAs.
TEST_P(FlashAttention, FloatLeavesTheTilesWhenTurnedOff) {
  {
    const testing::ScopedAmxUse model(AmxUse::kModel);
    const testing::ScopedFp32OnAmx off(false);
    EXPECT_FALSE(flash_attention_float_on_tiles());
  }
  const testing::ScopedAmxUse never(AmxUse::kNever);
  const testing::ScopedFp32OnAmx on(true);
  EXPECT_FALSE(flash_attention_float_on_tiles());
}

// An output larger than the L2s of every thread the call could use is written with streaming
// stores (streams_output): its fp32 rows of whole vectors (dv = 64 on every target; heads
// interleaved, the 64-byte aligned tensor's rows 256 bytes apart) against the reference, with a
// ragged last query tile, per-query lengths 0 to m and a causal mask.
TEST_P(FlashAttention, OutputsPastTheThreadsL2sMatchTheReference) {
  Rng rng(83);
  const auto threads = static_cast<size_t>(omp_get_max_threads());
  const auto queries =
      static_cast<int64_t>(2 * l2_cache_bytes() * threads / (2 * 64 * sizeof(float)) + 37);
  check_case({1, 2, queries, 40, 16, 64, 2, false, 1.0F}, rng, GetParam());
  check_case({1, 2, queries, 40, 16, 64, 0, true, 1.0F}, rng, GetParam());
}

// Keys whose packed rows outgrow half of any L2 here (2500 × (64 + 64) floats, 1.3 MB) send the
// tiles of a head through FlashForwardTiles in blocks of up to kMaxQueryBlock; on one thread every
// target's tile count (5, 10, 19 tiles of 300 queries) makes full and partial blocks. Lengths per
// query and causal masks end a block's tiles at different keys.
TEST_P(FlashAttention, MatchesReferenceInQueryBlocks) {
  Rng rng(78);
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  for (const Case& c :
       {Case{1, 2, 300, 2500, 64, 64, 0, false, 1.0F},
        Case{3, 2, 300, 2500, 64, 64, 1, false, 1.0F},
        Case{2, 2, 300, 2500, 64, 64, 2, false, 1.0F}, Case{1, 2, 300, 2500, 64, 64, 0, true, 1.0F},
        Case{2, 1, 300, 2500, 64, 64, 2, true, 1.0F},
        // One head: rows back to back, read in place (values of 64) or packed (60: padded to
        // the lanes on AVX2 and AVX-512).
        Case{2, 1, 300, 2500, 64, 64, 0, false, 1.0F},
        Case{1, 1, 300, 2500, 64, 60, 0, false, 1.0F}}) {
    check_case(c, rng, GetParam());
  }
  omp_set_num_threads(saved_threads);
}

// On 2 threads, 6 heads whose keys are packed (2 per row, 2500 keys: blocks of query tiles as
// above) are handed out a run of blocks of one head per task (FlashForward's blocks_per_task): 2
// blocks of 3 on AVX2 and AVX-512, 3 of 5 on SSE4, 14 of 19 on the scalar target, so every target
// has a head's blocks split over tasks of unequal length, in causal heads' heaviest-first order
// too. The output starts as NaN: a block no task runs fails the comparison.
TEST_P(FlashAttention, MatchesReferenceWithAHeadsBlocksInRunsOnTwoThreads) {
  Rng rng(79);
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(2);
  for (const Case& c :
       {Case{3, 2, 300, 2500, 64, 64, 0, false, 1.0F}, Case{3, 2, 300, 2500, 64, 64, 0, true, 1.0F},
        Case{3, 2, 300, 2500, 64, 64, 2, true, 1.0F}}) {
    check_case(c, rng, GetParam());
  }
  omp_set_num_threads(saved_threads);
}

TEST_P(FlashAttention, RejectsInconsistentShapes) {
  const Tensor q(Shape{2, 3, 4}), k(Shape{2, 5, 4}), v(Shape{2, 5, 6});
  Tensor out(Shape{2, 3, 6});
  EXPECT_THROW_MESSAGE(
      flash_attention_forward(single_head(q, "q"), single_head(Tensor(Shape{2, 5, 3}), "k"),
                              single_head(v, "v"), {}, {}, single_head(out, "out")),
      ShapeError, "keys: expected size 4 (that of queries), got 3");
  EXPECT_THROW_MESSAGE(flash_attention_forward(single_head(q, "q"), single_head(k, "k"),
                                               single_head(Tensor(Shape{2, 4, 6}), "v"), {}, {},
                                               single_head(out, "out")),
                       ShapeError, "values: expected 2 × 1 heads of 5 × 6 (one row per key)");
  EXPECT_THROW_MESSAGE(
      flash_attention_forward(single_head(q, "q"), single_head(k, "k"), single_head(v, "v"),
                              ValidLengths::per_batch({1, 6}), {}, single_head(out, "out")),
      ValueError, "valid_lens[1]: expected a valid length in [0, 5]");
  EXPECT_THROW_MESSAGE(split_heads(q, 3, "q"), ShapeError,
                       "q: expected the last dimension to split into 3 heads");
  // An offset whose diagonal keys would leave int64 (INT64_MAX hid every key, without an error).
  FlashAttentionOptions offset{.causal = true,
                               .alignment = DiagonalAlignment::kOffset,
                               .diagonal_offset = INT64_MAX,
                               .mask = {}};
  EXPECT_THROW_MESSAGE(
      flash_attention_forward(single_head(q, "q"), single_head(k, "k"), single_head(v, "v"), {},
                              offset, single_head(out, "out")),
      ValueError, "diagonal_offset: expected an offset within ±");
}

// A sliding window over inputs past half the L3 (25 MB here: 2 heads of 512 over 1536 queries
// and keys, against 16 MiB on the development machine's 32 MiB L3) has each task request its
// next task's key and value rows (AddNextWindowRows), which must leave the result as it is:
// against a double reference over each query's 41 visible keys. (On a CPU whose L3 exceeds 50 MB
// the requests are not made and the test checks the plain path.)
TEST_P(FlashAttention, SlidingWindowPastTheL3MatchesTheReference) {
  Rng rng(80);
  const int64_t heads = 2, rows = 1536, depth = 512, window = 40;
  const Tensor q = random_tensor(Shape{1, rows, heads * depth}, rng, 0.2F);
  const Tensor k = random_tensor(Shape{1, rows, heads * depth}, rng, 0.2F);
  const Tensor v = random_tensor(Shape{1, rows, heads * depth}, rng);
  Tensor out(Shape{1, rows, heads * depth});
  const float scale = 1.0F / std::sqrt(static_cast<float>(depth));
  FlashAttentionOptions options = testing::kernel_options(scale, true);
  options.window_left = window;
  flash_attention_forward(split_heads(q, heads, "q"), split_heads(k, heads, "k"),
                          split_heads(v, heads, "v"), {}, options, split_heads(out, heads, "out"));
  double worst = 0.0;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t first = std::max<int64_t>(0, i - window);
      std::vector<double> weights;
      double row_max = -INFINITY, sum = 0.0;
      for (int64_t j = first; j <= i; ++j) {
        double dot = 0.0;
        for (int64_t t = 0; t < depth; ++t)
          dot += static_cast<double>(q(0, i, h * depth + t)) * k(0, j, h * depth + t);
        weights.push_back(dot * scale);
        row_max = std::max(row_max, weights.back());
      }
      for (double& w : weights) sum += w = std::exp(w - row_max);
      for (int64_t t = 0; t < depth; ++t) {
        double expected = 0.0;
        for (int64_t j = first; j <= i; ++j)
          expected += weights[static_cast<size_t>(j - first)] * v(0, j, h * depth + t);
        expected /= sum;
        // Outputs are convex combinations of |v| ≲ 5: kTolerance relative to that magnitude.
        worst = std::max(worst, std::abs(out(0, i, h * depth + t) - expected));
      }
    }
  }
  EXPECT_LT(worst, kTolerance * 5.0) << "target " << hwy::TargetName(GetParam());
}

// Scores that rise from one key tile to the next (kKeyTile = 64 keys) by different amounts per
// query: on AVX-512 (the other targets take the full step throughout) the lazy softmax step keeps a
// row's running maximum (a rise of 2 in e's units, under its margin of 8 in base 2), raises it
// after the pass (rises of 20 and 75: P and the sums rescaled), or recomputes the tile's scores for
// the full step (a rise of 100, 144 in base 2: P could have overflowed); falling scores and rows of
// a ragged last query tile beside them. Against a double reference of every row, with the
// log-sum-exp.
TEST_P(FlashAttention, ScoresRisingAcrossKeyTilesMatchTheReference) {
  Rng rng(81);
  const int64_t queries = 100, keys = 300, depth = 4;
  // Key j's first element: its tile's level (keys 0–63: 0, then 1, 1, 0.5, 1); the rest random.
  // One rise only, at the second tile, which the later tiles then share the weight with: a second
  // rise would rescale away any error of the first.
  const float levels[] = {0.0F, 1.0F, 1.0F, 0.5F, 1.0F};
  // Query i's first element: the rise per level (score = 0.5 · rise · level + noise). A rise that
  // makes a tile recompute its scores does so for all its queries: only in the first 16 queries,
  // a query tile of its own on every target.
  const auto rise = [](int64_t i) {
    const float first[] = {0.0F, 200.0F, 4.0F, -40.0F};
    const float others[] = {0.0F, 4.0F, 40.0F, 150.0F, -40.0F, 1.0F, 20.0F};
    return i < 16 ? first[i % 4] : others[i % 7];
  };
  Tensor q = random_tensor(Shape{1, queries, depth}, rng, 0.5F);
  Tensor k = random_tensor(Shape{1, keys, depth}, rng, 0.5F);
  const Tensor v = random_tensor(Shape{1, keys, depth}, rng);
  for (int64_t i = 0; i < queries; ++i) q(0, i, 0) = rise(i);
  for (int64_t j = 0; j < keys; ++j) k(0, j, 0) = levels[j / 64];
  Tensor out(Shape{1, queries, depth});
  std::vector<float> lse(static_cast<size_t>(queries));
  const float scale = 0.5F;
  flash_attention_forward(single_head(q, "q"), single_head(k, "k"), single_head(v, "v"), {},
                          testing::kernel_options(scale, false), single_head(out, "out"),
                          lse.data());
  for (int64_t i = 0; i < queries; ++i) {
    std::vector<double> weights;
    double row_max = -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < keys; ++j) {
      double dot = 0.0;
      for (int64_t t = 0; t < depth; ++t) dot += static_cast<double>(q(0, i, t)) * k(0, j, t);
      weights.push_back(dot * scale);
      row_max = std::max(row_max, weights.back());
    }
    for (double& w : weights) sum += w = std::exp(w - row_max);
    // Scores up to 200 carry float32 rounding of 200 · 2⁻²⁴ ≈ 1.2e-5 into each weight's exponent:
    // 1e-5 times the largest score's magnitude, relative to the values (|v| ≲ 5).
    const double tolerance = 1e-5 * std::max(1.0, row_max) * 5.0;
    for (int64_t t = 0; t < depth; ++t) {
      double expected = 0.0;
      for (int64_t j = 0; j < keys; ++j) expected += weights[static_cast<size_t>(j)] * v(0, j, t);
      EXPECT_NEAR(out(0, i, t), expected / sum, tolerance)
          << "query " << i << " (rise " << rise(i) << "), target " << hwy::TargetName(GetParam());
    }
    const double expected_lse = row_max + std::log(sum);
    EXPECT_NEAR(lse[static_cast<size_t>(i)], expected_lse, 1e-5 + 1e-6 * std::abs(expected_lse))
        << "query " << i;
  }
}

// Running maxima past 2²¹ in base 2 (scores past about 1.45e6), which AVX2 and below subtract
// before the exponential instead of folding them into its constants (kMaxFoldedShift): each row's
// scores are exactly q0 · k0 (one nonzero dimension), so keys of equal k0 tie bit for bit and, at
// these magnitudes, the others' weights underflow to 0: the output is the mean of the values of
// the largest score's keys, which the double reference gives within 1e-5. Query tiles (32 rows
// each on AVX2, 16 on SSE4) whose maxima always fold (q0 = 1, 0.5), cross 2²¹ at the last key tile
// (q0 = 2²⁰: the levels rise per key tile) or never fold (−2²¹; −2²² and 2²⁴, whose constants
// would round if they did), in one call.
TEST_P(FlashAttention, ScoresBeyondTheFoldedShiftMatchTheReference) {
  Rng rng(83);
  const int64_t keys = 200, depth = 8, rows_per_group = 32;
  const std::vector<float> groups = {1.0F, 1048576.0F, -2097152.0F, -4194304.0F, 16777216.0F, 0.5F};
  const auto queries = static_cast<int64_t>(groups.size()) * rows_per_group;
  // k0: 0.75 in the first key tile, rising by 0.25 per tile after it, and 0.125 more on every
  // third key: the largest score of q0 > 0 is the last tile's third keys, of q0 < 0 the first
  // tile's others.
  const auto level = [](int64_t j) {
    return 0.75F + 0.25F * static_cast<float>(j / 64) + (j % 3 == 0 ? 0.125F : 0.0F);
  };
  Tensor q(Shape{1, queries, depth}), k(Shape{1, keys, depth});
  for (int64_t i = 0; i < queries; ++i)
    q(0, i, 0) = groups[static_cast<size_t>(i / rows_per_group)];
  for (int64_t j = 0; j < keys; ++j) k(0, j, 0) = level(j);
  const Tensor v = random_tensor(Shape{1, keys, depth}, rng);
  Tensor out = Tensor::full(Shape{1, queries, depth}, std::nanf(""));
  flash_attention_forward(single_head(q, "q"), single_head(k, "k"), single_head(v, "v"), {},
                          testing::kernel_options(1.0F, false), single_head(out, "out"), nullptr);
  for (int64_t i = 0; i < queries; ++i) {
    std::vector<double> weights;
    double row_max = -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < keys; ++j) {
      weights.push_back(static_cast<double>(q(0, i, 0)) * k(0, j, 0));
      row_max = std::max(row_max, weights.back());
    }
    for (double& w : weights) sum += w = std::exp(w - row_max);
    for (int64_t t = 0; t < depth; ++t) {
      double expected = 0.0;
      for (int64_t j = 0; j < keys; ++j) expected += weights[static_cast<size_t>(j)] * v(0, j, t);
      EXPECT_NEAR(out(0, i, t), expected / sum, kTolerance * 4.0)
          << "query " << i << " (q0 " << q(0, i, 0) << "), column " << t << ", target "
          << hwy::TargetName(GetParam());
    }
  }
}

// `read` reports the largest |x| of every query row and of the key and value rows the pass reads,
// exactly, both where the rows are packed (heads strided through (B, n, heads·d), d = 17 leaving a
// tail past the vectors) and where they are read in place (one head, rows back to back, d = dv =
// 16): top-left causal with n = 70 < m = 300 reads keys [0, 70) only, so a huge key and a NaN value
// beyond them are not reported (nor do they reach the output), while a NaN or ∞ in a row read is.
TEST_P(FlashAttention, ReportsTheMagnitudesOfTheRowsItReads) {
  Rng rng(79);
  for (const int64_t heads : {2, 1}) {
    const int64_t depth = heads == 2 ? 17 : 16, value_depth = heads == 2 ? 9 : 16;
    const int64_t batch = 2, queries = 70, keys = 300;
    SCOPED_TRACE(heads == 2 ? "packed rows" : "rows in place");
    // Normal entries of σ = 0.1 stay far below the planted magnitudes.
    Tensor q = random_tensor(Shape{batch, queries, heads * depth}, rng, 0.1F);
    Tensor k = random_tensor(Shape{batch, keys, heads * depth}, rng, 0.1F);
    Tensor v = random_tensor(Shape{batch, keys, heads * value_depth}, rng, 0.1F);
    q(1, 33, heads * depth - 1) = -7.5F;
    k(1, 69, 0) = -6.25F;  // the last key a query sees
    k(0, 200, 3) = 1e30F;  // never read
    v(0, 10, value_depth - 1) = 5.5F;
    v(1, 250, 2) = std::nanf("");  // never read
    Tensor out(Shape{batch, queries, heads * value_depth});
    FlashAttentionOptions options = testing::kernel_options(0.25F, true);
    options.alignment = DiagonalAlignment::kTopLeft;
    const auto run = [&] {
      ReadMagnitudes read{-1.0F, -1.0F, -1.0F};
      flash_attention_forward(split_heads(q, heads, "q"), split_heads(k, heads, "k"),
                              split_heads(v, heads, "v"), {}, options,
                              split_heads(out, heads, "out"), nullptr, &read);
      return read;
    };
    ReadMagnitudes read = run();
    EXPECT_EQ(read.query, 7.5F);
    EXPECT_EQ(read.key, 6.25F);
    EXPECT_EQ(read.value, 5.5F);
    for (const float x : out.span()) ASSERT_TRUE(std::isfinite(x));
    k(0, 3, depth - 1) = std::nanf("");
    v(1, 0, 0) = -std::numeric_limits<float>::infinity();
    read = run();
    EXPECT_EQ(read.query, 7.5F);
    EXPECT_TRUE(std::isnan(read.key)) << read.key;
    EXPECT_EQ(read.value, std::numeric_limits<float>::infinity());
  }
}

ATTN_INSTANTIATE_FOR_EVERY_SIMD_TARGET(FlashAttention);

}  // namespace
}  // namespace attn
