// The four attention layers against the double reference on random shapes and masks (n = 1,
// m = 1, valid lengths 0 and m, per-query lengths, large magnitudes), plus their input checks.
#include <gtest/gtest.h>

#include <array>

#include <cmath>

#include "attn/core/error.hpp"
#include "attn/nn/additive_attention.hpp"
#include "attn/nn/dot_product_attention.hpp"
#include "attn/nn/gaussian_kernel_pooling.hpp"
#include "attn/nn/general_attention.hpp"
#include "attn/nn/multi_head_attention.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

using testing::close_to;
using testing::random_tensor;
using testing::to_doubles;
using testing::to_reference;

// Outputs are sums of ≤ 64 weighted values after ≤ 64-term float32 products and a float32 softmax:
// each stage adds at most ~64·2⁻²⁴ ≈ 4e-6 relative to the output's magnitude; 2e-5 covers three.
constexpr double kOutputTolerance = 2e-5;
constexpr double kWeightTolerance = 2e-5;

struct Case {
  int64_t batch, queries, keys;
};

const Case kCases[] = {{1, 1, 1}, {2, 1, 5}, {1, 4, 1}, {3, 7, 13}, {2, 16, 33}};

// Masks of every kind for a case: none, per batch (including 0 and m), per query (including 0, m).
std::vector<ValidLengths> masks_for(const Case& c, Rng& rng) {
  std::vector<int64_t> per_batch, per_query;
  for (int64_t b = 0; b < c.batch; ++b)
    per_batch.push_back(
        b % 2 == 0 ? c.keys
                   : static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(c.keys + 1)));
  per_batch.back() = c.batch > 1 ? 0 : per_batch.back();
  for (int64_t index = 0; index < c.batch * c.queries; ++index) {
    per_query.push_back(
        index == 0   ? 0
        : index == 1 ? c.keys
                     : static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(c.keys + 1)));
  }
  return {ValidLengths(), ValidLengths::per_batch(per_batch),
          ValidLengths::per_query(per_query, c.batch, c.queries)};
}

TEST(DotProductAttention, MatchesReference) {
  Rng rng(1);
  for (const Case& c : kCases)
    for (const float magnitude : {1.0F, 10.0F})
      for (const ValidLengths& mask : masks_for(c, rng)) {
        const Tensor q = random_tensor(Shape{c.batch, c.queries, 8}, rng, magnitude);
        const Tensor k = random_tensor(Shape{c.batch, c.keys, 8}, rng, magnitude);
        const Tensor v = random_tensor(Shape{c.batch, c.keys, 3}, rng);
        DotProductAttention attention(0.5F);
        attention.eval();
        const Tensor out = attention(q, k, v, mask);
        const auto expected = reference::dot_product_attention(
            to_reference(q), to_reference(k), to_reference(v),
            testing::expand(mask, c.batch, c.queries, c.keys), 1.0 / std::sqrt(8.0));
        // Scores of magnitude ~100 carry float32 error ~100·2⁻²⁴ into the exponent; scale the
        // bound.
        const double tolerance = kOutputTolerance * magnitude * magnitude;
        ASSERT_TRUE(close_to(out, expected.output.values, tolerance))
            << c.batch << "," << c.queries << "," << c.keys;
        ASSERT_TRUE(close_to(attention.attention_weights(), expected.weights.values, tolerance));
      }
}

TEST(DotProductAttention, CustomScaleAndZeroLengthGivesZeroOutput) {
  Rng rng(2);
  const Tensor q = random_tensor(Shape{2, 3, 4}, rng);
  const Tensor k = random_tensor(Shape{2, 5, 4}, rng);
  const Tensor v = random_tensor(Shape{2, 5, 6}, rng);
  DotProductAttention attention(0.0F, 0.25F);
  const ValidLengths mask = ValidLengths::per_batch({0, 5});
  const Tensor out = attention(q, k, v, mask);
  const auto expected = reference::dot_product_attention(
      to_reference(q), to_reference(k), to_reference(v), testing::expand(mask, 2, 3, 5), 0.25);
  EXPECT_TRUE(close_to(out, expected.output.values, kOutputTolerance));
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t t = 0; t < 6; ++t) EXPECT_EQ(out(0, i, t), 0.0F);
}

TEST(DotProductAttention, FusedAndReferencePathsAgree) {
  Rng rng(12);
  const Tensor q = random_tensor(Shape{3, 70, 16}, rng), k = random_tensor(Shape{3, 150, 16}, rng);
  const Tensor v = random_tensor(Shape{3, 150, 8}, rng);
  const ValidLengths mask = ValidLengths::per_batch({150, 0, 77});
  DotProductAttention fused, reference;
  reference.set_path(AttentionPath::kReference);
  fused.eval();
  reference.eval();
  const Tensor fused_out = fused(q, k, v, mask);
  const Tensor reference_out = reference(q, k, v, mask);
  EXPECT_TRUE(close_to(fused_out, to_doubles(reference_out), kOutputTolerance));
  // The fused pass defers the weights; on request the kernel recomputes the probabilities it used,
  // which differ from the reference path's float32 softmax by rounding only (weights ≤ 1).
  EXPECT_TRUE(close_to(fused.attention_weights(), to_doubles(reference.attention_weights()), 1e-6));
}

TEST(DotProductAttention, FusedPathRejectsNonFiniteInputs) {
  DotProductAttention attention;
  attention.eval();
  Tensor q(Shape{1, 2, 2}), k(Shape{1, 3, 2}), v(Shape{1, 3, 2});
  k(0, 1, 1) = std::nanf("");
  EXPECT_THROW_MESSAGE(attention(q, k, v), ValueError,
                       "keys: expected finite values, got nan at flat index 3");
  // Scores that overflow are reported, as on the reference path.
  k(0, 1, 1) = 3e38F;
  q(0, 0, 1) = 3e38F;
  EXPECT_THROW_MESSAGE(attention(q, k, v), ValueError,
                       "scores[0, 0, 1]: expected a finite score, got +inf");
}

TEST(AdditiveAttention, MatchesReference) {
  Rng rng(3);
  for (const Case& c : kCases)
    for (const float magnitude : {1.0F, 1e4F})
      for (const ValidLengths& mask : masks_for(c, rng)) {
        AdditiveAttention attention(/*key_size=*/3, /*query_size=*/5, /*num_hiddens=*/7,
                                    /*dropout=*/0.2F,
                                    /*seed=*/c.keys);
        attention.eval();
        // Large inputs saturate tanh; the scores stay bounded by ‖w_v‖₁.
        const Tensor q = random_tensor(Shape{c.batch, c.queries, 5}, rng, magnitude);
        const Tensor k = random_tensor(Shape{c.batch, c.keys, 3}, rng, magnitude);
        const Tensor v = random_tensor(Shape{c.batch, c.keys, 4}, rng);
        const Tensor out = attention(q, k, v, mask);
        const StateDict state = attention.state_dict();
        const auto expected = reference::additive_attention(
            to_reference(q), to_reference(k), to_reference(v),
            testing::expand(mask, c.batch, c.queries, c.keys), to_doubles(state.at("W_q.weight")),
            to_doubles(state.at("W_k.weight")), to_doubles(state.at("w_v.weight")));
        ASSERT_TRUE(close_to(out, expected.output.values, kOutputTolerance))
            << c.batch << "," << c.queries << "," << c.keys;
        ASSERT_TRUE(
            close_to(attention.attention_weights(), expected.weights.values, kWeightTolerance));
      }
}

TEST(AdditiveAttention, BookToyExampleGivesMeansOfValidValues) {
  // The book: keys all ones make every score equal, so each output is the mean of its valid values.
  Rng rng(0);
  const Tensor queries = random_tensor(Shape{2, 1, 20}, rng);
  const Tensor keys = Tensor::full(Shape{2, 10, 2}, 1.0F);
  Tensor values(Shape{2, 10, 4});
  for (int64_t index = 0; index < values.numel(); ++index)
    values.data()[index] = static_cast<float>(index % 40);
  AdditiveAttention attention(2, 20, 8, 0.1F);
  attention.eval();
  const Tensor out = attention(queries, keys, values, ValidLengths::per_batch({2, 6}));
  EXPECT_TRUE(close_to(out, {2, 3, 4, 5, 10, 11, 12, 13}, 1e-6));
  EXPECT_EQ(attention.attention_weights().shape(), (Shape{2, 1, 10}));
  EXPECT_NEAR(attention.attention_weights()(1, 0, 5), 1.0 / 6.0, 1e-7);
  EXPECT_EQ(attention.attention_weights()(1, 0, 6), 0.0F);
}

TEST(AdditiveAttention, RejectsWrongSizes) {
  AdditiveAttention attention(2, 20, 8, 0.0F);
  const Tensor keys(Shape{2, 10, 2}), values(Shape{2, 10, 4});
  EXPECT_THROW_MESSAGE(attention(Tensor(Shape{2, 1, 19}), keys, values), ShapeError,
                       "queries: expected the last dimension to be 20 (the layer's input size), "
                       "got shape (2, 1, 19)");
  EXPECT_THROW_MESSAGE(attention(Tensor(Shape{2, 1, 20}), Tensor(Shape{2, 10, 3}), values),
                       ShapeError, "keys: expected the last dimension to be 2");
  EXPECT_THROW_MESSAGE(
      attention(Tensor(Shape{2, 1, 20}), keys, Tensor(Shape{2, 9, 4})), ShapeError,
      "values: expected dimension 1 to be 10 (the number of keys), got shape (2, 9, 4)");
  EXPECT_THROW_MESSAGE(attention(Tensor(Shape{3, 1, 20}), keys, values), ShapeError,
                       "keys: expected dimension 0 to be 3 (the batch size of queries)");
  EXPECT_THROW_MESSAGE(attention(Tensor(Shape{1, 20}), keys, values), ShapeError,
                       "queries: expected a tensor of rank 3");
  EXPECT_THROW_MESSAGE(
      attention(Tensor(Shape{2, 1, 20}), keys, values, ValidLengths::per_batch({2, 11})),
      ValueError, "valid_lens[1]: expected a valid length in [0, 10]");
  EXPECT_THROW_MESSAGE(AdditiveAttention(0, 20, 8, 0.0F), ValueError,
                       "key_size: expected a positive size, got 0");
  EXPECT_THROW_MESSAGE(AdditiveAttention(2, -1, 8, 0.0F), ValueError,
                       "query_size: expected a positive size, got -1");
  EXPECT_THROW_MESSAGE(MultiHeadAttention(2, 2, 0, 4, 2, 0.0F), ValueError,
                       "value_size: expected a positive size");
  EXPECT_THROW_MESSAGE(AdditiveAttention(2, 20, 8, 1.5F), ValueError,
                       "dropout: expected a probability in [0, 1], got 1.5");
}

// Luong's general score on queries and keys of different sizes: the fused and reference paths
// agree with each other and with softmax((W q)·k) V in double; errors name the argument.
TEST(GeneralAttention, FusedAndReferencePathsMatchTheDoubleReference) {
  Rng rng(41);
  const Tensor q = random_tensor(Shape{2, 33, 5}, rng), k = random_tensor(Shape{2, 70, 9}, rng);
  const Tensor v = random_tensor(Shape{2, 70, 4}, rng), g = random_tensor(Shape{2, 33, 4}, rng);
  const ValidLengths mask = ValidLengths::per_batch({70, 0});
  GeneralAttention fused(5, 9, 0.0F, 3), reference(5, 9, 0.0F, 3);
  reference.set_path(AttentionPath::kReference);
  const Tensor out = fused(q, k, v, mask);
  const reference::Array<double> projected = reference::linear(
      testing::to_reference(q), to_doubles(fused.state_dict().at("W.weight")), {}, 9);
  const reference::Result expected = reference::dot_product_attention(
      projected, testing::to_reference(k), testing::to_reference(v),
      testing::expand(mask, 2, 33, 70), 1.0);
  EXPECT_TRUE(close_to(out, expected.output.values, kOutputTolerance));
  EXPECT_TRUE(close_to(reference(q, k, v, mask), expected.output.values, kOutputTolerance));
  EXPECT_TRUE(close_to(fused.attention_weights(), expected.weights.values, kOutputTolerance));
  const AttentionGradients fused_grads = fused.backward(g), reference_grads = reference.backward(g);
  EXPECT_TRUE(close_to(fused_grads.queries, to_doubles(reference_grads.queries), 2e-5));
  EXPECT_TRUE(close_to(fused_grads.keys, to_doubles(reference_grads.keys), 2e-5));
  EXPECT_TRUE(close_to(fused_grads.values, to_doubles(reference_grads.values), 2e-5));

  EXPECT_THROW_MESSAGE(fused(q, Tensor(Shape{2, 70, 8}), v), ShapeError,
                       "keys: expected the last dimension to be 9 (the layer's key size)");
  EXPECT_THROW_MESSAGE(fused(Tensor(Shape{2, 33, 4}), k, v), ShapeError,
                       "queries: expected the last dimension to be 5 (the layer's input size)");
  EXPECT_THROW_MESSAGE(GeneralAttention(5, 0), ValueError,
                       "key_size: expected a positive size, got 0");
  GeneralAttention loaded(5, 9);
  loaded.load_state_dict(fused.state_dict());
  EXPECT_EQ(loaded.state_dict().at("W.weight").values(),
            fused.state_dict().at("W.weight").values());
  EXPECT_THROW_MESSAGE(loaded.load_state_dict({{"W.weight", Tensor(Shape{5, 9})}}), ShapeError,
                       "W.weight");
}

// The dot-product, general and additive layers' fused passes keep their inputs (general: its
// projection) in the storage of the last pass's (FusedAttentionPass::release_inputs): after a
// longer pass, a reference-path pass and another, a pass must equal a fresh layer's forward,
// weights and backward bit for bit.
TEST(AttentionLayers, LaterPassesEqualFreshLayers) {
  Rng rng(23);
  const auto inputs = [&rng](int64_t n, int64_t m) {
    return std::array<Tensor, 3>{random_tensor(Shape{2, n, 9}, rng),
                                 random_tensor(Shape{2, m, 9}, rng),
                                 random_tensor(Shape{2, m, 5}, rng)};
  };
  const std::array<Tensor, 3> longer = inputs(60, 140), other = inputs(30, 50),
                              last = inputs(30, 50);
  const Tensor g = random_tensor(Shape{2, 30, 5}, rng);
  const ValidLengths lengths = ValidLengths::per_batch({0, 41});
  DotProductAttention reused, fresh;
  GeneralAttention general_reused(9, 9, 0.0F, 4), general_fresh(9, 9, 0.0F, 4);
  AdditiveAttention additive_reused(9, 9, 6, 0.0F, 4), additive_fresh(9, 9, 6, 0.0F, 4);
  const auto earlier_passes = [&](auto& layer) {
    (void)layer(longer[0], longer[1], longer[2], ValidLengths());
    layer.set_path(AttentionPath::kReference);
    (void)layer(other[0], other[1], other[2], ValidLengths());
    layer.set_path(AttentionPath::kFused);
    (void)layer(longer[0], longer[1], longer[2], ValidLengths());
    (void)layer(other[0], other[1], other[2], ValidLengths());
  };
  // The last pass of `reused` (after the earlier ones) against `fresh`'s only pass, bit for bit:
  // output, weights, gradients.
  const auto expect_fresh = [&](auto& reused_layer, auto& fresh_layer, const char* layer) {
    earlier_passes(reused_layer);
    EXPECT_EQ(reused_layer(last[0], last[1], last[2], lengths).values(),
              fresh_layer(last[0], last[1], last[2], lengths).values())
        << layer;
    EXPECT_EQ(reused_layer.attention_weights().values(), fresh_layer.attention_weights().values())
        << layer;
    const AttentionGradients reused_grads = reused_layer.backward(g),
                             fresh_grads = fresh_layer.backward(g);
    EXPECT_EQ(reused_grads.queries.values(), fresh_grads.queries.values()) << layer;
    EXPECT_EQ(reused_grads.keys.values(), fresh_grads.keys.values()) << layer;
    EXPECT_EQ(reused_grads.values.values(), fresh_grads.values.values()) << layer;
  };
  expect_fresh(reused, fresh, "DotProductAttention");
  expect_fresh(general_reused, general_fresh, "GeneralAttention");
  expect_fresh(additive_reused, additive_fresh, "AdditiveAttention");
}

TEST(GaussianKernelPooling, MatchesReference) {
  Rng rng(4);
  for (const Case& c : kCases)
    for (const float width : {1.0F, 2.5F})
      for (const ValidLengths& mask : masks_for(c, rng)) {
        GaussianKernelPooling pooling(width);
        const Tensor q = random_tensor(Shape{c.batch, c.queries, 2}, rng);
        const Tensor k = random_tensor(Shape{c.batch, c.keys, 2}, rng);
        const Tensor v = random_tensor(Shape{c.batch, c.keys, 1}, rng);
        const Tensor out = pooling(q, k, v, mask);
        const auto expected = reference::gaussian_kernel_pooling(
            to_reference(q), to_reference(k), to_reference(v),
            testing::expand(mask, c.batch, c.queries, c.keys), width);
        ASSERT_TRUE(close_to(out, expected.output.values, kOutputTolerance));
        ASSERT_TRUE(
            close_to(pooling.attention_weights(), expected.weights.values, kWeightTolerance));
      }
}

TEST(GaussianKernelPooling, NadarayaWatsonOnScalarsInterpolates) {
  // Keys 0 and 10 with values 1 and 5: a query at 0 sees essentially only the first key.
  GaussianKernelPooling pooling;
  const Tensor out =
      pooling(Tensor(Shape{1, 2, 1}, {0.0F, 5.0F}), Tensor(Shape{1, 2, 1}, {0.0F, 10.0F}),
              Tensor(Shape{1, 2, 1}, {1.0F, 5.0F}));
  EXPECT_NEAR(out(0, 0, 0), 1.0F, 1e-6);
  EXPECT_NEAR(out(0, 1, 0), 3.0F, 1e-6);  // equidistant: the mean
  EXPECT_THROW_MESSAGE(GaussianKernelPooling(std::nanf("")), ValueError,
                       "width: expected a finite number");
}

TEST(GaussianKernelPooling, FarKeysAndNonFiniteInputs) {
  // Every score of the row beyond float: the nearest key takes the weight (zeros before), and its
  // gradients stay finite.
  GaussianKernelPooling pooling;
  const Tensor q(Shape{1, 1, 1}, {0.0F}), k(Shape{1, 2, 1}, {2e20F, 1e20F}),
      v(Shape{1, 2, 1}, {1.0F, 2.0F});
  EXPECT_EQ(pooling(q, k, v)(0, 0, 0), 2.0F);
  EXPECT_EQ(pooling.attention_weights()(0, 0, 0), 0.0F);
  EXPECT_EQ(pooling.attention_weights()(0, 0, 1), 1.0F);
  const AttentionGradients grads = pooling.backward(Tensor(Shape{1, 1, 1}, {1.0F}));
  EXPECT_TRUE(all_finite(grads.queries) && all_finite(grads.keys));
  EXPECT_THROW_MESSAGE(pooling.backward(Tensor(Shape{1, 1, 1}, {NAN})), ValueError, "grad_output");
  Tensor bad = v;
  bad.data()[0] = NAN;
  EXPECT_THROW_MESSAGE(pooling(q, k, bad), ValueError, "values");
  bad = k;
  bad.data()[1] = INFINITY;
  EXPECT_THROW_MESSAGE(pooling(q, bad, v), ValueError, "keys");
}

TEST(MultiHeadAttention, MatchesReference) {
  Rng rng(5);
  for (const bool bias : {false, true})
    for (const Case& c : kCases)
      for (const ValidLengths& mask : masks_for(c, rng)) {
        MultiHeadAttention attention(/*key_size=*/6, /*query_size=*/5, /*value_size=*/3,
                                     /*num_hiddens=*/12,
                                     /*num_heads=*/3, /*dropout=*/0.3F, bias, /*seed=*/9);
        attention.eval();
        const Tensor q = random_tensor(Shape{c.batch, c.queries, 5}, rng);
        const Tensor k = random_tensor(Shape{c.batch, c.keys, 6}, rng);
        const Tensor v = random_tensor(Shape{c.batch, c.keys, 3}, rng);
        const Tensor out = attention(q, k, v, mask);
        const StateDict state = attention.state_dict();
        reference::MultiHeadParameters p{to_doubles(state.at("W_q.weight")),
                                         to_doubles(state.at("W_k.weight")),
                                         to_doubles(state.at("W_v.weight")),
                                         to_doubles(state.at("W_o.weight")),
                                         {},
                                         {},
                                         {},
                                         {}};
        if (bias) {
          p.b_q = to_doubles(state.at("W_q.bias"));
          p.b_k = to_doubles(state.at("W_k.bias"));
          p.b_v = to_doubles(state.at("W_v.bias"));
          p.b_o = to_doubles(state.at("W_o.bias"));
        }
        const auto expected = reference::multi_head_attention(
            to_reference(q), to_reference(k), to_reference(v),
            testing::expand(mask, c.batch, c.queries, c.keys), p, 12, 3);
        ASSERT_EQ(out.shape(), (Shape{c.batch, c.queries, 12}));
        ASSERT_TRUE(close_to(out, expected.output.values, kOutputTolerance)) << "bias " << bias;
        ASSERT_EQ(attention.attention_weights().shape(), (Shape{c.batch * 3, c.queries, c.keys}));
        ASSERT_TRUE(
            close_to(attention.attention_weights(), expected.weights.values, kWeightTolerance));
      }
}

TEST(MultiHeadAttention, FusedAndReferencePathsAgreeForwardAndBackward) {
  Rng rng(13);
  const Tensor q = random_tensor(Shape{2, 40, 12}, rng), k = random_tensor(Shape{2, 70, 10}, rng);
  const Tensor v = random_tensor(Shape{2, 70, 6}, rng), g = random_tensor(Shape{2, 40, 16}, rng);
  const ValidLengths mask = ValidLengths::per_batch({70, 0});
  MultiHeadAttention fused(10, 12, 6, 16, 4, 0.0F, /*bias=*/true, 3),
      reference(10, 12, 6, 16, 4, 0.0F, true, 3);
  reference.set_path(AttentionPath::kReference);
  EXPECT_TRUE(
      close_to(fused(q, k, v, mask), to_doubles(reference(q, k, v, mask)), kOutputTolerance));
  EXPECT_TRUE(close_to(fused.attention_weights(), to_doubles(reference.attention_weights()),
                       kWeightTolerance));
  const AttentionGradients fused_grads = fused.backward(g), reference_grads = reference.backward(g);
  EXPECT_TRUE(close_to(fused_grads.queries, to_doubles(reference_grads.queries), kOutputTolerance));
  EXPECT_TRUE(close_to(fused_grads.keys, to_doubles(reference_grads.keys), kOutputTolerance));
  EXPECT_TRUE(close_to(fused_grads.values, to_doubles(reference_grads.values), kOutputTolerance));
  const auto fused_parameters = fused.parameters(), reference_parameters = reference.parameters();
  for (size_t index = 0; index < fused_parameters.size(); ++index) {
    EXPECT_TRUE(close_to(*fused_parameters[index].grad,
                         to_doubles(*reference_parameters[index].grad), kOutputTolerance))
        << fused_parameters[index].name;
  }
}

// A layer's later passes keep their inputs for the backward in the storage of the earlier ones
// (Tensor::assign), and write their projections and the fused pass's output into the storage of
// the last pass's (Tensor::assign_zeros): after a longer pass, a reference-path pass and one of
// the same size, over a batch element whose queries see no key, the layer must equal a fresh
// layer's, forward and backward (the projections' gradients read the kept inputs), bit for bit.
TEST(MultiHeadAttention, ASecondPassEqualsAFreshLayers) {
  Rng rng(17);
  const Tensor q0 = random_tensor(Shape{2, 90, 12}, rng),
               k0 = random_tensor(Shape{2, 130, 10}, rng);
  const Tensor v0 = random_tensor(Shape{2, 130, 6}, rng);
  const Tensor q1 = random_tensor(Shape{2, 40, 12}, rng), k1 = random_tensor(Shape{2, 70, 10}, rng);
  const Tensor v1 = random_tensor(Shape{2, 70, 6}, rng);
  const Tensor q = random_tensor(Shape{2, 40, 12}, rng), k = random_tensor(Shape{2, 70, 10}, rng);
  const Tensor v = random_tensor(Shape{2, 70, 6}, rng), g = random_tensor(Shape{2, 40, 16}, rng);
  const ValidLengths lengths = ValidLengths::per_batch({0, 33});
  MultiHeadAttention reused(10, 12, 6, 16, 4, 0.0F, /*bias=*/true, 5),
      fresh(10, 12, 6, 16, 4, 0.0F, true, 5);
  (void)reused(q0, k0, v0, ValidLengths());
  reused.set_path(AttentionPath::kReference);
  (void)reused(q1, k1, v1, ValidLengths());
  reused.set_path(AttentionPath::kFused);
  (void)reused(q0, k0, v0, ValidLengths());
  (void)reused(q1, k1, v1, ValidLengths());
  const Tensor first = reused(q, k, v, lengths), second = fresh(q, k, v, lengths);
  EXPECT_EQ(first.values(), second.values());
  const AttentionGradients reused_grads = reused.backward(g), fresh_grads = fresh.backward(g);
  EXPECT_EQ(reused_grads.queries.values(), fresh_grads.queries.values());
  EXPECT_EQ(reused_grads.keys.values(), fresh_grads.keys.values());
  EXPECT_EQ(reused_grads.values.values(), fresh_grads.values.values());
  const auto reused_parameters = reused.parameters(), fresh_parameters = fresh.parameters();
  for (size_t index = 0; index < reused_parameters.size(); ++index) {
    EXPECT_EQ(reused_parameters[index].grad->values(), fresh_parameters[index].grad->values())
        << reused_parameters[index].name;
  }
}

TEST(MultiHeadAttention, BookShapeAndErrors) {
  // The book: num_hiddens 100, 5 heads, batch 2, 4 queries, 6 key-value pairs, valid lens [3, 2].
  MultiHeadAttention attention(100, 100, 100, 100, 5, 0.5F);
  attention.eval();
  Rng rng(6);
  const Tensor x = Tensor::full(Shape{2, 4, 100}, 1.0F);
  const Tensor y = Tensor::full(Shape{2, 6, 100}, 1.0F);
  EXPECT_EQ(attention(x, y, y, ValidLengths::per_batch({3, 2})).shape(), (Shape{2, 4, 100}));
  EXPECT_EQ(attention.attention_weights().shape(), (Shape{10, 4, 6}));
  EXPECT_THROW_MESSAGE(MultiHeadAttention(4, 4, 4, 10, 3, 0.0F), ValueError,
                       "num_heads: expected a positive divisor of num_hiddens = 10, got 3");
  EXPECT_THROW_MESSAGE(MultiHeadAttention(4, 4, 4, 12, 0, 0.0F), ValueError, "got 0");
  // A size of 0 hidden units is the size's error, not the heads' (it read "num_heads: expected a
  // positive divisor of num_hiddens = 0, got 2").
  EXPECT_THROW_MESSAGE(MultiHeadAttention(4, 4, 4, 0, 2, 0.0F), ValueError,
                       "num_hiddens: expected a positive size, got 0");
  EXPECT_THROW_MESSAGE(attention(x, y, Tensor(Shape{2, 6, 99})), ShapeError,
                       "values: expected the last dimension to be 100");
}

}  // namespace
}  // namespace attn
