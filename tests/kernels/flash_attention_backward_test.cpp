// The fused flash-attention backward kernel against the reference layer's backward pass (itself
// checked against double finite differences in tests/nn/gradients_test.cpp), on every SIMD target:
// strided multi-head views, tails, masks with lengths 0 and m, per-query lengths, causal n < m and
// n > m.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>

#include "attn/core/error.hpp"
#include "attn/kernels/flash_attention.hpp"
#include "attn/nn/dot_product_attention.hpp"
#include "every_simd_target.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

using testing::close_to;
using testing::head_of;
using testing::random_tensor;
using testing::to_doubles;

// Gradients are sums over up to a few hundred float32 products on both sides, accumulated in
// different orders: each side is within ~n·2⁻²⁴ ≈ 2e-5 of exact in the worst case, typically far
// less; 2e-5 relative to the gradient's magnitude (floor 1) holds with margin on these shapes.
constexpr double kTolerance = 2e-5;

class FlashAttentionBackward : public testing::EverySimdTarget {};

struct Case {
  int64_t batch, heads, queries, keys, depth, value_depth;
  int mask_kind;  // 0 none, 1 per batch, 2 per query
  bool causal;
};

TEST_P(FlashAttentionBackward, MatchesReferenceLayer) {
  Rng rng(91);
  const Case cases[] = {{1, 1, 1, 1, 1, 1, 0, false},      {2, 1, 3, 5, 3, 2, 1, false},
                        {1, 2, 7, 1, 4, 4, 2, false},      {2, 2, 70, 130, 8, 5, 2, false},
                        {2, 3, 65, 150, 16, 16, 1, false}, {1, 2, 129, 77, 32, 17, 0, true},
                        {2, 1, 50, 20, 8, 8, 1, true},     {2, 2, 20, 90, 8, 8, 2, true}};
  for (const Case& c : cases) {
    const Tensor q = random_tensor(Shape{c.batch, c.queries, c.heads * c.depth}, rng);
    const Tensor k = random_tensor(Shape{c.batch, c.keys, c.heads * c.depth}, rng);
    const Tensor v = random_tensor(Shape{c.batch, c.keys, c.heads * c.value_depth}, rng);
    const Tensor g = random_tensor(Shape{c.batch, c.queries, c.heads * c.value_depth}, rng);
    ValidLengths mask;
    if (c.mask_kind == 1) {
      std::vector<int64_t> lengths;
      for (int64_t b = 0; b < c.batch; ++b)
        lengths.push_back(b == 0 ? c.keys : b == 1 ? 0 : c.keys / 2);
      mask = ValidLengths::per_batch(lengths);
    } else if (c.mask_kind == 2) {
      std::vector<int64_t> lengths;
      for (int64_t index = 0; index < c.batch * c.queries; ++index)
        lengths.push_back(index % (c.keys + 1));
      mask = ValidLengths::per_query(lengths, c.batch, c.queries);
    }
    const float scale = 0.37F;
    Tensor out(Shape{c.batch, c.queries, c.heads * c.value_depth});
    std::vector<float> lse(static_cast<size_t>(c.batch * c.heads * c.queries));
    const FlashAttentionOptions options = testing::kernel_options(scale, c.causal);
    flash_attention_forward(split_heads(q, c.heads, "q"), split_heads(k, c.heads, "k"),
                            split_heads(v, c.heads, "v"), mask, options,
                            split_heads(out, c.heads, "out"), lse.data());
    Tensor dq = Tensor::full(q.shape(), std::nanf("")), dk = Tensor::full(k.shape(), std::nanf(""));
    Tensor dv = Tensor::full(v.shape(), std::nanf(""));
    flash_attention_backward(split_heads(q, c.heads, "q"), split_heads(k, c.heads, "k"),
                             split_heads(v, c.heads, "v"), split_heads(out, c.heads, "out"),
                             split_heads(g, c.heads, "g"), lse.data(), mask, options,
                             split_heads(dq, c.heads, "dq"), split_heads(dk, c.heads, "dk"),
                             split_heads(dv, c.heads, "dv"));
    const ValidLengths effective =
        c.causal ? mask.with_causal_mask(c.batch, c.queries, c.keys) : mask;
    const std::string where = "target " + std::string(hwy::TargetName(GetParam())) +
                              " B=" + std::to_string(c.batch) + " H=" + std::to_string(c.heads) +
                              " n=" + std::to_string(c.queries) + " m=" + std::to_string(c.keys) +
                              " causal=" + std::to_string(c.causal);
    for (int64_t h = 0; h < c.heads; ++h) {
      DotProductAttention reference(0.0F, scale);
      reference.set_path(AttentionPath::kReference);
      reference.eval();
      reference(head_of(q, h, c.depth), head_of(k, h, c.depth), head_of(v, h, c.value_depth),
                effective);
      const AttentionGradients expected = reference.backward(head_of(g, h, c.value_depth));
      EXPECT_TRUE(close_to(head_of(dq, h, c.depth), to_doubles(expected.queries), kTolerance))
          << where << " dQ head " << h;
      EXPECT_TRUE(close_to(head_of(dk, h, c.depth), to_doubles(expected.keys), kTolerance))
          << where << " dK head " << h;
      EXPECT_TRUE(close_to(head_of(dv, h, c.value_depth), to_doubles(expected.values), kTolerance))
          << where << " dV head " << h;
    }
  }
}

TEST_P(FlashAttentionBackward, RejectsMismatchedGradients) {
  const Tensor q(Shape{1, 2, 4}), k(Shape{1, 3, 4}), v(Shape{1, 3, 5}), out(Shape{1, 2, 5});
  Tensor dq(Shape{1, 2, 4}), dk(Shape{1, 3, 4}), dv(Shape{1, 3, 5});
  const std::vector<float> lse(2);
  EXPECT_THROW_MESSAGE(
      flash_attention_backward(single_head(q, "q"), single_head(k, "k"), single_head(v, "v"),
                               single_head(out, "out"), single_head(Tensor(Shape{1, 2, 4}), "g"),
                               lse.data(), {}, {}, single_head(dq, "dq"), single_head(dk, "dk"),
                               single_head(dv, "dv")),
      ShapeError, "grad_out: expected 1 × 1 heads of 2 × 5 (as out), got 1 × 1 of 2 × 4");
  EXPECT_THROW_MESSAGE(
      flash_attention_backward(single_head(q, "q"), single_head(k, "k"), single_head(v, "v"),
                               single_head(out, "out"), single_head(out, "g"), nullptr, {}, {},
                               single_head(dq, "dq"), single_head(dk, "dk"), single_head(dv, "dv")),
      ValueError, "log_sum_exp: expected the forward pass's values");
}

ATTN_INSTANTIATE_FOR_EVERY_SIMD_TARGET(FlashAttentionBackward);

}  // namespace
}  // namespace attn
