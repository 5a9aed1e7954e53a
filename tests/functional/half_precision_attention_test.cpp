// attn::scaled_dot_product_attention's fp16 and bf16 overloads on every SIMD target: the forward
// pass against the float overload on the widened inputs (bit-equal once rounded where the kernel
// widens; within the bf16 kernel's stated bound where it runs on bf16 dot products), the
// log-sum-exp, grouped heads, causal, masks, valid lengths, strided inputs, ranks 2 to 5, values
// near float's maximum; the backward pass bit-equal to the float one rounded; the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/core/half.hpp"
#include "attn/core/random.hpp"
#include "attn/functional/scaled_dot_product_attention.hpp"
#include "attn/kernels/flash_attention.hpp"
#include "every_simd_target.hpp"
#include "functional/prefill_without_scans.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

using HalfView = StridedView<const uint16_t>;

const char* type_name(HalfType type) {
  return type == HalfType::kFloat16 ? "fp16" : "bf16";
}

// Values rounded to `type`, as bits (the half overloads' input) and widened back to float (the
// float overload's input: the same numbers exactly).
struct HalfArray {
  HalfArray(HalfType type, const Tensor& values)
      : bits(static_cast<size_t>(values.numel())), widened(values.shape()) {
    for (int64_t e = 0; e < values.numel(); ++e) {
      bits[static_cast<size_t>(e)] = float_to_half_bits(type, values.data()[e]);
      widened.data()[e] = half_bits_to_float(type, bits[static_cast<size_t>(e)]);
    }
  }
  HalfView view() const { return {bits.data(), widened.shape()}; }
  // The same data under other shape and strides (a transposed view, say), in both forms.
  HalfView view(const Shape& shape, const std::vector<int64_t>& strides) const {
    return {bits.data(), shape, strides};
  }
  ConstStridedView wide(const Shape& shape, const std::vector<int64_t>& strides) const {
    return {widened.data(), shape, strides};
  }

  std::vector<uint16_t> bits;
  Tensor widened;
};

Shape with_last(const Shape& shape, int64_t last) {
  int64_t dims[Shape::kMaxRank];
  for (int axis = 0; axis < shape.rank(); ++axis) dims[axis] = shape[axis];
  dims[shape.rank() - 1] = last;
  return Shape::from_dims(dims, shape.rank());
}

// A contiguous copy of any float view, by an explicit index loop.
Tensor contiguous(const ConstStridedView& view) {
  Tensor copy(view.shape());
  for (int64_t flat = 0; flat < copy.numel(); ++flat) {
    int64_t rest = flat, offset = 0;
    for (int axis = view.rank() - 1; axis >= 0; --axis) {
      offset += (rest % view.dim(axis)) * view.stride(axis);
      rest /= view.dim(axis);
    }
    copy.data()[flat] = view.data()[offset];
  }
  return copy;
}

// True when the kernel widens bf16 to fp32 on heads of `depth` (and fp16 always): results are then
// the float path's.
bool widened_kernel(HalfType type, int64_t depth) {
  return type == HalfType::kFloat16 || !flash_attention_bfloat16_native(depth);
}

// The half forward pass of q, k, v against the float overload on the same values (`wide_*`).
// Exact kernels: every output is the float output rounded once (bit-equal), the log-sum-exp
// bit-equal. The native bf16 kernel (bf16 dot products, P rounded to bf16 before P·V):
//   |out − out32| ≤ 1e-5·max|out32| + 2⁻⁸·|out32| + 2⁻⁸·Σ_j P_ij·|v_j|
// — the float kernel's own 1e-5 against exact arithmetic (functional tests), the output's
// rounding to bf16 (half an ulp, 2⁻⁹ relative, doubled for margin) and P's rounding (2⁻⁹ relative
// per probability, doubled: the kernel's stated bound). Its scores differ from the float path's
// only in the order of their fp32 sums (bf16 products are exact in fp32), each within
// E·2⁻²⁴·|scale|·Σ_t|q_t·k_t|, so the log-sum-exp moves by at most twice that, bounded by
// E²·2⁻²³·|scale|·max|q|·max|k|, plus a few ulps of exp and log (1e-6·(1 + |lse|)).
void expect_forward_matches(HalfType type, HalfView q, HalfView k, HalfView v,
                            ConstStridedView wide_q, ConstStridedView wide_k,
                            ConstStridedView wide_v, const AttentionOptions& options,
                            const std::string& what) {
  SCOPED_TRACE(std::string(type_name(type)) + " " + what);
  const Shape out_shape = with_last(q.shape(), v.dim(-1));
  std::vector<uint16_t> out(static_cast<size_t>(out_shape.numel()), 0xffffU);
  std::vector<float> lse(static_cast<size_t>(log_sum_exp_size(q.shape())), NAN);
  scaled_dot_product_attention(type, q, k, v, options, StridedView<uint16_t>(out.data(), out_shape),
                               lse);
  // The overload into new storage: the same bits and log-sum-exp, shaped and typed as asked.
  const HalfAttentionForward fresh = scaled_dot_product_attention(type, q, k, v, options);
  EXPECT_EQ(fresh.output.type, type);
  EXPECT_EQ(fresh.output.shape, out_shape);
  EXPECT_EQ(std::vector<uint16_t>(fresh.output.bits.begin(), fresh.output.bits.end()), out);
  ASSERT_EQ(fresh.log_sum_exp.size(), lse.size());
  for (size_t r = 0; r < lse.size(); ++r) {
    EXPECT_EQ(std::bit_cast<uint32_t>(fresh.log_sum_exp[r]), std::bit_cast<uint32_t>(lse[r]))
        << "log_sum_exp " << r;
  }
  const AttentionForward expected = scaled_dot_product_attention(wide_q, wide_k, wide_v, options);
  ASSERT_EQ(expected.output.numel(), out_shape.numel());
  if (widened_kernel(type, q.dim(-1))) {
    int64_t mismatches = 0;
    for (int64_t e = 0; e < out_shape.numel(); ++e) {
      const uint16_t want = float_to_half_bits(type, expected.output.data()[e]);
      if (out[static_cast<size_t>(e)] != want && mismatches++ < 5) {
        ADD_FAILURE() << "output " << e << ": got bits " << out[static_cast<size_t>(e)]
                      << ", the float path rounded gives " << want;
      }
    }
    EXPECT_EQ(mismatches, 0);
    for (size_t r = 0; r < lse.size(); ++r) {
      ASSERT_EQ(std::bit_cast<uint32_t>(lse[r]), std::bit_cast<uint32_t>(expected.log_sum_exp[r]))
          << "log_sum_exp " << r << ": " << lse[r] << " vs " << expected.log_sum_exp[r];
    }
    return;
  }
  // Σ_j P_ij·|v_j| per output element, from the float pass's weights (N', Hq, L, S), the leading
  // axes folded into N'; query head h reads value head h / (Hq / Hkv).
  const Tensor weights = attention_weights(wide_q, wide_k, expected.log_sum_exp, options);
  const Tensor values = contiguous(wide_v);
  const int rank = q.rank();
  const int64_t q_heads = rank >= 4 ? q.dim(-3) : 1, kv_heads = rank >= 4 ? k.dim(-3) : 1;
  const int64_t rows = q.dim(-2), keys = k.dim(-2), depth = q.dim(-1), value_depth = v.dim(-1);
  const int64_t batch = out_shape.numel() / std::max<int64_t>(1, q_heads * rows * value_depth);
  double out_max = 0.0;
  for (int64_t e = 0; e < out_shape.numel(); ++e)
    out_max = std::max(out_max, std::fabs(static_cast<double>(expected.output.data()[e])));
  int64_t failures = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < q_heads; ++h)
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t c = 0; c < value_depth; ++c) {
          double spread = 0.0;
          const int64_t g = h / (q_heads / kv_heads);
          for (int64_t j = 0; j < keys; ++j) {
            spread +=
                static_cast<double>(weights.data()[((b * q_heads + h) * rows + i) * keys + j]) *
                std::fabs(static_cast<double>(
                    values.data()[((b * kv_heads + g) * keys + j) * value_depth + c]));
          }
          const int64_t e = ((b * q_heads + h) * rows + i) * value_depth + c;
          const double want = expected.output.data()[e];
          const double got = half_bits_to_float(type, out[static_cast<size_t>(e)]);
          const double bound = 1e-5 * out_max + 0x1p-8 * std::fabs(want) + 0x1p-8 * spread;
          if (!(std::fabs(got - want) <= bound) && failures++ < 5) {
            ADD_FAILURE() << "output " << e << ": " << got << " vs " << want << " (bound " << bound
                          << ")";
          }
        }
  EXPECT_EQ(failures, 0);
  const Tensor wide_query = contiguous(wide_q), wide_key = contiguous(wide_k);
  double q_max = 0.0, k_max = 0.0;
  for (int64_t e = 0; e < wide_query.numel(); ++e)
    q_max = std::max(q_max, std::fabs(static_cast<double>(wide_query.data()[e])));
  for (int64_t e = 0; e < wide_key.numel(); ++e)
    k_max = std::max(k_max, std::fabs(static_cast<double>(wide_key.data()[e])));
  const double scale =
      options.scale ? std::fabs(*options.scale) : 1.0 / std::sqrt(static_cast<double>(depth));
  // (Depth 0: every score is 0, and the default scale 1/√0 is ∞, whose product with 0 is NaN.)
  const double score_bound =
      depth == 0 ? 0.0 : static_cast<double>(depth * depth) * 0x1p-23 * scale * q_max * k_max;
  for (size_t r = 0; r < lse.size(); ++r) {
    const double want = expected.log_sum_exp[r];
    if (std::isinf(want)) {
      EXPECT_EQ(lse[r], expected.log_sum_exp[r]) << "log_sum_exp " << r;
      continue;
    }
    EXPECT_NEAR(lse[r], want, score_bound + 1e-6 * (1.0 + std::fabs(want))) << "log_sum_exp " << r;
  }
}

// Random normal q, k, v of the given shapes, rounded to `type`.
struct Inputs {
  Inputs(HalfType type, const Shape& q_shape, const Shape& k_shape, const Shape& v_shape,
         uint64_t seed, float value_scale = 1.0F)
      : rng(seed),
        q(type, testing::random_tensor(q_shape, rng)),
        k(type, testing::random_tensor(k_shape, rng)),
        v(type, testing::random_tensor(v_shape, rng, value_scale)) {}
  void expect_matches(HalfType type, const AttentionOptions& options, const std::string& what) {
    expect_forward_matches(type, q.view(), k.view(), v.view(), q.widened, k.widened, v.widened,
                           options, what);
  }
  Rng rng;
  HalfArray q, k, v;
};

class HalfPrecisionSdpa : public testing::EverySimdTarget {};

constexpr HalfType kTypes[] = {HalfType::kFloat16, HalfType::kBFloat16};

TEST_P(HalfPrecisionSdpa, ForwardMatchesTheFloatPathOnWidenedInputs) {
  uint64_t seed = 1;
  for (const HalfType type : kTypes) {
    // Grouped heads (4 query heads over 2), sizes that divide no tile.
    Inputs in(type, Shape{2, 4, 37, 16}, Shape{2, 2, 70, 16}, Shape{2, 2, 70, 12}, seed++);
    AttentionOptions options;
    options.enable_gqa = true;
    in.expect_matches(type, options, "grouped heads");
    options.causal = true;
    in.expect_matches(type, options, "causal");
    options.alignment = DiagonalAlignment::kBottomRight;
    in.expect_matches(type, options, "causal bottom-right");

    AttentionOptions masked;
    masked.enable_gqa = true;
    std::vector<uint8_t> keep(2 * 37 * 70);
    for (auto& entry : keep) entry = in.rng.uniform() < 0.7 ? 1 : 0;
    keep[5 * 70 + 0] = 0;  // row 5 of batch 0 sees nothing: a zero output
    std::fill_n(keep.begin() + 5 * 70, 70, 0);
    masked.attn_mask =
        AttentionMask::boolean(StridedView<const uint8_t>(keep.data(), {2, 1, 37, 70}));
    in.expect_matches(type, masked, "bool mask with an empty row");

    AttentionOptions lengths;
    lengths.enable_gqa = true;
    lengths.valid_lens = ValidLengths::per_batch({23, 70});
    in.expect_matches(type, lengths, "valid lengths");

    AttentionOptions more;
    more.enable_gqa = true;
    more.scale = 0.3F;
    more.softcap = 5.0F;
    more.window = SlidingWindow{9, 4};
    std::vector<float> sinks = {0.5F, -1.0F, 2.0F, 0.0F};
    more.sinks = sinks;
    in.expect_matches(type, more, "scale, softcap, window, sinks");
  }
}

// Decoding shapes (a few queries against many keys) run on the decode kernel, which reads the
// half keys and values in place: the float path on the widened inputs runs on it too.
TEST_P(HalfPrecisionSdpa, DecodingShapesMatchTheFloatPath) {
  uint64_t seed = 30;
  for (const HalfType type : kTypes) {
    for (const int64_t n : {1, 4}) {
      Inputs in(type, Shape{2, 8, n, 64}, Shape{2, 2, 300, 64}, Shape{2, 2, 300, 40}, seed++);
      AttentionOptions options;
      options.enable_gqa = true;
      in.expect_matches(type, options, "decoding, n = " + std::to_string(n));
      options.causal = true;
      options.alignment = DiagonalAlignment::kBottomRight;
      options.softcap = 4.0F;
      std::vector<float> sinks = {0.5F, -1.0F, 2.0F, 0.0F, 1.0F, -2.0F, 0.25F, 3.0F};
      options.sinks = sinks;
      in.expect_matches(type, options,
                        "decoding, causal, softcap, sinks, n = " + std::to_string(n));
      AttentionOptions lengths;
      lengths.enable_gqa = true;
      lengths.valid_lens = ValidLengths::per_batch({0, 157});
      in.expect_matches(type, lengths, "decoding, valid lengths, n = " + std::to_string(n));
      // Masks the decode kernel reads as entries: bools with gaps, per head; a float bias.
      std::vector<uint8_t> keep(static_cast<size_t>(2 * 8 * n * 300));
      Tensor bias(Shape{2, 1, 1, 300});
      Rng rng(seed++);
      for (uint8_t& entry : keep) entry = rng.uniform() < 0.5 ? 1 : 0;
      for (int64_t e = 0; e < bias.numel(); ++e)
        bias.data()[e] =
            rng.uniform() < 0.2 ? -std::numeric_limits<float>::infinity() : rng.normal();
      AttentionOptions bools;
      bools.enable_gqa = true;
      bools.attn_mask =
          AttentionMask::boolean(StridedView<const uint8_t>(keep.data(), Shape{2, 8, n, 300}));
      in.expect_matches(type, bools, "decoding, bool mask with gaps, n = " + std::to_string(n));
      AttentionOptions biased;
      biased.enable_gqa = true;
      biased.attn_mask = AttentionMask::additive(bias);
      in.expect_matches(type, biased, "decoding, float bias, n = " + std::to_string(n));
    }
  }
}

TEST_P(HalfPrecisionSdpa, QueriesOfDepthZeroGiveTheValuesMean) {
  // E = 0, as PyTorch takes it: every score is 0, each output row the mean of the values it sees.
  // The half prefill divided by the depth when widening the queries (SIGFPE); decode-sized and
  // prefill-sized query counts, plain and causal, forward and backward.
  uint64_t seed = 40;
  for (const HalfType type : kTypes) {
    for (const int64_t n : {1, 3, 40, 100}) {
      Inputs in(type, Shape{1, 2, n, 0}, Shape{1, 2, 50, 0}, Shape{1, 2, 50, 5}, seed++);
      const std::string what = "depth 0, n = " + std::to_string(n);
      in.expect_matches(type, {}, what);
      AttentionOptions causal;
      causal.causal = true;
      causal.alignment = DiagonalAlignment::kBottomRight;
      in.expect_matches(type, causal, what + ", causal");
      // dV_j = Σ_i P_ij·dO_i with P_ij = 1/50: within the rounding of dO and dV to `type`.
      const HalfAttentionForward forward =
          scaled_dot_product_attention(type, in.q.view(), in.k.view(), in.v.view());
      const HalfArray grad_out(type, testing::random_tensor(Shape{1, 2, n, 5}, in.rng));
      const HalfAttentionBackward gradients = scaled_dot_product_attention_backward(
          type, in.q.view(), in.k.view(), in.v.view(),
          HalfView(forward.output.bits.data(), forward.output.shape), grad_out.view(),
          forward.log_sum_exp, {});
      EXPECT_EQ(gradients.query.bits.size(), 0U);
      EXPECT_EQ(gradients.key.bits.size(), 0U);
      ASSERT_EQ(gradients.value.bits.size(), 2U * 50 * 5);
      const double unit = type == HalfType::kFloat16 ? 0x1p-11 : 0x1p-8;
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t j = 0; j < 50; ++j)
          for (int64_t c = 0; c < 5; ++c) {
            double want = 0.0, size = 0.0;
            for (int64_t i = 0; i < n; ++i) {
              want += grad_out.widened.data()[(h * n + i) * 5 + c] / 50.0;
              size += std::fabs(grad_out.widened.data()[(h * n + i) * 5 + c]) / 50.0;
            }
            const double got = half_bits_to_float(
                type, gradients.value.bits[static_cast<size_t>((h * 50 + j) * 5 + c)]);
            EXPECT_NEAR(got, want, unit * size + 1e-6) << what << " dV " << h << " " << j;
          }
    }
  }
}

TEST_P(HalfPrecisionSdpa, Fp16DropoutIsTheFloatPathsDropout) {
  // Exact for fp16 on every target: the same seeds drop the same weights.
  Inputs in(HalfType::kFloat16, Shape{2, 2, 21, 8}, Shape{2, 2, 33, 8}, Shape{2, 2, 33, 8}, 50);
  AttentionOptions options;
  options.dropout = 0.25F;
  options.seed = 1234;
  in.expect_matches(HalfType::kFloat16, options, "dropout");
}

TEST_P(HalfPrecisionSdpa, EveryRankAndStridedInputs) {
  uint64_t seed = 60;
  for (const HalfType type : kTypes) {
    const AttentionOptions plain;
    Inputs(type, Shape{19, 8}, Shape{29, 8}, Shape{29, 4}, seed++)
        .expect_matches(type, plain, "rank 2");
    Inputs(type, Shape{3, 19, 8}, Shape{3, 29, 8}, Shape{3, 29, 4}, seed++)
        .expect_matches(type, plain, "rank 3");
    Inputs(type, Shape{2, 3, 2, 19, 8}, Shape{2, 3, 2, 29, 8}, Shape{2, 3, 2, 29, 4}, seed++)
        .expect_matches(type, plain, "rank 5");

    // The query as (N, L, H, E) data read as (N, H, L, E) — heads inside a projection, read in
    // place — and the key stored transposed, (N, H, E, S), so its last axis is strided and the
    // overload copies it.
    const int64_t n = 2, h = 3, l = 17, s = 26, e = 8;
    Rng rng(seed++);
    const HalfArray q(type, testing::random_tensor(Shape{n, l, h, e}, rng));
    const HalfArray k(type, testing::random_tensor(Shape{n, h, e, s}, rng));
    const HalfArray v(type, testing::random_tensor(Shape{n, h, s, e}, rng));
    const Shape q_shape{n, h, l, e}, k_shape{n, h, s, e};
    const std::vector<int64_t> q_strides{l * h * e, e, h * e, 1}, k_strides{h * e * s, e * s, 1, s};
    expect_forward_matches(type, q.view(q_shape, q_strides), k.view(k_shape, k_strides), v.view(),
                           q.wide(q_shape, q_strides), k.wide(k_shape, k_strides), v.widened, plain,
                           "transposed query and key");
  }
}

TEST_P(HalfPrecisionSdpa, StridedOutputIsWrittenInPlace) {
  // An output with heads inside rows, (N, L, H, Ev) read as (N, H, L, Ev): the same bits as a
  // contiguous one, untouched elsewhere (a padding column stays as it was).
  const HalfType type = HalfType::kBFloat16;
  Inputs in(type, Shape{1, 2, 9, 8}, Shape{1, 2, 12, 8}, Shape{1, 2, 12, 4}, 70);
  std::vector<uint16_t> contiguous(1 * 2 * 9 * 4);
  scaled_dot_product_attention(type, in.q.view(), in.k.view(), in.v.view(), {},
                               StridedView<uint16_t>(contiguous.data(), Shape{1, 2, 9, 4}));
  std::vector<uint16_t> padded(1 * 9 * 2 * 5, 0x1234U);  // (N, L, H, Ev + 1)
  scaled_dot_product_attention(
      type, in.q.view(), in.k.view(), in.v.view(), {},
      StridedView<uint16_t>(padded.data(), Shape{1, 2, 9, 4}, std::vector<int64_t>{90, 5, 10, 1}));
  for (int64_t head = 0; head < 2; ++head)
    for (int64_t i = 0; i < 9; ++i) {
      for (int64_t c = 0; c < 4; ++c) {
        EXPECT_EQ(padded[static_cast<size_t>(i * 10 + head * 5 + c)],
                  contiguous[static_cast<size_t>((head * 9 + i) * 4 + c)]);
      }
      EXPECT_EQ(padded[static_cast<size_t>(i * 10 + head * 5 + 4)], 0x1234U);
    }
}

TEST_P(HalfPrecisionSdpa, Bf16ValuesNearFloatsMaximumTakeTheFloatPath) {
  // max|v|·S = 2¹²⁰·40 passes finite_range's 2¹²⁰: the overload widens and calls the float path,
  // which scales the values down for its sums; the result is its result rounded once, on every
  // target. 17 queries: a prefill (decoding shapes, next test, take the decode kernel first).
  const HalfType type = HalfType::kBFloat16;
  Inputs in(type, Shape{1, 2, 17, 8}, Shape{1, 2, 40, 8}, Shape{1, 2, 40, 8}, 80, 0x1p120F);
  const Shape out_shape{1, 2, 17, 8};
  std::vector<uint16_t> out(static_cast<size_t>(out_shape.numel()));
  std::vector<float> lse(34);
  scaled_dot_product_attention(type, in.q.view(), in.k.view(), in.v.view(), {},
                               StridedView<uint16_t>(out.data(), out_shape), lse);
  const AttentionForward expected =
      scaled_dot_product_attention(in.q.widened, in.k.widened, in.v.widened);
  for (int64_t e = 0; e < out_shape.numel(); ++e) {
    ASSERT_TRUE(std::isfinite(expected.output.data()[e]));
    ASSERT_EQ(out[static_cast<size_t>(e)], float_to_half_bits(type, expected.output.data()[e]))
        << e;
  }
  for (size_t r = 0; r < lse.size(); ++r) EXPECT_EQ(lse[r], expected.log_sum_exp[r]) << r;
}

// Decoding shapes with values near float's maximum: the decode kernel reads the bf16 values
// without scanning them, so it cannot scale them first; its sums either stay finite (the result
// is then the float path's within float rounding) or overflow, which its check of the output
// sees, and the call goes the float path's way as above. Both happen here: normal values of scale
// 2¹²⁰ over 40 keys stay finite; values all 2¹²⁴ over 400 keys sum past 2¹²⁸ (Σ_j exp(s_j − max)
// > 16), where the float path's scaled sums give exactly 2¹²⁴.
TEST_P(HalfPrecisionSdpa, Bf16DecodingNearFloatsMaximumIsTheFloatPathsResult) {
  const HalfType type = HalfType::kBFloat16;
  {
    Inputs in(type, Shape{1, 2, 1, 8}, Shape{1, 2, 40, 8}, Shape{1, 2, 40, 8}, 81, 0x1p120F);
    const HalfAttentionForward got =
        scaled_dot_product_attention(type, in.q.view(), in.k.view(), in.v.view(), {});
    const AttentionForward expected =
        scaled_dot_product_attention(in.q.widened, in.k.widened, in.v.widened);
    for (size_t e = 0; e < got.output.bits.size(); ++e) {
      const double want = expected.output.data()[e];
      ASSERT_TRUE(std::isfinite(want));
      // The float path's result rounded to bf16, within one bf16 ulp (the two kernels' fp32 sums
      // differ in their last bits, which can move the rounding).
      EXPECT_NEAR(half_bits_to_float(type, got.output.bits[e]), want, 0x1p-7 * std::fabs(want))
          << e;
    }
    for (size_t r = 0; r < got.log_sum_exp.size(); ++r)
      EXPECT_NEAR(got.log_sum_exp[r], expected.log_sum_exp[r], 1e-5) << r;
  }
  Inputs in(type, Shape{1, 2, 1, 8}, Shape{1, 2, 400, 8}, Shape{1, 2, 400, 8}, 82);
  for (uint16_t& bits : in.v.bits) bits = float_to_half_bits(type, 0x1p124F);
  const HalfAttentionForward got =
      scaled_dot_product_attention(type, in.q.view(), in.k.view(), in.v.view(), {});
  for (size_t e = 0; e < got.output.bits.size(); ++e)
    EXPECT_EQ(half_bits_to_float(type, got.output.bits[e]), 0x1p124F) << e;
}

TEST_P(HalfPrecisionSdpa, BackwardIsTheFloatBackwardRoundedOnce) {
  uint64_t seed = 90;
  for (const HalfType type : kTypes) {
    SCOPED_TRACE(type_name(type));
    const Shape q_shape{2, 4, 23, 16}, k_shape{2, 2, 41, 16}, v_shape{2, 2, 41, 12};
    Inputs in(type, q_shape, k_shape, v_shape, seed++);
    Tensor mask = testing::random_tensor(Shape{23, 41}, in.rng);
    AttentionOptions options;
    options.enable_gqa = true;
    options.causal = true;
    options.attn_mask = AttentionMask::additive(mask);
    std::vector<float> sinks = {0.25F, -0.5F, 1.0F, 0.0F};
    options.sinks = sinks;
    const Shape out_shape{2, 4, 23, 12};
    std::vector<uint16_t> out(static_cast<size_t>(out_shape.numel()));
    std::vector<float> lse(static_cast<size_t>(log_sum_exp_size(q_shape)));
    scaled_dot_product_attention(type, in.q.view(), in.k.view(), in.v.view(), options,
                                 StridedView<uint16_t>(out.data(), out_shape), lse);
    const HalfArray grad_out(type, testing::random_tensor(out_shape, in.rng));
    std::vector<uint16_t> gq(in.q.bits.size()), gk(in.k.bits.size()), gv(in.v.bits.size());
    Tensor grad_mask(mask.shape());
    std::vector<float> grad_sinks(4);
    scaled_dot_product_attention_backward(
        type, in.q.view(), in.k.view(), in.v.view(), HalfView(out.data(), out_shape),
        grad_out.view(), lse, options, StridedView<uint16_t>(gq.data(), q_shape),
        StridedView<uint16_t>(gk.data(), k_shape), StridedView<uint16_t>(gv.data(), v_shape),
        grad_mask, grad_sinks);
    // The float backward on the same numbers: the half output widened, the same log-sum-exp.
    Tensor wide_out(out_shape);
    for (int64_t e = 0; e < out_shape.numel(); ++e)
      wide_out.data()[e] = half_bits_to_float(type, out[static_cast<size_t>(e)]);
    const AttentionBackward expected =
        scaled_dot_product_attention_backward(in.q.widened, in.k.widened, in.v.widened, wide_out,
                                              grad_out.widened, lse, options, true, true);
    // Bit-equal where the kernel widens. The bf16 dot-product path sums the scores' and dP's exact
    // products in another order (the mask's and sinks' gradients, made of dS and D, stay within
    // the fp32 kernels' 1e-5 of the largest entry) and rounds P and dS to bf16 for dV, dK and dQ:
    // each element may move by 2⁻⁸ times the sum of its terms' magnitudes, computed here from the
    // float pass's weights (flash_attention_half_test derives the bound).
    const bool native =
        type == HalfType::kBFloat16 && flash_attention_bfloat16_backward_native(16, 12);
    const auto expect_close = [native](const float* got, const float* want, int64_t count) {
      double largest = 0.0;
      for (int64_t e = 0; e < count; ++e) largest = std::max<double>(largest, std::abs(want[e]));
      for (int64_t e = 0; e < count; ++e) {
        if (native) {
          ASSERT_NEAR(got[e], want[e], 1e-5 * largest) << e;
        } else {
          ASSERT_EQ(got[e], want[e]) << e;
        }
      }
    };
    std::vector<double> bound_q(gq.size()), bound_k(gk.size()), bound_v(gv.size());
    if (native) {
      const Tensor weights = attention_weights(in.q.widened, in.k.widened, lse, options);
      const float* q = in.q.widened.data();
      const float* k = in.k.widened.data();
      const float* v = in.v.widened.data();
      const float* g = grad_out.widened.data();
      const double scale = 1.0 / std::sqrt(16.0);
      const int64_t heads = 4, kv_heads = 2, n = 23, m = 41, d = 16, dv = 12;
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t i = 0; i < n; ++i) {
            const int64_t row = (b * heads + h) * n + i;
            double delta = 0.0;
            for (int64_t t = 0; t < dv; ++t)
              delta += static_cast<double>(g[row * dv + t]) * wide_out.data()[row * dv + t];
            for (int64_t j = 0; j < m; ++j) {
              const double p = weights.data()[row * m + j];
              const int64_t key = (b * kv_heads + h / 2) * m + j;
              double grad_p = 0.0;
              for (int64_t t = 0; t < dv; ++t)
                grad_p += static_cast<double>(g[row * dv + t]) * v[key * dv + t];
              const double grad_s = p * (std::abs(grad_p) + std::abs(delta));
              for (int64_t t = 0; t < d; ++t) {
                bound_q[static_cast<size_t>(row * d + t)] +=
                    scale * grad_s * std::abs(k[key * d + t]);
                bound_k[static_cast<size_t>(key * d + t)] +=
                    scale * grad_s * std::abs(q[row * d + t]);
              }
              for (int64_t t = 0; t < dv; ++t)
                bound_v[static_cast<size_t>(key * dv + t)] += p * std::abs(g[row * dv + t]);
            }
          }
    }
    const std::tuple<const std::vector<uint16_t>*, const Tensor*, const std::vector<double>*>
        gradients[] = {{&gq, &expected.query, &bound_q},
                       {&gk, &expected.key, &bound_k},
                       {&gv, &expected.value, &bound_v}};
    for (const auto& [got, want, bound] : gradients) {
      double largest = 0.0;
      for (int64_t e = 0; e < want->numel(); ++e)
        largest = std::max<double>(largest, std::abs(want->data()[e]));
      for (int64_t e = 0; e < want->numel(); ++e) {
        const uint16_t bits = (*got)[static_cast<size_t>(e)];
        if (native) {
          ASSERT_NEAR(half_bits_to_float(type, bits), want->data()[e],
                      0x1p-8 * (std::abs(want->data()[e]) + (*bound)[static_cast<size_t>(e)]) +
                          1e-5 * largest)
              << e;
        } else {
          ASSERT_EQ(bits, float_to_half_bits(type, want->data()[e])) << e;
        }
      }
    }
    expect_close(grad_mask.data(), expected.attn_mask.data(), grad_mask.numel());
    expect_close(grad_sinks.data(), expected.sinks.data(), expected.sinks.numel());
    // The overload into new storage, which leaves it unwritten for the kernel: the same gradients,
    // with blocks of all-ones bits (NaN) of the gradients' sizes just freed for malloc to reuse.
    {
      const HalfTensor::Storage recycled_q(gq.size(), uint16_t{0xFFFF}),
          recycled_k(gk.size(), uint16_t{0xFFFF}), recycled_v(gv.size(), uint16_t{0xFFFF});
    }
    const HalfAttentionBackward fresh = scaled_dot_product_attention_backward(
        type, in.q.view(), in.k.view(), in.v.view(), HalfView(out.data(), out_shape),
        grad_out.view(), lse, options, true, true);
    EXPECT_EQ(std::vector<uint16_t>(fresh.query.bits.begin(), fresh.query.bits.end()), gq);
    EXPECT_EQ(std::vector<uint16_t>(fresh.key.bits.begin(), fresh.key.bits.end()), gk);
    EXPECT_EQ(std::vector<uint16_t>(fresh.value.bits.begin(), fresh.value.bits.end()), gv);
    EXPECT_EQ(fresh.value.shape, v_shape);
    EXPECT_TRUE(std::equal(grad_mask.span().begin(), grad_mask.span().end(),
                           fresh.attn_mask.span().begin()));
    EXPECT_TRUE(std::equal(grad_sinks.begin(), grad_sinks.end(), fresh.sinks.span().begin()));
    // The weights of the half pass: the float weights of the widened query and key.
    const Tensor weights = attention_weights(type, in.q.view(), in.k.view(), lse, options);
    const Tensor wide_weights = attention_weights(in.q.widened, in.k.widened, lse, options);
    EXPECT_TRUE(
        std::equal(weights.span().begin(), weights.span().end(), wide_weights.span().begin()));
    // Not all zero: the comparison above means something.
    EXPECT_TRUE(std::any_of(gk.begin(), gk.end(), [](uint16_t bits) { return bits != 0; }));
  }
}

// bf16 values of 2¹²⁰ make the backward's dS pass finite_range's bound: the half overload then
// widens and calls the float backward, which scales its copies for its sums; the gradients are its
// gradients rounded once (the half kernel, reading the bits in place, is not used).
TEST_P(HalfPrecisionSdpa, Bf16BackwardNearFloatsMaximumTakesTheFloatPath) {
  const HalfType type = HalfType::kBFloat16;
  const Shape q_shape{1, 2, 11, 8}, k_shape{1, 2, 40, 8}, out_shape{1, 2, 11, 8};
  Inputs in(type, q_shape, k_shape, k_shape, 81, 0x1p120F);
  std::vector<uint16_t> out(static_cast<size_t>(out_shape.numel()));
  std::vector<float> lse(22);
  scaled_dot_product_attention(type, in.q.view(), in.k.view(), in.v.view(), {},
                               StridedView<uint16_t>(out.data(), out_shape), lse);
  const HalfArray grad_out(type, testing::random_tensor(out_shape, in.rng));
  const HalfAttentionBackward got = scaled_dot_product_attention_backward(
      type, in.q.view(), in.k.view(), in.v.view(), HalfView(out.data(), out_shape), grad_out.view(),
      lse, {}, false, false);
  Tensor wide_out(out_shape);
  for (int64_t e = 0; e < out_shape.numel(); ++e)
    wide_out.data()[e] = half_bits_to_float(type, out[static_cast<size_t>(e)]);
  const AttentionBackward expected = scaled_dot_product_attention_backward(
      in.q.widened, in.k.widened, in.v.widened, wide_out, grad_out.widened, lse, {}, false, false);
  const std::pair<const HalfTensor*, const Tensor*> pairs[] = {
      {&got.query, &expected.query}, {&got.key, &expected.key}, {&got.value, &expected.value}};
  for (const auto& [half, want] : pairs) {
    for (int64_t e = 0; e < want->numel(); ++e) {
      ASSERT_TRUE(std::isfinite(want->data()[e])) << e;
      ASSERT_EQ(half->bits[static_cast<size_t>(e)], float_to_half_bits(type, want->data()[e])) << e;
    }
  }
  EXPECT_TRUE(std::any_of(got.query.bits.begin(), got.query.bits.end(),
                          [](uint16_t bits) { return bits != 0; }));
}

// As the float path (FunctionalSdpa.PrefillReadsOnlyTheKeysSomeQuerySees): is_causal top-left
// with L = 37 < S = 300 reads keys [0, 64) alone, in the forward and backward passes of both
// types (the bf16 vdpbf16ps and AMX paths at d = 64 included); NaN and ±∞ bits in the other rows
// change no bit of the output, the log-sum-exp or the gradients.
TEST_P(HalfPrecisionSdpa, PrefillReadsOnlyTheKeysSomeQuerySees) {
  uint64_t seed = 960;
  for (const HalfType type : kTypes) {
    SCOPED_TRACE(type_name(type));
    const Shape q_shape{2, 4, 37, 64}, k_shape{2, 2, 300, 64}, v_shape{2, 2, 300, 32};
    Inputs in(type, q_shape, k_shape, v_shape, seed++);
    const HalfArray grad_out(type, testing::random_tensor(Shape{2, 4, 37, 32}, in.rng));
    AttentionOptions options;
    options.enable_gqa = true;
    options.causal = true;
    const auto run = [&] {
      HalfAttentionForward forward =
          scaled_dot_product_attention(type, in.q.view(), in.k.view(), in.v.view(), options);
      const HalfView output(forward.output.bits.data(), forward.output.shape);
      HalfAttentionBackward backward =
          scaled_dot_product_attention_backward(type, in.q.view(), in.k.view(), in.v.view(), output,
                                                grad_out.view(), forward.log_sum_exp, options);
      return std::pair{std::move(forward), std::move(backward)};
    };
    const auto [clean, clean_grads] = run();
    const uint16_t exponent = type == HalfType::kFloat16 ? 0x7c00U : 0x7f80U;
    const uint16_t unread[] = {static_cast<uint16_t>(exponent | 1U), exponent,
                               static_cast<uint16_t>(exponent | 0x8000U)};  // NaN, +∞, −∞
    int64_t written = 0;
    for (HalfArray* input : {&in.k, &in.v}) {
      const int64_t cols = input->widened.dim(-1);
      for (size_t e = 0; e < input->bits.size(); ++e) {
        if (static_cast<int64_t>(e) / cols % 300 >= 64) input->bits[e] = unread[written++ % 3];
      }
    }
    const auto [dirty, dirty_grads] = run();
    ASSERT_EQ(dirty.output.bits, clean.output.bits);
    ASSERT_EQ(dirty.log_sum_exp, clean.log_sum_exp);
    ASSERT_EQ(dirty_grads.query.bits, clean_grads.query.bits);
    ASSERT_EQ(dirty_grads.key.bits, clean_grads.key.bits);
    ASSERT_EQ(dirty_grads.value.bits, clean_grads.value.bits);
  }
}

// As the float call: a NaN that the half kernel read, found after the pass, leaves zeros in the
// caller's output and log-sum-exp, and the scanned path names it.
TEST_P(HalfPrecisionSdpa, NonFiniteInputFoundAfterThePassLeavesZeros) {
  uint64_t seed = 961;
  for (const HalfType type : kTypes) {
    SCOPED_TRACE(type_name(type));
    Inputs in(type, Shape{2, 2, 40, 64}, Shape{2, 2, 50, 64}, Shape{2, 2, 50, 32}, seed++);
    const int64_t flat = ((1 * 2 + 1) * 50 + 49) * 64 + 3;  // batch 1, head 1, the last key
    in.k.bits[static_cast<size_t>(flat)] = float_to_half_bits(type, -INFINITY);
    std::vector<uint16_t> out(2 * 2 * 40 * 32, float_to_half_bits(type, 7.0F));
    std::vector<float> log_sum_exp(2 * 2 * 40, 7.0F);
    EXPECT_THROW_MESSAGE(
        scaled_dot_product_attention(type, in.q.view(), in.k.view(), in.v.view(), {},
                                     StridedView<uint16_t>(out.data(), Shape{2, 2, 40, 32}),
                                     log_sum_exp),
        ValueError, "key: expected finite values, got -inf at flat index " + std::to_string(flat));
    for (const uint16_t bits : out) ASSERT_EQ(bits, 0U);
    for (const float x : log_sum_exp) ASSERT_EQ(x, 0.0F);
  }
}

// As the float backward (FunctionalSdpa.NonFiniteGradOutputFoundAfterThePassLeavesZeros): on plain
// rows the half backward runs without scanning its five inputs first, and its gradients are the
// scanned path's bit for bit (a strided query takes that path); an ∞ in grad_output, found after
// the pass, leaves zeros in every gradient (the sinks' too) and the scanned path names it, as it
// names a NaN query.
TEST_P(HalfPrecisionSdpa, NonFiniteGradOutputFoundAfterThePassLeavesZeros) {
  uint64_t seed = 962;
  for (const HalfType type : kTypes) {
    SCOPED_TRACE(type_name(type));
    const Shape q_shape{2, 2, 40, 64}, k_shape{2, 2, 50, 64}, v_shape{2, 2, 50, 32},
        out_shape{2, 2, 40, 32};
    Inputs in(type, q_shape, k_shape, v_shape, seed++);
    HalfArray grad_out(type, testing::random_tensor(out_shape, in.rng));
    AttentionOptions options;
    const float sinks[] = {0.5F, -1.0F};
    options.sinks = sinks;
    const HalfAttentionForward forward =
        scaled_dot_product_attention(type, in.q.view(), in.k.view(), in.v.view(), options);
    const HalfView output(forward.output.bits.data(), forward.output.shape);
    // The same query with its last axis strided: the scanned path (which copies it).
    std::vector<uint16_t> wide(2 * in.q.bits.size());
    for (size_t e = 0; e < in.q.bits.size(); ++e) wide[2 * e] = in.q.bits[e];
    const HalfView strided(wide.data(), q_shape, std::vector<int64_t>{10240, 5120, 128, 2});
    const HalfAttentionBackward scanned = scaled_dot_product_attention_backward(
        type, strided, in.k.view(), in.v.view(), output, grad_out.view(), forward.log_sum_exp,
        options, false, true);
    const HalfAttentionBackward unscanned = scaled_dot_product_attention_backward(
        type, in.q.view(), in.k.view(), in.v.view(), output, grad_out.view(), forward.log_sum_exp,
        options, false, true);
    EXPECT_EQ(unscanned.query.bits, scanned.query.bits);
    EXPECT_EQ(unscanned.key.bits, scanned.key.bits);
    EXPECT_EQ(unscanned.value.bits, scanned.value.bits);
    EXPECT_EQ(unscanned.sinks.values(), scanned.sinks.values());
    EXPECT_TRUE(std::any_of(unscanned.key.bits.begin(), unscanned.key.bits.end(),
                            [](uint16_t bits) { return bits != 0; }));
    // That was the unscanned path: it takes these inputs, and declines the strided query.
    std::vector<uint16_t> direct_q(in.q.bits.size()), direct_k(in.k.bits.size()),
        direct_v(in.v.bits.size());
    std::vector<float> direct_sinks(2, 0.0F);
    const auto direct = [&](const HalfView& query) {
      return functional_detail::backward_without_scans(
          type, query, in.k.view(), in.v.view(), output, grad_out.view(), forward.log_sum_exp,
          options, StridedView<uint16_t>(direct_q.data(), q_shape),
          StridedView<uint16_t>(direct_k.data(), k_shape),
          StridedView<uint16_t>(direct_v.data(), v_shape), {}, direct_sinks);
    };
    EXPECT_TRUE(direct(in.q.view()));
    EXPECT_TRUE(std::equal(direct_k.begin(), direct_k.end(), unscanned.key.bits.begin(),
                           unscanned.key.bits.end()));
    EXPECT_FALSE(direct(strided));
    const int64_t flat = ((1 * 2 + 1) * 40 + 39) * 32 + 5;  // batch 1, head 1, the last query
    grad_out.bits[static_cast<size_t>(flat)] = float_to_half_bits(type, INFINITY);
    const uint16_t seven = float_to_half_bits(type, 7.0F);
    std::vector<uint16_t> grad_q(in.q.bits.size(), seven), grad_k(in.k.bits.size(), seven),
        grad_v(in.v.bits.size(), seven);
    std::vector<float> grad_sinks(2, 7.0F);
    const auto backward = [&](const HalfView& query) {
      scaled_dot_product_attention_backward(
          type, query, in.k.view(), in.v.view(), output, grad_out.view(), forward.log_sum_exp,
          options, StridedView<uint16_t>(grad_q.data(), q_shape),
          StridedView<uint16_t>(grad_k.data(), k_shape),
          StridedView<uint16_t>(grad_v.data(), v_shape), {}, grad_sinks);
    };
    EXPECT_THROW_MESSAGE(
        backward(in.q.view()), ValueError,
        "grad_output: expected finite values, got inf at flat index " + std::to_string(flat));
    for (const std::vector<uint16_t>* gradient : {&grad_q, &grad_k, &grad_v}) {
      for (const uint16_t bits : *gradient) ASSERT_EQ(bits, 0U);
    }
    for (const float x : grad_sinks) ASSERT_EQ(x, 0.0F);
    // A NaN query: the scanned path names it before it would zero the sinks' gradient itself.
    grad_out.bits[static_cast<size_t>(flat)] = float_to_half_bits(type, 0.5F);
    const int64_t query_flat = ((1 * 2 + 1) * 40 + 39) * 64 + 5;
    in.q.bits[static_cast<size_t>(query_flat)] = float_to_half_bits(type, NAN);
    std::fill(grad_sinks.begin(), grad_sinks.end(), 7.0F);
    EXPECT_THROW_MESSAGE(
        backward(in.q.view()), ValueError,
        "query: expected finite values, got NaN at flat index " + std::to_string(query_flat));
    for (const float x : grad_sinks) ASSERT_EQ(x, 0.0F);
  }
}

ATTN_INSTANTIATE_FOR_EVERY_SIMD_TARGET(HalfPrecisionSdpa);

// A training call's residuals (output_residual) on each route of the forward and backward passes:
// the plain kernel call, inputs with a strided last axis (the scanned path's copies), decoding
// shapes (which then take the prefill kernel), bf16 values near float's maximum (the float path
// on widened copies), and an output over the query's memory (computed apart). Where the kernel
// widens, the output's bits are those of a call without residuals, each residual is that of the
// float path's output (output_residual), and the gradients are the float backward's on the
// widened inputs and the output before its rounding (output_with_residual), rounded once.
TEST_P(HalfPrecisionSdpa, ResidualsReachTheBackwardOnEveryRoute) {
  struct Route {
    const char* name;
    Shape q, k, v;
    float value_scale;
    bool strided_key, output_over_query;
  };
  const Route routes[] = {
      {"plain", Shape{2, 4, 37, 16}, Shape{2, 2, 45, 16}, Shape{2, 2, 45, 16}, 1.0F, false, false},
      {"strided key", Shape{1, 2, 19, 8}, Shape{1, 2, 8, 30}, Shape{1, 2, 30, 8}, 1.0F, true,
       false},
      {"decoding shape", Shape{2, 4, 1, 64}, Shape{2, 2, 300, 64}, Shape{2, 2, 300, 64}, 1.0F,
       false, false},
      {"near float's maximum", Shape{1, 2, 11, 8}, Shape{1, 2, 40, 8}, Shape{1, 2, 40, 8}, 0x1p120F,
       false, false},
      {"output over the query", Shape{1, 2, 21, 8}, Shape{1, 2, 30, 8}, Shape{1, 2, 30, 8}, 1.0F,
       false, true},
  };
  uint64_t seed = 700;
  for (const HalfType type : kTypes) {
    for (const Route& route : routes) {
      if (route.value_scale > 1.0F && type == HalfType::kFloat16) continue;  // fp16 ends at 65504
      SCOPED_TRACE(std::string(type_name(type)) + ", " + route.name);
      Inputs in(type, route.q, route.k, route.v, seed++, route.value_scale);
      // The strided key: its (…, 30, 8) view of (…, 8, 30) storage, last axis 30 apart.
      const Shape strided_shape{1, 2, 30, 8};
      const std::vector<int64_t> strides{480, 240, 1, 30};
      const HalfView key = route.strided_key ? in.k.view(strided_shape, strides) : in.k.view();
      const ConstStridedView wide_key =
          route.strided_key ? in.k.wide(strided_shape, strides) : ConstStridedView(in.k.widened);
      const Shape key_shape = key.shape();
      AttentionOptions options;
      options.enable_gqa = route.q.dim(1) != key_shape.dim(1);
      options.causal = !route.strided_key;
      const Shape out_shape = with_last(route.q, route.v.dim(-1));
      const auto count = static_cast<size_t>(out_shape.numel());
      const HalfAttentionForward plain =
          scaled_dot_product_attention(type, in.q.view(), key, in.v.view(), options);
      // The output over the query: a copy of the query's bits, the output written over it.
      std::vector<uint16_t> query_bits = in.q.bits;
      const HalfView query =
          route.output_over_query ? HalfView(query_bits.data(), route.q) : in.q.view();
      std::vector<uint16_t> out_bits(count), residual_bits(count, 0xffffU);
      uint16_t* out = route.output_over_query ? query_bits.data() : out_bits.data();
      std::vector<float> lse(plain.log_sum_exp.size());
      scaled_dot_product_attention(type, query, key, in.v.view(), options,
                                   StridedView<uint16_t>(out, out_shape), lse,
                                   StridedView<uint16_t>(residual_bits.data(), out_shape));
      // The same output and log-sum-exp, bit for bit, on every route (decoding shapes included:
      // the decode kernel writes residuals too).
      ASSERT_EQ(std::vector<uint16_t>(out, out + count),
                std::vector<uint16_t>(plain.output.bits.begin(), plain.output.bits.end()));
      EXPECT_EQ(lse, plain.log_sum_exp);
      const bool widened = widened_kernel(type, route.q.dim(-1));
      const HalfAttentionForward fresh =
          scaled_dot_product_attention(type, in.q.view(), key, in.v.view(), options, true);
      EXPECT_EQ(fresh.output_residual.shape, out_shape);
      EXPECT_EQ(std::vector<uint16_t>(fresh.output_residual.bits.begin(),
                                      fresh.output_residual.bits.end()),
                residual_bits);
      EXPECT_TRUE(plain.output_residual.bits.empty());
      if (!widened) continue;  // P rounded to bf16: no float path to match
      const AttentionForward wide =
          scaled_dot_product_attention(in.q.widened, wide_key, in.v.widened, options);
      Tensor exact_out(out_shape);
      for (size_t e = 0; e < count; ++e) {
        exact_out.data()[e] = output_with_residual(type, out[e], residual_bits[e]);
        ASSERT_EQ(residual_bits[e], output_residual(type, wide.output.data()[e], out[e]))
            << "residual " << e;
      }
      const HalfArray grad_out(type, testing::random_tensor(out_shape, in.rng));
      const HalfAttentionBackward got = scaled_dot_product_attention_backward(
          type, in.q.view(), key, in.v.view(), HalfView(out, out_shape), grad_out.view(), lse,
          options, false, false, HalfView(residual_bits.data(), out_shape));
      const AttentionBackward want =
          scaled_dot_product_attention_backward(in.q.widened, wide_key, in.v.widened, exact_out,
                                                grad_out.widened, lse, options, false, false);
      const std::pair<const HalfTensor*, const Tensor*> pairs[] = {
          {&got.query, &want.query}, {&got.key, &want.key}, {&got.value, &want.value}};
      for (const auto& [half, expected] : pairs) {
        for (int64_t e = 0; e < expected->numel(); ++e) {
          ASSERT_EQ(half->bits[static_cast<size_t>(e)],
                    float_to_half_bits(type, expected->data()[e]))
              << "gradient element " << e;
        }
      }
    }
  }
}

TEST(HalfPrecisionSdpaArguments, NamesWhatIsWrongWithResiduals) {
  for (const HalfType type : kTypes) {
    SCOPED_TRACE(type_name(type));
    Rng rng(3);
    const HalfArray q(type, testing::random_tensor(Shape{1, 2, 20, 8}, rng));
    const HalfArray k(type, testing::random_tensor(Shape{1, 2, 24, 8}, rng));
    const Shape out_shape{1, 2, 20, 8};
    std::vector<uint16_t> out(320), residual(320);
    std::vector<float> lse(40);
    const StridedView<uint16_t> output(out.data(), out_shape);
    EXPECT_THROW_MESSAGE(
        scaled_dot_product_attention(type, q.view(), k.view(), k.view(), {}, output, lse,
                                     StridedView<uint16_t>(residual.data(), Shape{1, 2, 8, 20})),
        ShapeError,
        "output_residual: expected shape (1, 2, 20, 8) (that of output), got (1, 2, 8, 20)");
    EXPECT_THROW_MESSAGE(
        scaled_dot_product_attention(type, q.view(), k.view(), k.view(), {}, output, lse,
                                     StridedView<uint16_t>(out.data() + 8, out_shape)),
        ValueError,
        "output_residual: expected memory of its own, apart from the inputs, the "
        "output and the log-sum-exp");
    EXPECT_THROW_MESSAGE(
        scaled_dot_product_attention(
            type, q.view(), k.view(), k.view(), {}, output, lse,
            StridedView<uint16_t>(residual.data(), out_shape, std::vector<int64_t>{320, 0, 8, 1})),
        ValueError, "output_residual: expected a view whose elements are each their own memory");
    scaled_dot_product_attention(type, q.view(), k.view(), k.view(), {}, output, lse,
                                 StridedView<uint16_t>(residual.data(), out_shape));
    std::vector<uint16_t> gq(320), gk(384), gv(384);
    const auto backward = [&](const HalfView& given_residual) {
      scaled_dot_product_attention_backward(
          type, q.view(), k.view(), k.view(), HalfView(out.data(), out_shape),
          HalfView(out.data(), out_shape), lse, {},
          StridedView<uint16_t>(gq.data(), q.view().shape()),
          StridedView<uint16_t>(gk.data(), k.view().shape()),
          StridedView<uint16_t>(gv.data(), k.view().shape()), {}, {}, given_residual);
    };
    EXPECT_THROW_MESSAGE(backward(HalfView(residual.data(), Shape{1, 2, 20, 4})), ShapeError,
                         "output_residual: expected shape (1, 2, 20, 8) (that of output), got "
                         "(1, 2, 20, 4)");
    residual[17] = float_to_half_bits(type, NAN);
    EXPECT_THROW_MESSAGE(backward(HalfView(residual.data(), out_shape)), ValueError,
                         "output_residual: expected finite values, got NaN at flat index 17");
    // Strides whose rows overlap (a row stride of 1 below the row's 8 elements): the kernel's
    // threads would race on shared elements.
    EXPECT_THROW_MESSAGE(
        scaled_dot_product_attention(
            type, q.view(), k.view(), k.view(), {}, output, lse,
            StridedView<uint16_t>(residual.data(), out_shape, std::vector<int64_t>{160, 80, 1, 1})),
        ValueError,
        "output_residual: expected a view whose elements are each their own memory, got strides "
        "(160, 80, 1, 1) for shape (1, 2, 20, 8): axis 3's stride reaches elements of the axes "
        "below it");
    EXPECT_THROW_MESSAGE(
        scaled_dot_product_attention(
            type, q.view(), k.view(), k.view(), {},
            StridedView<uint16_t>(out.data(), out_shape, std::vector<int64_t>{160, 20, 8, 1})),
        ValueError,
        "output: expected a view whose elements are each their own memory, got "
        "strides (160, 20, 8, 1)");
  }
}

// A gradient written over the forward's residuals, which the backward reads: computed apart, as
// over any other input (160 of 640 dQ elements came out wrong when the residual was not counted
// among the backward's reads), here grad_query in (B, L, H, E) order over the residual's buffer.
TEST(HalfPrecisionSdpaArguments, GradientsOverTheResidualsAreComputedApart) {
  for (const HalfType type : kTypes) {
    SCOPED_TRACE(type_name(type));
    Rng rng(5);
    const Shape shape{2, 4, 20, 8};
    const HalfArray q(type, testing::random_tensor(shape, rng));
    const HalfArray k(type, testing::random_tensor(shape, rng));
    const HalfArray v(type, testing::random_tensor(shape, rng));
    const HalfArray grad_out(type, testing::random_tensor(shape, rng));
    const HalfAttentionForward forward =
        scaled_dot_product_attention(type, q.view(), k.view(), v.view(), {}, true);
    const HalfView output(forward.output.bits.data(), shape);
    const HalfAttentionBackward want = scaled_dot_product_attention_backward(
        type, q.view(), k.view(), v.view(), output, grad_out.view(), forward.log_sum_exp, {}, false,
        false, HalfView(forward.output_residual.bits.data(), shape));
    std::vector<uint16_t> residual(forward.output_residual.bits.begin(),
                                   forward.output_residual.bits.end());
    std::vector<uint16_t> gk(residual.size()), gv(residual.size());
    // (B, H, L, E) addressed in (B, L, H, E) order: strides (L·H·E, E, H·E, 1).
    const StridedView<uint16_t> grad_query(residual.data(), shape,
                                           std::vector<int64_t>{640, 8, 32, 1});
    scaled_dot_product_attention_backward(
        type, q.view(), k.view(), v.view(), output, grad_out.view(), forward.log_sum_exp, {},
        grad_query, StridedView<uint16_t>(gk.data(), shape),
        StridedView<uint16_t>(gv.data(), shape), {}, {}, HalfView(residual.data(), shape));
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < 4; ++h)
        for (int64_t i = 0; i < 20; ++i)
          for (int64_t t = 0; t < 8; ++t) {
            const int64_t flat = ((b * 4 + h) * 20 + i) * 8 + t;
            ASSERT_EQ(residual[static_cast<size_t>(b * 640 + i * 32 + h * 8 + t)],
                      want.query.bits[static_cast<size_t>(flat)])
                << "dQ element " << flat;
          }
    EXPECT_EQ(gk, std::vector<uint16_t>(want.key.bits.begin(), want.key.bits.end()));
    EXPECT_EQ(gv, std::vector<uint16_t>(want.value.bits.begin(), want.value.bits.end()));
  }
}

TEST(HalfPrecisionSdpaArguments, NamesWhatIsWrong) {
  for (const HalfType type : kTypes) {
    SCOPED_TRACE(type_name(type));
    const Tensor zeros_q(Shape{2, 2, 3, 8}), zeros_k(Shape{2, 2, 5, 8}), zeros_v(Shape{2, 2, 5, 6});
    HalfArray q(type, zeros_q), k(type, zeros_k), v(type, zeros_v);
    std::vector<uint16_t> out(2 * 2 * 3 * 6);
    const StridedView<uint16_t> output(out.data(), Shape{2, 2, 3, 6});
    k.bits[5] = float_to_half_bits(type, NAN);
    EXPECT_THROW_MESSAGE(
        scaled_dot_product_attention(type, q.view(), k.view(), v.view(), {}, output), ValueError,
        "key: expected finite values, got NaN at flat index 5");
    k.bits[5] = 0;
    v.bits[3] = float_to_half_bits(type, -INFINITY);
    EXPECT_THROW_MESSAGE(
        scaled_dot_product_attention(type, q.view(), k.view(), v.view(), {}, output), ValueError,
        "value: expected finite values, got -inf at flat index 3");
    v.bits[3] = 0;
    q.bits[7] = float_to_half_bits(type, INFINITY);
    EXPECT_THROW_MESSAGE(
        scaled_dot_product_attention(type, q.view(), k.view(), v.view(), {}, output), ValueError,
        "query: expected finite values, got inf at flat index 7");
    q.bits[7] = 0;
    // Shapes before values, as the float overload checks them.
    const HalfArray k7(type, Tensor(Shape{2, 2, 5, 7}));
    EXPECT_THROW_MESSAGE(
        scaled_dot_product_attention(type, q.view(), k7.view(), v.view(), {}, output), ShapeError,
        "key: expected the last axis 8 (that of query), got shape (2, 2, 5, 7)");
    EXPECT_THROW_MESSAGE(
        scaled_dot_product_attention(type, q.view(), k.view(), v.view(), {},
                                     StridedView<uint16_t>(out.data(), Shape{2, 2, 6, 3})),
        ShapeError, "output: expected shape (2, 2, 3, 6)");
    std::vector<float> short_lse(3);
    EXPECT_THROW_MESSAGE(
        scaled_dot_product_attention(type, q.view(), k.view(), v.view(), {}, output, short_lse),
        ShapeError, "log_sum_exp: expected 12 values (one per query row), got 3");
    std::vector<uint16_t> gq(q.bits.size()), gk(k.bits.size()), gv(v.bits.size());
    std::vector<float> lse(12);
    EXPECT_THROW_MESSAGE(
        scaled_dot_product_attention_backward(type, q.view(), k.view(), v.view(), output, output,
                                              lse, {},
                                              StridedView<uint16_t>(gq.data(), Shape{2, 2, 8, 3}),
                                              StridedView<uint16_t>(gk.data(), Shape{2, 2, 5, 8}),
                                              StridedView<uint16_t>(gv.data(), Shape{2, 2, 5, 6})),
        ShapeError,
        "grad_query: expected shape (2, 2, 3, 8) (the shape of its input), got (2, 2, 8, 3)");
    EXPECT_THROW_MESSAGE(
        scaled_dot_product_attention_backward(type, q.view(), k.view(), v.view(), output, output,
                                              lse, {}, true, false),
        ValueError,
        "mask_gradient: expected a float attn_mask to differentiate, got no "
        "attn_mask");
    out[4] = float_to_half_bits(type, NAN);
    EXPECT_THROW_MESSAGE(
        scaled_dot_product_attention_backward(type, q.view(), k.view(), v.view(), output,
                                              HalfView(out.data(), Shape{2, 2, 3, 6}), lse, {},
                                              StridedView<uint16_t>(gq.data(), Shape{2, 2, 3, 8}),
                                              StridedView<uint16_t>(gk.data(), Shape{2, 2, 5, 8}),
                                              StridedView<uint16_t>(gv.data(), Shape{2, 2, 5, 6})),
        ValueError, "finite values, got NaN at flat index 4");
    out[4] = 0;
    AttentionOptions base_two;
    base_two.log_sum_exp_recomputed_base_two = true;
    EXPECT_THROW_MESSAGE(
        scaled_dot_product_attention_backward(type, q.view(), k.view(), v.view(), output, output,
                                              lse, base_two),
        ValueError,
        "options.log_sum_exp_recomputed_base_two: expected false in a half-precision backward "
        "pass (a base-2 log-sum-exp is the float pass's), got true");
  }
}

}  // namespace
}  // namespace attn
