// attn::scaled_dot_product_attention (forward, backward, weights) against the double reference
// on every SIMD target: every option alone and combined — bool and float masks of every broadcast
// shape, fully masked rows, causal in both alignments, sliding windows, ALiBi, soft-capping,
// sinks, grouped-query heads, valid lengths, dropout, explicit scale — with tails that divide no
// tile; the reference's own gradients against double finite differences.
#include "attn/functional/scaled_dot_product_attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "attn/core/error.hpp"
#include "every_simd_target.hpp"
#include "sdpa_test_case.hpp"

namespace attn {
namespace {

using testing::close_to;
using testing::SdpaShape;
using testing::SdpaTestCase;

// Outputs are convex combinations of values (|v| ≲ 4) with float32 weights: the float32 scores,
// exponentials and sums differ from double by a few ulps per term, so 1e-5 relative to the
// output's magnitude bounds them (as for the book's kernels).
constexpr double kForwardTolerance = 1e-5;
// Gradients sum up to a few hundred float32 products in different orders on both sides (each
// within ~n·2⁻²⁴ ≈ 2e-5 of exact in the worst case), and soft-capping adds the kernels' tanh
// (3.5e-7 relative) inside them: 3e-5 relative to each gradient's magnitude holds with margin.
constexpr double kBackwardTolerance = 3e-5;

enum class MaskKind { kNone, kBool, kFloat };
enum class Causal { kNone, kTopLeft, kBottomRight };

struct Config {
  SdpaShape shape;
  MaskKind mask = MaskKind::kNone;
  int mask_shape = 0;  // index into mask_shape_of: which axes the mask has
  Causal causal = Causal::kNone;
  int64_t window_left = -2, window_right = -2;  // −2: no window
  bool bottom_right = false;                     // alignment of window/ALiBi without causal
  float softcap = 0.0F;
  bool alibi = false, sinks = false, lengths = false, hide_row = false;
  float dropout = 0.0F;
  float scale = 0.0F;  // 0: default
  float magnitude = 1.0F;

  std::string describe() const {
    const SdpaShape& s = shape;
    return "N=" + std::to_string(s.batch) + " Hq=" + std::to_string(s.q_heads) +
           " Hkv=" + std::to_string(s.kv_heads) + " L=" + std::to_string(s.queries) +
           " S=" + std::to_string(s.keys) + " E=" + std::to_string(s.depth) +
           " Ev=" + std::to_string(s.value_depth) + " mask=" + std::to_string(static_cast<int>(mask)) +
           "/" + std::to_string(mask_shape) + " causal=" + std::to_string(static_cast<int>(causal)) +
           " window=(" + std::to_string(window_left) + "," + std::to_string(window_right) + ")" +
           " bottom_right=" + std::to_string(bottom_right) + " softcap=" + std::to_string(softcap) +
           " alibi=" + std::to_string(alibi) + " sinks=" + std::to_string(sinks) +
           " lengths=" + std::to_string(lengths) + " hide_row=" + std::to_string(hide_row) +
           " dropout=" + std::to_string(dropout) + " scale=" + std::to_string(scale) +
           " magnitude=" + std::to_string(magnitude);
  }
};

// The broadcast shapes PyTorch users pass, right-aligned against (N, Hq, L, S).
Shape mask_shape_of(int which, const SdpaShape& s) {
  switch (which) {
    case 0: return Shape{s.batch, s.q_heads, s.queries, s.keys};
    case 1: return Shape{s.queries, s.keys};
    case 2: return Shape{1, 1, s.queries, s.keys};
    case 3: return Shape{s.batch, 1, s.queries, s.keys};
    case 4: return Shape{s.batch, 1, 1, s.keys};  // key padding
    case 5: return Shape{1, s.q_heads, 1, s.keys};
    default: return Shape{s.q_heads, s.queries, s.keys};
  }
}
constexpr int kMaskShapes = 7;

SdpaTestCase make_case(const Config& config, uint64_t seed) {
  SdpaTestCase c(config.shape, seed, config.magnitude);
  if (config.mask != MaskKind::kNone) {
    c.set_mask(mask_shape_of(config.mask_shape, config.shape), config.mask == MaskKind::kBool, 0.8);
    if (config.hide_row) c.hide_row(config.shape.queries / 2);
  }
  if (config.causal != Causal::kNone) c.set_causal(config.causal == Causal::kBottomRight);
  else c.set_alignment(config.bottom_right);
  if (config.window_left > -2) c.set_window(config.window_left, config.window_right);
  if (config.softcap > 0) c.set_softcap(config.softcap);
  if (config.alibi) c.set_alibi();
  if (config.sinks) c.set_sinks();
  if (config.scale != 0) c.set_scale(config.scale);
  if (config.lengths) {
    std::vector<int64_t> lengths;
    for (int64_t index = 0; index < config.shape.batch * config.shape.queries; ++index)
      lengths.push_back(index == 0 ? 0 : index == 1 ? config.shape.keys
                                                    : (index * 7) % (config.shape.keys + 1));
    c.set_lengths(lengths);
  }
  if (config.dropout > 0) c.set_dropout(config.dropout, seed * 31 + 5);
  return c;
}

// Forward, weights and backward (every gradient the options allow) against the reference.
void check(const Config& config, uint64_t seed) {
  SCOPED_TRACE(config.describe());
  SdpaTestCase c = make_case(config, seed);
  const AttentionForward forward = scaled_dot_product_attention(c.q, c.k, c.v, c.options);
  const reference::SdpaForward expected = c.expected_forward();
  EXPECT_TRUE(close_to(forward.output, expected.out, kForwardTolerance)) << "output";
  const Tensor weights = attention_weights(c.q, c.k, forward.log_sum_exp, c.options);
  EXPECT_TRUE(close_to(weights, expected.weights, kForwardTolerance)) << "weights";

  const bool mask_gradient = config.mask == MaskKind::kFloat;
  const AttentionGradients grads = scaled_dot_product_attention_backward(
      c.q, c.k, c.v, forward.output, c.grad_out, forward.log_sum_exp, c.options, mask_gradient,
      config.sinks);
  const reference::SdpaGradients expected_grads = c.expected_backward();
  EXPECT_TRUE(close_to(grads.query, expected_grads.q, kBackwardTolerance)) << "grad query";
  EXPECT_TRUE(close_to(grads.key, expected_grads.k, kBackwardTolerance)) << "grad key";
  EXPECT_TRUE(close_to(grads.value, expected_grads.v, kBackwardTolerance)) << "grad value";
  if (mask_gradient) {
    EXPECT_EQ(grads.attn_mask.shape(), c.mask_floats.shape());
    EXPECT_TRUE(close_to(grads.attn_mask, c.reduce_to_mask(expected_grads.mask), kBackwardTolerance))
        << "grad attn_mask";
  }
  if (config.sinks) {
    EXPECT_TRUE(close_to(grads.sinks, expected_grads.sinks, kBackwardTolerance)) << "grad sinks";
  }
}

class FunctionalSdpa : public testing::EverySimdTarget {};

TEST_P(FunctionalSdpa, EachOptionAloneMatchesTheReference) {
  const SdpaShape shape{2, 4, 2, 37, 70, 16, 12};
  uint64_t seed = 1;
  check({shape}, seed++);
  for (int which = 0; which < kMaskShapes; ++which) {
    check({shape, MaskKind::kBool, which}, seed++);
    check({shape, MaskKind::kFloat, which}, seed++);
  }
  check({.shape = shape, .causal = Causal::kTopLeft}, seed++);
  check({.shape = shape, .causal = Causal::kBottomRight}, seed++);
  check({.shape = shape, .window_left = 5, .window_right = 3}, seed++);
  check({.shape = shape, .window_left = 0, .window_right = -1, .bottom_right = true}, seed++);
  check({.shape = shape, .window_left = -1, .window_right = 2}, seed++);
  check({.shape = shape, .softcap = 2.5F, .magnitude = 3.0F}, seed++);
  check({.shape = shape, .alibi = true}, seed++);
  check({.shape = shape, .bottom_right = true, .alibi = true}, seed++);
  check({.shape = shape, .sinks = true}, seed++);
  check({.shape = shape, .lengths = true}, seed++);
  check({.shape = shape, .dropout = 0.3F}, seed++);
  check({.shape = shape, .scale = 0.7F}, seed++);
}

TEST_P(FunctionalSdpa, FullyMaskedRowsGiveZeroOutputAndGradients) {
  const SdpaShape shape{2, 2, 2, 19, 33, 8, 8};
  uint64_t seed = 100;
  for (const MaskKind kind : {MaskKind::kBool, MaskKind::kFloat}) {
    check({.shape = shape, .mask = kind, .mask_shape = 0, .hide_row = true}, seed++);
    check({.shape = shape, .mask = kind, .mask_shape = 3, .sinks = true, .hide_row = true}, seed++);
    // A mask broadcast over the queries that hides a key row hides everything: zero everywhere.
    check({.shape = shape, .mask = kind, .mask_shape = 4, .hide_row = true}, seed++);
  }
  // Bottom-right causal with more queries than keys: the first rows see nothing.
  check({.shape = {1, 2, 1, 40, 9, 8, 4}, .causal = Causal::kBottomRight}, seed++);
}

TEST_P(FunctionalSdpa, GroupedQueryHeadsMatchTheReference) {
  uint64_t seed = 200;
  for (const int64_t group : {1, 2, 4, 8}) {
    check({.shape = {2, 8, 8 / group, 21, 45, 8, 8}}, seed++);
    check({.shape = {1, 8, 8 / group, 33, 65, 16, 8},
           .mask = MaskKind::kFloat,
           .mask_shape = 5,
           .causal = Causal::kTopLeft,
           .sinks = true},
          seed++);
  }
}

TEST_P(FunctionalSdpa, CombinedOptionsMatchTheReference) {
  uint64_t seed = 300;
  check({.shape = {2, 4, 2, 70, 130, 16, 8},
         .mask = MaskKind::kFloat,
         .mask_shape = 3,
         .causal = Causal::kBottomRight,
         .window_left = 40,
         .window_right = -1,
         .softcap = 3.0F,
         .alibi = true,
         .sinks = true,
         .lengths = true,
         .dropout = 0.2F},
        seed++);
  check({.shape = {1, 2, 1, 130, 70, 32, 17},
         .mask = MaskKind::kBool,
         .mask_shape = 1,
         .causal = Causal::kTopLeft,
         .window_left = 17,
         .window_right = 0,
         .softcap = 1.0F,
         .sinks = true,
         .magnitude = 4.0F},
        seed++);
  // L = 1 (decoding), S ≠ L, one key, one query.
  check({.shape = {2, 4, 1, 1, 200, 64, 64}, .causal = Causal::kBottomRight, .alibi = true}, seed++);
  check({.shape = {1, 1, 1, 1, 1, 1, 1}, .mask = MaskKind::kFloat, .mask_shape = 0}, seed++);
  check({.shape = {1, 1, 1, 5, 1, 3, 2}, .causal = Causal::kTopLeft}, seed++);
}

TEST_P(FunctionalSdpa, RandomCombinationsMatchTheReference) {
  Rng rng(4242);
  const auto pick = [&](int64_t count) {
    return static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(count));
  };
  for (int trial = 0; trial < 24; ++trial) {
    Config config;
    const int64_t heads[] = {1, 2, 4};
    const int64_t q_heads = heads[pick(3)];
    config.shape = {1 + pick(2), q_heads,      q_heads,     1 + pick(90),
                    1 + pick(150), 1 + pick(40), 1 + pick(20)};
    if (q_heads > 1 && pick(2) == 0) config.shape.kv_heads = q_heads / 2;
    config.mask = static_cast<MaskKind>(pick(3));
    config.mask_shape = static_cast<int>(pick(kMaskShapes));
    config.causal = static_cast<Causal>(pick(3));
    if (pick(3) == 0) {
      config.window_left = pick(30) - 1;
      config.window_right = pick(30) - 1;
    }
    config.bottom_right = pick(2) == 0;
    config.softcap = pick(3) == 0 ? 2.0F : 0.0F;
    config.alibi = pick(3) == 0;
    config.sinks = pick(3) == 0;
    config.lengths = pick(4) == 0;
    config.dropout = pick(4) == 0 ? 0.25F : 0.0F;
    config.magnitude = pick(4) == 0 ? 3.0F : 1.0F;
    check(config, 1000 + static_cast<uint64_t>(trial));
  }
}

ATTN_INSTANTIATE_FOR_EVERY_SIMD_TARGET(FunctionalSdpa);

// The reference's backward pass against central differences of its forward pass, every option
// on: what the kernel tests above compare with is itself right.
TEST(SdpaReference, GradientsMatchFiniteDifferences) {
  SdpaTestCase c({1, 2, 1, 4, 5, 3, 2}, 77);
  c.set_mask(Shape{1, 2, 4, 5}, false, 0.85);
  c.set_causal(true);
  c.set_window(2, -1);
  c.set_softcap(1.5F);
  c.set_alibi();
  c.set_sinks();
  c.problem.dropout.assign(40, 1.0);
  c.problem.dropout[3] = 0.0;
  c.problem.dropout[17] = 2.0;
  const std::vector<double> g = testing::to_doubles(c.grad_out);
  const auto loss = [&](const std::vector<std::vector<double>>& x) {
    reference::SdpaProblem problem = c.problem;
    problem.mask = x[3];
    problem.sinks = x[4];
    return testing::dot(reference::sdpa_forward(problem, x[0], x[1], x[2]).out, g);
  };
  const std::vector<std::vector<double>> arguments{
      testing::to_doubles(c.q), testing::to_doubles(c.k), testing::to_doubles(c.v), c.problem.mask,
      c.problem.sinks};
  const auto numerical = testing::numerical_gradients(loss, arguments, 1e-6);
  const reference::SdpaGradients analytic = c.expected_backward();
  const std::vector<double>* gradients[] = {&analytic.q, &analytic.k, &analytic.v, &analytic.mask,
                                            &analytic.sinks};
  for (size_t a = 0; a < 5; ++a) {
    for (size_t i = 0; i < numerical[a].size(); ++i) {
      // Hidden entries (−∞ in the mask) have no finite neighbourhood: skip them.
      if (a == 3 && std::isinf(c.problem.mask[i])) continue;
      // Central differences with h = 1e-6 in double: truncation ~h², rounding ~1e-16/h = 1e-10.
      EXPECT_NEAR((*gradients[a])[i], numerical[a][i], 1e-7) << "argument " << a << " index " << i;
    }
  }
}

}  // namespace
}  // namespace attn
