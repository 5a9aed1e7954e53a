// attn::additive_attention (forward, weights, backward with the parameters' gradients) against the
// double reference on every SIMD target: valid lengths, bottom-right causal, dropout, a window and
// a bool mask (checked against the equivalent lengths), rank-4 inputs; refused options.
#include "attn/functional/additive_attention.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "attn/core/error.hpp"
#include "every_simd_target.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

using testing::close_to;
using testing::random_tensor;
using testing::to_doubles;

// As the additive kernels' own tests: float32 sums of up to a few hundred terms with the kernels'
// tanh (3.5e-7 relative) against double: 1e-5 relative to the result's magnitude.
constexpr double kTolerance = 1e-5;
// The parameters' gradients add one more float32 GEMM over B·n rows (oneDNN) on top.
constexpr double kParameterTolerance = 3e-5;

class FunctionalAdditive : public testing::EverySimdTarget {};

struct Parameters {
  Tensor W_q, W_k, w_v;
  AdditiveParameters view() const { return {W_q, W_k, w_v.span()}; }
};

Parameters random_parameters(int64_t hidden, int64_t query_size, int64_t key_size, Rng& rng) {
  return {random_tensor(Shape{hidden, query_size}, rng, 0.5F),
          random_tensor(Shape{hidden, key_size}, rng, 0.5F), random_tensor(Shape{hidden}, rng)};
}

// x Wᵀ in double, for (rows, in) x and (out, in) W.
reference::Array<double> project(const Tensor& x, const Tensor& W) {
  return reference::linear(testing::to_reference(x), to_doubles(W), {}, W.dim(0));
}

TEST_P(FunctionalAdditive, MatchesTheReferenceForwardAndBackward) {
  Rng rng(5);
  struct Case {
    int64_t batch, queries, keys, query_size, key_size, hidden, value_size;
    bool causal;
    float dropout;
  };
  for (const Case& c :
       {Case{2, 9, 70, 7, 5, 8, 3, false, 0.0F}, Case{3, 33, 17, 4, 6, 16, 5, true, 0.0F},
        Case{2, 20, 65, 3, 3, 4, 2, false, 0.3F}, Case{1, 1, 1, 1, 1, 1, 1, false, 0.0F}}) {
    const Tensor q = random_tensor(Shape{c.batch, c.queries, c.query_size}, rng);
    const Tensor k = random_tensor(Shape{c.batch, c.keys, c.key_size}, rng);
    const Tensor v = random_tensor(Shape{c.batch, c.keys, c.value_size}, rng);
    const Tensor g = random_tensor(Shape{c.batch, c.queries, c.value_size}, rng);
    const Parameters p = random_parameters(c.hidden, c.query_size, c.key_size, rng);
    std::vector<int64_t> lengths;
    for (int64_t b = 0; b < c.batch; ++b) lengths.push_back(b == 1 ? 0 : c.keys - b);
    AttentionOptions options;
    options.valid_lens = ValidLengths::per_batch(lengths);
    options.causal = c.causal;
    options.alignment = DiagonalAlignment::kBottomRight;
    options.dropout = c.dropout;
    options.seed = 11;

    const AttentionForward forward = additive_attention(q, k, v, p.view(), options);
    const ValidLengths effective =
        c.causal ? options.valid_lens.with_causal_mask(c.batch, c.queries, c.keys)
                 : options.valid_lens;
    const auto expanded = testing::expand(effective, c.batch, c.queries, c.keys);
    std::vector<double> dropout;
    if (c.dropout > 0) {
      dropout = to_doubles(
          attention_dropout_mask(q.shape(), Shape{c.batch, c.keys, c.query_size}, options));
    }
    const reference::Result expected = reference::additive_attention(
        testing::to_reference(q), testing::to_reference(k), testing::to_reference(v), expanded,
        to_doubles(p.W_q), to_doubles(p.W_k), to_doubles(p.w_v), dropout);
    EXPECT_TRUE(close_to(forward.output, expected.output.values, kTolerance));
    EXPECT_TRUE(close_to(additive_attention_weights(q, k, p.view(), forward.log_sum_exp, options),
                         expected.weights.values, kTolerance));

    const AdditiveGradients grads = additive_attention_backward(q, k, v, p.view(), forward.output,
                                                                g, forward.log_sum_exp, options);
    const reference::Array<double> a = project(q, p.W_q), b = project(k, p.W_k);
    const reference::AdditiveGradients projected = reference::additive_attention_backward(
        a, b, testing::to_reference(v), expanded, to_doubles(p.w_v), testing::to_reference(g),
        dropout);
    // Back through the projections: dq = da W_q, dW_q = daᵀ q (and the same for keys).
    const auto back = [](const reference::Array<double>& grad, const Tensor& x, const Tensor& W,
                         std::vector<double>& grad_x, std::vector<double>& grad_W) {
      const int64_t rows = x.numel() / x.dim(-1), in = x.dim(-1), out = W.dim(0);
      grad_x.assign(static_cast<size_t>(x.numel()), 0.0);
      grad_W.assign(static_cast<size_t>(W.numel()), 0.0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = 0; o < out; ++o)
          for (int64_t t = 0; t < in; ++t) {
            const double d = grad.values[static_cast<size_t>(r * out + o)];
            grad_x[static_cast<size_t>(r * in + t)] += d * W.data()[o * in + t];
            grad_W[static_cast<size_t>(o * in + t)] += d * x.data()[r * in + t];
          }
    };
    std::vector<double> dq, dWq, dk, dWk;
    back(projected.queries, q, p.W_q, dq, dWq);
    back(projected.keys, k, p.W_k, dk, dWk);
    EXPECT_TRUE(close_to(grads.queries, dq, kParameterTolerance));
    EXPECT_TRUE(close_to(grads.keys, dk, kParameterTolerance));
    EXPECT_TRUE(close_to(grads.values, projected.values.values, kTolerance));
    EXPECT_TRUE(close_to(grads.W_q, dWq, kParameterTolerance));
    EXPECT_TRUE(close_to(grads.W_k, dWk, kParameterTolerance));
    EXPECT_TRUE(close_to(grads.w_v, projected.w_v, kParameterTolerance));
  }
}

// A bool mask hiding the keys past each batch element's length, a window and rank-4 inputs give
// what the equivalent valid lengths and rank-3 calls give.
TEST_P(FunctionalAdditive, MasksWindowsAndRanksAgreeWithTheirEquivalents) {
  Rng rng(6);
  const int64_t batch = 2, n = 30, m = 80;
  const Tensor q = random_tensor(Shape{batch, n, 6}, rng),
               k = random_tensor(Shape{batch, m, 4}, rng),
               v = random_tensor(Shape{batch, m, 3}, rng);
  const Parameters p = random_parameters(8, 6, 4, rng);
  AttentionOptions by_lengths;
  by_lengths.valid_lens = ValidLengths::per_batch({m - 5, 37});
  std::vector<uint8_t> bytes(static_cast<size_t>(batch * m));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t j = 0; j < m; ++j)
      bytes[static_cast<size_t>(b * m + j)] = j < (b == 0 ? m - 5 : 37);
  AttentionOptions by_mask;
  by_mask.attn_mask =
      AttentionMask::boolean(StridedView<const uint8_t>(bytes.data(), Shape{batch, 1, m}));
  const Tensor expected = additive_attention(q, k, v, p.view(), by_lengths).output;
  EXPECT_TRUE(
      close_to(additive_attention(q, k, v, p.view(), by_mask).output, to_doubles(expected), 1e-6));

  // Window (left 0, right 9) from the top-left diagonal = per-query lengths i + 10 on keys ≥ i.
  AttentionOptions window;
  window.window = SlidingWindow{0, 9};
  std::vector<int64_t> per_query;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < n; ++i) per_query.push_back(std::min<int64_t>(i + 10, m));
  const Tensor windowed = additive_attention(q, k, v, p.view(), window).output;
  const Tensor weights = additive_attention_weights(
      q, k, p.view(), additive_attention(q, k, v, p.view(), window).log_sum_exp, window);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) {
        const bool visible = j >= i && j <= i + 9;
        if (!visible)
          EXPECT_EQ(weights(b, i, j), 0.0F) << b << " " << i << " " << j;
        else
          EXPECT_GT(weights(b, i, j), 0.0F) << b << " " << i << " " << j;
      }
  (void)windowed;

  // (2, 1, n, ·) inputs: the same numbers as (2, n, ·).
  Tensor q4 = q, k4 = k, v4 = v;
  q4.reshape(Shape{batch, 1, n, 6});
  k4.reshape(Shape{batch, 1, m, 4});
  v4.reshape(Shape{batch, 1, m, 3});
  const Tensor rank4 = additive_attention(q4, k4, v4, p.view(), by_lengths).output;
  EXPECT_EQ(rank4.shape(), (Shape{batch, 1, n, 3}));
  EXPECT_TRUE(close_to(rank4, to_doubles(expected), 0.0));
}

// A float mask adding one constant to a whole row changes nothing (softmax ignores it), however
// far below zero: with w_v = 0 every score is 0, so the masked scores are the constant exactly and
// the float log-sum-exp's rounding of it (log(m) lost at −1e9) is all that could differ. Before
// the rows' totals, that row's weights summed to m and its dV and dw_v terms were m times too
// large.
TEST_P(FunctionalAdditive, ARowMaskedFarBelowZeroKeepsItsWeightsAndGradients) {
  Rng rng(8);
  const int64_t batch = 2, n = 6, m = 9;
  const Tensor q = random_tensor(Shape{batch, n, 3}, rng),
               k = random_tensor(Shape{batch, m, 4}, rng),
               v = random_tensor(Shape{batch, m, 5}, rng),
               g = random_tensor(Shape{batch, n, 5}, rng);
  Parameters p = random_parameters(8, 3, 4, rng);
  std::fill_n(p.w_v.data(), p.w_v.numel(), 0.0F);
  const AttentionOptions plain;
  const AttentionForward expected = additive_attention(q, k, v, p.view(), plain);
  const AdditiveGradients expected_grads = additive_attention_backward(
      q, k, v, p.view(), expected.output, g, expected.log_sum_exp, plain);
  for (const float far : {-1e4F, -1e9F}) {
    SCOPED_TRACE("mask " + std::to_string(far));
    Tensor mask(Shape{n, m});
    for (int64_t j = 0; j < m; ++j) mask(2, j) = far;
    AttentionOptions masked;
    masked.attn_mask = AttentionMask::additive(mask);
    const AttentionForward forward = additive_attention(q, k, v, p.view(), masked);
    EXPECT_TRUE(close_to(forward.output, to_doubles(expected.output), 1e-6));
    EXPECT_TRUE(close_to(
        additive_attention_weights(q, k, p.view(), forward.log_sum_exp, masked),
        to_doubles(additive_attention_weights(q, k, p.view(), expected.log_sum_exp, plain)), 1e-6));
    const AdditiveGradients grads = additive_attention_backward(q, k, v, p.view(), forward.output,
                                                                g, forward.log_sum_exp, masked);
    EXPECT_TRUE(close_to(grads.values, to_doubles(expected_grads.values), 1e-6)) << "values";
    EXPECT_TRUE(close_to(grads.w_v, to_doubles(expected_grads.w_v), 1e-5)) << "w_v";
    EXPECT_TRUE(close_to(grads.queries, to_doubles(expected_grads.queries), 1e-6)) << "queries";
  }
}

// The forward pass's projections handed back: the same gradients and weights, bit for bit, as
// projecting again (the tests above check those against the reference).
TEST_P(FunctionalAdditive, KeptProjectionsGiveTheSameGradientsAndWeights) {
  Rng rng(11);
  const Tensor q = random_tensor(Shape{3, 5, 4}, rng), k = random_tensor(Shape{3, 19, 6}, rng);
  const Tensor v = random_tensor(Shape{3, 19, 2}, rng), g = random_tensor(Shape{3, 5, 2}, rng);
  const Parameters p = random_parameters(8, 4, 6, rng);
  AttentionOptions options;
  options.valid_lens = ValidLengths::per_batch({19, 7, 1});
  AdditiveProjections kept;
  const AttentionForward forward = additive_attention(q, k, v, p.view(), options, &kept);
  ASSERT_EQ(kept.queries.shape(), (Shape{3, 5, 8}));
  ASSERT_EQ(kept.keys.shape(), (Shape{3, 19, 8}));
  const AdditiveGradients again = additive_attention_backward(q, k, v, p.view(), forward.output, g,
                                                              forward.log_sum_exp, options);
  const AdditiveGradients reused = additive_attention_backward(q, k, v, p.view(), forward.output, g,
                                                               forward.log_sum_exp, options, &kept);
  const auto same = [](const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() && std::equal(a.data(), a.data() + a.numel(), b.data());
  };
  EXPECT_TRUE(same(reused.queries, again.queries));
  EXPECT_TRUE(same(reused.keys, again.keys));
  EXPECT_TRUE(same(reused.values, again.values));
  EXPECT_TRUE(same(reused.W_q, again.W_q));
  EXPECT_TRUE(same(reused.W_k, again.W_k));
  EXPECT_TRUE(same(reused.w_v, again.w_v));
  EXPECT_TRUE(same(additive_attention_weights(q, k, p.view(), forward.log_sum_exp, options, &kept),
                   additive_attention_weights(q, k, p.view(), forward.log_sum_exp, options)));
}

ATTN_INSTANTIATE_FOR_EVERY_SIMD_TARGET(FunctionalAdditive);

TEST(FunctionalAdditiveArguments, NamesWhatIsWrong) {
  const Tensor q(Shape{1, 2, 3}), k(Shape{1, 4, 5}), v(Shape{1, 4, 2});
  const Tensor W_q(Shape{6, 3}), W_k(Shape{6, 5}), w_v(Shape{6});
  const AdditiveParameters p{W_q, W_k, w_v.span()};
  EXPECT_THROW_MESSAGE(
      additive_attention(q, k, v, {W_q, Tensor(Shape{6, 4}), w_v.span()}), ShapeError,
      "W_k: expected shape (6, 5) (num_hiddens × the last axis of keys), got (6, 4)");
  EXPECT_THROW_MESSAGE(
      additive_attention(q, k, v, {W_q, W_k, std::span<const float>(w_v.data(), 5)}), ShapeError,
      "w_v: expected 6 weights (num_hiddens, as W_q), got 5");
  Tensor infinite_w_v(Shape{6});
  infinite_w_v.data()[3] = INFINITY;
  const AdditiveParameters infinite{W_q, W_k, infinite_w_v.span()};
  EXPECT_THROW_MESSAGE(additive_attention(q, k, v, infinite), ValueError,
                       "w_v: expected finite values, got inf at index 3");
  EXPECT_THROW_MESSAGE(additive_attention_weights(q, k, infinite, std::vector<float>(2), {}),
                       ValueError, "w_v: expected finite values");
  // Finite weights whose scores could overflow (Σ|w_v| bounds them): a NaN output before.
  Tensor huge_w_v(Shape{6});
  std::fill_n(huge_w_v.data(), 6, 1e37F);
  const AdditiveParameters huge{W_q, W_k, huge_w_v.span()};
  EXPECT_THROW_MESSAGE(additive_attention(q, k, v, huge), ValueError,
                       "w_v: scores could overflow float32 (Σ|w_v| = 6e+37");
  EXPECT_THROW_MESSAGE(additive_attention_weights(q, k, huge, std::vector<float>(2), {}),
                       ValueError, "w_v: scores could overflow float32");
  AttentionOptions softcap;
  softcap.softcap = 2.0F;
  EXPECT_THROW_MESSAGE(additive_attention(q, k, v, p, softcap), ValueError,
                       "softcap: additive attention takes no scale, softcap");
  AttentionOptions scale;
  scale.scale = 2.0F;
  EXPECT_THROW_MESSAGE(additive_attention(q, k, v, p, scale), ValueError,
                       "scale: additive attention");
  const AdditiveProjections wrong{Tensor(Shape{1, 2, 6}), Tensor(Shape{1, 3, 6})};
  const std::vector<float> lse(2);
  EXPECT_THROW_MESSAGE(additive_attention_weights(q, k, p, lse, {}, &wrong), ShapeError,
                       "projections.keys: expected shape (1, 4, 6) (the forward pass's "
                       "projection), got (1, 3, 6)");
  // The inputs' shapes against each other, as passed: these were found on the projections and
  // named "key: expected the leading axes of query (1, 2, 6) ..." and "the shape of key (1, 4, 6)".
  const std::string batch_error =
      "keys: expected the axes before (S, key size) to be those of queries (1,), got shape (2, 4, "
      "5) (queries (1, 2, 3))";
  EXPECT_THROW_MESSAGE(additive_attention(q, Tensor(Shape{2, 4, 5}), Tensor(Shape{2, 4, 2}), p),
                       ShapeError, batch_error);
  EXPECT_THROW_MESSAGE(
      additive_attention_weights(q, Tensor(Shape{2, 4, 5}), p, std::vector<float>(2), {}),
      ShapeError, batch_error);
  EXPECT_THROW_MESSAGE(additive_attention(q, k, Tensor(Shape{1, 9, 2}), p), ShapeError,
                       "values: expected the shape of keys (1, 4) up to the last axis, got shape "
                       "(1, 9, 2)");
  EXPECT_THROW_MESSAGE(additive_attention_backward(q, k, Tensor(Shape{1, 9, 2}), p, Tensor(),
                                                   Tensor(), std::vector<float>(2), {}),
                       ShapeError, "values: expected the shape of keys (1, 4)");
}

}  // namespace
}  // namespace attn
