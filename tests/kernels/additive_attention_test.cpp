// The fused additive-attention forward kernel against the double reference on every SIMD target:
// tails, n = 1, m = 1, lengths 0 and m, per-query lengths, causal, scores near tanh's saturation,
// and with dropout against the reference given the reported multipliers.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/kernels/additive_attention.hpp"
#include "attn/nn/additive_attention.hpp"
#include "every_simd_target.hpp"
#include "kernels/kernel_arguments.hpp"
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
                        // Inputs up to 10.4: the exponential form near its limit (e^{2(a+b)} near
                        // e^{±42}, a pair's denominators' product near e^84); 20 and 30: past
                        // kAdditiveExponentialLimit, the direct tanh form.
                        {2, 37, 131, 19, 7, 2, false, 10.4F, 0.0F},
                        {2, 37, 131, 19, 7, 2, false, 20.0F, 0.0F},
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

// The forward pass of one unmasked head (projected queries a, keys b, weights w, values v: batch
// 1) against the double reference, within kTolerance.
::testing::AssertionResult ForwardMatchesReference(const Tensor& a, const Tensor& b,
                                                   const Tensor& w, const Tensor& v) {
  const int64_t n = a.dim(1), m = b.dim(1), hidden = a.dim(2);
  Tensor out(Shape{1, n, v.dim(2)});
  additive_attention_forward(single_head(a, "a"), single_head(b, "b"), w.span(),
                             single_head(v, "v"), {}, {}, single_head(out, "out"));
  const auto expected = reference::additive_attention(
      testing::to_reference(a), testing::to_reference(b), testing::to_reference(v),
      testing::expand(ValidLengths{}, 1, n, m), identity(hidden), identity(hidden), to_doubles(w),
      {});
  return close_to(out, expected.output.values, kTolerance);
}

// The exponential form shares a reciprocal between two terms: (w0·a1 + w1·a0) / (a0·a1) with
// a = e^{2(q + k)} + 1. Hidden unit 0 sits at `fixed` for every query and key (the same a0 for
// every pair, so the softmax ignores it), the others within ±`spread`. Inputs up to 10.4 and
// weights up to 2^64 keep the form (1e19: numerators near 1e37); weights of 1e30 would overflow
// the numerator, and inputs of 20.9 the denominator (a0 ≈ e^83.6 times a1 > e^5), so both take the
// direct form. Weights of 1e19 and 1e30 make one-hot softmax weights (each output the value row of
// its query's best key); weights within ±1, smooth ones.
TEST_P(AdditiveAttentionKernel, MatchesReferenceAtTheExponentialFormsLimits) {
  Rng rng(23);
  const int64_t n = 40, m = 70, hidden = 9;
  struct Limits {
    float fixed, spread, weight_scale;
  };
  for (const Limits& c :
       {Limits{10.4F, 1.0F, 1e19F}, Limits{10.4F, 1.0F, 1e30F}, Limits{20.9F, 2.0F, 1.0F}}) {
    Tensor a = random_tensor(Shape{1, n, hidden}, rng, c.spread);
    Tensor b = random_tensor(Shape{1, m, hidden}, rng, c.spread);
    for (Tensor* input : {&a, &b}) {
      for (int64_t row = 0; row < input->dim(1); ++row)
        input->span()[static_cast<size_t>(row * hidden)] = c.fixed;
    }
    Tensor w = random_tensor(Shape{hidden}, rng);
    for (float& x : w.span()) x *= c.weight_scale;
    const Tensor v = random_tensor(Shape{1, m, 3}, rng);
    EXPECT_TRUE(ForwardMatchesReference(a, b, w, v))
        << hwy::TargetName(GetParam()) << " inputs " << c.fixed << " weights x" << c.weight_scale;
  }
}

// Four terms share a reciprocal where every input lies within ±8 and every weight within ±2^24
// (kAdditiveQuadLimit, kAdditiveQuadWeightLimit), eight within ±4 and ±2^20: the scaled
// denominators e^{2k} + e^{−2q} multiply to within [2^−89, 2^101] and the numerator stays below
// 2^124. Every input here is ±`limit` or within it (half of them at the limit, signs at random, so
// that some products meet the largest and the smallest denominators), and one weight is
// ±`weight_limit`: each form at its extremes, and just past them the next form. h = 15: one step
// of eight units, one of four and three single units; or three of four and three. Weights of 2^20
// and more make one-hot softmax weights.
TEST_P(AdditiveAttentionKernel, MatchesReferenceAtTheSharedReciprocalsLimits) {
  Rng rng(29);
  const int64_t n = 40, m = 70, hidden = 15;
  struct Limits {
    float input, weight;
    AdditiveScoreForm form;
  };
  for (const Limits& c : {Limits{3.99F, 1.0F, AdditiveScoreForm::kExponentialEights},
                          Limits{3.99F, 0x1p20F, AdditiveScoreForm::kExponentialEights},
                          Limits{4.01F, 1.0F, AdditiveScoreForm::kExponentialQuads},
                          Limits{3.99F, 0x1p21F, AdditiveScoreForm::kExponentialQuads},
                          Limits{7.99F, 1.0F, AdditiveScoreForm::kExponentialQuads},
                          Limits{7.99F, 0x1p24F, AdditiveScoreForm::kExponentialQuads},
                          Limits{8.01F, 1.0F, AdditiveScoreForm::kExponentialPairs},
                          Limits{7.99F, 0x1p25F, AdditiveScoreForm::kExponentialPairs}}) {
    Tensor a(Shape{1, n, hidden}), b(Shape{1, m, hidden});
    for (Tensor* input : {&a, &b}) {
      for (float& x : input->span()) {
        const float sign = rng.uniform(-1.0F, 1.0F) < 0.0F ? -1.0F : 1.0F;
        x = rng.uniform(0.0F, 1.0F) < 0.5F ? sign * c.input : rng.uniform(-c.input, c.input);
      }
    }
    Tensor w = random_tensor(Shape{hidden}, rng);
    for (float& x : w.span()) x = std::clamp(x, -1.0F, 1.0F) * c.weight;
    w.span()[3] = -c.weight;
    const Tensor v = random_tensor(Shape{1, m, 3}, rng);
    ASSERT_EQ(additive_score_form(single_head(a, "a"), single_head(b, "b"), w.span()), c.form)
        << "inputs " << c.input << " weights " << c.weight;
    EXPECT_TRUE(ForwardMatchesReference(a, b, w, v))
        << hwy::TargetName(GetParam()) << " inputs " << c.input << " weights " << c.weight;
  }
}

// A tile of one query keeps its row and sums vectors over the hidden units
// (OneQueryAdditiveScores): n = 1 (a Bahdanau decoder step) and n = 17, 33, 65 (a full tile and one
// query after it on SSE4, AVX2 and AVX-512), hidden units that fill whole vectors (256) and leave a
// tail (19), in every score form (inputs within ±3.99, ±7.99, ±10.4, then ±20: eight, four, two
// terms a reciprocal, then tanh), per-query lengths: the outputs, and the weights
// additive_attention_weights computes again from the forward pass's log-sum-exp, against the double
// reference.
TEST_P(AdditiveAttentionKernel, MatchesReferenceForTilesOfOneQuery) {
  Rng rng(31);
  for (const float limit : {3.99F, 7.99F, 10.4F, 20.0F}) {
    for (const Case& c :
         {Case{3, 1, 10, 256, 4, 2, false, 0.0F, 0.0F}, Case{2, 1, 70, 19, 3, 2, false, 0.0F, 0.0F},
          Case{1, 17, 20, 19, 3, 2, false, 0.0F, 0.0F},
          Case{1, 33, 20, 40, 3, 2, false, 0.0F, 0.0F},
          Case{1, 65, 12, 19, 3, 0, false, 0.0F, 0.0F}}) {
      Tensor a(Shape{c.batch, c.queries, c.hidden}), b(Shape{c.batch, c.keys, c.hidden});
      for (Tensor* input : {&a, &b})
        for (float& x : input->span()) x = rng.uniform(-limit, limit);
      const Tensor v = random_tensor(Shape{c.batch, c.keys, c.value_depth}, rng);
      const Tensor w = random_tensor(Shape{c.hidden}, rng);
      std::vector<int64_t> lengths;
      for (int64_t index = 0; index < c.batch * c.queries; ++index)
        lengths.push_back(c.keys - index % 4);
      const ValidLengths mask =
          c.mask_kind == 2 ? ValidLengths::per_query(lengths, c.batch, c.queries) : ValidLengths{};
      Tensor out(Shape{c.batch, c.queries, c.value_depth});
      std::vector<float> lse(static_cast<size_t>(c.batch * c.queries));
      additive_attention_forward(single_head(a, "a"), single_head(b, "b"), w.span(),
                                 single_head(v, "v"), mask, {}, single_head(out, "out"),
                                 lse.data());
      Tensor weights(Shape{c.batch, c.queries, c.keys});
      additive_attention_weights(single_head(a, "a"), single_head(b, "b"), w.span(), lse.data(),
                                 mask, {}, single_head(weights, "weights"));
      const auto expected = reference::additive_attention(
          testing::to_reference(a), testing::to_reference(b), testing::to_reference(v),
          testing::expand(mask, c.batch, c.queries, c.keys), identity(c.hidden), identity(c.hidden),
          to_doubles(w), {});
      const std::string where = std::string(hwy::TargetName(GetParam())) + " inputs within " +
                                std::to_string(limit) + " n=" + std::to_string(c.queries) +
                                " h=" + std::to_string(c.hidden);
      EXPECT_TRUE(close_to(out, expected.output.values, kTolerance)) << where;
      EXPECT_TRUE(close_to(weights, expected.weights.values, kTolerance)) << where << " weights";
    }
  }
}

// The form each range of inputs and weights takes: eight terms a reciprocal within ±4 and ±2^20,
// four within ±8 and ±2^24, two within ±10.5 and ±2^64, else (or with a NaN or ∞ anywhere) the
// direct tanh.
TEST(AdditiveScoreForm, FollowsTheLargestInputAndWeight) {
  const auto form = [](float query, float key, float weight) {
    const std::vector<float> a{0.5F, query}, b{key, -0.25F}, w{1.0F, weight};
    const ConstHeadsView queries{a.data(), 1, 1, 1, 2, 2, 2, 2};
    const ConstHeadsView keys{b.data(), 1, 1, 1, 2, 2, 2, 2};
    return additive_score_form(queries, keys, w);
  };
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(form(4.0F, -4.0F, 0x1p20F), AdditiveScoreForm::kExponentialEights);
  EXPECT_EQ(form(0.0F, 4.01F, 1.0F), AdditiveScoreForm::kExponentialQuads);
  EXPECT_EQ(form(1.0F, 1.0F, 0x1.000002p20F), AdditiveScoreForm::kExponentialQuads);
  EXPECT_EQ(form(8.0F, -8.0F, 0x1p24F), AdditiveScoreForm::kExponentialQuads);
  EXPECT_EQ(form(-8.01F, 0.0F, 1.0F), AdditiveScoreForm::kExponentialPairs);
  EXPECT_EQ(form(0.0F, 8.01F, 1.0F), AdditiveScoreForm::kExponentialPairs);
  EXPECT_EQ(form(1.0F, 1.0F, -0x1.000002p24F), AdditiveScoreForm::kExponentialPairs);
  EXPECT_EQ(form(10.5F, -10.5F, 0x1p64F), AdditiveScoreForm::kExponentialPairs);
  EXPECT_EQ(form(10.51F, 0.0F, 1.0F), AdditiveScoreForm::kTanh);
  EXPECT_EQ(form(0.0F, 0.0F, 0x1.000002p64F), AdditiveScoreForm::kTanh);
  EXPECT_EQ(form(nan, 0.0F, 1.0F), AdditiveScoreForm::kTanh);
  EXPECT_EQ(form(0.0F, -inf, 1.0F), AdditiveScoreForm::kTanh);
  EXPECT_EQ(form(0.0F, 0.0F, nan), AdditiveScoreForm::kTanh);
}

// A bound the caller gives (FlashAttentionOptions::additive_input_bound) stands for the scan of the
// projections, at the same limits; the weights are scanned still; a negative bound (the default)
// or NaN scans.
TEST(AdditiveScoreForm, AGivenBoundStandsForTheInputs) {
  const std::vector<float> a{0.5F, 9.0F}, b{-0.25F, 1.0F}, w{1.0F, 2.0F};
  const ConstHeadsView queries{a.data(), 1, 1, 1, 2, 2, 2, 2};
  const ConstHeadsView keys{b.data(), 1, 1, 1, 2, 2, 2, 2};
  EXPECT_EQ(additive_score_form(queries, keys, w), AdditiveScoreForm::kExponentialPairs);
  EXPECT_EQ(additive_score_form(queries, keys, w, 4.0F), AdditiveScoreForm::kExponentialEights);
  EXPECT_EQ(additive_score_form(queries, keys, w, 8.0F), AdditiveScoreForm::kExponentialQuads);
  EXPECT_EQ(additive_score_form(queries, keys, w, 10.51F), AdditiveScoreForm::kTanh);
  EXPECT_EQ(additive_score_form(queries, keys, w, 0.0F), AdditiveScoreForm::kExponentialEights);
  EXPECT_EQ(additive_score_form(queries, keys, w, -1.0F), AdditiveScoreForm::kExponentialPairs);
  EXPECT_EQ(additive_score_form(queries, keys, w, std::numeric_limits<float>::quiet_NaN()),
            AdditiveScoreForm::kExponentialPairs);
  const std::vector<float> heavy{1.0F, 0x1p25F};
  EXPECT_EQ(additive_score_form(queries, keys, heavy, 1.0F), AdditiveScoreForm::kExponentialPairs);
}

// The forward, weights and backward kernels take the form from the options' bound when one is
// given: inputs within ±1 (eight terms a reciprocal when scanned) under a bound of 20 (tanh) give
// other roundings of the same results, and a bound equal to the inputs' largest magnitude gives
// the scanned run's bits.
TEST_P(AdditiveAttentionKernel, TakesTheFormFromAGivenBound) {
  Rng rng(37);
  const int64_t batch = 2, n = 9, m = 21, hidden = 19, dv = 3;
  Tensor a(Shape{batch, n, hidden}), b(Shape{batch, m, hidden});
  for (Tensor* input : {&a, &b})
    for (float& x : input->span()) x = rng.uniform(-1.0F, 1.0F);
  const Tensor v = random_tensor(Shape{batch, m, dv}, rng);
  const Tensor w = random_tensor(Shape{hidden}, rng);
  const Tensor g = random_tensor(Shape{batch, n, dv}, rng);
  float largest = 0.0F;
  for (const Tensor* input : {&a, &b})
    for (const float x : input->span()) largest = std::max(largest, std::fabs(x));
  struct Run {
    Tensor out, weights, grad_a, grad_b, grad_v, grad_w;
  };
  const auto run = [&](float bound) {
    FlashAttentionOptions options;
    options.additive_input_bound = bound;
    Run r{Tensor(Shape{batch, n, dv}), Tensor(Shape{batch, n, m}), Tensor(a.shape()),
          Tensor(b.shape()),           Tensor(v.shape()),          Tensor(Shape{hidden})};
    std::vector<float> lse(static_cast<size_t>(batch * n));
    additive_attention_forward(single_head(a, "a"), single_head(b, "b"), w.span(),
                               single_head(v, "v"), {}, options, single_head(r.out, "out"),
                               lse.data());
    additive_attention_weights(single_head(a, "a"), single_head(b, "b"), w.span(), lse.data(), {},
                               options, single_head(r.weights, "weights"));
    additive_attention_backward(single_head(a, "a"), single_head(b, "b"), w.span(),
                                single_head(v, "v"), single_head(r.out, "out"), single_head(g, "g"),
                                lse.data(), {}, options, single_head(r.grad_a, "grad_a"),
                                single_head(r.grad_b, "grad_b"), r.grad_w.span(),
                                single_head(r.grad_v, "grad_v"));
    return r;
  };
  const Run scanned = run(-1.0F), exact = run(largest), loose = run(20.0F);
  const auto same = [](const Tensor& x, const Tensor& y) { return x.to_vector() == y.to_vector(); };
  EXPECT_TRUE(same(scanned.out, exact.out) && same(scanned.weights, exact.weights) &&
              same(scanned.grad_a, exact.grad_a) && same(scanned.grad_b, exact.grad_b) &&
              same(scanned.grad_w, exact.grad_w))
      << hwy::TargetName(GetParam());
  EXPECT_FALSE(same(scanned.out, loose.out) && same(scanned.grad_a, loose.grad_a))
      << hwy::TargetName(GetParam()) << ": the bound of 20 did not change the form";
  EXPECT_TRUE(close_to(loose.out, to_doubles(scanned.out), kTolerance));
  EXPECT_TRUE(close_to(loose.weights, to_doubles(scanned.weights), kTolerance));
  EXPECT_TRUE(close_to(loose.grad_a, to_doubles(scanned.grad_a), kTolerance));
  EXPECT_TRUE(close_to(loose.grad_b, to_doubles(scanned.grad_b), kTolerance));
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
