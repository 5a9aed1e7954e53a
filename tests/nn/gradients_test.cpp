// Every layer's backward pass against central finite differences of the double-precision
// reference forward pass: the loss is sum(output ⊙ G) for a fixed random G, over random shapes
// and masks (valid length 0 and m, per-query lengths, n = 1, m = 1), in training mode with dropout
// (the reference reuses the layer's dropout multipliers) and in evaluation mode.
#include <gtest/gtest.h>

#include <functional>

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
using testing::dot;
using testing::numerical_gradients;
using testing::random_tensor;
using testing::to_doubles;
using Flat = std::vector<double>;
using Arguments = std::vector<Flat>;

// The backward passes run in float32 through at most four chained products of ≤ 64 terms; their
// round-off stays near 1e-6 of the gradient's magnitude. Central differences in double with
// h = 1e-5 have truncation error ~h²·|f'''| ≈ 1e-10. 1e-4 (the bound) leaves wide margin
// while any wrong term gives errors of order one.
constexpr double kGradientTolerance = 1e-4;
constexpr double kStep = 1e-5;

reference::Array<double> array(const Flat& values, const Shape& shape) {
  reference::Array<double> result(std::vector<int64_t>(shape.data(), shape.data() + shape.rank()));
  result.values = values;
  return result;
}

struct Case {
  int64_t batch, queries, keys;
  int mask_kind;  // 0 none, 1 per batch, 2 per query
  bool training;
};

const Case kCases[] = {{1, 1, 1, 0, false},
                       {2, 3, 4, 1, true},
                       {2, 3, 5, 2, true},
                       {1, 4, 1, 2, false},
                       {3, 2, 6, 1, false}};

ValidLengths mask_for(const Case& c) {
  if (c.mask_kind == 1) {
    std::vector<int64_t> lengths;
    for (int64_t b = 0; b < c.batch; ++b) lengths.push_back(b == 0 ? 0 : b == 1 ? c.keys : 1);
    return ValidLengths::per_batch(lengths);
  }
  if (c.mask_kind == 2) {
    std::vector<int64_t> lengths;
    for (int64_t index = 0; index < c.batch * c.queries; ++index)
      lengths.push_back(index % (c.keys + 1));
    return ValidLengths::per_query(lengths, c.batch, c.queries);
  }
  return {};
}

std::string describe(const Case& c) {
  return "B=" + std::to_string(c.batch) + " n=" + std::to_string(c.queries) +
         " m=" + std::to_string(c.keys) + " mask=" + std::to_string(c.mask_kind) +
         (c.training ? " training" : " eval");
}

TEST(Gradients, DotProductAttention) {
  Rng rng(31);
  for (const Case& c : kCases) {
    const Shape q_shape{c.batch, c.queries, 4}, k_shape{c.batch, c.keys, 4},
        v_shape{c.batch, c.keys, 3};
    const Tensor q = random_tensor(q_shape, rng), k = random_tensor(k_shape, rng),
                 v = random_tensor(v_shape, rng);
    const Tensor g = random_tensor(Shape{c.batch, c.queries, 3}, rng);
    const ValidLengths mask = mask_for(c);
    DotProductAttention attention(0.3F, std::nullopt, 5);
    attention.train(c.training);
    attention(q, k, v, mask);
    const AttentionGradients grads = attention.backward(g);
    const Flat dropout = to_doubles(attention.dropout_mask());
    const auto lengths = testing::expand(mask, c.batch, c.queries, c.keys);
    const auto loss = [&](const Arguments& a) {
      return dot(reference::dot_product_attention(array(a[0], q_shape), array(a[1], k_shape),
                                                  array(a[2], v_shape), lengths, 0.5, dropout)
                     .output.values,
                 to_doubles(g));
    };
    const Arguments expected =
        numerical_gradients(loss, {to_doubles(q), to_doubles(k), to_doubles(v)}, kStep);
    EXPECT_TRUE(close_to(grads.queries, expected[0], kGradientTolerance)) << describe(c);
    EXPECT_TRUE(close_to(grads.keys, expected[1], kGradientTolerance)) << describe(c);
    EXPECT_TRUE(close_to(grads.values, expected[2], kGradientTolerance)) << describe(c);
  }
}

// Luong's general score: the reference is the dot-product reference, unscaled, on W q.
TEST(Gradients, GeneralAttention) {
  Rng rng(35);
  for (const Case& c : kCases) {
    const Shape q_shape{c.batch, c.queries, 3}, k_shape{c.batch, c.keys, 4},
        v_shape{c.batch, c.keys, 2};
    const Tensor q = random_tensor(q_shape, rng), k = random_tensor(k_shape, rng),
                 v = random_tensor(v_shape, rng);
    const Tensor g = random_tensor(Shape{c.batch, c.queries, 2}, rng);
    const ValidLengths mask = mask_for(c);
    for (const AttentionPath path : {AttentionPath::kFused, AttentionPath::kReference}) {
      GeneralAttention attention(/*query_size=*/3, /*key_size=*/4, 0.3F, 9);
      attention.set_path(path);
      attention.train(c.training);
      attention(q, k, v, mask);
      const AttentionGradients grads = attention.backward(g);
      const Flat dropout = to_doubles(attention.dropout_mask());
      const auto lengths = testing::expand(mask, c.batch, c.queries, c.keys);
      const Tensor W = attention.state_dict().at("W.weight");
      const auto loss = [&](const Arguments& a) {
        const reference::Array<double> projected =
            reference::linear(array(a[0], q_shape), a[3], {}, 4);
        return dot(reference::dot_product_attention(projected, array(a[1], k_shape),
                                                    array(a[2], v_shape), lengths, 1.0, dropout)
                       .output.values,
                   to_doubles(g));
      };
      const Arguments expected = numerical_gradients(
          loss, {to_doubles(q), to_doubles(k), to_doubles(v), to_doubles(W)}, kStep);
      const std::string label =
          describe(c) + (path == AttentionPath::kFused ? " fused" : " reference");
      EXPECT_TRUE(close_to(grads.queries, expected[0], kGradientTolerance)) << label;
      EXPECT_TRUE(close_to(grads.keys, expected[1], kGradientTolerance)) << label;
      EXPECT_TRUE(close_to(grads.values, expected[2], kGradientTolerance)) << label;
      EXPECT_TRUE(close_to(attention.parameters()[0].grad->view(), expected[3], kGradientTolerance))
          << label;
    }
  }
}

TEST(Gradients, AdditiveAttention) {
  Rng rng(32);
  for (const Case& c : kCases) {
    const Shape q_shape{c.batch, c.queries, 3}, k_shape{c.batch, c.keys, 2},
        v_shape{c.batch, c.keys, 2};
    const Tensor q = random_tensor(q_shape, rng), k = random_tensor(k_shape, rng),
                 v = random_tensor(v_shape, rng);
    const Tensor g = random_tensor(Shape{c.batch, c.queries, 2}, rng);
    const ValidLengths mask = mask_for(c);
    AdditiveAttention attention(/*key_size=*/2, /*query_size=*/3, /*num_hiddens=*/5, 0.3F, 7);
    attention.train(c.training);
    attention(q, k, v, mask);
    const AttentionGradients grads = attention.backward(g);
    const Flat dropout = to_doubles(attention.dropout_mask());
    const auto lengths = testing::expand(mask, c.batch, c.queries, c.keys);
    const StateDict state = attention.state_dict();
    const auto loss = [&](const Arguments& a) {
      return dot(
          reference::additive_attention(array(a[0], q_shape), array(a[1], k_shape),
                                        array(a[2], v_shape), lengths, a[3], a[4], a[5], dropout)
              .output.values,
          to_doubles(g));
    };
    const Arguments expected = numerical_gradients(
        loss,
        {to_doubles(q), to_doubles(k), to_doubles(v), to_doubles(state.at("W_q.weight")),
         to_doubles(state.at("W_k.weight")), to_doubles(state.at("w_v.weight"))},
        kStep);
    EXPECT_TRUE(close_to(grads.queries, expected[0], kGradientTolerance)) << describe(c);
    EXPECT_TRUE(close_to(grads.keys, expected[1], kGradientTolerance)) << describe(c);
    EXPECT_TRUE(close_to(grads.values, expected[2], kGradientTolerance)) << describe(c);
    std::map<std::string, const Tensor*> parameter_grads;
    for (const NamedParameter& parameter : attention.parameters())
      parameter_grads[parameter.name] = parameter.grad;
    EXPECT_TRUE(close_to(*parameter_grads.at("W_q.weight"), expected[3], kGradientTolerance))
        << describe(c);
    EXPECT_TRUE(close_to(*parameter_grads.at("W_k.weight"), expected[4], kGradientTolerance))
        << describe(c);
    EXPECT_TRUE(close_to(*parameter_grads.at("w_v.weight"), expected[5], kGradientTolerance))
        << describe(c);
  }
}

TEST(Gradients, GaussianKernelPooling) {
  Rng rng(33);
  for (const Case& c : kCases) {
    const Shape q_shape{c.batch, c.queries, 2}, k_shape{c.batch, c.keys, 2},
        v_shape{c.batch, c.keys, 3};
    const Tensor q = random_tensor(q_shape, rng), k = random_tensor(k_shape, rng),
                 v = random_tensor(v_shape, rng);
    const Tensor g = random_tensor(Shape{c.batch, c.queries, 3}, rng);
    const ValidLengths mask = mask_for(c);
    GaussianKernelPooling pooling(1.7F, 0.3F, 9);
    pooling.train(c.training);
    pooling(q, k, v, mask);
    const AttentionGradients grads = pooling.backward(g);
    const Flat dropout = to_doubles(pooling.dropout_mask());
    const auto lengths = testing::expand(mask, c.batch, c.queries, c.keys);
    const auto loss = [&](const Arguments& a) {
      return dot(reference::gaussian_kernel_pooling(array(a[0], q_shape), array(a[1], k_shape),
                                                    array(a[2], v_shape), lengths, a[3][0], dropout)
                     .output.values,
                 to_doubles(g));
    };
    const Arguments expected =
        numerical_gradients(loss, {to_doubles(q), to_doubles(k), to_doubles(v), {1.7F}}, kStep);
    EXPECT_TRUE(close_to(grads.queries, expected[0], kGradientTolerance)) << describe(c);
    EXPECT_TRUE(close_to(grads.keys, expected[1], kGradientTolerance)) << describe(c);
    EXPECT_TRUE(close_to(grads.values, expected[2], kGradientTolerance)) << describe(c);
    EXPECT_TRUE(close_to(*pooling.parameters().at(0).grad, expected[3], kGradientTolerance))
        << describe(c);
  }
}

TEST(Gradients, MultiHeadAttention) {
  Rng rng(34);
  for (const bool bias : {false, true})
    for (const Case& c : kCases) {
      const Shape q_shape{c.batch, c.queries, 3}, k_shape{c.batch, c.keys, 4},
          v_shape{c.batch, c.keys, 2};
      const Tensor q = random_tensor(q_shape, rng), k = random_tensor(k_shape, rng),
                   v = random_tensor(v_shape, rng);
      const Tensor g = random_tensor(Shape{c.batch, c.queries, 6}, rng);
      const ValidLengths mask = mask_for(c);
      MultiHeadAttention attention(/*key_size=*/4, /*query_size=*/3, /*value_size=*/2,
                                   /*num_hiddens=*/6,
                                   /*num_heads=*/2, 0.3F, bias, 11);
      attention.train(c.training);
      attention(q, k, v, mask);
      const AttentionGradients grads = attention.backward(g);
      const Flat dropout = to_doubles(attention.dropout_mask());
      const auto lengths = testing::expand(mask, c.batch, c.queries, c.keys);
      const std::vector<NamedParameter> parameters = attention.parameters();
      Arguments arguments{to_doubles(q), to_doubles(k), to_doubles(v)};
      for (const NamedParameter& parameter : parameters)
        arguments.push_back(to_doubles(*parameter.tensor));
      const auto loss = [&](const Arguments& a) {
        // parameters() lists W_q, W_k, W_v, W_o, each weight followed by its bias when there is
        // one.
        reference::MultiHeadParameters p;
        size_t next = 3;
        for (auto [weight, bias_vector] : {std::pair{&p.W_q, &p.b_q}, std::pair{&p.W_k, &p.b_k},
                                           std::pair{&p.W_v, &p.b_v}, std::pair{&p.W_o, &p.b_o}}) {
          *weight = a[next++];
          if (bias) *bias_vector = a[next++];
        }
        return dot(reference::multi_head_attention(array(a[0], q_shape), array(a[1], k_shape),
                                                   array(a[2], v_shape), lengths, p, 6, 2, dropout)
                       .output.values,
                   to_doubles(g));
      };
      const Arguments expected = numerical_gradients(loss, arguments, kStep);
      EXPECT_TRUE(close_to(grads.queries, expected[0], kGradientTolerance)) << describe(c);
      EXPECT_TRUE(close_to(grads.keys, expected[1], kGradientTolerance)) << describe(c);
      EXPECT_TRUE(close_to(grads.values, expected[2], kGradientTolerance)) << describe(c);
      for (size_t index = 0; index < parameters.size(); ++index) {
        EXPECT_TRUE(close_to(*parameters[index].grad, expected[3 + index], kGradientTolerance))
            << parameters[index].name << " " << describe(c);
      }
    }
}

TEST(Gradients, AccumulateUntilZeroGrad) {
  Rng rng(35);
  const Tensor q = random_tensor(Shape{1, 2, 3}, rng), k = random_tensor(Shape{1, 3, 2}, rng);
  const Tensor v = random_tensor(Shape{1, 3, 2}, rng), g = random_tensor(Shape{1, 2, 2}, rng);
  AdditiveAttention attention(2, 3, 4, 0.0F);
  attention(q, k, v);
  attention.backward(g);
  const Tensor once = *attention.parameters().at(1).grad;
  attention.backward(g);
  Flat twice = to_doubles(once);
  for (double& value : twice) value *= 2;
  EXPECT_TRUE(close_to(*attention.parameters().at(1).grad, twice, 1e-6));
  zero_grad(attention.parameters());
  EXPECT_TRUE(close_to(*attention.parameters().at(1).grad, Flat(once.values().size(), 0.0), 0.0));
}

TEST(Gradients, BackwardNeedsAForwardPassAndAMatchingShape) {
  DotProductAttention attention;
  EXPECT_THROW_MESSAGE(attention.backward(Tensor(Shape{1, 1, 1})), ValueError,
                       "DotProductAttention.backward: expected a forward pass first");
  MultiHeadAttention multi_head(2, 2, 2, 4, 2, 0.0F);
  EXPECT_THROW_MESSAGE(multi_head.backward(Tensor(Shape{1, 1, 4})), ValueError,
                       "MultiHeadAttention.backward: expected a forward pass first");
  attention(Tensor(Shape{1, 2, 3}), Tensor(Shape{1, 4, 3}), Tensor(Shape{1, 4, 5}));
  EXPECT_THROW_MESSAGE(attention.backward(Tensor(Shape{1, 2, 4})), ShapeError,
                       "grad_output: expected shape (1, 2, 5) (that of the last forward pass's "
                       "output), got shape (1, 2, 4)");
}

}  // namespace
}  // namespace attn
