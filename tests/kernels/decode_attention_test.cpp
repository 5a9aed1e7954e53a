// The decode kernel against the double reference on every SIMD target: fp32, fp16, bf16 and int8
// caches (the reference reads the same stored values, widened in double), sequences of different
// cached lengths (0 and the full capacity included), 1 to 8 query heads per key/value head, one or
// several new queries (causal among them, aligned to each sequence's end; one query of one head
// per key/value head takes the one-row passes), windows, soft-capping, sinks, and splits of the
// keys across threads.
#include "attn/kernels/decode_attention.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/core/half.hpp"
#include "attn/kernels/flash_attention.hpp"
#include "every_simd_target.hpp"
#include "scoped_bf16_products.hpp"
#include "sdpa_reference.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

using testing::close_to;

// As the prefill kernels' bound: outputs are convex combinations of value rows with float32
// weights, a few ulps per term, so 1e-5 relative to the output's magnitude. The cache's own
// rounding is not in it: the reference reads the stored (rounded) values.
constexpr double kTolerance = 1e-5;

// A (B, H_kv, capacity, cols) cache tensor of `dtype` filled from normal values, and the values it
// stores, widened to double, for the reference.
struct StoredTensor {
  CacheDType dtype;
  std::vector<float> f32;
  std::vector<uint16_t> halves;
  std::vector<int8_t> bytes;
  std::vector<float> scales;
  std::vector<double> widened;
  CacheTensorView view;

  StoredTensor(CacheDType type, int64_t batch, int64_t heads, int64_t capacity, int64_t cols,
               Rng& rng)
      : dtype(type) {
    const auto count = static_cast<size_t>(batch * heads * capacity * cols);
    std::vector<float> values(count);
    for (float& value : values) value = rng.normal();
    widened.resize(count);
    if (dtype == CacheDType::kFloat32) {
      f32 = values;
      for (size_t e = 0; e < count; ++e) widened[e] = f32[e];
    } else if (dtype == CacheDType::kFloat16 || dtype == CacheDType::kBFloat16) {
      halves.resize(count);
      for (size_t e = 0; e < count; ++e) {
        halves[e] =
            dtype == CacheDType::kFloat16 ? float_to_half(values[e]) : float_to_bfloat16(values[e]);
        widened[e] =
            dtype == CacheDType::kFloat16 ? half_to_float(halves[e]) : bfloat16_to_float(halves[e]);
      }
    } else {
      // One scale per row: max |x| / 127, as a quantising cache would store.
      bytes.resize(count);
      scales.resize(static_cast<size_t>(batch * heads * capacity));
      for (size_t row = 0; row < scales.size(); ++row) {
        float largest = 0.0F;
        for (int64_t t = 0; t < cols; ++t)
          largest = std::max(
              largest, std::fabs(values[row * static_cast<size_t>(cols) + static_cast<size_t>(t)]));
        scales[row] = largest > 0.0F ? largest / 127.0F : 1.0F;
        for (int64_t t = 0; t < cols; ++t) {
          const size_t e = row * static_cast<size_t>(cols) + static_cast<size_t>(t);
          bytes[e] = static_cast<int8_t>(std::lround(values[e] / scales[row]));
          widened[e] = static_cast<double>(bytes[e]) * scales[row];
        }
      }
    }
    view.dtype = dtype;
    view.data = dtype == CacheDType::kFloat32 ? static_cast<const void*>(f32.data())
                : dtype == CacheDType::kInt8  ? static_cast<const void*>(bytes.data())
                                              : static_cast<const void*>(halves.data());
    view.scales = dtype == CacheDType::kInt8 ? scales.data() : nullptr;
    view.batch = batch;
    view.heads = heads;
    view.capacity = capacity;
    view.cols = cols;
    view.row_stride = cols;
    view.head_stride = capacity * cols;
    view.batch_stride = heads * capacity * cols;
  }

  // Rows [length, capacity) of sequence b become NaN (int8 rows: their scales), as a cache's rows
  // past what it has written may hold anything: the kernel must not read them into any sum.
  void poison_rows_from(int64_t b, int64_t length) {
    for (int64_t h = 0; h < view.heads; ++h) {
      for (int64_t row = length; row < view.capacity; ++row) {
        const int64_t first = b * view.batch_stride + h * view.head_stride + row * view.row_stride;
        if (dtype == CacheDType::kInt8) {
          scales[static_cast<size_t>((b * view.heads + h) * view.capacity + row)] = NAN;
          continue;
        }
        for (int64_t t = 0; t < view.cols; ++t) {
          const auto e = static_cast<size_t>(first + t);
          if (dtype == CacheDType::kFloat32)
            f32[e] = NAN;
          else
            halves[e] = dtype == CacheDType::kFloat16 ? 0x7E00 : 0x7FC0;
        }
      }
    }
  }
};

struct Case {
  int64_t batch, q_heads, kv_heads, queries, capacity, depth, value_depth;
  bool causal;
  int64_t window_left, window_right;
  float softcap;
  bool sinks;
  bool alibi = false;  // slopes 2^−(h+1) (h mod 8), as ALiBi's geometric series
};

class DecodeAttention : public testing::EverySimdTarget {};

// The kernel's options for case `c`: scale 1/√d, its mask, window and soft cap, the sinks and ALiBi
// slopes given (one per query head) where the case has them.
DecodeOptions options_of(const Case& c, const std::vector<float>& sinks,
                         const std::vector<float>& slopes) {
  DecodeOptions options;
  options.scale = 1.0F / std::sqrt(static_cast<float>(c.depth));
  options.causal = c.causal;
  options.window_left = c.window_left;
  options.window_right = c.window_right;
  options.softcap = c.softcap;
  options.sinks = c.sinks ? sinks.data() : nullptr;
  options.alibi_slopes = c.alibi ? slopes.data() : nullptr;
  return options;
}

// With `bf16_queries` the queries are rounded to bf16 first, as an upcast bf16 model's arrive:
// with a bf16 cache and 3 or more rows a key/value head, AVX-512 targets on CPUs with AVX512-BF16
// then score on vdpbf16ps where bf16_dot_in_use() (FourRowScoresOnPairs, EightRowScoresOnPairs,
// ScoresOnPairs), within the fp32 bound; queries that bf16 does not hold keep the fp32 products.
void check(const Case& c, CacheDType dtype, uint64_t seed, bool bf16_queries = false) {
  SCOPED_TRACE("dtype " + std::to_string(static_cast<int>(dtype)) +
               " B=" + std::to_string(c.batch) + " Hq=" + std::to_string(c.q_heads) +
               " Hkv=" + std::to_string(c.kv_heads) + " n=" + std::to_string(c.queries) +
               " m=" + std::to_string(c.capacity) + (bf16_queries ? " bf16 queries" : ""));
  Rng rng(seed);
  Tensor q = testing::random_tensor(Shape{c.batch, c.q_heads, c.queries, c.depth}, rng);
  if (bf16_queries) {
    for (int64_t e = 0; e < q.numel(); ++e)
      q.data()[e] = bfloat16_to_float(float_to_bfloat16(q.data()[e]));
  }
  StoredTensor keys(dtype, c.batch, c.kv_heads, c.capacity, c.depth, rng);
  StoredTensor values(dtype, c.batch, c.kv_heads, c.capacity, c.value_depth, rng);
  std::vector<int64_t> lengths;
  for (int64_t b = 0; b < c.batch; ++b) {
    lengths.push_back(
        b == 0   ? c.capacity
        : b == 1 ? 0
                 : static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(c.capacity + 1)));
    keys.poison_rows_from(b, lengths.back());
    values.poison_rows_from(b, lengths.back());
  }
  std::vector<float> sinks;
  for (int64_t h = 0; h < c.q_heads && c.sinks; ++h) sinks.push_back(rng.normal());
  std::vector<float> slopes;
  for (int64_t h = 0; h < c.q_heads && c.alibi; ++h)
    slopes.push_back(std::ldexp(1.0F, -static_cast<int>(h % 8) - 1));
  const DecodeOptions options = options_of(c, sinks, slopes);

  Tensor out = Tensor::full(Shape{c.batch, c.q_heads, c.queries, c.value_depth}, NAN);
  const auto heads = [](const Tensor& t) {
    return ConstHeadsView{t.data(),
                          t.dim(0),
                          t.dim(1),
                          t.dim(2),
                          t.dim(3),
                          t.dim(1) * t.dim(2) * t.dim(3),
                          t.dim(2) * t.dim(3),
                          t.dim(3)};
  };
  HeadsView out_view{out.data(),
                     out.dim(0),
                     out.dim(1),
                     out.dim(2),
                     out.dim(3),
                     out.dim(1) * out.dim(2) * out.dim(3),
                     out.dim(2) * out.dim(3),
                     out.dim(3)};
  decode_attention_forward(heads(q), keys.view, values.view, lengths.data(), options, out_view);

  reference::SdpaProblem problem;
  problem.batch = c.batch;
  problem.q_heads = c.q_heads;
  problem.kv_heads = c.kv_heads;
  problem.queries = c.queries;
  problem.keys = c.capacity;
  problem.depth = c.depth;
  problem.value_depth = c.value_depth;
  problem.scale = options.scale;
  problem.causal = c.causal;
  problem.window_left = c.window_left;
  problem.window_right = c.window_right;
  problem.softcap = c.softcap;
  problem.sinks.assign(sinks.begin(), sinks.end());
  problem.alibi.assign(slopes.begin(), slopes.end());
  for (int64_t b = 0; b < c.batch; ++b) {
    problem.batch_offsets.push_back(lengths[static_cast<size_t>(b)] - c.queries);
    for (int64_t i = 0; i < c.queries; ++i)
      problem.lengths.push_back(lengths[static_cast<size_t>(b)]);
  }
  const reference::SdpaForward expected =
      reference::sdpa_forward(problem, testing::to_doubles(q), keys.widened, values.widened);
  // Queries that are bf16 values may score on vdpbf16ps (exact products, fp32 sums); P·V stays
  // fp32 for float queries, P rounded to bf16 only for a bf16 call's (the half overload, below).
  EXPECT_TRUE(close_to(out, expected.out, kTolerance));
}

TEST_P(DecodeAttention, MatchesTheReferenceForEveryCacheType) {
  const Case cases[] = {
      {3, 8, 2, 1, 300, 64, 64, true, -1, -1, 0.0F, false},    // one token, GQA 4
      {3, 8, 8, 2, 129, 32, 16, true, -1, -1, 0.0F, true},     // MHA, two tokens, sinks
      {2, 8, 1, 4, 200, 16, 24, true, 40, 0, 0.0F, false},     // MQA 8, four tokens, window
      {2, 4, 2, 3, 70, 8, 8, false, -1, -1, 2.0F, false},      // not causal, softcap
      {1, 4, 4, 1, 2000, 64, 64, true, -1, -1, 0.0F, false},   // many splits of one head
      {2, 2, 1, 1, 1, 5, 3, true, -1, -1, 0.0F, true},         // one cached key, odd sizes
      {2, 8, 2, 1, 333, 128, 128, true, -1, -1, 0.0F, false},  // d = 128: whole value rows
      {1, 4, 1, 2, 150, 128, 128, false, -1, -1, 0.0F, true},  // d = 128, two groups of 4 rows
      // 12 rows a key/value head (GQA 6, two tokens), d and dv not multiples of any vector: the
      // fp16 tiles widened to floats (WidensTiles, AVX2) with their columns' tails
      {2, 6, 1, 2, 100, 20, 36, true, -1, -1, 0.0F, false},
      // More than 8 rows a key/value head take the rows-along-lanes scores on AVX-512
      // (BroadcastScoreTile) where a task sees at least 128 keys (the 12 rows above and the 32 of
      // MQA 8 with four tokens see fewer and keep the dot products): 48 rows (GQA 12, four tokens)
      // with odd d and dv and keys not a multiple of the 8 per step; 64 rows (GQA 4, 16 tokens) at
      // d = 128 with a window of 140 keys, soft-capping, sinks and ALiBi; the same with a window of
      // 60 (fewer keys than that: the dot products); more than 48 rows score on the prefill's
      // register tiles (ProductsOnTiles): 52 rows (GQA 13, four tokens), odd d, 203 keys (a last
      // tile of 11 keys, blocks of six keys and a remainder)
      {2, 12, 1, 4, 137, 20, 36, true, -1, -1, 0.0F, false},
      {1, 8, 2, 16, 300, 128, 128, true, 140, 0, 2.0F, true, true},
      {1, 8, 2, 16, 150, 128, 128, true, 60, 0, 2.0F, true, true},
      {2, 13, 1, 4, 203, 33, 40, true, -1, -1, 0.0F, false},
      // 5 to 8 rows a key/value head take 8-lane rows where full vectors have 16: 7 rows (GQA 7)
      // over a last tile of 5 keys, 5 rows over one of 3 keys, 8 rows with a window, soft-capping,
      // sinks and ALiBi (bf16 queries: the pairs' probabilities packed four keys a step)
      {1, 7, 1, 1, 133, 64, 64, true, -1, -1, 0.0F, false},
      {2, 5, 1, 1, 67, 32, 40, true, -1, -1, 0.0F, true},
      {1, 8, 1, 1, 131, 48, 40, true, 20, 0, 2.0F, true, true},
      // 3 and 4 rows (GQA 3 and 4, one token; bf16 queries: dot products of bf16 pairs): d of 20
      // pairs (a vector of 16 and a masked tail), dv of 72 and 100 (a 64-column block, then blocks
      // of 32 and 16 with masked columns), an odd last key; a window, soft-capping, sinks, ALiBi
      {2, 3, 1, 1, 75, 40, 72, true, -1, -1, 0.0F, true},
      {1, 4, 1, 1, 131, 64, 100, true, 20, 0, 2.0F, true, true},
      // ALiBi: one token of GQA 4; window, softcap and sinks with four tokens of MQA 8; not
      // causal over many splits; d = 128 over two groups of 4 rows
      {3, 8, 2, 1, 300, 64, 64, true, -1, -1, 0.0F, false, true},
      {2, 8, 1, 4, 200, 16, 24, true, 40, 0, 2.0F, true, true},
      {1, 4, 4, 1, 2000, 64, 64, false, -1, -1, 0.0F, false, true},
      {1, 4, 1, 2, 150, 128, 128, false, -1, -1, 0.0F, true, true},
      // One row per key/value head (MHA, one token: the one-row score and value passes): d =
      // 128, whole value rows; odd sizes (a last partial vector, an odd count of whole ones) with
      // a window, soft-capping, sinks and ALiBi; value rows of more than 8 vectors on every
      // target; many splits, keys not a multiple of the 2 or 4 per step; fp32 keys past the L2
      // (5 MB) take the four-row score steps; value rows of whole vectors on every target (d =
      // 32, 128) take the one row's dense softmax, with a window, soft-capping, sinks and ALiBi
      {2, 4, 4, 1, 300, 128, 128, true, -1, -1, 0.0F, false},
      {3, 3, 3, 1, 90, 20, 36, true, 30, 0, 2.0F, true, true},
      {3, 3, 3, 1, 90, 32, 32, true, 30, 0, 2.0F, true, true},
      {2, 2, 2, 1, 77, 48, 200, false, -1, -1, 0.0F, false},
      {1, 2, 2, 1, 3001, 64, 64, true, -1, -1, 0.0F, true},
      {1, 1, 1, 1, 20000, 64, 64, true, -1, -1, 0.0F, false},
  };
  uint64_t seed = 1;
  for (const Case& c : cases) {
    for (const CacheDType dtype :
         {CacheDType::kFloat32, CacheDType::kFloat16, CacheDType::kBFloat16, CacheDType::kInt8}) {
      check(c, dtype, seed++);
    }
    check(c, CacheDType::kBFloat16, seed++, true);
    // vdpbf16ps wherever the CPU has it (by default only where it outpaces fp32 FMAs: AMD's).
    const testing::ScopedBf16DotUse dot(Bf16DotUse::kAlways);
    check(c, CacheDType::kBFloat16, seed++, true);
  }
}

// The half overload (fp16 or bf16 queries and outputs, read and written in place, rows padded
// apart) gives the float overload's outputs on the widened queries, each rounded once (bf16 on
// vdpbf16ps: within P's rounding to bf16, which the float overload does not do), their rounding
// residuals, and the same log-sum-exp: splits of the keys merged after the tasks (2000 keys of one
// head) and unsplit tasks, one row a key/value head and 4, 8, 12 and 64, windows, soft-capping,
// sinks and ALiBi.
TEST_P(DecodeAttention, HalfQueriesAndOutputsGiveTheFloatCallsRounded) {
  const Case cases[] = {
      {3, 8, 2, 1, 300, 64, 64, true, -1, -1, 0.0F, false},
      {1, 4, 4, 1, 2000, 64, 64, true, -1, -1, 0.0F, true},
      {2, 6, 1, 2, 100, 20, 36, true, -1, -1, 0.0F, false},
      {1, 8, 2, 16, 300, 128, 128, true, 140, 0, 2.0F, true, true},
      {1, 8, 1, 1, 131, 48, 40, true, 20, 0, 2.0F, true, true},
      {3, 3, 3, 1, 90, 20, 36, true, 30, 0, 2.0F, true, true},
  };
  uint64_t seed = 500;
  // By default, and with vdpbf16ps wherever the CPU has it (by default only AMD's).
  for (const bool bf16_dot : {false, true}) {
    std::optional<testing::ScopedBf16DotUse> dot;
    if (bf16_dot) dot.emplace(Bf16DotUse::kAlways);
    for (const Case& c : cases) {
      for (const HalfType type : {HalfType::kFloat16, HalfType::kBFloat16}) {
        SCOPED_TRACE(std::string(type == HalfType::kFloat16 ? "fp16" : "bf16") +
                     " Hq=" + std::to_string(c.q_heads) + " n=" + std::to_string(c.queries) +
                     " m=" + std::to_string(c.capacity) + (bf16_dot ? " vdpbf16ps" : ""));
        Rng rng(seed++);
        const CacheDType dtype =
            type == HalfType::kFloat16 ? CacheDType::kFloat16 : CacheDType::kBFloat16;
        const StoredTensor keys(dtype, c.batch, c.kv_heads, c.capacity, c.depth, rng);
        const StoredTensor values(dtype, c.batch, c.kv_heads, c.capacity, c.value_depth, rng);
        std::vector<int64_t> lengths;
        for (int64_t b = 0; b < c.batch; ++b) lengths.push_back(b == 1 ? 0 : c.capacity - 3 * b);
        std::vector<float> sinks, slopes;
        for (int64_t h = 0; h < c.q_heads; ++h) {
          sinks.push_back(rng.normal());
          slopes.push_back(std::ldexp(1.0F, -static_cast<int>(h % 8) - 1));
        }
        const DecodeOptions options = options_of(c, sinks, slopes);
        // Rows `pad` elements longer than their data, the heads and sequences back to back.
        const int64_t pad = 3, rows = c.batch * c.q_heads * c.queries;
        const int64_t q_stride = c.depth + pad, out_stride = c.value_depth + pad;
        std::vector<uint16_t> q16(static_cast<size_t>(rows * q_stride), 0);
        std::vector<float> q32(static_cast<size_t>(rows * c.depth));
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t t = 0; t < c.depth; ++t) {
            const uint16_t bits = float_to_half_bits(type, rng.normal());
            q16[static_cast<size_t>(r * q_stride + t)] = bits;
            q32[static_cast<size_t>(r * c.depth + t)] = half_bits_to_float(type, bits);
          }
        }
        const auto view = [&](auto* data, int64_t cols, int64_t stride) {
          using View = BasicHeadsView<std::remove_pointer_t<decltype(data)>>;
          return View{data,
                      c.batch,
                      c.q_heads,
                      c.queries,
                      cols,
                      c.q_heads * c.queries * stride,
                      c.queries * stride,
                      stride};
        };
        std::vector<float> out32(static_cast<size_t>(rows * c.value_depth));
        std::vector<uint16_t> out16(static_cast<size_t>(rows * out_stride), 0xFFFF);
        std::vector<uint16_t> residual16(out16.size(), 0xFFFF);
        std::vector<float> lse32(static_cast<size_t>(rows)), lse16(static_cast<size_t>(rows));
        const bool finite32 = decode_attention_forward(
            ConstHeadsView(view(q32.data(), c.depth, c.depth)), keys.view, values.view,
            lengths.data(), options, view(out32.data(), c.value_depth, c.value_depth),
            lse32.data());
        const bool finite16 = decode_attention_forward(
            type, ConstHalfHeadsView(view(q16.data(), c.depth, q_stride)), keys.view, values.view,
            lengths.data(), options, view(out16.data(), c.value_depth, out_stride), lse16.data(),
            view(residual16.data(), c.value_depth, out_stride));
        EXPECT_EQ(finite16, finite32);
        EXPECT_EQ(lse16, lse32);
        double largest_value = 0.0;
        for (const double v : values.widened) largest_value = std::max(largest_value, std::abs(v));
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t t = 0; t < out_stride; ++t) {
            const uint16_t got = out16[static_cast<size_t>(r * out_stride + t)];
            if (t >= c.value_depth) {
              ASSERT_EQ(got, 0xFFFF) << "row " << r << ", column " << t;  // the padding untouched
              continue;
            }
            const float wide = out32[static_cast<size_t>(r * c.value_depth + t)];
            if (got == float_to_half_bits(type, wide)) {
              // Its rounding residual, on every route (the keys split over tasks and merged
              // after them too: 2000 keys of one head left them unwritten): the float call's own
              // where the half call widens, within P's rounding of it on vdpbf16ps.
              const uint16_t residual = residual16[static_cast<size_t>(r * out_stride + t)];
              if (type == HalfType::kBFloat16 && bf16_dot_in_use() &&
                  (GetParam() == HWY_AVX3 || GetParam() == HWY_AVX3_DL)) {
                ASSERT_NEAR(output_with_residual(type, got, residual), wide,
                            0x1p-8 * largest_value + 0x1p-16 * std::abs(wide))
                    << "residual, row " << r << ", column " << t;
              } else {
                ASSERT_EQ(residual, output_residual(type, wide, got))
                    << "residual, row " << r << ", column " << t;
              }
              continue;
            }
            // Only a bf16 call's P·V on vdpbf16ps rounds P to bf16 (ValuesOnPairs; the float call
            // keeps P in fp32): each weight within 2⁻⁹, so 2⁻⁸·max|v| more, and the output's own
            // rounding, 2⁻⁸ of it.
            ASSERT_EQ(type, HalfType::kBFloat16) << "row " << r << ", column " << t;
            ASSERT_NEAR(half_bits_to_float(type, got), wide,
                        0x1p-8 * (std::abs(wide) + largest_value))
                << "row " << r << ", column " << t;
          }
        }
      }
    }
  }
}

// A bf16 call's P·V on vdpbf16ps where a row's values cancel (2048 cached keys, nearly uniform
// weights, values ~N(0, 1)): with P split in two bf16 parts (ATTN_BF16_P=split) each output, read
// back before its rounding from its residual, is within 2⁻¹⁶·Σ_j P_j·|v_j| of the double
// reference on the stored inputs (plus 2⁻²⁰ of it for fp32's sums and 2⁻¹⁶|o| for the residual);
// with P rounded (the default on vdpbf16ps) it misses that bound by more than 4× somewhere. Rows
// of a key/value head: 4 (the 4-lane pairs), 8 (8-lane pairs) and 16 (GemmBF16's tiles).
TEST_P(DecodeAttention, BFloat16SplitProbabilitiesKeepCancellingOutputsExact) {
  const testing::ScopedBf16DotUse dot(Bf16DotUse::kAlways);
  const int64_t keys = 2048, depth = 64;
  for (const int64_t rows : {4, 8, 16}) {
    const int64_t q_heads = rows;  // one key/value head, one query each
    Rng rng(static_cast<uint64_t>(700 + rows));
    const StoredTensor key_cache(CacheDType::kBFloat16, 1, 1, keys, depth, rng);
    const StoredTensor value_cache(CacheDType::kBFloat16, 1, 1, keys, depth, rng);
    std::vector<uint16_t> q16(static_cast<size_t>(q_heads * depth));
    std::vector<double> q(q16.size());
    for (size_t e = 0; e < q16.size(); ++e) {
      q16[e] = float_to_bfloat16(0.05F * rng.normal());
      q[e] = bfloat16_to_float(q16[e]);
    }
    const float scale = 0.125F;
    std::vector<double> want(static_cast<size_t>(q_heads * depth)), weighted(want.size());
    for (int64_t h = 0; h < q_heads; ++h) {
      std::vector<double> p(static_cast<size_t>(keys));
      double largest = -std::numeric_limits<double>::infinity(), total = 0.0;
      for (int64_t j = 0; j < keys; ++j) {
        double score = 0.0;
        for (int64_t t = 0; t < depth; ++t)
          score += q[static_cast<size_t>(h * depth + t)] *
                   key_cache.widened[static_cast<size_t>(j * depth + t)];
        p[static_cast<size_t>(j)] = score * scale;
        largest = std::max(largest, score * scale);
      }
      for (double& x : p) total += x = std::exp(x - largest);
      for (int64_t t = 0; t < depth; ++t) {
        for (int64_t j = 0; j < keys; ++j) {
          const double value = value_cache.widened[static_cast<size_t>(j * depth + t)];
          want[static_cast<size_t>(h * depth + t)] += p[static_cast<size_t>(j)] / total * value;
          weighted[static_cast<size_t>(h * depth + t)] +=
              p[static_cast<size_t>(j)] / total * std::abs(value);
        }
      }
    }
    DecodeOptions options;
    options.scale = scale;
    options.causal = false;
    const std::vector<int64_t> lengths{keys};
    // The largest error over Σ P|v| (less the residual's share) under `choice`.
    const auto relative_error = [&](Bf16Probabilities choice) {
      const testing::ScopedBf16Probabilities probabilities(choice);
      std::vector<uint16_t> out(want.size()), residual(want.size());
      const auto view = [&](uint16_t* data) {
        return HalfHeadsView{data, 1, q_heads, 1, depth, q_heads * depth, depth, depth};
      };
      decode_attention_forward(
          HalfType::kBFloat16,
          ConstHalfHeadsView{q16.data(), 1, q_heads, 1, depth, q_heads * depth, depth, depth},
          key_cache.view, value_cache.view, lengths.data(), options, view(out.data()), nullptr,
          view(residual.data()));
      double worst = 0.0;
      for (size_t e = 0; e < want.size(); ++e) {
        const double got = output_with_residual(HalfType::kBFloat16, out[e], residual[e]);
        worst =
            std::max(worst, (std::abs(got - want[e]) - 0x1p-16 * std::abs(want[e])) / weighted[e]);
      }
      return worst;
    };
    const double split = relative_error(Bf16Probabilities::kSplit);
    const double rounded = relative_error(Bf16Probabilities::kRounded);
    EXPECT_LE(split, 0x1p-16 + 0x1p-20) << rows << " rows, P split";
    // (Rounded P only where the target multiplies on vdpbf16ps; elsewhere bf16 widens.)
    if (GetParam() == HWY_AVX3 || GetParam() == HWY_AVX3_DL) {
      if (bf16_dot_available()) {
        EXPECT_GT(rounded, 4 * (0x1p-16 + 0x1p-20)) << rows << " rows";
      }
    }
  }
}

TEST_P(DecodeAttention, RejectsBadArguments) {
  Rng rng(3);
  const StoredTensor keys(CacheDType::kFloat32, 1, 2, 10, 4, rng);
  const Tensor q(Shape{1, 4, 1, 4});
  Tensor out(Shape{1, 4, 1, 4});
  const ConstHeadsView q_view{q.data(), 1, 4, 1, 4, 16, 4, 4};
  const HeadsView out_view{out.data(), 1, 4, 1, 4, 16, 4, 4};
  const std::vector<int64_t> too_long{11};
  EXPECT_THROW_MESSAGE(
      decode_attention_forward(q_view, keys.view, keys.view, too_long.data(), {}, out_view),
      ValueError, "lengths[0]: expected a cached length in [0, 10], got 11");
  const Tensor many(Shape{1, 4, 40, 4});
  Tensor many_out(Shape{1, 4, 40, 4});
  const std::vector<int64_t> ten{10};
  EXPECT_THROW_MESSAGE(
      decode_attention_forward({many.data(), 1, 4, 40, 4, 160, 40, 4}, keys.view, keys.view,
                               ten.data(), {}, {many_out.data(), 1, 4, 40, 4, 160, 40, 4}),
      ValueError, "queries: expected at most 64 rows per key/value head");
  CacheTensorView three_heads = keys.view;
  three_heads.heads = 3;
  EXPECT_THROW_MESSAGE(
      decode_attention_forward(q_view, three_heads, three_heads, ten.data(), {}, out_view),
      ShapeError, "keys: expected a cache of 1 sequences, a number of heads dividing");
  // Key ranges: within the sequence's length, first ≤ last, and alone (no causal, no window).
  std::vector<int64_t> ranges(8, 0);
  ranges[2 * 3 + 1] = 11;
  DecodeOptions ranged;
  ranged.causal = false;
  ranged.key_ranges = ranges.data();
  EXPECT_THROW_MESSAGE(
      decode_attention_forward(q_view, keys.view, keys.view, ten.data(), ranged, out_view),
      ValueError,
      "key_ranges[3]: expected 0 ≤ first ≤ last ≤ the sequence's length 10, got [0, 11)");
  ranges[2 * 3 + 1] = 4;
  ranged.causal = true;
  EXPECT_THROW_MESSAGE(
      decode_attention_forward(q_view, keys.view, keys.view, ten.data(), ranged, out_view),
      ValueError, "key_ranges: expected no causal mask or window beside them");
  // ALiBi: finite slopes, and not beside key ranges (whose rows have no position).
  const std::vector<float> slopes{0.5F, 0.25F, NAN, 0.125F};
  DecodeOptions alibi;
  alibi.alibi_slopes = slopes.data();
  EXPECT_THROW_MESSAGE(
      decode_attention_forward(q_view, keys.view, keys.view, ten.data(), alibi, out_view),
      ValueError, "alibi_slopes[2]: expected a finite slope, got nan");
  ranged.causal = false;
  ranged.alibi_slopes = slopes.data();
  EXPECT_THROW_MESSAGE(
      decode_attention_forward(q_view, keys.view, keys.view, ten.data(), ranged, out_view),
      ValueError, "alibi_slopes: expected no key_ranges beside them");
  // A mask's entries: given, and not beside ALiBi.
  DecodeOptions masked;
  masked.mask.kind = MaskKind::kBool;
  EXPECT_THROW_MESSAGE(
      decode_attention_forward(q_view, keys.view, keys.view, ten.data(), masked, out_view),
      ValueError, "mask: expected its entries, got a mask kind without data");
  const std::vector<uint8_t> keep(10, 1);
  masked.mask.data = keep.data();
  masked.mask.col_stride = 1;
  const std::vector<float> finite_slopes{0.5F, 0.25F, 0.125F, 0.0625F};
  masked.alibi_slopes = finite_slopes.data();
  EXPECT_THROW_MESSAGE(
      decode_attention_forward(q_view, keys.view, keys.view, ten.data(), masked, out_view),
      ValueError, "alibi_slopes: expected no mask beside them");
}

// What the kernel reports (its return value): true for finite inputs, also with a row that sees no
// key (its output 0, its log-sum-exp −∞); false for a NaN or ±∞ query element — also where no row
// sees a key and the kernel computes no score — and for a value row it reads that is not finite
// (its outputs). 100 keys run as one task per key/value head, whose task writes the rows; 1000 keys
// split over tasks whose partials the call merges.
TEST_P(DecodeAttention, ReportsNonFiniteQueriesAndOutputs) {
  for (const int64_t capacity : {100, 1000}) {
    SCOPED_TRACE("keys: " + std::to_string(capacity));
    Rng rng(static_cast<uint64_t>(capacity));
    const StoredTensor keys(CacheDType::kFloat32, 1, 1, capacity, 16, rng);
    StoredTensor values(CacheDType::kFloat32, 1, 1, capacity, 8, rng);
    Tensor q(Shape{1, 4, 1, 16});
    for (float& x : q.span()) x = rng.normal();
    Tensor out(Shape{1, 4, 1, 8});
    std::vector<float> log_sum_exp(4);
    const ConstHeadsView q_view{q.data(), 1, 4, 1, 16, 64, 16, 16};
    const HeadsView out_view{out.data(), 1, 4, 1, 8, 32, 8, 8};
    const std::vector<int64_t> lengths{capacity};
    // Query head 2 sees no key; the others all of them.
    const std::vector<int64_t> ranges{0, capacity, 0, capacity, 0, 0, 0, capacity};
    DecodeOptions options;
    options.causal = false;
    options.key_ranges = ranges.data();
    const auto run = [&] {
      return decode_attention_forward(q_view, keys.view, values.view, lengths.data(), options,
                                      out_view, log_sum_exp.data());
    };
    EXPECT_TRUE(run());
    for (int64_t t = 0; t < 8; ++t) EXPECT_EQ(out.data()[2 * 8 + t], 0.0F) << t;
    EXPECT_EQ(log_sum_exp[2], -std::numeric_limits<float>::infinity());
    for (const int64_t h : {int64_t{2}, int64_t{3}}) {
      for (const float bad : {NAN, std::numeric_limits<float>::infinity()}) {
        const float kept = q.data()[h * 16 + 5];
        q.data()[h * 16 + 5] = bad;
        EXPECT_FALSE(run()) << "query head " << h << ": " << bad;
        q.data()[h * 16 + 5] = kept;
      }
    }
    EXPECT_TRUE(run());
    // No row sees a key: the task computes no score, and only its check of the queries finds one
    // that is not finite (with keys for some row, that row's scores of every key tile are NaN too).
    const std::vector<int64_t> none(8, 0);
    options.key_ranges = none.data();
    EXPECT_TRUE(run());
    q.data()[2 * 16 + 5] = NAN;
    EXPECT_FALSE(run()) << "no row with keys, a NaN query";
    q.data()[2 * 16 + 5] = 0.5F;
    options.key_ranges = ranges.data();
    values.f32[static_cast<size_t>((capacity - 3) * 8 + 1)] =
        -std::numeric_limits<float>::infinity();
    EXPECT_FALSE(run()) << "a value row of -inf";
  }
}

ATTN_INSTANTIATE_FOR_EVERY_SIMD_TARGET(DecodeAttention);

}  // namespace
}  // namespace attn
