// The attention mask's coverage of the fused kernels' tiles (src/kernels/score_masks.hpp), on every
// SIMD target this machine runs: a float mask's tiles of −∞ only are skipped as a bool mask's
// hidden tiles are, in the fp32 and bf16 forward, the weights and the backward; and the lanes and
// keys the products of a tile crossed by key ranges multiply.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/core/half.hpp"
#include "attn/kernels/flash_attention.hpp"
#include "every_simd_target.hpp"
#include "kernels/score_masks.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

class ScoreMasks : public testing::EverySimdTarget {};

constexpr int64_t kHeads = 2, kQueries = 100, kKeys = 320, kDepth = 16, kValueDepth = 8;
// Keys [128, 256) are hidden from every query: whole key tiles on every path (64 keys a tile in
// the fp32 kernels, 128 in the bf16 forward); the queries from 64 on also see [256, 320).
bool visible(int64_t query, int64_t key) {
  return key < 128 || (query >= 64 && key >= 256);
}

template <class T>
BasicHeadsView<T> heads_of(T* data, int64_t rows, int64_t cols) {
  return {data, 1, kHeads, rows, cols, kHeads * rows * cols, rows * cols, cols};
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if constexpr (std::is_same_v<T, float>) {
      if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return false;
    } else if (a[i] != b[i]) {
      return false;
    }
  }
  return true;
}

// What one pass over (q, k, v) gives, in T (float, or bf16 bits), the mask's gradient in float.
template <class T>
struct Results {
  std::vector<T> output, grad_q, grad_k, grad_v;
  std::vector<float> log_sum_exp, weights, grad_mask;
};

class MaskedProblem {
 public:
  explicit MaskedProblem(uint64_t seed) {
    Rng rng(seed);
    const auto normals = [&](int64_t count) {
      std::vector<float> values(static_cast<size_t>(count));
      for (float& value : values) value = rng.normal();
      return values;
    };
    q = normals(kHeads * kQueries * kDepth);
    k = normals(kHeads * kKeys * kDepth);
    v = normals(kHeads * kKeys * kValueDepth);
    grad_out = normals(kHeads * kQueries * kValueDepth);
    // A bias where the key is visible, −∞ where it is hidden; (n, m), broadcast over the heads.
    mask.resize(static_cast<size_t>(kQueries * kKeys));
    for (int64_t i = 0; i < kQueries; ++i) {
      for (int64_t j = 0; j < kKeys; ++j) {
        mask[static_cast<size_t>(i * kKeys + j)] =
            visible(i, j) ? rng.normal() : -std::numeric_limits<float>::infinity();
      }
    }
    options = testing::kernel_options(0.25F);
    options.mask = {MaskKind::kFloat, mask.data(), 0, 0, kKeys, 1};
  }

  // NaN in rows of keys and values only the hidden tiles hold: the results must not change.
  void poison_hidden_rows() {
    k[static_cast<size_t>(150 * kDepth + 3)] = NAN;             // head 0
    k[static_cast<size_t>((kKeys + 200) * kDepth + 1)] = NAN;   // head 1
    v[static_cast<size_t>(210 * kValueDepth + 2)] = NAN;        // head 0
    v[static_cast<size_t>((kKeys + 255) * kValueDepth)] = NAN;  // head 1
  }

  Results<float> run_float() const {
    Results<float> r;
    r.output.resize(grad_out.size());
    r.log_sum_exp.resize(static_cast<size_t>(kHeads * kQueries));
    flash_attention_forward(heads_of(q.data(), kQueries, kDepth), heads_of(k.data(), kKeys, kDepth),
                            heads_of(v.data(), kKeys, kValueDepth), {}, options,
                            heads_of(r.output.data(), kQueries, kValueDepth), r.log_sum_exp.data());
    r.weights.resize(static_cast<size_t>(kHeads * kQueries * kKeys));
    flash_attention_weights(heads_of(q.data(), kQueries, kDepth), heads_of(k.data(), kKeys, kDepth),
                            r.log_sum_exp.data(), {}, options,
                            heads_of(r.weights.data(), kQueries, kKeys));
    r.grad_q.resize(q.size());
    r.grad_k.resize(k.size());
    r.grad_v.resize(v.size());
    flash_attention_backward(
        heads_of(q.data(), kQueries, kDepth), heads_of(k.data(), kKeys, kDepth),
        heads_of(v.data(), kKeys, kValueDepth), heads_of(r.output.data(), kQueries, kValueDepth),
        heads_of(grad_out.data(), kQueries, kValueDepth), r.log_sum_exp.data(), {}, options,
        heads_of(r.grad_q.data(), kQueries, kDepth), heads_of(r.grad_k.data(), kKeys, kDepth),
        heads_of(r.grad_v.data(), kKeys, kValueDepth), mask_gradient(r.grad_mask));
    return r;
  }

  Results<uint16_t> run_bfloat16() const {
    constexpr HalfType kType = HalfType::kBFloat16;
    const auto rounded = [](const std::vector<float>& values) {
      std::vector<uint16_t> bits(values.size());
      for (size_t i = 0; i < values.size(); ++i) bits[i] = float_to_half_bits(kType, values[i]);
      return bits;
    };
    const std::vector<uint16_t> q16 = rounded(q), k16 = rounded(k), v16 = rounded(v),
                                g16 = rounded(grad_out);
    Results<uint16_t> r;
    r.output.resize(grad_out.size());
    r.log_sum_exp.resize(static_cast<size_t>(kHeads * kQueries));
    flash_attention_forward(kType, heads_of(q16.data(), kQueries, kDepth),
                            heads_of(k16.data(), kKeys, kDepth),
                            heads_of(v16.data(), kKeys, kValueDepth), {}, options,
                            heads_of(r.output.data(), kQueries, kValueDepth), r.log_sum_exp.data());
    r.grad_q.resize(q.size());
    r.grad_k.resize(k.size());
    r.grad_v.resize(v.size());
    flash_attention_backward(
        kType, heads_of(q16.data(), kQueries, kDepth), heads_of(k16.data(), kKeys, kDepth),
        heads_of(v16.data(), kKeys, kValueDepth),
        heads_of(static_cast<const uint16_t*>(r.output.data()), kQueries, kValueDepth),
        heads_of(g16.data(), kQueries, kValueDepth), r.log_sum_exp.data(), {}, options,
        heads_of(r.grad_q.data(), kQueries, kDepth), heads_of(r.grad_k.data(), kKeys, kDepth),
        heads_of(r.grad_v.data(), kKeys, kValueDepth), mask_gradient(r.grad_mask));
    return r;
  }

  // Zeros laid out as the mask (its strides) for its gradient, which the kernels add into.
  ScoreMaskGradient mask_gradient(std::vector<float>& gradient) const {
    gradient.assign(mask.size(), 0.0F);
    return {MaskKind::kFloat,        gradient.data(),        0, 0,
            options.mask.row_stride, options.mask.col_stride};
  }

  std::vector<float> q, k, v, grad_out, mask;
  FlashAttentionOptions options;
};

template <class T>
void expect_same_results(const Results<T>& clean, const Results<T>& poisoned) {
  EXPECT_TRUE(same_bits(clean.output, poisoned.output));
  EXPECT_TRUE(same_bits(clean.log_sum_exp, poisoned.log_sum_exp));
  EXPECT_TRUE(same_bits(clean.weights, poisoned.weights));
  EXPECT_TRUE(same_bits(clean.grad_q, poisoned.grad_q));
  EXPECT_TRUE(same_bits(clean.grad_k, poisoned.grad_k));
  EXPECT_TRUE(same_bits(clean.grad_v, poisoned.grad_v));
  EXPECT_TRUE(same_bits(clean.grad_mask, poisoned.grad_mask));
}

// The hidden tiles of a float mask are never read: NaN in the keys and values only they hold
// leaves every result bit for bit as it was (computing such a tile made its scores NaN + −∞), with
// the mask per query and broadcast over the queries (a key-padding mask: row 0's entries for all).
TEST_P(ScoreMasks, FloatMaskTilesOfMinusInfinityAreNeverRead) {
  for (const int64_t row_stride : {kKeys, int64_t{0}}) {
    SCOPED_TRACE("mask row stride " + std::to_string(row_stride));
    MaskedProblem problem(91);
    problem.options.mask.row_stride = row_stride;
    const Results<float> clean = problem.run_float();
    const Results<uint16_t> clean16 = problem.run_bfloat16();
    for (const float value : clean.output) ASSERT_TRUE(std::isfinite(value));
    problem.poison_hidden_rows();
    expect_same_results(clean, problem.run_float());
    expect_same_results(clean16, problem.run_bfloat16());
  }
}

// A float mask strided along the keys (here the transpose of a contiguous one, as PyTorch's
// mask.mT.contiguous().mT) gives the contiguous mask's results bit for bit: the kernels add the
// entries of a strided mask one by one and those of a contiguous one in 4 × 4 blocks.
TEST_P(ScoreMasks, StridedFloatMasksGiveTheContiguousResults) {
  MaskedProblem problem(92);
  const Results<float> contiguous = problem.run_float();
  const Results<uint16_t> contiguous16 = problem.run_bfloat16();
  // The same entries, keys × queries in memory: row stride 1, column stride n.
  std::vector<float> transposed(problem.mask.size());
  for (int64_t i = 0; i < kQueries; ++i) {
    for (int64_t j = 0; j < kKeys; ++j) {
      transposed[static_cast<size_t>(j * kQueries + i)] =
          problem.mask[static_cast<size_t>(i * kKeys + j)];
    }
  }
  problem.mask = transposed;
  problem.options.mask = {MaskKind::kFloat, problem.mask.data(), 0, 0, 1, kQueries};
  Results<float> strided = problem.run_float();
  Results<uint16_t> strided16 = problem.run_bfloat16();
  // Their mask gradients, laid out as their mask, back to the contiguous layout.
  for (std::vector<float>* gradient : {&strided.grad_mask, &strided16.grad_mask}) {
    std::vector<float> rows(gradient->size());
    for (int64_t i = 0; i < kQueries; ++i) {
      for (int64_t j = 0; j < kKeys; ++j) {
        rows[static_cast<size_t>(i * kKeys + j)] =
            (*gradient)[static_cast<size_t>(j * kQueries + i)];
      }
    }
    *gradient = rows;
  }
  expect_same_results(contiguous, strided);
  expect_same_results(contiguous16, strided16);
}

ATTN_INSTANTIATE_FOR_EVERY_SIMD_TARGET(ScoreMasks);

// The lanes and keys a crossed key tile's bands multiply (crosses_key_ranges, lanes_seeing,
// keys_seen_by_lanes, for_each_key_band, for_each_query_band), on a causal tile of 8 queries from
// query 8 over 16 keys, lane 5 seeing nothing (a valid length of 0).
// The backward passes' key chunks hold equal shares of the visible pairs: halves of the tiles
// without a mask; under a causal mask (n = m = 4096: key j seen by n − j queries) the first chunk
// ends where the pairs reach half, near key n(1 − 1/√2) = 1200; every chunk keeps a tile; equal
// counts where nothing is visible or there are more chunks than tiles.
TEST(ScoreMaskRanges, KeyChunksShareTheVisiblePairsEqually) {
  const int64_t n = 4096;
  FlashAttentionOptions options;
  EXPECT_EQ(key_chunk_bounds({}, options, 1, 1, n, n, 64, 2), (std::vector<size_t>{0, 32, 64}));
  options.causal = true;
  const std::vector<size_t> causal = key_chunk_bounds({}, options, 2, 3, n, n, 64, 2);
  ASSERT_EQ(causal.size(), 3U);
  EXPECT_EQ(causal.front(), 0U);
  EXPECT_EQ(causal.back(), 64U);
  // Pairs of keys [0, 64·t): Σ_{j < 64t} (n − j); the bound is the first tile whose pairs reach
  // half of all n(n + 1)/2.
  const auto pairs_before = [&](size_t tile) {
    const auto keys = static_cast<double>(64 * tile);
    return keys * static_cast<double>(n) - keys * (keys - 1.0) / 2.0;
  };
  const double half = static_cast<double>(n) * static_cast<double>(n + 1) / 4.0;
  EXPECT_GE(pairs_before(causal[1]), half);
  EXPECT_LT(pairs_before(causal[1] - 1), half);
  EXPECT_EQ(causal[1], 19U);
  // Four chunks of a causal head, each at least one tile and increasing.
  const std::vector<size_t> four = key_chunk_bounds({}, options, 1, 1, n, n, 64, 4);
  for (size_t c = 0; c < 4; ++c) EXPECT_LT(four[c], four[c + 1]);
  // Queries whose valid lengths are all 0 see nothing: equal tile counts.
  const ValidLengths none = ValidLengths::per_batch({0});
  EXPECT_EQ(key_chunk_bounds(none, options, 1, 1, n, n, 64, 4),
            (std::vector<size_t>{0, 16, 32, 48, 64}));
  // A window of each query's own key: every key seen once, equal halves again.
  FlashAttentionOptions diagonal = options;
  diagonal.window_left = 0;
  EXPECT_EQ(key_chunk_bounds({}, diagonal, 1, 1, n, n, 64, 2), (std::vector<size_t>{0, 32, 64}));
  // Three chunks of two tiles: equal counts, one chunk empty.
  EXPECT_EQ(key_chunk_bounds({}, options, 1, 1, 10, 100, 64, 3), (std::vector<size_t>{0, 0, 1, 2}));
}

TEST(ScoreMaskRanges, BandsOfACrossedTileSeeTheirLanesAndKeys) {
  int32_t first[8], last[8];
  for (int32_t r = 0; r < 8; ++r) {
    first[r] = 0;
    last[r] = 8 + r + 1;  // query 8 + r sees keys 0 … 8 + r
  }
  first[5] = last[5] = 0;
  const TileKeyRanges ranges{0, 16, 0, 9};
  EXPECT_FALSE(crosses_key_ranges(ranges, 0, 9));
  EXPECT_TRUE(crosses_key_ranges(ranges, 0, 10));
  EXPECT_TRUE(crosses_key_ranges(ranges, 8, 16));

  // Keys 12 … 13: queries 12 … 15 (lanes 4 … 7), lane 5 inside the hull though it sees none.
  EXPECT_EQ(lanes_seeing(first, last, 8, 12, 14), (std::pair<size_t, size_t>{4, 8}));
  // Keys 15 …: lane 7 alone; keys 16 …: none.
  EXPECT_EQ(lanes_seeing(first, last, 8, 15, 16), (std::pair<size_t, size_t>{7, 8}));
  const auto none = lanes_seeing(first, last, 8, 16, 20);
  EXPECT_GE(none.first, none.second);

  // Lanes 0 … 2 see keys 0 … 10 of the tile [4, 16): [4, 11).
  const KeyRange seen = keys_seen_by_lanes(first, last, 0, 3, 4, 16);
  EXPECT_EQ(seen.begin, 4);
  EXPECT_EQ(seen.end, 11);
  // Lane 5 alone sees nothing.
  const KeyRange nothing = keys_seen_by_lanes(first, last, 5, 6, 4, 16);
  EXPECT_GE(nothing.begin, nothing.end);

  // Keys 8 … 19 in bands of 4: keys 8 … 15 by their lanes, 16 … 19 seen by none (left out).
  std::vector<std::vector<size_t>> key_bands;
  for_each_key_band(first, last, 8, 8, 12, 4,
                    [&](size_t j0, size_t keys, size_t lane_begin, size_t lane_end) {
                      key_bands.push_back({j0, keys, lane_begin, lane_end});
                    });
  EXPECT_EQ(key_bands, (std::vector<std::vector<size_t>>{{0, 4, 0, 8}, {4, 4, 4, 8}}));
  // Queries in bands of 3 over keys 4 … 15: every band, the last one short; lanes 3 … 5 see up to
  // key 12 (lane 4), lanes 6 … 7 up to key 15.
  std::vector<std::vector<int64_t>> query_bands;
  for_each_query_band(first, last, 8, 4, 12, 3, [&](size_t r0, size_t queries, KeyRange band_keys) {
    query_bands.push_back(
        {static_cast<int64_t>(r0), static_cast<int64_t>(queries), band_keys.begin, band_keys.end});
  });
  EXPECT_EQ(query_bands,
            (std::vector<std::vector<int64_t>>{{0, 3, 4, 11}, {3, 3, 4, 13}, {6, 2, 4, 16}}));
}

}  // namespace
}  // namespace attn
