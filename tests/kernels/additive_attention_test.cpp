// The fused additive-attention forward kernel against the double reference on every SIMD target:
// tails, n = 1, m = 1, lengths 0 and m, per-query lengths, causal, scores near tanh's saturation,
// and with dropout against the reference given the reported multipliers.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include "attn/core/error.hpp"
#include "attn/kernels/additive_attention.hpp"
#include "attn/nn/additive_attention.hpp"
#include "every_simd_target.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

using testing::close_to;
using testing::random_tensor;
using testing::to_doubles;

// The kernels' tanh is within 3.5e-7 relative (a few ulps); each score sums h ≤ 40 such terms and
// each output is a convex combination of values: 1e-5 relative to the output's magnitude holds with
// margin.
constexpr double kTolerance = 1e-5;

class AdditiveAttentionKernel : public testing::EverySimdTarget {};

std::vector<double> identity(int64_t size) {
  std::vector<double> matrix(static_cast<size_t>(size * size));
  for (int64_t i = 0; i < size; ++i) matrix[static_cast<size_t>(i * size + i)] = 1.0;
  return matrix;
}

struct Case {
  int64_t batch, queries, keys, hidden, value_depth;
  int mask_kind;  // 0 none, 1 per batch, 2 per query
  bool causal;
  float magnitude, dropout;
};

TEST_P(AdditiveAttentionKernel, MatchesReference) {
  Rng rng(17);
  const Case cases[] = {{1, 1, 1, 1, 1, 0, false, 1.0F, 0.0F},
                        {2, 1, 5, 3, 2, 1, false, 1.0F, 0.0F},
                        {1, 7, 1, 8, 4, 2, false, 1.0F, 0.0F},
                        {3, 37, 45, 16, 5, 1, false, 1.0F, 0.0F},
                        {2, 70, 150, 40, 8, 2, false, 3.0F, 0.0F},
                        {2, 20, 90, 8, 8, 2, true, 1.0F, 0.0F},
                        {2, 33, 140, 12, 6, 1, false, 1.0F, 0.3F},
                        // Inputs up to 20.9: the exponential form near its limit (e^{2(a+b)} near
                        // e^{±84}); 30: past kAdditiveExponentialLimit, the direct tanh form.
                        {2, 37, 131, 19, 7, 2, false, 20.9F, 0.0F},
                        {2, 20, 90, 8, 5, 2, true, 30.0F, 0.0F}};
  for (const Case& c : cases) {
    const Tensor a = random_tensor(Shape{c.batch, c.queries, c.hidden}, rng, c.magnitude);
    const Tensor b = random_tensor(Shape{c.batch, c.keys, c.hidden}, rng, c.magnitude);
    const Tensor v = random_tensor(Shape{c.batch, c.keys, c.value_depth}, rng);
    const Tensor w = random_tensor(Shape{c.hidden}, rng);
    ValidLengths mask;
    if (c.mask_kind == 1) {
      std::vector<int64_t> lengths;
      for (int64_t batch = 0; batch < c.batch; ++batch)
        lengths.push_back(batch == 0 ? c.keys : batch == 1 ? 0 : 3);
      mask = ValidLengths::per_batch(lengths);
    } else if (c.mask_kind == 2) {
      std::vector<int64_t> lengths;
      for (int64_t index = 0; index < c.batch * c.queries; ++index)
        lengths.push_back(index % (c.keys + 1));
      mask = ValidLengths::per_query(lengths, c.batch, c.queries);
    }
    const FlashAttentionOptions options = testing::kernel_options(1.0F, c.causal, c.dropout, 99);
    Tensor out(Shape{c.batch, c.queries, c.value_depth});
    additive_attention_forward(single_head(a, "a"), single_head(b, "b"), w.span(),
                               single_head(v, "v"), mask, options, single_head(out, "out"));
    const ValidLengths effective =
        c.causal ? mask.with_causal_mask(c.batch, c.queries, c.keys) : mask;
    const std::vector<double> multipliers =
        c.dropout > 0.0F
            ? to_doubles(flash_attention_dropout_mask(options, c.batch, c.queries, c.keys))
            : std::vector<double>{};
    const auto expected = reference::additive_attention(
        testing::to_reference(a), testing::to_reference(b), testing::to_reference(v),
        testing::expand(effective, c.batch, c.queries, c.keys), identity(c.hidden),
        identity(c.hidden), to_doubles(w), multipliers);
    EXPECT_TRUE(close_to(out, expected.output.values, kTolerance))
        << hwy::TargetName(GetParam()) << " B=" << c.batch << " n=" << c.queries << " m=" << c.keys
        << " h=" << c.hidden << " causal=" << c.causal << " dropout=" << c.dropout;
  }
}

TEST_P(AdditiveAttentionKernel, ChecksTheWeightCount) {
  const Tensor a(Shape{1, 2, 4}), b(Shape{1, 3, 4}), v(Shape{1, 3, 2}), w(Shape{3});
  Tensor out(Shape{1, 2, 2});
  EXPECT_THROW_MESSAGE(
      additive_attention_forward(single_head(a, "a"), single_head(b, "b"), w.span(),
                                 single_head(v, "v"), {}, {}, single_head(out, "out")),
      ShapeError, "w_v: expected 4 weights (the hidden size), got 3");
}

TEST(AdditiveAttentionLayer, FusedAndReferencePathsAgree) {
  Rng rng(18);
  const Tensor q = random_tensor(Shape{2, 30, 7}, rng), k = random_tensor(Shape{2, 140, 5}, rng);
  const Tensor v = random_tensor(Shape{2, 140, 3}, rng), g = random_tensor(Shape{2, 30, 3}, rng);
  const ValidLengths mask = ValidLengths::per_batch({0, 99});
  AdditiveAttention fused(5, 7, 16, 0.0F, 4), reference(5, 7, 16, 0.0F, 4);
  reference.set_path(AttentionPath::kReference);
  EXPECT_TRUE(close_to(fused(q, k, v, mask), to_doubles(reference(q, k, v, mask)), kTolerance));
  // The kernel's recomputed probabilities: the reference path's float32 softmax up to rounding.
  EXPECT_TRUE(close_to(fused.attention_weights(), to_doubles(reference.attention_weights()), 1e-6));
  // The fused backward pass matches the reference path's within rounding.
  const AttentionGradients fused_grads = fused.backward(g), reference_grads = reference.backward(g);
  EXPECT_TRUE(close_to(fused_grads.queries, to_doubles(reference_grads.queries), kTolerance));
  EXPECT_TRUE(close_to(fused_grads.keys, to_doubles(reference_grads.keys), kTolerance));
}

ATTN_INSTANTIATE_FOR_EVERY_SIMD_TARGET(AdditiveAttentionKernel);

}  // namespace
}  // namespace attn
