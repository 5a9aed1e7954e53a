// Float attention masks stored as bfloat16 or float16 bits (AttentionMask::additive(type, ...)),
// which the kernels read in place and widen exactly: on every SIMD target each call gives the
// bits of the same call with the mask's values as float32 — fp32 and half inputs, prefill and
// decoding shapes, broadcast and strided masks, masks of intervals, the backward pass and the
// mask's gradient — and NaN or +∞ entries are refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/core/half.hpp"
#include "attn/core/random.hpp"
#include "attn/functional/scaled_dot_product_attention.hpp"
#include "every_simd_target.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

using HalfView = StridedView<const uint16_t>;
constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();

// Values rounded to `type`: their bits, and the same values as floats (exact).
struct HalfValues {
  HalfValues(HalfType type, const Tensor& values) : widened(values.shape()) {
    bits.resize(static_cast<size_t>(values.numel()));
    for (int64_t e = 0; e < values.numel(); ++e) {
      bits[static_cast<size_t>(e)] = float_to_half_bits(type, values.data()[e]);
      widened.data()[e] = half_bits_to_float(type, bits[static_cast<size_t>(e)]);
    }
  }
  HalfView view() const { return HalfView(bits.data(), widened.shape()); }

  std::vector<uint16_t> bits;
  Tensor widened;
};

// A mask of `shape` for `type`: random biases of a few units, some keys hidden (−∞), and where
// the type reaches it an entry below −2^127 (float's lowest, as transformers' masks hold, which
// the kernels add as −2^127).
HalfValues random_mask(HalfType type, const Shape& shape, Rng& rng) {
  Tensor values = testing::random_tensor(shape, rng, 3.0F);
  for (int64_t e = 0; e < values.numel(); e += 7) values.data()[e] = kMinusInfinity;
  if (type == HalfType::kBFloat16 && values.numel() > 3) {
    values.data()[3] = std::numeric_limits<float>::lowest();
  }
  return HalfValues(type, values);
}

AttentionOptions with_mask(AttentionOptions options, const AttentionMask& mask) {
  options.attn_mask = mask;
  return options;
}

void expect_same_bits(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  for (int64_t e = 0; e < actual.numel(); ++e) {
    ASSERT_EQ(std::bit_cast<uint32_t>(actual.data()[e]),
              std::bit_cast<uint32_t>(expected.data()[e]))
        << what << ": element " << e << " is " << actual.data()[e] << ", expected "
        << expected.data()[e];
  }
}

void expect_same_bits(const std::vector<float>& actual, const std::vector<float>& expected,
                      const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t e = 0; e < actual.size(); ++e) {
    ASSERT_EQ(std::bit_cast<uint32_t>(actual[e]), std::bit_cast<uint32_t>(expected[e]))
        << what << ": log-sum-exp " << e;
  }
}

// fp32 inputs: forward (output, log-sum-exp) and backward (every gradient, the mask's included)
// with the half mask against the same call with its float32 values.
void expect_float_inputs_match(HalfType type, const Shape& q_shape, const Shape& k_shape,
                               const StridedView<const float>& float_view,
                               const HalfView& half_view, const AttentionOptions& base, Rng& rng,
                               const std::string& what) {
  SCOPED_TRACE(what);
  const Tensor q = testing::random_tensor(q_shape, rng);
  const Tensor k = testing::random_tensor(k_shape, rng);
  const Tensor v = testing::random_tensor(k_shape, rng);
  const AttentionOptions as_float = with_mask(base, AttentionMask::additive(float_view));
  const AttentionOptions as_half = with_mask(base, AttentionMask::additive(type, half_view));
  const AttentionForward expected = scaled_dot_product_attention(q, k, v, as_float);
  const AttentionForward actual = scaled_dot_product_attention(q, k, v, as_half);
  expect_same_bits(actual.output, expected.output, "output");
  expect_same_bits(actual.log_sum_exp, expected.log_sum_exp, "log-sum-exp");
  const Tensor grad_out = testing::random_tensor(expected.output.shape(), rng);
  const AttentionBackward expected_grads = scaled_dot_product_attention_backward(
      q, k, v, expected.output, grad_out, expected.log_sum_exp, as_float, true);
  const AttentionBackward actual_grads = scaled_dot_product_attention_backward(
      q, k, v, actual.output, grad_out, actual.log_sum_exp, as_half, true);
  expect_same_bits(actual_grads.query, expected_grads.query, "d query");
  expect_same_bits(actual_grads.key, expected_grads.key, "d key");
  expect_same_bits(actual_grads.value, expected_grads.value, "d value");
  expect_same_bits(actual_grads.attn_mask, expected_grads.attn_mask, "d attn_mask");
}

// Half inputs of `type` (the dtype PyTorch requires of the mask then): the forward pass.
void expect_half_inputs_match(HalfType type, const Shape& q_shape, const Shape& k_shape,
                              const HalfValues& mask, const AttentionOptions& base, Rng& rng,
                              const std::string& what) {
  SCOPED_TRACE(what);
  const HalfValues q(type, testing::random_tensor(q_shape, rng));
  const HalfValues k(type, testing::random_tensor(k_shape, rng));
  const HalfValues v(type, testing::random_tensor(k_shape, rng));
  const AttentionOptions as_float =
      with_mask(base, AttentionMask::additive(StridedView<const float>(mask.widened)));
  const AttentionOptions as_half = with_mask(base, AttentionMask::additive(type, mask.view()));
  const HalfAttentionForward expected =
      scaled_dot_product_attention(type, q.view(), k.view(), v.view(), as_float);
  const HalfAttentionForward actual =
      scaled_dot_product_attention(type, q.view(), k.view(), v.view(), as_half);
  ASSERT_EQ(actual.output.bits.size(), expected.output.bits.size());
  for (size_t e = 0; e < actual.output.bits.size(); ++e)
    ASSERT_EQ(actual.output.bits[e], expected.output.bits[e]) << "output element " << e;
  expect_same_bits(actual.log_sum_exp, expected.log_sum_exp, "log-sum-exp");
}

constexpr HalfType kTypes[] = {HalfType::kBFloat16, HalfType::kFloat16};

std::string type_name(HalfType type) {
  return type == HalfType::kBFloat16 ? "bf16" : "fp16";
}

class HalfMasks : public testing::EverySimdTarget {};

TEST_P(HalfMasks, PrefillGivesTheFloatMasksBits) {
  Rng rng(11);
  for (const HalfType type : kTypes) {
    // (L, S) broadcast over batch and heads, (B, H, L, S) whole, (B, 1, 1, S) broadcast over the
    // queries; tails that divide no tile (37 queries, 70 keys).
    for (const Shape& mask_shape : {Shape{37, 70}, Shape{2, 3, 37, 70}, Shape{2, 1, 1, 70}}) {
      const HalfValues mask = random_mask(type, mask_shape, rng);
      const std::string what = type_name(type) + " mask " + mask_shape.str();
      expect_float_inputs_match(type, Shape{2, 3, 37, 16}, Shape{2, 3, 70, 16},
                                StridedView<const float>(mask.widened), mask.view(), {}, rng,
                                what + ", fp32 inputs");
      AttentionOptions causal;
      causal.causal = true;
      expect_float_inputs_match(type, Shape{2, 3, 37, 16}, Shape{2, 3, 70, 16},
                                StridedView<const float>(mask.widened), mask.view(), causal, rng,
                                what + ", fp32 inputs, causal");
      expect_half_inputs_match(type, Shape{2, 3, 37, 16}, Shape{2, 3, 70, 16}, mask, {}, rng,
                               what + ", half inputs");
      expect_half_inputs_match(type, Shape{2, 3, 37, 80}, Shape{2, 3, 70, 80}, mask, {}, rng,
                               what + ", half inputs, d = 80");
    }
  }
}

TEST_P(HalfMasks, StridedAndTransposedMasksGiveTheFloatMasksBits) {
  Rng rng(12);
  for (const HalfType type : kTypes) {
    // An (S, L) buffer read as its transpose (L, S): each key's entries side by side.
    const HalfValues buffer = random_mask(type, Shape{70, 37}, rng);
    const int64_t strides[] = {1, 37};
    const StridedView<const float> float_view(buffer.widened.data(), Shape{37, 70}, strides);
    const HalfView half_view(buffer.bits.data(), Shape{37, 70}, strides);
    expect_float_inputs_match(type, Shape{2, 3, 37, 16}, Shape{2, 3, 70, 16}, float_view, half_view,
                              {}, rng, type_name(type) + " transposed mask");
    // Every other key of a (37, 140) buffer.
    const HalfValues wide = random_mask(type, Shape{37, 140}, rng);
    const int64_t skip[] = {140, 2};
    expect_float_inputs_match(type, Shape{2, 3, 37, 16}, Shape{2, 3, 70, 16},
                              StridedView<const float>(wide.widened.data(), Shape{37, 70}, skip),
                              HalfView(wide.bits.data(), Shape{37, 70}, skip), {}, rng,
                              type_name(type) + " mask of every other key");
  }
}

TEST_P(HalfMasks, DecodingShapesGiveTheFloatMasksBits) {
  Rng rng(13);
  for (const HalfType type : kTypes) {
    for (const int64_t n : {1, 3, 16}) {
      AttentionOptions grouped;
      grouped.enable_gqa = true;
      const HalfValues mask = random_mask(type, Shape{2, 1, n, 300}, rng);
      const std::string what = type_name(type) + " decoding n = " + std::to_string(n);
      expect_float_inputs_match(type, Shape{2, 8, n, 32}, Shape{2, 2, 300, 32},
                                StridedView<const float>(mask.widened), mask.view(), grouped, rng,
                                what + ", fp32 inputs");
      expect_half_inputs_match(type, Shape{2, 8, n, 32}, Shape{2, 2, 300, 32}, mask, grouped, rng,
                               what + ", half inputs");
    }
  }
}

TEST_P(HalfMasks, MasksOfIntervalsGiveTheFloatMasksBits) {
  // 0 and −∞ only: each row one interval of keys (left padding, then a causal edge), which the
  // functional API turns into key ranges whatever the entries' format.
  Rng rng(14);
  for (const HalfType type : kTypes) {
    for (const int64_t n : {1, 37}) {
      Tensor values(Shape{2, 1, n, 70});
      for (int64_t b = 0; b < 2; ++b) {
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t j = 0; j < 70; ++j) {
            const bool visible = j >= 5 * (b + 1) && j <= 70 - n + i;
            values.data()[(b * n + i) * 70 + j] = visible ? 0.0F : kMinusInfinity;
          }
        }
      }
      const HalfValues mask(type, values);
      const std::string what = type_name(type) + " intervals, n = " + std::to_string(n);
      expect_float_inputs_match(type, Shape{2, 4, n, 16}, Shape{2, 4, 70, 16},
                                StridedView<const float>(mask.widened), mask.view(), {}, rng, what);
      expect_half_inputs_match(type, Shape{2, 4, n, 16}, Shape{2, 4, 70, 16}, mask, {}, rng,
                               what + ", half inputs");
    }
  }
}

ATTN_INSTANTIATE_FOR_EVERY_SIMD_TARGET(HalfMasks);

TEST(HalfMaskValues, NaNAndPlusInfinityAreRefusedByName) {
  Rng rng(15);
  const Tensor q = testing::random_tensor(Shape{1, 2, 4, 8}, rng);
  for (const HalfType type : kTypes) {
    const uint16_t exponent = type == HalfType::kFloat16 ? 0x7c00U : 0x7f80U;
    struct Case {
      uint16_t bits;
      const char* named;
    };
    const Case cases[] = {{exponent, "inf"},
                          {static_cast<uint16_t>(exponent | 1U), "NaN"},
                          {static_cast<uint16_t>(0x8000U | exponent | 1U), "NaN"}};
    for (const Case& c : cases) {
      std::vector<uint16_t> bits(16, 0);
      bits[6] = c.bits;
      AttentionOptions options;
      options.attn_mask = AttentionMask::additive(type, HalfView(bits.data(), Shape{4, 4}));
      try {
        (void)scaled_dot_product_attention(q, q, q, options);
        FAIL() << type_name(type) << " bits " << c.bits << " were accepted";
      } catch (const ValueError& error) {
        const std::string message = error.what();
        EXPECT_NE(message.find("attn_mask: expected finite values or -inf, got " +
                               std::string(c.named) + " at flat index 6"),
                  std::string::npos)
            << message;
      }
    }
    // −∞ hides a key: accepted.
    std::vector<uint16_t> hidden(16, 0);
    hidden[6] = static_cast<uint16_t>(0x8000U | exponent);
    AttentionOptions options;
    options.attn_mask = AttentionMask::additive(type, HalfView(hidden.data(), Shape{4, 4}));
    EXPECT_NO_THROW((void)scaled_dot_product_attention(q, q, q, options));
    // fp16's largest and bf16's 2^127 are taken, bf16 past 2^127 refused (as float32 masks: it
    // overflows the base-2 scores), contiguous and strided; float's lowest adds −2^127.
    for (const bool strided : {false, true}) {
      std::vector<uint16_t> large(16, 0);
      const Shape shape{4, 4};
      const std::vector<int64_t> strides =
          strided ? std::vector<int64_t>{1, 4} : std::vector<int64_t>{4, 1};
      large[6] = type == HalfType::kFloat16 ? 0x7bffU : 0x7f00U;
      large[9] = type == HalfType::kFloat16 ? 0xfbffU : 0xff7fU;
      options.attn_mask = AttentionMask::additive(type, HalfView(large.data(), shape, strides));
      EXPECT_NO_THROW((void)scaled_dot_product_attention(q, q, q, options));
      if (type == HalfType::kFloat16) continue;
      large[6] = 0x7f01U;  // the bf16 after 2^127
      EXPECT_THROW_MESSAGE((void)scaled_dot_product_attention(q, q, q, options), ValueError,
                           "attn_mask: expected entries of at most 2^127 (1.7e38: attn adds them "
                           "to the scores in base 2, where larger ones overflow), got " +
                               number_text(bfloat16_to_float(0x7f01U)) + " at flat index " +
                               (strided ? "9" : "6"));
    }
  }
}

}  // namespace
}  // namespace attn
