// KVCache (appending in each dtype, ragged counts, growth past the capacity) and attention of new
// queries against it — the decode kernel for a few queries, the prefill path for many — against
// the double reference on the values the cache stores; refused options name themselves.
#include "attn/functional/kv_cache.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/core/half.hpp"
#include "attn/kernels/half_conversion.hpp"
#include "sdpa_reference.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

using testing::close_to;
using testing::random_tensor;

// Outputs against the double reference on the stored values: a few float32 ulps per term, as the
// kernels' own tests.
constexpr double kTolerance = 1e-5;

const CacheDType kDTypes[] = {CacheDType::kFloat32, CacheDType::kFloat16, CacheDType::kBFloat16,
                              CacheDType::kInt8};

TEST(KVCache, StoresWhatItIsGivenInItsOwnPrecisionAndGrows) {
  Rng rng(1);
  for (const CacheDType dtype : kDTypes) {
    KVCache cache(2, 3, 8, /*capacity=*/4, dtype, /*value_dim=*/5);
    const Tensor k1 = random_tensor(Shape{2, 3, 3, 8}, rng),
                 v1 = random_tensor(Shape{2, 3, 3, 5}, rng);
    const Tensor k2 = random_tensor(Shape{2, 3, 4, 8}, rng),
                 v2 = random_tensor(Shape{2, 3, 4, 5}, rng);
    cache.append(k1, v1);
    const std::vector<int64_t> counts{4, 1};  // ragged, and past the capacity of 4
    cache.append(k2, v2, counts);
    EXPECT_EQ(cache.lengths(), (std::vector<int64_t>{7, 4}));
    EXPECT_GE(cache.capacity(), 7);
    const Tensor keys = cache.keys(), values = cache.values();
    ASSERT_EQ(keys.shape(), (Shape{2, 3, 7, 8}));
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < 3; ++h)
        for (int64_t row = 0; row < 7; ++row)
          for (int64_t c = 0; c < 8; ++c) {
            const float stored = keys(b, h, row, c);
            if (row >= cache.lengths()[static_cast<size_t>(b)]) {
              EXPECT_EQ(stored, 0.0F);
              continue;
            }
            const float given = row < 3 ? k1(b, h, row, c) : k2(b, h, row - 3, c);
            switch (dtype) {
              case CacheDType::kFloat32:
                EXPECT_EQ(stored, given);
                break;
              case CacheDType::kFloat16:
                EXPECT_EQ(stored, half_to_float(float_to_half(given)));
                break;
              case CacheDType::kBFloat16:
                EXPECT_EQ(stored, bfloat16_to_float(float_to_bfloat16(given)));
                break;
              case CacheDType::kInt8: {
                // Within half a step of the row's scale, max|x| / 127 ≤ 4/127 for these values.
                EXPECT_NEAR(stored, given, 0.5 * 4.0 / 127.0 + 1e-6);
                break;
              }
            }
          }
    EXPECT_EQ(values.shape(), (Shape{2, 3, 7, 5}));
    EXPECT_EQ(cache.bytes_per_token(),
              3 * (13 * cache_dtype_size(dtype) + (dtype == CacheDType::kInt8 ? 8 : 0)));
  }
}

// Keys and values read through strides (a tokens-major (B, T, H, d) buffer seen as (B, H, T, d), as
// a model's projections leave them) are stored exactly as their contiguous copies are: row by row
// rather than one call per head, the same bytes and scales.
TEST(KVCache, StoresStridedRowsAsTheirContiguousCopies) {
  Rng rng(5);
  const int64_t batch = 2, heads = 3, tokens = 6, d = 20, dv = 9;
  const Tensor k_tokens = random_tensor(Shape{batch, tokens, heads, d}, rng),
               v_tokens = random_tensor(Shape{batch, tokens, heads, dv}, rng);
  const std::vector<int64_t> k_strides{tokens * heads * d, d, heads * d, 1},
      v_strides{tokens * heads * dv, dv, heads * dv, 1};
  const ConstStridedView k_view(k_tokens.data(), Shape{batch, heads, tokens, d}, k_strides),
      v_view(v_tokens.data(), Shape{batch, heads, tokens, dv}, v_strides);
  Tensor k_packed(Shape{batch, heads, tokens, d}), v_packed(Shape{batch, heads, tokens, dv});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t c = 0; c < d; ++c) k_packed(b, h, t, c) = k_tokens(b, t, h, c);
        for (int64_t c = 0; c < dv; ++c) v_packed(b, h, t, c) = v_tokens(b, t, h, c);
      }
  const std::vector<int64_t> counts{tokens, 4};
  for (const CacheDType dtype : kDTypes) {
    KVCache strided(batch, heads, d, 8, dtype, dv), packed(batch, heads, d, 8, dtype, dv);
    strided.append(k_view, v_view, counts);
    packed.append(k_packed, v_packed, counts);
    EXPECT_EQ(strided.keys().values(), packed.keys().values()) << static_cast<int>(dtype);
    EXPECT_EQ(strided.values().values(), packed.values().values()) << static_cast<int>(dtype);
    EXPECT_EQ(strided.lengths(), packed.lengths());
  }
}

// A cache of capacity 0 has no storage until its first append: attention against it is every
// row's zero output, as against a cache with room and nothing in it (it threw a ShapeError whose
// "got" was its "expected"), in every dtype, on the decode kernel and the prefill path.
TEST(KVCacheAttention, ACacheOfCapacityZeroGivesZeroOutputs) {
  Rng rng(31);
  for (const CacheDType dtype : kDTypes) {
    for (const int64_t n : {1, 40}) {
      KVCache cache(2, 2, 8, 0, dtype);
      const Tensor q = random_tensor(Shape{2, 2, n, 8}, rng);
      const AttentionForward forward = scaled_dot_product_attention(q, cache);
      for (const float x : forward.output.span()) ASSERT_EQ(x, 0.0F) << static_cast<int>(dtype);
      std::vector<uint16_t> half_query(static_cast<size_t>(q.numel()), 0x3C00);
      const HalfAttentionForward half = scaled_dot_product_attention(
          HalfType::kFloat16, StridedView<const uint16_t>(half_query.data(), q.shape()), cache);
      for (const uint16_t bits : half.output.bits) ASSERT_EQ(bits, 0U);
    }
  }
}

// Values near float's maximum: the decode kernel's unnormalised sums overflowed (inf, no error);
// such calls are redone on the prefill path, which scales the values first: equal scores give
// the values' average, 3e38, float32 and bf16 queries alike.
TEST(KVCacheAttention, ValuesNearFloatsMaximumGiveTheirAverage) {
  KVCache cache(1, 2, 4, 8);
  cache.append(Tensor(Shape{1, 2, 8, 4}), Tensor::full(Shape{1, 2, 8, 4}, 3e38F));
  Rng rng(33);
  const Tensor q = random_tensor(Shape{1, 2, 1, 4}, rng);
  const AttentionForward forward = scaled_dot_product_attention(q, cache);
  for (const float x : forward.output.span()) ASSERT_NEAR(x, 3e38F, 3e38F * 1e-6F);
  std::vector<uint16_t> half_query;
  for (const float x : q.span()) half_query.push_back(float_to_half_bits(HalfType::kBFloat16, x));
  const HalfAttentionForward half = scaled_dot_product_attention(
      HalfType::kBFloat16, StridedView<const uint16_t>(half_query.data(), q.shape()), cache);
  for (const uint16_t bits : half.output.bits)
    ASSERT_EQ(bits, float_to_half_bits(HalfType::kBFloat16, 3e38F));
}

// Enumerators cast from out-of-range integers are refused, naming the argument and the value
// (a HalfType(9) was read as bfloat16, a DiagonalAlignment(7) as no known diagonal, without a
// word).
TEST(KVCache, RefusesEnumeratorsOutOfRange) {
  EXPECT_THROW_MESSAGE(KVCache(1, 1, 8, 4, static_cast<CacheDType>(9)), ValueError,
                       "dtype: expected CacheDType::kFloat32, kFloat16, kBFloat16 or kInt8, got "
                       "the value 9");
  KVCache cache(1, 1, 8, 4);
  std::vector<uint16_t> bits(8, 0x3C00);
  const StridedView<const uint16_t> row(bits.data(), Shape{1, 1, 1, 8});
  EXPECT_THROW_MESSAGE(cache.append(static_cast<HalfType>(9), row, row), ValueError,
                       "type: expected HalfType::kFloat16 or HalfType::kBFloat16, got the value 9");
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(static_cast<HalfType>(9), row, row, row),
                       ValueError, "type: expected HalfType::kFloat16 or HalfType::kBFloat16");
  AttentionOptions options;
  options.causal = true;
  options.alignment = static_cast<DiagonalAlignment>(7);
  const Tensor q(Shape{1, 1, 3, 8});
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, q, q, options), ValueError,
                       "alignment: expected DiagonalAlignment::kTopLeft, kBottomRight or kOffset, "
                       "got the value 7");
}

// Rows of the cache's own storage appended again (a prefix copied for another beam) while the
// append grows the storage: read before the old storage goes (they were read after it was freed).
TEST(KVCache, AppendsRowsOfItsOwnStorage) {
  Rng rng(32);
  const int64_t d = 8, tokens = 4;
  const Tensor k = random_tensor(Shape{1, 1, tokens, d}, rng),
               v = random_tensor(Shape{1, 1, tokens, d}, rng);
  KVCache cache(1, 1, d, tokens);
  cache.append(k, v);
  const CacheTensorView keys = cache.keys_view(), values = cache.values_view();
  const ConstStridedView own_keys(static_cast<const float*>(keys.data), k.shape()),
      own_values(static_cast<const float*>(values.data), v.shape());
  cache.append(own_keys, own_values);  // grows from 4 to 8 tokens
  ASSERT_EQ(cache.lengths()[0], 2 * tokens);
  const Tensor stored_keys = cache.keys(), stored_values = cache.values();
  for (int64_t t = 0; t < 2 * tokens; ++t) {
    for (int64_t c = 0; c < d; ++c) {
      ASSERT_EQ(stored_keys(0, 0, t, c), k(0, 0, t % tokens, c)) << t;
      ASSERT_EQ(stored_values(0, 0, t, c), v(0, 0, t % tokens, c)) << t;
    }
  }
}

// Attention through the cache: n new queries at the end of sequences of different lengths.
void check_attention(CacheDType dtype, int64_t n, int64_t q_heads, int64_t kv_heads, bool causal,
                     std::optional<SlidingWindow> window, bool sinks, uint64_t seed,
                     bool alibi = false) {
  SCOPED_TRACE("dtype " + std::to_string(static_cast<int>(dtype)) + " n=" + std::to_string(n) +
               " Hq=" + std::to_string(q_heads) + " Hkv=" + std::to_string(kv_heads));
  Rng rng(seed);
  const int64_t batch = 3, d = 16, dv = 12, tokens = 90;
  KVCache cache(batch, kv_heads, d, 32, dtype, dv);
  const std::vector<int64_t> counts{tokens, 20, 0};
  cache.append(random_tensor(Shape{batch, kv_heads, tokens, d}, rng),
               random_tensor(Shape{batch, kv_heads, tokens, dv}, rng), counts);
  const Tensor q = random_tensor(Shape{batch, q_heads, n, d}, rng);
  std::vector<float> sink_values;
  for (int64_t h = 0; h < q_heads && sinks; ++h) sink_values.push_back(rng.normal());
  std::vector<float> slopes;  // ALiBi's 2^−(h+1)
  for (int64_t h = 0; h < q_heads && alibi; ++h)
    slopes.push_back(std::ldexp(1.0F, -static_cast<int>(h) - 1));
  AttentionOptions options;
  options.alibi_slopes = slopes;
  options.causal = causal;
  options.window = window;
  options.enable_gqa = q_heads != kv_heads;
  options.sinks = sink_values;
  const AttentionForward forward = scaled_dot_product_attention(q, cache, options);

  const Tensor keys = cache.keys(), values = cache.values();
  reference::SdpaProblem problem;
  problem.batch = batch;
  problem.q_heads = q_heads;
  problem.kv_heads = kv_heads;
  problem.queries = n;
  problem.keys = keys.dim(2);
  problem.depth = d;
  problem.value_depth = dv;
  problem.scale = 1.0 / std::sqrt(static_cast<double>(d));
  problem.causal = causal;
  if (window) {
    problem.window_left = window->left;
    problem.window_right = window->right;
  }
  problem.sinks.assign(sink_values.begin(), sink_values.end());
  problem.alibi.assign(slopes.begin(), slopes.end());
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t length = cache.lengths()[static_cast<size_t>(b)];
    problem.batch_offsets.push_back(length - n);
    for (int64_t i = 0; i < n; ++i) problem.lengths.push_back(length);
  }
  const reference::SdpaForward expected = reference::sdpa_forward(
      problem, testing::to_doubles(q), testing::to_doubles(keys), testing::to_doubles(values));
  EXPECT_TRUE(close_to(forward.output, expected.out, kTolerance));
  // Queries at negative positions (causal) and every query of an empty sequence see no key: their
  // rows are exactly zero.
  const int64_t rows_per_sequence = q_heads * n;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t length = cache.lengths()[static_cast<size_t>(b)];
    for (int64_t h = 0; h < q_heads; ++h) {
      for (int64_t i = 0; i < n; ++i) {
        if (length > 0 && (!causal || length - n + i >= 0)) continue;
        const float* row = forward.output.data() + ((b * rows_per_sequence) + h * n + i) * dv;
        for (int64_t c = 0; c < dv; ++c)
          ASSERT_EQ(row[c], 0.0F) << "b " << b << " h " << h << " query " << i;
      }
    }
  }
}

TEST(KVCacheAttention, DecodeAndPrefillMatchTheReference) {
  uint64_t seed = 10;
  for (const CacheDType dtype : kDTypes) {
    check_attention(dtype, 1, 8, 2, true, std::nullopt, false, seed++);         // decode, GQA
    check_attention(dtype, 4, 4, 4, true, SlidingWindow{30, 0}, true, seed++);  // window, sinks
    check_attention(dtype, 2, 2, 1, false, std::nullopt, false, seed++);        // not causal
    // prefill path; sequence 1 holds 20 tokens for 70 queries (50 rows that see no key, zero)
    check_attention(dtype, 70, 4, 2, true, SlidingWindow{25, 0}, true, seed++);
    // ALiBi from each query's position: decode (GQA; not causal with sinks), prefill path
    check_attention(dtype, 1, 8, 2, true, std::nullopt, false, seed++, true);
    check_attention(dtype, 3, 4, 4, false, std::nullopt, true, seed++, true);
    check_attention(dtype, 70, 4, 2, true, SlidingWindow{25, 0}, false, seed++, true);
  }
}

// Quantisation error of narrow caches against the fp32 cache on the same random inputs (keys,
// values and queries normal × 2, so the scores, scaled by 1/√d, spread with a standard deviation
// of 4 and the softmax is peaked as in trained models; 1 query × 8 heads over 2, d = 64,
// m = 2000): the output's error relative to the largest |output| of its row, max and mean over
// all rows. int8 rounds each row to max|x|/127 steps (up to 0.4% of the row's largest entry per
// element), which the exponential amplifies in the scores; fp16 keeps 11 bits, bf16 8. Measured on
// 2026-11-23 (docs/kernels.md): fp16 max 1.7e-3 mean 2.0e-4, bf16 1.1e-2 and 1.4e-3, int8 4.4e-2
// and 5.3e-3; the bounds are about 2× those, so a change that loses precision fails here.
TEST(KVCacheAttention, NarrowCachesStayWithinTheirQuantisationBounds) {
  Rng rng(7);
  const int64_t batch = 2, kv_heads = 2, heads = 8, d = 64, m = 2000;
  const Tensor keys = random_tensor(Shape{batch, kv_heads, m, d}, rng, 2.0F);
  const Tensor values = random_tensor(Shape{batch, kv_heads, m, d}, rng, 2.0F);
  const Tensor query = random_tensor(Shape{batch, heads, 1, d}, rng, 2.0F);
  AttentionOptions options;
  options.enable_gqa = true;
  options.causal = true;
  const auto output_with = [&](CacheDType dtype) {
    KVCache cache(batch, kv_heads, d, m, dtype);
    cache.append(keys, values);
    return scaled_dot_product_attention(query, cache, options).output;
  };
  const Tensor exact = output_with(CacheDType::kFloat32);
  const struct {
    CacheDType dtype;
    const char* name;
    double max_bound, mean_bound;
  } cases[] = {{CacheDType::kFloat16, "float16", 4e-3, 5e-4},
               {CacheDType::kBFloat16, "bfloat16", 2.5e-2, 3e-3},
               {CacheDType::kInt8, "int8", 9e-2, 1.1e-2}};
  for (const auto& c : cases) {
    const Tensor narrow = output_with(c.dtype);
    double max_error = 0.0, sum_error = 0.0;
    int64_t count = 0;
    for (int64_t row = 0; row < batch * heads; ++row) {
      double largest = 0.0;
      for (int64_t t = 0; t < d; ++t)
        largest = std::max(largest, std::abs(static_cast<double>(exact.data()[row * d + t])));
      for (int64_t t = 0; t < d; ++t) {
        const double error =
            std::abs(static_cast<double>(narrow.data()[row * d + t]) - exact.data()[row * d + t]) /
            largest;
        max_error = std::max(max_error, error);
        sum_error += error;
        ++count;
      }
    }
    const double mean_error = sum_error / static_cast<double>(count);
    std::printf(
        "%s cache: output error relative to the row's largest |output|: max %.2e, mean %.2e\n",
        c.name, max_error, mean_error);
    EXPECT_LT(max_error, c.max_bound) << c.name;
    EXPECT_LT(mean_error, c.mean_bound) << c.name;
    EXPECT_GT(max_error, 0.0) << c.name << ": a narrow cache that loses nothing is not narrow";
  }
}

TEST(KVCacheAttention, RefusesWhatACacheDoesNotTake) {
  KVCache cache(1, 2, 4, 8);
  cache.append(Tensor(Shape{1, 2, 3, 4}), Tensor(Shape{1, 2, 3, 4}));
  const Tensor q(Shape{1, 4, 1, 4});
  AttentionOptions gqa;
  gqa.enable_gqa = true;
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, cache), ShapeError,
                       "query: expected 2 heads (the cache's; set enable_gqa");
  AttentionOptions lengths = gqa;
  lengths.valid_lens = ValidLengths::per_batch({2});
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, cache, lengths), ValueError,
                       "valid_lens: not taken with a KV cache");
  AttentionOptions slopes = gqa;
  const std::vector<float> three{0.5F, 0.25F, 0.125F}, not_finite{0.5F, 0.25F, INFINITY, 1.0F};
  slopes.alibi_slopes = three;
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, cache, slopes), ShapeError,
                       "alibi_slopes: expected one value per query head (4), got 3");
  slopes.alibi_slopes = not_finite;
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, cache, slopes), ValueError,
                       "alibi_slopes: expected finite values, got inf at index 2");
  const std::vector<float> steep{0.5F, 0.25F, -3e38F, 1.0F};
  slopes.alibi_slopes = steep;
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, cache, slopes), ValueError,
                       "alibi_slopes: expected slopes of magnitude at most 2.3586574e+38");
  AttentionOptions dropout = gqa;
  dropout.dropout = 0.5F;
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, cache, dropout), ValueError,
                       "dropout: not taken with a KV cache");
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(Tensor(Shape{1, 4, 1, 5}), cache, gqa),
                       ShapeError, "query: expected shape (1, H_q, n, 4)");
  EXPECT_THROW_MESSAGE(
      cache.append(Tensor(Shape{1, 2, 3, 5}), Tensor(Shape{1, 2, 3, 4})), ShapeError,
      "keys: expected shape (1, 2, T, 4) (batch, kv_heads, tokens, dim), got (1, 2, 3, 5)");
  Tensor nan_keys(Shape{1, 2, 1, 4});
  nan_keys.data()[2] = NAN;
  EXPECT_THROW_MESSAGE(cache.append(nan_keys, Tensor(Shape{1, 2, 1, 4})), ValueError,
                       "keys: expected finite values, got NaN at flat index 2");
  EXPECT_EQ(cache.lengths(), (std::vector<int64_t>{3}));  // nothing appended by the failed calls
  const std::vector<int64_t> too_many{5};
  EXPECT_THROW_MESSAGE(cache.append(Tensor(Shape{1, 2, 3, 4}), Tensor(Shape{1, 2, 3, 4}), too_many),
                       ValueError, "counts[0]: expected a number of tokens in [0, 3], got 5");
  EXPECT_THROW_MESSAGE(KVCache(1, 0, 4, 8), ValueError,
                       "kv_heads: expected a positive size, got 0");
  EXPECT_THROW_MESSAGE(cache.reserve(-1), ValueError,
                       "capacity: expected a number of tokens ≥ 0, got -1");
}

// A half cache rounds each entry once: one beyond its range became ±∞ (and the outputs that read
// it NaN). Refused, naming the tensor; what rounds to the largest finite half is kept.
TEST(KVCache, RefusesEntriesItsDTypeRoundsToInfinity) {
  struct Case {
    CacheDType dtype;
    float kept, beyond;
  };
  for (const Case& c : {Case{CacheDType::kFloat16, 65519.0F, 65520.0F},
                        Case{CacheDType::kBFloat16, 3.38e38F, 3.4e38F}}) {
    KVCache cache(1, 1, 4, 8, c.dtype);
    Tensor large(Shape{1, 1, 1, 4});
    large.data()[1] = -c.beyond;
    EXPECT_THROW_MESSAGE(cache.append(large, Tensor(Shape{1, 1, 1, 4})), ValueError,
                         "keys: expected magnitudes a ");
    EXPECT_THROW_MESSAGE(cache.append(Tensor(Shape{1, 1, 1, 4}), large), ValueError,
                         "which rounds to infinity; scale the values down");
    EXPECT_EQ(cache.lengths(), (std::vector<int64_t>{0}));
    large.data()[1] = -c.kept;
    cache.append(large, large);
    EXPECT_TRUE(all_finite(cache.keys()));
  }
  KVCache wide(1, 1, 4, 8);  // float32 holds any finite float
  Tensor largest(Shape{1, 1, 1, 4});
  largest.data()[0] = std::numeric_limits<float>::max();
  wide.append(largest, largest);
  EXPECT_EQ(wide.lengths(), (std::vector<int64_t>{1}));
}

// A half model's tensors go in as they are: appended keys and values are stored as their exact
// widening would be (a bf16 cache keeps bf16 entries bit for bit), and a half query's output is
// the widened query's output rounded once to its type (a bf16 call's on vdpbf16ps within P's
// rounding to bf16).
TEST(KVCache, TakesAHalfModelsKeysValuesAndQueries) {
  Rng rng(5);
  for (const HalfType type : {HalfType::kBFloat16, HalfType::kFloat16}) {
    for (const CacheDType dtype : kDTypes) {
      const auto rounded = [&](const Tensor& x) {
        std::vector<uint16_t> bits(static_cast<size_t>(x.numel()));
        narrow_to_half(type, x.data(), bits.data(), bits.size());
        Tensor wide(x.shape());
        widen_half(type, bits.data(), wide.data(), bits.size());
        return std::make_pair(bits, wide);
      };
      const auto [key_bits, keys] = rounded(random_tensor(Shape{2, 2, 5, 8}, rng));
      const auto [value_bits, values] = rounded(random_tensor(Shape{2, 2, 5, 8}, rng));
      KVCache half_cache(2, 2, 8, 4, dtype), wide_cache(2, 2, 8, 4, dtype);
      const std::vector<int64_t> counts{5, 3};
      half_cache.append(type, StridedView<const uint16_t>(key_bits.data(), keys.shape()),
                        StridedView<const uint16_t>(value_bits.data(), values.shape()), counts);
      wide_cache.append(keys, values, counts);
      EXPECT_EQ(half_cache.keys().to_vector(), wide_cache.keys().to_vector());
      EXPECT_EQ(half_cache.values().to_vector(), wide_cache.values().to_vector());
      if (dtype == CacheDType::kBFloat16 && type == HalfType::kBFloat16) {
        // Bit for bit: sequence 0, which took all 5 tokens (the other's rows past 3 read 0).
        const std::vector<float> stored = half_cache.keys().to_vector(), given = keys.to_vector();
        EXPECT_TRUE(std::equal(given.begin(), given.begin() + 2 * 5 * 8, stored.begin()));
      }
      const auto [query_bits, query] = rounded(random_tensor(Shape{2, 4, 2, 8}, rng));
      AttentionOptions gqa;
      gqa.enable_gqa = true;
      const HalfAttentionForward half = scaled_dot_product_attention(
          type, StridedView<const uint16_t>(query_bits.data(), query.shape()), half_cache, gqa);
      const AttentionForward wide = scaled_dot_product_attention(query, wide_cache, gqa);
      std::vector<uint16_t> expected(static_cast<size_t>(wide.output.numel()));
      narrow_to_half(type, wide.output.data(), expected.data(), expected.size());
      EXPECT_EQ(half.output.type, type);
      EXPECT_EQ(half.output.shape, wide.output.shape());
      const std::vector<uint16_t> got(half.output.bits.begin(), half.output.bits.end());
      if (type == HalfType::kBFloat16 && dtype == CacheDType::kBFloat16 && got != expected) {
        // A bf16 call on a bf16 cache whose P·V runs on vdpbf16ps (by default on AMD's cores)
        // rounds P to bf16 first, which the float call does not: each weight within 2⁻⁹, so
        // 2⁻⁸·max|v| more beside the output's own rounding, 2⁻⁸ of it.
        float largest_value = 0.0F;
        for (const float v : values.values()) largest_value = std::max(largest_value, std::fabs(v));
        for (size_t e = 0; e < got.size(); ++e) {
          const float want = wide.output.data()[e];
          EXPECT_NEAR(half_bits_to_float(type, got[e]), want,
                      0x1p-8F * (std::fabs(want) + largest_value))
              << "element " << e;
        }
      } else {
        EXPECT_EQ(got, expected);
      }
      EXPECT_EQ(half.log_sum_exp, wide.log_sum_exp);
    }
  }
}

// Sizes whose storage no address space holds are refused, naming them: the byte count used to
// wrap around int64 (2⁶² tokens × 8 dims × 4 bytes = 2⁶⁷ → 0), so the cache allocated nothing and
// its first append wrote past the end. A refused reserve leaves the cache as it was.
TEST(KVCache, RefusesSizesWhoseStorageNoMemoryHolds) {
  constexpr int64_t kTooMany = int64_t{1} << 62;
  EXPECT_THROW_MESSAGE(KVCache(1, 1, 8, kTooMany), ValueError,
                       "capacity: expected a number of tokens whose storage fits in memory's "
                       "addresses, got 4611686018427387904 tokens for each of 1 sequence(s)");
  EXPECT_THROW_MESSAGE(KVCache(int64_t{1} << 31, int64_t{1} << 31, int64_t{1} << 31, 0), ValueError,
                       "batch, kv_heads, head_dim, value_dim: expected sizes whose "
                       "one token");
  KVCache cache(1, 2, 4, 2, CacheDType::kInt8);
  EXPECT_THROW_MESSAGE(cache.reserve(kTooMany), ValueError, "capacity: expected a number");
  EXPECT_EQ(cache.capacity(), 2);
  cache.append(Tensor(Shape{1, 2, 3, 4}), Tensor(Shape{1, 2, 3, 4}));  // grows by doubling
  EXPECT_EQ(cache.lengths(), (std::vector<int64_t>{3}));
  EXPECT_EQ(cache.capacity(), 4);
}

// The cache's keys and values sit on HugePageAllocator blocks: several MiB start on a 2 MiB
// boundary, where the kernel can back them with transparent huge pages.
TEST(KVCache, LargeStorageStartsOnHugePageBoundaries) {
  // 2 sequences × 4 heads × 4096 tokens × 64 fp32 = 8 MiB of keys, as much of values.
  const KVCache cache(2, 4, 64, 4096, CacheDType::kFloat32);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(cache.keys_view().data) % core_detail::kHugePageBytes, 0U);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(cache.values_view().data) % core_detail::kHugePageBytes,
            0U);
}

}  // namespace
}  // namespace attn
