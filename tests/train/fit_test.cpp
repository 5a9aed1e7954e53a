// End-to-end training: a small multi-head attention learns to imitate a teacher of the same shape.
#include <gtest/gtest.h>

#include "attn/nn/multi_head_attention.hpp"
#include "attn/train/adam.hpp"
#include "attn/train/gradient_clipping.hpp"
#include "attn/train/losses.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

TEST(Fit, MultiHeadAttentionLearnsATeacher) {
  Rng rng(21);
  const Tensor queries = testing::random_tensor(Shape{4, 5, 6}, rng);
  const Tensor keys = testing::random_tensor(Shape{4, 7, 6}, rng);
  const ValidLengths lengths = ValidLengths::per_batch({7, 5, 3, 6});
  MultiHeadAttention teacher(6, 6, 6, 8, 2, 0.0F, /*bias=*/true, /*seed=*/100);
  teacher.eval();
  const Tensor target = teacher(queries, keys, keys, lengths);

  MultiHeadAttention student(6, 6, 6, 8, 2, 0.0F, /*bias=*/true, /*seed=*/200);
  AdamOptions options;
  options.lr = 0.02F;
  Adam optimizer(student.parameters(), options);
  float first_loss = 0.0F, loss = 0.0F;
  for (int step = 0; step < 300; ++step) {
    optimizer.zero_grad();
    const LossResult result = mse_loss(student(queries, keys, keys, lengths), target);
    student.backward(result.grad);
    clip_grad_norm(student.parameters(), 5.0F);
    optimizer.step();
    if (step == 0) first_loss = result.loss;
    loss = result.loss;
  }
  // Measured: the loss falls from 0.079 to 4.9e-5 in 300 steps; 2% of the first loss
  // leaves room for platform round-off while a broken gradient would not get near it.
  EXPECT_GT(first_loss, 0.05F);
  EXPECT_LT(loss, 0.02F * first_loss) << "first loss " << first_loss << ", last loss " << loss;
}

}  // namespace
}  // namespace attn
