// Finite in, finite out: finite inputs whose exact result is finite give that result (to float
// round-off) — values near float's maximum overflowed the kernels' unnormalised sums before — and a
// result that does overflow float is an error naming the inputs, never an infinity.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/core/random.hpp"
#include "attn/functional/additive_attention.hpp"
#include "attn/functional/scaled_dot_product_attention.hpp"
#include "attn/nn/general_attention.hpp"
#include "attn/nn/multi_head_attention.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

constexpr float kNearMax = 3.0e38F;  // float's maximum is 3.4028e38

Tensor random(const Shape& shape, uint64_t seed, float scale) {
  Rng rng(seed);
  Tensor tensor(shape);
  for (float& value : tensor.span()) value = scale * rng.uniform(-1.0F, 1.0F);
  return tensor;
}

bool all_finite(const Tensor& tensor) {
  for (const float value : tensor.span()) {
    if (!std::isfinite(value)) return false;
  }
  return true;
}

// Single-head dot-product attention in double: (L, E), (S, E), (S, Ev) → P (L, S) and O (L, Ev).
struct Reference {
  std::vector<std::vector<double>> p, o;
};

Reference reference_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  const int64_t L = q.dim(0), S = k.dim(0), E = q.dim(1), Ev = v.dim(1);
  Reference r{std::vector<std::vector<double>>(L, std::vector<double>(S)),
              std::vector<std::vector<double>>(L, std::vector<double>(Ev))};
  for (int64_t i = 0; i < L; ++i) {
    std::vector<double> s(S);
    double max = -std::numeric_limits<double>::infinity(), sum = 0.0;
    for (int64_t j = 0; j < S; ++j) {
      for (int64_t e = 0; e < E; ++e) s[j] += scale * q(i, e) * k(j, e);
      max = std::max(max, s[j]);
    }
    for (int64_t j = 0; j < S; ++j) sum += std::exp(s[j] - max);
    for (int64_t j = 0; j < S; ++j) {
      r.p[i][j] = std::exp(s[j] - max) / sum;
      for (int64_t c = 0; c < Ev; ++c) r.o[i][c] += r.p[i][j] * static_cast<double>(v(j, c));
    }
  }
  return r;
}

// The gradients of sum(O ⊙ G) in double: dQ, dK, dV.
struct ReferenceGradients {
  std::vector<std::vector<double>> dq, dk, dv;
};

ReferenceGradients reference_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const Tensor& g, double scale) {
  const int64_t L = q.dim(0), S = k.dim(0), E = q.dim(1), Ev = v.dim(1);
  const Reference r = reference_forward(q, k, v, scale);
  ReferenceGradients d{std::vector<std::vector<double>>(L, std::vector<double>(E)),
                       std::vector<std::vector<double>>(S, std::vector<double>(E)),
                       std::vector<std::vector<double>>(S, std::vector<double>(Ev))};
  for (int64_t i = 0; i < L; ++i) {
    double row = 0.0;  // D_i = G_i · O_i
    for (int64_t c = 0; c < Ev; ++c) row += static_cast<double>(g(i, c)) * r.o[i][c];
    for (int64_t j = 0; j < S; ++j) {
      double dp = 0.0;
      for (int64_t c = 0; c < Ev; ++c) {
        dp += static_cast<double>(g(i, c)) * static_cast<double>(v(j, c));
        d.dv[j][c] += r.p[i][j] * static_cast<double>(g(i, c));
      }
      const double ds = r.p[i][j] * (dp - row) * scale;
      for (int64_t e = 0; e < E; ++e) {
        d.dq[i][e] += ds * static_cast<double>(k(j, e));
        d.dk[j][e] += ds * static_cast<double>(q(i, e));
      }
    }
  }
  return d;
}

// |actual − expected| within 1e-5 of the largest expected magnitude (float round-off of sums).
void expect_close(const Tensor& actual, const std::vector<std::vector<double>>& expected,
                  const char* what) {
  double largest = 0.0;
  for (const auto& row : expected)
    for (const double x : row) largest = std::max(largest, std::fabs(x));
  ASSERT_TRUE(all_finite(actual)) << what << " is not finite";
  const int64_t cols = actual.dim(-1);
  for (size_t i = 0; i < expected.size(); ++i) {
    for (size_t c = 0; c < expected[i].size(); ++c) {
      const float value = actual.data()[static_cast<int64_t>(i) * cols + static_cast<int64_t>(c)];
      EXPECT_NEAR(value, expected[i][c], 1e-5 * largest) << what << "[" << i << ", " << c << "]";
    }
  }
}

TEST(HostileFinite, DotProductForwardWithValuesNearFloatMax) {
  // 64 keys: the kernel's unnormalised sum reaches 64 · 3e38 without the scaling.
  const Tensor q = random(Shape{5, 8}, 1, 1.0F), k = random(Shape{64, 8}, 2, 1.0F);
  const Tensor v = random(Shape{64, 4}, 3, kNearMax);
  const AttentionForward forward = scaled_dot_product_attention(q, k, v, {});
  expect_close(forward.output, reference_forward(q, k, v, 1.0 / std::sqrt(8.0)).o, "output");
  // The same values all at +3e38: each output is exactly 3e38 (a convex combination).
  const Tensor same = Tensor::full(Shape{64, 4}, kNearMax);
  const AttentionForward flat = scaled_dot_product_attention(q, k, same, {});
  for (const float value : flat.output.span()) EXPECT_NEAR(value, kNearMax, 1e-5 * kNearMax);
}

TEST(HostileFinite, DotProductForwardKeepsSmallValuesOfOrdinaryInputsExact) {
  // Ordinary magnitudes take no scaling at all: outputs identical to a run on the same inputs.
  const Tensor q = random(Shape{2, 3, 4}, 4, 1.0F), k = random(Shape{2, 9, 4}, 5, 1.0F);
  const Tensor v = random(Shape{2, 9, 5}, 6, 1e-30F);
  const AttentionForward forward = scaled_dot_product_attention(q, k, v, {});
  EXPECT_TRUE(all_finite(forward.output));
  double largest = 0.0;
  for (const float value : forward.output.span())
    largest = std::max(largest, std::fabs(double{value}));
  EXPECT_GT(largest, 1e-32);
}

TEST(HostileFinite, DotProductBackwardWithValuesNearFloatMax) {
  // V ~ 1e38 makes dP = G·Vᵀ ~ 4e38 and the kernel's dS overflow; the exact dQ and dK are finite
  // because the keys and queries are small.
  const Tensor q = random(Shape{4, 3}, 7, 1e-3F), k = random(Shape{16, 3}, 8, 1e-3F);
  const Tensor v = random(Shape{16, 4}, 9, 1e38F), g = random(Shape{4, 4}, 10, 1.0F);
  const double scale = 1.0 / std::sqrt(3.0);
  const AttentionForward forward = scaled_dot_product_attention(q, k, v, {});
  ASSERT_TRUE(all_finite(forward.output));
  const AttentionBackward grads =
      scaled_dot_product_attention_backward(q, k, v, forward.output, g, forward.log_sum_exp, {});
  const ReferenceGradients expected = reference_backward(q, k, v, g, scale);
  expect_close(grads.value, expected.dv, "grad_value");
  expect_close(grads.query, expected.dq, "grad_query");
  expect_close(grads.key, expected.dk, "grad_key");
}

TEST(HostileFinite, DotProductBackwardWithGradOutputNearFloatMax) {
  // dV sums 64 rows of G ~ 3e38 / 64: finite exactly, but the kernel's partial sums are not
  // bounded by that unless G is scaled first.
  const Tensor q = random(Shape{64, 2}, 11, 1.0F), k = random(Shape{3, 2}, 12, 1.0F);
  const Tensor v = random(Shape{3, 2}, 13, 1.0F);
  const Tensor g = Tensor::full(Shape{64, 2}, kNearMax / 64.0F);
  const AttentionForward forward = scaled_dot_product_attention(q, k, v, {});
  const AttentionBackward grads =
      scaled_dot_product_attention_backward(q, k, v, forward.output, g, forward.log_sum_exp, {});
  const ReferenceGradients expected = reference_backward(q, k, v, g, 1.0 / std::sqrt(2.0));
  expect_close(grads.value, expected.dv, "grad_value");
  expect_close(grads.query, expected.dq, "grad_query");
  expect_close(grads.key, expected.dk, "grad_key");
}

TEST(HostileFinite, GradientsThatOverflowFloatAreErrorsNamingTheInputs) {
  // G = 3e38 on 64 queries that all attend to one key: dV of that key is 64 · 3e38, which no
  // float holds.
  const Tensor q = Tensor::full(Shape{64, 2}, 0.0F), k = Tensor::full(Shape{1, 2}, 1.0F);
  const Tensor v = Tensor::full(Shape{1, 2}, 1.0F), g = Tensor::full(Shape{64, 2}, kNearMax);
  const AttentionForward forward = scaled_dot_product_attention(q, k, v, {});
  EXPECT_THROW_MESSAGE(
      scaled_dot_product_attention_backward(q, k, v, forward.output, g, forward.log_sum_exp, {}),
      ValueError, "grad_value: the exact result overflows float32");
}

TEST(HostileFinite, AdditiveForwardAndBackwardWithValuesNearFloatMax) {
  // W_q, W_k and w_v small: the weights are near uniform, the output a mean of values ~ 3e38.
  const Tensor queries = random(Shape{1, 3, 2}, 14, 1.0F), keys = random(Shape{1, 32, 2}, 15, 1.0F);
  const Tensor values = random(Shape{1, 32, 3}, 16, kNearMax);
  const Tensor W_q = random(Shape{4, 2}, 17, 0.1F), W_k = random(Shape{4, 2}, 18, 0.1F);
  const std::vector<float> w_v = {0.1F, -0.2F, 0.05F, 0.1F};
  const AdditiveParameters parameters{W_q, W_k, w_v};
  const AttentionForward forward = additive_attention(queries, keys, values, parameters, {});
  ASSERT_TRUE(all_finite(forward.output));
  // Each output is a convex combination: within the values' range.
  for (const float value : forward.output.span()) EXPECT_LE(std::fabs(value), kNearMax);
  const Tensor g = random(Shape{1, 3, 3}, 19, 1.0F);
  const AdditiveGradients grads = additive_attention_backward(
      queries, keys, values, parameters, forward.output, g, forward.log_sum_exp, {});
  for (const Tensor* gradient :
       {&grads.values, &grads.queries, &grads.keys, &grads.W_q, &grads.W_k, &grads.w_v}) {
    EXPECT_TRUE(all_finite(*gradient));
  }
  // dV = Pᵀ G does not involve the values: compare it with the weights' own computation.
  const Tensor weights =
      additive_attention_weights(queries, keys, parameters, forward.log_sum_exp, {});
  for (int64_t j = 0; j < 32; ++j) {
    for (int64_t c = 0; c < 3; ++c) {
      double expected = 0.0;
      for (int64_t i = 0; i < 3; ++i) expected += double{weights(0, i, j)} * g(0, i, c);
      EXPECT_NEAR(grads.values(0, j, c), expected, 1e-5);
    }
  }
}

TEST(HostileFinite, AdditiveProjectionsThatOverflowAreErrorsNamingThem) {
  const Tensor queries = Tensor::full(Shape{1, 1, 4}, kNearMax),
               keys = random(Shape{1, 2, 2}, 20, 1.0F);
  const Tensor values = random(Shape{1, 2, 2}, 21, 1.0F);
  const Tensor W_q = Tensor::full(Shape{3, 4}, 2.0F), W_k = random(Shape{3, 2}, 22, 1.0F);
  const std::vector<float> w_v = {1.0F, 1.0F, 1.0F};
  EXPECT_THROW_MESSAGE(additive_attention(queries, keys, values, {W_q, W_k, w_v}, {}), ValueError,
                       "queries·W_qᵀ: the exact result overflows float32");
}

// A multi-head layer whose projections are identities (num_hiddens = every size = 2, one head).
MultiHeadAttention identity_layer(float w_o_scale) {
  MultiHeadAttention layer(2, 2, 2, 2, 1, 0.0F);
  StateDict state;
  const Tensor identity(Shape{2, 2}, {1.0F, 0.0F, 0.0F, 1.0F});
  state.emplace("W_q.weight", identity);
  state.emplace("W_k.weight", identity);
  state.emplace("W_v.weight", identity);
  state.emplace("W_o.weight", Tensor(Shape{2, 2}, {w_o_scale, 0.0F, 0.0F, w_o_scale}));
  layer.load_state_dict(state);
  layer.eval();
  return layer;
}

TEST(HostileFinite, MultiHeadWithValuesNearFloatMaxForwardAndBackward) {
  MultiHeadAttention layer = identity_layer(1.0F);
  const Tensor queries = random(Shape{1, 3, 2}, 23, 1.0F), keys = random(Shape{1, 40, 2}, 24, 1.0F);
  const Tensor values = random(Shape{1, 40, 2}, 25, kNearMax);
  const Tensor output = layer(queries, keys, values);
  const Reference expected =
      reference_forward(Tensor::from(queries.view().reshaped(Shape{3, 2})),
                        Tensor::from(keys.view().reshaped(Shape{40, 2})),
                        Tensor::from(values.view().reshaped(Shape{40, 2})), 1.0 / std::sqrt(2.0));
  expect_close(output, expected.o, "output");
  const AttentionGradients grads = layer.backward(random(Shape{1, 3, 2}, 26, 1e-30F));
  EXPECT_TRUE(all_finite(grads.queries) && all_finite(grads.keys) && all_finite(grads.values));
}

TEST(HostileFinite, MultiHeadOutputProjectionThatOverflowsNamesW_o) {
  // A finite W_o of 3e38 times outputs of size ~1: the product is beyond float.
  MultiHeadAttention layer = identity_layer(kNearMax);
  const Tensor queries = random(Shape{1, 2, 2}, 27, 1.0F), keys = random(Shape{1, 3, 2}, 28, 1.0F);
  const Tensor values = Tensor::full(Shape{1, 3, 2}, 4.0F);
  EXPECT_THROW_MESSAGE(layer(queries, keys, values), ValueError,
                       "W_o: the projection of the concatenated heads overflows float32");
}

TEST(HostileFinite, NonFiniteParametersAreNamed) {
  MultiHeadAttention layer = identity_layer(1.0F);
  StateDict state = layer.state_dict();
  state.at("W_v.weight").data()[1] = std::numeric_limits<float>::quiet_NaN();
  layer.load_state_dict(state);
  const Tensor x = random(Shape{1, 2, 2}, 29, 1.0F);
  EXPECT_THROW_MESSAGE(layer(x, x, x), ValueError, "W_v.weight: expected finite values");
}

TEST(HostileFinite, GeneralAttentionNamesWhatIsNotFiniteAndItsProjection) {
  GeneralAttention layer(2, 2);
  StateDict state = layer.state_dict();
  std::fill_n(state.at("W.weight").data(), 4, kNearMax);
  layer.load_state_dict(state);
  const Tensor x = Tensor::full(Shape{1, 2, 2}, 4.0F);
  EXPECT_THROW_MESSAGE(layer(x, x, x), ValueError,
                       "W: the projection of the queries overflows float32");
  state.at("W.weight").data()[1] = std::numeric_limits<float>::quiet_NaN();
  layer.load_state_dict(state);
  EXPECT_THROW_MESSAGE(layer(x, x, x), ValueError, "W.weight: expected finite values");
  GeneralAttention plain(2, 2);
  Tensor bad = x;
  bad.data()[3] = std::numeric_limits<float>::infinity();
  EXPECT_THROW_MESSAGE(plain(x, x, bad), ValueError, "values: expected finite values");
  EXPECT_THROW_MESSAGE(plain(bad, x, x), ValueError, "queries: expected finite values");
  EXPECT_THROW_MESSAGE(plain(x, bad, x), ValueError, "keys: expected finite values");
}

}  // namespace
}  // namespace attn
