// Dropout inside the fused kernels: the mask the kernels apply is the one
// flash_attention_dropout_mask reports (forward against the double reference with that mask), the
// backward pass regenerates it (against central differences of the reference with the same mask),
// and the draws have the right rate and depend on the seed alone.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>

#include "attn/core/error.hpp"
#include "attn/kernels/flash_attention.hpp"
#include "every_simd_target.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

using testing::close_to;
using testing::random_tensor;
using testing::to_doubles;

class FlashAttentionDropout : public testing::EverySimdTarget {};

reference::Array<double> array(const Tensor& tensor) {
  return testing::to_reference(tensor);
}

TEST_P(FlashAttentionDropout, ForwardAndBackwardUseTheReportedMask) {
  Rng rng(5);
  // Single head, so the mask's (batch·heads) index is the batch index; m > the key tile.
  const int64_t batch = 2, n = 9, m = 150, depth = 4, value_depth = 3;
  const Tensor q = random_tensor(Shape{batch, n, depth}, rng),
               k = random_tensor(Shape{batch, m, depth}, rng);
  const Tensor v = random_tensor(Shape{batch, m, value_depth}, rng),
               g = random_tensor(Shape{batch, n, value_depth}, rng);
  const ValidLengths mask = ValidLengths::per_query(
      {150, 0, 3, 77, 1, 149, 150, 20, 64, 5, 6, 7, 8, 9, 10, 11, 12, 140}, batch, n);
  const FlashAttentionOptions options = testing::kernel_options(0.5F, false, 0.3F, 1234);
  Tensor out(Shape{batch, n, value_depth});
  std::vector<float> lse(static_cast<size_t>(batch * n));
  flash_attention_forward(single_head(q, "q"), single_head(k, "k"), single_head(v, "v"), mask,
                          options, single_head(out, "out"), lse.data());
  const std::vector<double> multipliers =
      to_doubles(flash_attention_dropout_mask(options, batch, n, m));
  const auto lengths = testing::expand(mask, batch, n, m);
  const auto expected =
      reference::dot_product_attention(array(q), array(k), array(v), lengths, 0.5, multipliers);
  // As the forward test: convex-ish combinations of float32 terms, 1e-5 of the magnitude.
  EXPECT_TRUE(close_to(out, expected.output.values, 1e-5)) << hwy::TargetName(GetParam());

  Tensor dq(q.shape()), dk(k.shape()), dv(v.shape());
  flash_attention_backward(single_head(q, "q"), single_head(k, "k"), single_head(v, "v"),
                           single_head(out, "out"), single_head(g, "g"), lse.data(), mask, options,
                           single_head(dq, "dq"), single_head(dk, "dk"), single_head(dv, "dv"));
  // Central differences (h = 1e-5) of the double reference with the same multipliers: truncation
  // ~1e-10; the float32 backward is within ~1e-6 of the magnitude, 1e-4 leaves margin.
  const std::vector<double> grad_out = to_doubles(g);
  const auto loss = [&](const Tensor& q_, const Tensor& k_, const Tensor& v_, size_t which,
                        size_t index, double step) {
    reference::Array<double> arrays[3] = {array(q_), array(k_), array(v_)};
    arrays[which].values[index] += step;
    const auto result = reference::dot_product_attention(arrays[0], arrays[1], arrays[2], lengths,
                                                         0.5, multipliers);
    double sum = 0;
    for (size_t i = 0; i < grad_out.size(); ++i) sum += result.output.values[i] * grad_out[i];
    return sum;
  };
  const Tensor* inputs[3] = {&q, &k, &v};
  const Tensor* grads[3] = {&dq, &dk, &dv};
  for (size_t which = 0; which < 3; ++which) {
    std::vector<double> numerical(static_cast<size_t>(inputs[which]->numel()));
    for (size_t index = 0; index < numerical.size(); ++index) {
      numerical[index] =
          (loss(q, k, v, which, index, 1e-5) - loss(q, k, v, which, index, -1e-5)) / 2e-5;
    }
    EXPECT_TRUE(close_to(*grads[which], numerical, 1e-4))
        << "input " << which << " " << hwy::TargetName(GetParam());
  }
}

TEST(FlashAttentionDropoutMask, RateScaleAndSeeds) {
  const FlashAttentionOptions options = testing::kernel_options(1.0F, false, 0.25F, 7);
  const Tensor mask = flash_attention_dropout_mask(options, 4, 100, 250);
  int64_t dropped = 0;
  for (const float value : mask.span()) {
    if (value == 0.0F) {
      ++dropped;
    } else {
      ASSERT_FLOAT_EQ(value, 1.0F / 0.75F);
    }
  }
  // 100000 Bernoulli(0.25) draws: standard deviation 0.0014 of the rate; allow five.
  EXPECT_NEAR(static_cast<double>(dropped) / static_cast<double>(mask.numel()), 0.25, 0.007);
  EXPECT_EQ(flash_attention_dropout_mask(options, 4, 100, 250).values(), mask.values());
  FlashAttentionOptions other = options;
  other.seed = 8;
  EXPECT_NE(flash_attention_dropout_mask(other, 4, 100, 250).values(), mask.values());
  // Heads and queries get different masks.
  const Tensor small = flash_attention_dropout_mask(options, 2, 2, 64);
  EXPECT_NE(std::vector<float>(small.data(), small.data() + 64),
            std::vector<float>(small.data() + 64, small.data() + 128));
  EXPECT_NE(std::vector<float>(small.data(), small.data() + 64),
            std::vector<float>(small.data() + 128, small.data() + 192));
}

TEST(FlashAttentionDropoutMask, RejectsProbabilityOne) {
  const Tensor q(Shape{1, 1, 1}), k(Shape{1, 1, 1}), v(Shape{1, 1, 1});
  Tensor out(Shape{1, 1, 1});
  EXPECT_THROW_MESSAGE(
      flash_attention_forward(single_head(q, "q"), single_head(k, "k"), single_head(v, "v"), {},
                              testing::kernel_options(1.0F, false, 1.0F), single_head(out, "out")),
      ValueError, "dropout: expected a probability in [0, 1) for the fused kernel, got 1");
}

ATTN_INSTANTIATE_FOR_EVERY_SIMD_TARGET(FlashAttentionDropout);

}  // namespace
}  // namespace attn
