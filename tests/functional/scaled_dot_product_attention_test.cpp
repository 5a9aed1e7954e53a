// attn::scaled_dot_product_attention (forward, backward, weights) against the double reference
// on every SIMD target: every option alone and combined — bool and float masks of every broadcast
// shape, fully masked rows, causal in both alignments, sliding windows, ALiBi, soft-capping,
// sinks, grouped-query heads, valid lengths, dropout, explicit scale — with tails that divide no
// tile; the reference's own gradients against double finite differences.
#include "attn/functional/scaled_dot_product_attention.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/core/half.hpp"
#include "attn/kernels/decode_attention.hpp"
#include "attn/kernels/flash_attention.hpp"
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
  bool bottom_right = false;                    // alignment of window/ALiBi without causal
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
           " Ev=" + std::to_string(s.value_depth) +
           " mask=" + std::to_string(static_cast<int>(mask)) + "/" + std::to_string(mask_shape) +
           " causal=" + std::to_string(static_cast<int>(causal)) + " window=(" +
           std::to_string(window_left) + "," + std::to_string(window_right) + ")" +
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
    case 0:
      return Shape{s.batch, s.q_heads, s.queries, s.keys};
    case 1:
      return Shape{s.queries, s.keys};
    case 2:
      return Shape{1, 1, s.queries, s.keys};
    case 3:
      return Shape{s.batch, 1, s.queries, s.keys};
    case 4:
      return Shape{s.batch, 1, 1, s.keys};  // key padding
    case 5:
      return Shape{1, s.q_heads, 1, s.keys};
    default:
      return Shape{s.q_heads, s.queries, s.keys};
  }
}
constexpr int kMaskShapes = 7;

SdpaTestCase make_case(const Config& config, uint64_t seed) {
  SdpaTestCase c(config.shape, seed, config.magnitude);
  if (config.mask != MaskKind::kNone) {
    c.set_mask(mask_shape_of(config.mask_shape, config.shape), config.mask == MaskKind::kBool, 0.8);
    if (config.hide_row) c.hide_row(config.shape.queries / 2);
  }
  if (config.causal != Causal::kNone)
    c.set_causal(config.causal == Causal::kBottomRight);
  else
    c.set_alignment(config.bottom_right);
  if (config.window_left > -2) c.set_window(config.window_left, config.window_right);
  if (config.softcap > 0) c.set_softcap(config.softcap);
  if (config.alibi) c.set_alibi();
  if (config.sinks) c.set_sinks();
  if (config.scale != 0) c.set_scale(config.scale);
  if (config.lengths) {
    std::vector<int64_t> lengths;
    for (int64_t index = 0; index < config.shape.batch * config.shape.queries; ++index)
      lengths.push_back(index == 0   ? 0
                        : index == 1 ? config.shape.keys
                                     : (index * 7) % (config.shape.keys + 1));
    c.set_lengths(lengths);
  }
  if (config.dropout > 0) c.set_dropout(config.dropout, seed * 31 + 5);
  return c;
}

// Forward, weights and backward of a prepared case against the reference: the float mask's
// gradient with `mask_gradient`, the sinks' with `sinks_gradient`.
// The forward pass and its weights of a prepared case against the reference; returns the pass.
AttentionForward check_forward(const SdpaTestCase& c,
                               double weights_tolerance = kForwardTolerance) {
  AttentionForward forward = scaled_dot_product_attention(c.q, c.k, c.v, c.options);
  const reference::SdpaForward expected = c.expected_forward();
  EXPECT_TRUE(close_to(forward.output, expected.out, kForwardTolerance)) << "output";
  const Tensor weights = attention_weights(c.q, c.k, forward.log_sum_exp, c.options);
  EXPECT_TRUE(close_to(weights, expected.weights, weights_tolerance)) << "weights";
  return forward;
}

void check_case(SdpaTestCase& c, bool mask_gradient, bool sinks_gradient,
                double weights_tolerance = kForwardTolerance) {
  const AttentionForward forward = check_forward(c, weights_tolerance);

  const AttentionBackward grads = scaled_dot_product_attention_backward(
      c.q, c.k, c.v, forward.output, c.grad_out, forward.log_sum_exp, c.options, mask_gradient,
      sinks_gradient);
  const reference::SdpaGradients expected_grads = c.expected_backward();
  EXPECT_TRUE(close_to(grads.query, expected_grads.q, kBackwardTolerance)) << "grad query";
  EXPECT_TRUE(close_to(grads.key, expected_grads.k, kBackwardTolerance)) << "grad key";
  EXPECT_TRUE(close_to(grads.value, expected_grads.v, kBackwardTolerance)) << "grad value";
  if (mask_gradient) {
    EXPECT_EQ(grads.attn_mask.shape(), c.mask_floats.shape());
    EXPECT_TRUE(
        close_to(grads.attn_mask, c.reduce_to_mask(expected_grads.mask), kBackwardTolerance))
        << "grad attn_mask";
  }
  if (sinks_gradient) {
    EXPECT_TRUE(close_to(grads.sinks, expected_grads.sinks, kBackwardTolerance)) << "grad sinks";
  }
}

// Forward, weights and backward (every gradient the options allow) against the reference.
void check(const Config& config, uint64_t seed, double weights_tolerance = kForwardTolerance) {
  SCOPED_TRACE(config.describe());
  SdpaTestCase c = make_case(config, seed);
  check_case(c, config.mask == MaskKind::kFloat, config.sinks, weights_tolerance);
}

class FunctionalSdpa : public testing::EverySimdTarget {};

// A contiguous copy of any view, through a pass of the attention API's own layout-free path: an
// explicit loop, independent of the code under test.
Tensor slice_copy(const ConstStridedView& view) {
  Tensor copy(view.shape());
  std::vector<int64_t> index(static_cast<size_t>(view.rank()), 0);
  for (int64_t flat = 0; flat < copy.numel(); ++flat) {
    int64_t rest = flat, offset = 0;
    for (int axis = view.rank() - 1; axis >= 0; --axis) {
      offset += (rest % view.dim(axis)) * view.stride(axis);
      rest /= view.dim(axis);
    }
    copy.data()[flat] = view.data()[offset];
  }
  return copy;
}

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

// Bit for bit, as FreshOutputsAreWrittenWhole wants: `fresh` against `into`.
void expect_same_bits(const Tensor& fresh, const Tensor& into, const char* what) {
  ASSERT_EQ(fresh.shape(), into.shape()) << what;
  for (int64_t e = 0; e < into.numel(); ++e) {
    ASSERT_EQ(std::bit_cast<uint32_t>(fresh.data()[e]), std::bit_cast<uint32_t>(into.data()[e]))
        << what << " " << e;
  }
}

// The overloads into new storage leave the output and the gradients unwritten for the kernels to
// write every element (assign_uninitialized): with NaN-filled blocks of their sizes just freed
// (which malloc hands back for the same sizes) they equal, bit for bit, the overloads into
// tensors filled with 7 — fully masked rows, rows of length 0, sinks, decoding shapes (grouped
// heads) and keys of length 0 (nothing flows back: zero gradients) included.
TEST_P(FunctionalSdpa, FreshOutputsAreWrittenWhole) {
  const SdpaShape shape{2, 2, 2, 19, 33, 8, 8}, decoding{2, 4, 2, 1, 40, 16, 16};
  uint64_t seed = 300;
  for (const Config& config :
       {Config{.shape = shape}, Config{.shape = shape, .mask = MaskKind::kBool, .hide_row = true},
        Config{.shape = shape, .sinks = true, .lengths = true},
        Config{.shape = decoding, .lengths = true}, Config{.shape = {1, 2, 2, 5, 0, 8, 8}}}) {
    SCOPED_TRACE(config.describe());
    const SdpaTestCase c = make_case(config, seed++);
    int64_t dims[Shape::kMaxRank];
    std::copy_n(c.q.shape().data(), c.q.shape().rank(), dims);
    dims[c.q.shape().rank() - 1] = c.v.shape().dim(-1);
    const Shape out_shape = Shape::from_dims(dims, c.q.shape().rank());
    Tensor into = Tensor::full(out_shape, 7.0F);
    std::vector<float> lse(static_cast<size_t>(log_sum_exp_size(c.q.shape())));
    scaled_dot_product_attention(c.q, c.k, c.v, c.options, into, lse);
    { const Tensor recycled = Tensor::full(out_shape, std::nanf("")); }
    const AttentionForward fresh = scaled_dot_product_attention(c.q, c.k, c.v, c.options);
    expect_same_bits(fresh.output, into, "output");

    Tensor grad_q = Tensor::full(c.q.shape(), 7.0F), grad_k = Tensor::full(c.k.shape(), 7.0F),
           grad_v = Tensor::full(c.v.shape(), 7.0F);
    scaled_dot_product_attention_backward(c.q, c.k, c.v, into, c.grad_out, lse, c.options, grad_q,
                                          grad_k, grad_v, MutableStridedView(), {});
    {
      const Tensor recycled_q = Tensor::full(c.q.shape(), std::nanf("")),
                   recycled_k = Tensor::full(c.k.shape(), std::nanf("")),
                   recycled_v = Tensor::full(c.v.shape(), std::nanf(""));
    }
    const AttentionBackward grads =
        scaled_dot_product_attention_backward(c.q, c.k, c.v, into, c.grad_out, lse, c.options);
    expect_same_bits(grads.query, grad_q, "grad query");
    expect_same_bits(grads.key, grad_k, "grad key");
    expect_same_bits(grads.value, grad_v, "grad value");
  }
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
  check({.shape = {2, 4, 1, 1, 200, 64, 64}, .causal = Causal::kBottomRight, .alibi = true},
        seed++);
  check({.shape = {1, 1, 1, 1, 1, 1, 1}, .mask = MaskKind::kFloat, .mask_shape = 0}, seed++);
  check({.shape = {1, 1, 1, 5, 1, 3, 2}, .causal = Causal::kTopLeft}, seed++);
}

// An explicit diagonal offset: the block of queries 100…139 against keys 64…163 of one sequence
// (offset 36), causal with a window and ALiBi, as ring attention computes one block pair; and a
// block entirely before or after the diagonal.
TEST_P(FunctionalSdpa, ExplicitDiagonalOffsetsMatchTheReference) {
  uint64_t seed = 400;
  for (const int64_t offset : {36, -200, 500}) {
    SdpaTestCase c({2, 2, 1, 40, 100, 16, 8}, seed++);
    c.set_causal(false);
    c.set_diagonal_offset(offset);
    c.set_window(50, 0);
    c.set_alibi();
    const AttentionForward forward = scaled_dot_product_attention(c.q, c.k, c.v, c.options);
    EXPECT_TRUE(close_to(forward.output, c.expected_forward().out, kForwardTolerance)) << offset;
    const AttentionBackward grads = scaled_dot_product_attention_backward(
        c.q, c.k, c.v, forward.output, c.grad_out, forward.log_sum_exp, c.options);
    const reference::SdpaGradients expected = c.expected_backward();
    EXPECT_TRUE(close_to(grads.query, expected.q, kBackwardTolerance)) << offset;
    EXPECT_TRUE(close_to(grads.key, expected.k, kBackwardTolerance)) << offset;
    EXPECT_TRUE(close_to(grads.value, expected.v, kBackwardTolerance)) << offset;
  }
}

// A sink 70 to 100 above every score: the outputs are e^(score − sink) times the values, 1e−30 to
// 1e−44, and keep float's accuracy relative to the largest of them (subnormal outputs round to
// 2⁻¹⁴⁹, under 1e−5 of 1e−39; past 1e−44 every output is within 2⁻¹⁴⁹ of 0 and the test reads the
// bound as that). The rows' running maxima started at the sink, so each P = exp(S − sink) fell
// under float's normal range and the outputs came out up to a fifth off, all zero at 95 (the
// Python measurement of docs/reliability.md). Few queries (the decode kernel), many (the prefill
// kernels), and 400 × 400 (fp32 on AMX tiles where the CPU has them).
TEST_P(FunctionalSdpa, SinksFarAboveEveryScoreKeepTheOutputsAccurate) {
  for (const SdpaShape shape : {SdpaShape{2, 4, 2, 3, 37, 8, 6}, SdpaShape{1, 2, 1, 67, 45, 16, 8},
                                SdpaShape{1, 1, 1, 400, 400, 16, 8}}) {
    for (const float above : {70.0F, 85.0F, 88.0F, 95.0F, 100.0F}) {
      SCOPED_TRACE("queries " + std::to_string(shape.queries) + ", sinks " + std::to_string(above) +
                   " above the scores");
      SdpaTestCase c(shape, 950);
      c.set_sinks();
      for (float& sink : c.sinks) sink += above;
      c.problem.sinks.assign(c.sinks.begin(), c.sinks.end());
      const AttentionForward forward = scaled_dot_product_attention(c.q, c.k, c.v, c.options);
      const reference::SdpaForward expected = c.expected_forward();
      double largest = 0.0, worst = 0.0;
      for (size_t i = 0; i < expected.out.size(); ++i) {
        largest = std::max(largest, std::abs(expected.out[i]));
        const double error =
            std::abs(static_cast<double>(forward.output.data()[i]) - expected.out[i]);
        worst = std::isnan(error) ? INFINITY : std::max(worst, error);
      }
      EXPECT_GT(largest, 0.0);
      EXPECT_LE(worst, std::max(kForwardTolerance * largest, 0x1p-149))
          << "largest output " << largest;
      // The log-sum-exp of a row is its sink's logit plus e^(lse of the scores − sink).
      for (size_t i = 0; i < forward.log_sum_exp.size(); ++i) {
        const float sink =
            c.sinks[(i / static_cast<size_t>(shape.queries)) % static_cast<size_t>(shape.q_heads)];
        EXPECT_NEAR(forward.log_sum_exp[i], sink, 1e-6 * sink) << i;
      }
      // The backward pass, each gradient relative to its largest (dQ, dK, dV are w·O(1), w the
      // scores' share, 1e−31 to 1e−44; past 1e−38 they are subnormal and a sum of a few hundred
      // terms rounds to some 2⁻¹⁴⁹ each). It took P = exp(S − lse) from the sink's log-sum-exp:
      // 0.3% off at 85 above, a quarter at 88, zeros beyond.
      const AttentionBackward grads = scaled_dot_product_attention_backward(
          c.q, c.k, c.v, forward.output, c.grad_out, forward.log_sum_exp, c.options,
          /*mask_gradient=*/false, /*sinks_gradient=*/true);
      const reference::SdpaGradients expected_grads = c.expected_backward();
      const std::pair<const Tensor*, const std::vector<double>*> gradients[] = {
          {&grads.query, &expected_grads.q},
          {&grads.key, &expected_grads.k},
          {&grads.value, &expected_grads.v},
          {&grads.sinks, &expected_grads.sinks}};
      const char* names[] = {"grad query", "grad key", "grad value", "grad sinks"};
      for (size_t g = 0; g < 4; ++g) {
        const auto [actual, wanted] = gradients[g];
        double largest_gradient = 0.0, worst_gradient = 0.0;
        for (size_t i = 0; i < wanted->size(); ++i) {
          largest_gradient = std::max(largest_gradient, std::abs((*wanted)[i]));
          const double error = std::abs(static_cast<double>(actual->data()[i]) - (*wanted)[i]);
          worst_gradient = std::isnan(error) ? INFINITY : std::max(worst_gradient, error);
        }
        EXPECT_LE(worst_gradient,
                  std::max(kBackwardTolerance * largest_gradient,
                           static_cast<double>(shape.queries + shape.keys) * 0x1p-149))
            << names[g] << ", largest " << largest_gradient;
      }
    }
  }
}

// A row an additive mask pushes to −1e4, −1e9 or float's lowest (transformers' masks) — a zero
// query, so its scores are the mask's exactly and the reference's double softmax is uniform, as
// PyTorch's is. The float log-sum-exp loses log(S) to rounding there: the weights came out as S
// ones (−1e9) or off by 5e−4 (−1e4), the gradients by the same factor; float's lowest times log2 e
// overflowed on the base-2 paths, which then hid the row (zero output) and gave NaN gradients.
// Few queries (the decode kernel's forward) and many (the prefill kernels').
TEST_P(FunctionalSdpa, RowsFarBelowZeroGiveExactWeightsAndGradients) {
  constexpr int64_t kRow = 2;
  for (const SdpaShape shape : {SdpaShape{2, 2, 2, 5, 7, 8, 6}, SdpaShape{1, 2, 2, 70, 40, 8, 6}}) {
    for (const float far : {-1e4F, -1e9F, std::numeric_limits<float>::lowest()}) {
      for (const bool sinks : {false, true}) {
        SCOPED_TRACE("queries " + std::to_string(shape.queries) + ", mask " + std::to_string(far) +
                     (sinks ? " with sinks" : ""));
        SdpaTestCase c(shape, 910);
        c.set_mask(Shape{shape.queries, shape.keys}, /*boolean=*/false, /*keep=*/1.0);
        if (sinks) c.set_sinks();
        for (int64_t b = 0; b < shape.batch; ++b) {
          for (int64_t h = 0; h < shape.q_heads; ++h) {
            for (int64_t e = 0; e < shape.depth; ++e) c.q(b, h, kRow, e) = 0.0F;
            for (int64_t j = 0; j < shape.keys; ++j) {
              c.mask_floats(kRow, j) = far;
              c.problem.mask[c.problem.score_index(b, h, kRow, j)] = far;
            }
          }
        }
        check_case(c, /*mask_gradient=*/true, /*sinks_gradient=*/sinks);
      }
    }
  }
}

// Scores of ±1e4 to ±3e9, each row's largest ahead of the rest by half its size or more: the
// weights are one-hot and dV = Pᵀ dO exact, as PyTorch's float pass gives them. The backward
// recomputed P from the forward's float log-sum-exp, converted to base 2: a few ulps of scores
// that size made its P 2^±30 (dV off by 7e9), or NaN, or 0 (a row's share of dV lost), and the
// weights rows of zeros. Few queries (the decode forward; 3-query tiles, whose scores the backward
// took from another product) and many. Keys k_j = f·(1 + t_j/2)·e_(j mod d), t_j = j div d;
// query i = ±f·e_(i mod d) (minus: its largest scores are the zeros of the other keys, a tie).
// dQ and dK are the reference's 0 up to dS = P ⊙ (dP − D) for the one key, dP − D two float
// dot products of dv terms apart: within 4·dv ulps of Σ|dO||V|, times c·|k| (dQ) or c·|q| summed
// over the rows (dK).
TEST_P(FunctionalSdpa, ScoresOfLargeMagnitudeGiveExactWeightsAndGradients) {
  // 3 queries: the weights, the recount and the backward all sum scores along the head there
  // (FewQueryProducts), one ulp of which at 1e9 is 2^±128 in P.
  for (const SdpaShape shape : {SdpaShape{1, 2, 1, 3, 7, 8, 4}, SdpaShape{1, 2, 1, 5, 7, 8, 4},
                                SdpaShape{1, 2, 2, 67, 40, 8, 4}}) {
    for (const float f : {1e2F, 1e3F, 1e4F, 4e4F}) {
      SCOPED_TRACE("queries " + std::to_string(shape.queries) + ", scale of q and k " +
                   std::to_string(f));
      SdpaTestCase c(shape, 930);
      for (int64_t b = 0; b < shape.batch; ++b) {
        for (int64_t h = 0; h < shape.kv_heads; ++h) {
          for (int64_t j = 0; j < shape.keys; ++j) {
            for (int64_t e = 0; e < shape.depth; ++e) {
              c.k(b, h, j, e) = e == j % shape.depth
                                    ? f * (1.0F + 0.5F * static_cast<float>(j / shape.depth))
                                    : 0.0F;
            }
          }
        }
        for (int64_t h = 0; h < shape.q_heads; ++h) {
          for (int64_t i = 0; i < shape.queries; ++i) {
            for (int64_t e = 0; e < shape.depth; ++e) {
              c.q(b, h, i, e) = e == i % shape.depth ? ((i + h) % 5 == 4 ? -f : f) : 0.0F;
            }
          }
        }
      }
      const AttentionForward forward = check_forward(c);
      const AttentionBackward grads = scaled_dot_product_attention_backward(
          c.q, c.k, c.v, forward.output, c.grad_out, forward.log_sum_exp, c.options);
      const reference::SdpaGradients expected_grads = c.expected_backward();
      EXPECT_TRUE(close_to(grads.value, expected_grads.v, kBackwardTolerance)) << "grad value";
      const double scale = 1.0 / std::sqrt(static_cast<double>(shape.depth));
      const double ds_bound = 4.0 * static_cast<double>(shape.value_depth) * 0x1p-24 *
                              static_cast<double>(shape.value_depth) * max_magnitude(c.grad_out) *
                              max_magnitude(c.v);
      const double q_bound = ds_bound * scale * max_magnitude(c.k);
      const double k_bound = ds_bound * scale * max_magnitude(c.q) *
                             static_cast<double>(shape.queries * shape.q_heads / shape.kv_heads);
      for (int64_t e = 0; e < grads.query.numel(); ++e) {
        ASSERT_LE(std::fabs(grads.query.data()[e] - expected_grads.q[static_cast<size_t>(e)]),
                  q_bound)
            << "grad query " << e;
      }
      for (int64_t e = 0; e < grads.key.numel(); ++e) {
        ASSERT_LE(std::fabs(grads.key.data()[e] - expected_grads.k[static_cast<size_t>(e)]),
                  k_bound)
            << "grad key " << e;
      }
    }
  }
}

// A few queries (the decode kernel's shapes; the backward's FewQueryProducts for at most 4) at
// scores far from 0: the forward sums each score in another order than the backward, so P =
// exp(S − lse) from the forward's log-sum-exp summed to 1 ± 1.0–1.4e−5 over a row here (10 and 16
// queries; 3–11e−6 for 3 and 4) and dV carried it. The backward now takes its rows from its own
// scores: a recount of each row's base-2 log-sum-exp for at most 4 queries, rounded once to float
// (|lse₂| < 128: half an ulp is 3.8e−6 of the exponent, 2.6e−6 of P; measured 1.7e−6), and for
// more the prefill forward run again, whose natural log-sum-exp goes to base 2 and back (twice
// that; measured 3.8e−6). With grad_output one-hot in row i, column 0, dV's column 0 is P's row i
// as the backward computes it. dV against double within 6e−6 of its largest, dQ and dK within the
// usual tolerance. (The weights need no check of their totals: attention_weights renormalises
// each row; DecodingShapesMatchTheReference holds them to the forward's tolerance.)
TEST_P(FunctionalSdpa, FewQueriesAtLargeScoresWeighTheirKeysToOne) {
  constexpr double kValueGradient = 6e-6;
  uint64_t seed = 960;
  for (const int64_t n : {1, 3, 4, 10, 16}) {
    const SdpaShape shape{2, 4, 2, n, 300, 64, 32};
    SCOPED_TRACE("queries " + std::to_string(n));
    SdpaTestCase c(shape, seed++, 4.0F);  // scores ~ N(0, 16²), reaching ±50 over 300 keys
    c.set_scale(1.0F / 8.0F);
    const AttentionForward forward = scaled_dot_product_attention(c.q, c.k, c.v, c.options);
    const float largest = *std::max_element(forward.log_sum_exp.begin(), forward.log_sum_exp.end());
    ASSERT_GT(largest, 40.0F) << "the scores should reach far from 0";
    const double row_total = n <= kBackwardFewQueries ? 3e-6 : 6e-6;
    for (int64_t i = 0; i < n; ++i) {
      Tensor one_hot(c.grad_out.shape());  // zeros
      for (int64_t head = 0; head < shape.batch * shape.q_heads; ++head)
        one_hot.data()[(head * n + i) * shape.value_depth] = 1.0F;
      const AttentionBackward grads = scaled_dot_product_attention_backward(
          c.q, c.k, c.v, forward.output, one_hot, forward.log_sum_exp, c.options);
      // dV sums over the 2 query heads of each key/value head: totals of 2.
      for (int64_t kv = 0; kv < shape.batch * shape.kv_heads; ++kv) {
        double total = 0.0;
        for (int64_t j = 0; j < shape.keys; ++j)
          total += grads.value.data()[(kv * shape.keys + j) * shape.value_depth];
        ASSERT_NEAR(total, 2.0, 2.0 * row_total) << "P of query " << i << ", key/value head " << kv;
      }
    }
    const AttentionBackward grads = scaled_dot_product_attention_backward(
        c.q, c.k, c.v, forward.output, c.grad_out, forward.log_sum_exp, c.options);
    const reference::SdpaGradients expected = c.expected_backward();
    EXPECT_TRUE(close_to(grads.value, expected.v, kValueGradient)) << "grad value";
    EXPECT_TRUE(close_to(grads.query, expected.q, kBackwardTolerance)) << "grad query";
    EXPECT_TRUE(close_to(grads.key, expected.k, kBackwardTolerance)) << "grad key";
  }
}

// Weights of a few queries at scores near 1e9 (their float log-sum-exp lost log(sum), so the
// weights take their rows' recounted one): the recount and the weights sum each score alike —
// along the head for at most 4 queries, as the backward — or one ulp of a score, 128 there, puts
// 2^±128 into P (rows came out all zero, or with an infinite weight and NaN after their
// renormalisation). Random q and k: the one-hot ones of the test above sum exactly in any
// order. Each row's weights finite, summing to 1 (renormalised; within m = 64 float ulps).
TEST_P(FunctionalSdpa, FewQueriesWeightsAtScoresNear1e9SumToOne) {
  for (const int64_t n : {1, 4, 5}) {
    SCOPED_TRACE("queries " + std::to_string(n));
    SdpaTestCase c({1, 4, 4, n, 64, 64, 4}, 990);
    for (float& value : c.q.span()) value *= 4e7F;  // scores ~ N(0, 3e8²)
    c.set_scale(1.0F);
    const AttentionForward forward = scaled_dot_product_attention(c.q, c.k, c.v, c.options);
    const Tensor weights = attention_weights(c.q, c.k, forward.log_sum_exp, c.options);
    for (int64_t row = 0; row < 4 * n; ++row) {
      double total = 0.0;
      for (int64_t j = 0; j < 64; ++j) {
        const float weight = weights.data()[row * 64 + j];
        ASSERT_TRUE(std::isfinite(weight)) << "row " << row << ", key " << j;
        total += weight;
      }
      ASSERT_NEAR(total, 1.0, 64 * 0x1p-24) << "row " << row;
    }
  }
}

// The recount of a few queries' rows leaves grad_output as given (their float log-sum-exp is
// exact but for its rounding): a finite grad_output at float's maximum gives finite gradients, as
// without the recount (a division of the rows by their totals, 1 − 3e−6, overflowed it to ∞ and
// the call named grad_output as not finite). 4 and 10 queries: the recount and the forward again.
TEST_P(FunctionalSdpa, FewQueriesAtLargeScoresTakeGradOutputAtFloatsMaximum) {
  for (const int64_t n : {4, 10}) {
    SCOPED_TRACE("queries " + std::to_string(n));
    // 4 heads, each row's own column at float's maximum: the rows' totals (1 ± 3e−6) fall under
    // 1 in some of them; dV's columns then hold one row's P times the maximum each.
    constexpr int64_t kHeads = 4, kColumns = 16;
    SdpaTestCase c({1, kHeads, kHeads, n, 64, 64, kColumns}, 980, 1.6F);
    c.set_scale(1.0F);  // scores ~ N(0, 20²)
    for (float& value : c.v.span()) value *= 1e-3F;
    for (float& value : c.grad_out.span()) value = 0.0F;
    for (int64_t row = 0; row < kHeads * n; ++row)
      c.grad_out.data()[row * kColumns + row % n] = std::numeric_limits<float>::max();
    const AttentionForward forward = scaled_dot_product_attention(c.q, c.k, c.v, c.options);
    ASSERT_GT(*std::max_element(forward.log_sum_exp.begin(), forward.log_sum_exp.end()), 30.0F);
    const AttentionBackward grads = scaled_dot_product_attention_backward(
        c.q, c.k, c.v, forward.output, c.grad_out, forward.log_sum_exp, c.options);
    const reference::SdpaGradients expected = c.expected_backward();
    EXPECT_TRUE(close_to(grads.value, expected.v, kBackwardTolerance)) << "grad value";
    // dS = P ⊙ (dP − D) cancels terms of 3e35 to leave ~1e26: in float, dQ and dK hold to the
    // bound of ScoresOfLargeMagnitudeGiveExactWeightsAndGradients (dS's rounding), finite.
    const double ds_bound =
        4.0 * 8.0 * 0x1p-24 * 8.0 * max_magnitude(c.grad_out) * max_magnitude(c.v);
    for (int64_t e = 0; e < grads.query.numel(); ++e) {
      ASSERT_LE(std::fabs(grads.query.data()[e] - expected.q[static_cast<size_t>(e)]),
                ds_bound * max_magnitude(c.k))
          << "grad query " << e;
    }
    for (int64_t e = 0; e < grads.key.numel(); ++e) {
      ASSERT_LE(std::fabs(grads.key.data()[e] - expected.k[static_cast<size_t>(e)]),
                ds_bound * max_magnitude(c.q) * static_cast<double>(n))
          << "grad key " << e;
    }
  }
}

// Heads of 5–16 queries at scores far from 0 run the forward again for their rows, and no longer
// read the caller's output: a NaN in it is still named (it went unnoticed, the gradients finite).
TEST_P(FunctionalSdpa, FewQueriesAtLargeScoresNameANonFiniteOutput) {
  for (const int64_t n : {3, 8}) {
    SCOPED_TRACE("queries " + std::to_string(n));
    SdpaTestCase c({1, 2, 2, n, 200, 64, 8}, 995, 1.6F);
    c.set_scale(1.0F);  // scores ~ N(0, 20²)
    AttentionForward forward = scaled_dot_product_attention(c.q, c.k, c.v, c.options);
    ASSERT_GT(*std::max_element(forward.log_sum_exp.begin(), forward.log_sum_exp.end()), 30.0F);
    forward.output.data()[1] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_THROW_MESSAGE(
        scaled_dot_product_attention_backward(c.q, c.k, c.v, forward.output, c.grad_out,
                                              forward.log_sum_exp, c.options),
        ValueError, "output: expected finite values, got NaN at flat index 1");
  }
}

// FlashAttention-2's backward decomposes over key blocks given the whole rows' log-sum-exp (ring
// attention's block pairs): with log_sum_exp_spans_more_keys the blocks' dQ add up to the whole
// call's and their dK, dV are its rows. Scores near ±400 put |lse| past 256, where a call that
// owns its log-sum-exp recounts each row's weights: over one block's keys that recount divided
// grad_output by the block's share of the row (about a half), not by the rounding's factor.
// Tolerance: the blocks keep the float log-sum-exp as given, whose rounding at |lse| ≈ 400 is
// 2^−24 · 400 ≈ 2.4e−5 of each P, which the whole call cancels.
TEST_P(FunctionalSdpa, KeyBlocksGivenTheWholeRowsLogSumExpAddUpToTheWholeBackward) {
  SdpaTestCase c({1, 2, 2, 20, 40, 16, 8}, 920);
  c.set_scale(40.0F);
  const AttentionForward whole = scaled_dot_product_attention(c.q, c.k, c.v, c.options);
  float largest = 0.0F;
  for (const float lse : whole.log_sum_exp) largest = std::max(largest, std::fabs(lse));
  ASSERT_GT(largest, 256.0F);
  const AttentionBackward expected = scaled_dot_product_attention_backward(
      c.q, c.k, c.v, whole.output, c.grad_out, whole.log_sum_exp, c.options);
  const auto rows = [](const Tensor& x, int64_t first, int64_t count) {
    Tensor block(Shape{x.dim(0), x.dim(1), count, x.dim(3)});
    for (int64_t b = 0; b < x.dim(0); ++b)
      for (int64_t h = 0; h < x.dim(1); ++h)
        for (int64_t j = 0; j < count; ++j)
          for (int64_t e = 0; e < x.dim(3); ++e) block(b, h, j, e) = x(b, h, first + j, e);
    return block;
  };
  AttentionOptions block_options = c.options;
  block_options.log_sum_exp_spans_more_keys = true;
  Tensor grad_query(c.q.shape());
  for (const int64_t first : {0, 20}) {
    const Tensor k = rows(c.k, first, 20), v = rows(c.v, first, 20);
    const AttentionBackward block = scaled_dot_product_attention_backward(
        c.q, k, v, whole.output, c.grad_out, whole.log_sum_exp, block_options);
    for (int64_t e = 0; e < grad_query.numel(); ++e) grad_query.data()[e] += block.query.data()[e];
    for (int64_t b = 0; b < 1; ++b)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t j = 0; j < 20; ++j) {
          for (int64_t e = 0; e < 16; ++e)
            EXPECT_NEAR(block.key(b, h, j, e), expected.key(b, h, first + j, e),
                        1e-3 * max_magnitude(expected.key));
          for (int64_t e = 0; e < 8; ++e)
            EXPECT_NEAR(block.value(b, h, j, e), expected.value(b, h, first + j, e),
                        1e-3 * max_magnitude(expected.value));
        }
  }
  EXPECT_TRUE(close_to(grad_query, testing::to_doubles(expected.query), 1e-3));
}

// A window side of 2^61 − 1 keys or more reaches past any tensor: the call must equal the call
// without that side. The diagonal plus INT64_MAX − 2 overflowed int64 and hid every key (zero
// outputs, exit status 0 from `attn run --window -1,9223372036854775807`).
TEST_P(FunctionalSdpa, WindowSidesPastAnyTensorAreUnbounded) {
  constexpr int64_t kHuge[] = {Shape::kMaxElements, INT64_MAX - 2, INT64_MAX};
  for (const bool bottom_right : {false, true}) {
    for (const int64_t huge : kHuge) {
      for (const SlidingWindow window : {SlidingWindow{-1, huge}, SlidingWindow{huge, -1},
                                         SlidingWindow{huge, huge}, SlidingWindow{3, huge}}) {
        SCOPED_TRACE("window (" + std::to_string(window.left) + ", " +
                     std::to_string(window.right) + ")" + (bottom_right ? " bottom-right" : ""));
        // L > S, so bottom-right diagonals start below key 0 (the left side's overflow).
        SdpaTestCase c({2, 2, 2, 9, 6, 8, 4}, 900);
        c.set_alignment(bottom_right);
        if (window.left >= 0 && window.left < Shape::kMaxElements) c.set_window(window.left, -1);
        const AttentionForward expected = scaled_dot_product_attention(c.q, c.k, c.v, c.options);
        const AttentionBackward expected_grads = scaled_dot_product_attention_backward(
            c.q, c.k, c.v, expected.output, c.grad_out, expected.log_sum_exp, c.options);
        c.options.window = window;
        const AttentionForward forward = scaled_dot_product_attention(c.q, c.k, c.v, c.options);
        EXPECT_TRUE(close_to(forward.output, testing::to_doubles(expected.output), 1e-6))
            << "output";
        const AttentionBackward grads = scaled_dot_product_attention_backward(
            c.q, c.k, c.v, forward.output, c.grad_out, forward.log_sum_exp, c.options);
        EXPECT_TRUE(close_to(grads.query, testing::to_doubles(expected_grads.query), 1e-6))
            << "grad query";
        EXPECT_TRUE(close_to(grads.key, testing::to_doubles(expected_grads.key), 1e-6))
            << "grad key";
        EXPECT_TRUE(close_to(grads.value, testing::to_doubles(expected_grads.value), 1e-6))
            << "grad value";
      }
    }
  }
}

// A diagonal offset is refused past ±(2^61 − 2), where a query's diagonal key plus a window side
// could leave int64: INT64_MAX wrapped around and hid every key (zero outputs, no error). Within
// it, causal offsets far either way see every key or none.
TEST(FunctionalSdpaOptions, DiagonalOffsetsPastAnyTensorAreRefused) {
  Rng rng(77);
  const Tensor q = testing::random_tensor(Shape{1, 2, 5, 4}, rng),
               k = testing::random_tensor(Shape{1, 2, 8, 4}, rng),
               v = testing::random_tensor(Shape{1, 2, 8, 3}, rng);
  const AttentionForward unmasked = scaled_dot_product_attention(q, k, v, AttentionOptions{});
  AttentionOptions options;
  options.causal = true;
  options.alignment = DiagonalAlignment::kOffset;
  for (const int64_t offset :
       {INT64_MAX, INT64_MAX - 100, Shape::kMaxElements, INT64_MIN, -Shape::kMaxElements}) {
    SCOPED_TRACE("offset " + std::to_string(offset));
    options.diagonal_offset = offset;
    EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, k, v, options), ValueError,
                         "diagonal_offset: expected an offset within ±2305843009213693950");
    options.window = SlidingWindow{2, 2};
    EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, k, v, options), ValueError,
                         "got " + std::to_string(offset));
    options.window.reset();
  }
  options.diagonal_offset = Shape::kMaxElements - 1;
  const AttentionForward sees_all = scaled_dot_product_attention(q, k, v, options);
  // (Another kernel route may sum in another order: within float rounding.)
  EXPECT_TRUE(close_to(sees_all.output, testing::to_doubles(unmasked.output), 1e-6));
  options.diagonal_offset = -(Shape::kMaxElements - 1);
  const AttentionForward sees_none = scaled_dot_product_attention(q, k, v, options);
  for (const float x : sees_none.output.values()) EXPECT_EQ(x, 0.0F);
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
    config.shape = {1 + pick(2),   q_heads,      q_heads,     1 + pick(90),
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

// Decoding shapes — up to 16 queries against more keys, without a mask or dropout — run on
// the decode kernel (next test): against the reference, forward and the backward from the decode
// kernel's log-sum-exp, for every option that kernel takes, key counts that divide no tile or
// split, group sizes 1–8, and valid lengths per batch element (0 and m among them) or, for one
// query, per query.
TEST_P(FunctionalSdpa, DecodingShapesMatchTheReference) {
  // attention_weights recomputes each score: the prefill kernels sum a score in the weights
  // kernel's order, so their float roundings cancel against the forward's log-sum-exp; the decode
  // kernel sums in its own, so where scores reach far from 0 (entries ~N(0, 9), scale 0.3 and
  // E = 32: ~60, whose float ulp is 3.8e-6) the weights take their own rows' log-sum-exp (they were
  // 1.8e-5 off before it, against the forward's 1e-5).
  uint64_t seed = 500;
  for (const int64_t n : {1, 4, 16}) {
    for (const int64_t group : {1, 4, 8}) {
      if (group * n > kMaxDecodeRows) continue;
      for (const int64_t m : {n, int64_t{77}, int64_t{700}}) {
        const SdpaShape shape{2, 2 * group, 2, n, m, 32, 24};
        check({shape}, seed++);
        check({.shape = shape, .causal = Causal::kBottomRight, .softcap = 2.0F, .sinks = true},
              seed++);
        check({.shape = shape, .window_left = 40, .window_right = 0, .bottom_right = true}, seed++);
        // ALiBi from the last key's diagonal (the decode kernel's positions), and from the
        // top-left one (not the kernel's: the prefill path), both right.
        check({.shape = shape, .bottom_right = true, .softcap = 2.0F, .alibi = true}, seed++);
        check({.shape = shape, .causal = Causal::kBottomRight, .alibi = true, .sinks = true},
              seed++);
        check({.shape = shape, .alibi = true}, seed++);
        // Top-left diagonals that end before the last key: the decode kernel's over the keys up
        // to the last query's diagonal where no query sees past its own (causal, a window with
        // nothing on the right); a window reaching right of it stays on the prefill path.
        check({.shape = shape, .causal = Causal::kTopLeft, .alibi = true, .sinks = true}, seed++);
        check({.shape = shape, .window_left = 10, .window_right = 0}, seed++);
        check({.shape = shape, .window_left = 10, .window_right = 3}, seed++);
        check({.shape = shape, .lengths = n == 1, .scale = 0.3F, .magnitude = 3.0F}, seed++);
        for (const bool causal : {false, true}) {
          // Per-batch lengths: with causal, not decoding-shaped (the diagonal is the last key's,
          // not the sequence's), so the prefill kernel answers; the same test either way.
          SCOPED_TRACE("batch lengths, causal " + std::to_string(causal) + ", m " +
                       std::to_string(m) + ", n " + std::to_string(n));
          SdpaTestCase c(shape, seed++);
          if (causal) c.set_causal(true);
          c.set_batch_lengths({0, m / 2 + 1});
          check_case(c, false, false);
        }
      }
    }
  }
}

// The calls above do run on the decode kernel: their outputs and log-sum-exps equal, bit for bit,
// the decode kernel's called directly on the same tensors (the prefill kernel sums in another
// order, so it would differ in the last bits), for plain, causal, windowed and capped calls, a
// key-padding mask (the kernel's key ranges), per-sequence lengths, ALiBi, masks read as
// entries: a bool mask per head with gaps in its rows, a float bias beside causal and a soft cap,
// is_causal's top-left diagonal with ALiBi (the kernel's lengths end at the last query's
// diagonal key), and key padding that leaves a sequence no key (its rows 0 with a log-sum-exp of
// −∞, as the prefill path's, without redoing the call there).
TEST_P(FunctionalSdpa, DecodingShapesRunTheDecodeKernel) {
  // Groups of 4 heads × 2 queries; 7 queries of one head each (rows that fill no vector: the
  // kernel's lanes past them must not count as scores).
  for (const SdpaShape& shape :
       {SdpaShape{3, 8, 2, 2, 300, 64, 40}, SdpaShape{3, 2, 2, 7, 300, 64, 40}})
    for (int which = 0; which < 10; ++which) {
      SCOPED_TRACE(std::to_string(which) + ", n = " + std::to_string(shape.queries));
      SdpaTestCase c(shape, 600 + static_cast<uint64_t>(which));
      DecodeOptions decode;
      decode.scale = 1.0F / std::sqrt(64.0F);
      decode.causal = false;
      std::vector<int64_t> ranges;
      if (which == 3) {
        // Key padding of batch element b: keys [40·b, 300 − 30·b) — as key ranges per row.
        c.set_mask(Shape{3, 1, 1, 300}, true, 1.0);
        c.hide_if(
            [](int64_t b, int64_t, int64_t, int64_t j) { return j < 40 * b || j >= 300 - 30 * b; });
        for (int64_t b = 0; b < 3; ++b) {
          for (int64_t row = 0; row < shape.q_heads * shape.queries; ++row) {
            ranges.push_back(40 * b);
            ranges.push_back(300 - 30 * b);
          }
        }
        decode.key_ranges = ranges.data();
      }
      if (which == 9) {  // key padding: batch element 1 sees no key, the others keys [0, 250)
        c.set_mask(Shape{3, 1, 1, 300}, true, 1.0);
        c.hide_if([](int64_t b, int64_t, int64_t, int64_t j) { return b == 1 || j >= 250; });
        for (int64_t b = 0; b < 3; ++b) {
          for (int64_t row = 0; row < shape.q_heads * shape.queries; ++row) {
            ranges.push_back(0);
            ranges.push_back(b == 1 ? 0 : 250);
          }
        }
        decode.key_ranges = ranges.data();
      }
      if (which == 1) {
        c.set_causal(true);
        c.set_softcap(3.0F);
        decode.causal = true;
        decode.softcap = 3.0F;
      }
      if (which == 2) {
        c.set_alignment(true);
        c.set_window(50, -1);
        c.set_sinks();
        decode.window_left = 50;
        decode.sinks = c.sinks.data();
      }
      if (which == 5) {  // ALiBi from each query's position (the last key's diagonal), causal
        c.set_causal(true);
        c.set_alignment(true);
        c.set_alibi();
        decode.causal = true;
        decode.alibi_slopes = c.alibi.data();
      }
      const int64_t heads = shape.q_heads, queries = shape.queries;
      if (which == 6) {  // a bool mask per head whose rows have gaps: entries
        c.set_mask(Shape{3, heads, queries, 300}, true, 0.6);
        decode.mask = ScoreMask{attn::MaskKind::kBool,
                                c.mask_bytes.data(),
                                heads * queries * 300,
                                queries * 300,
                                300,
                                1};
      }
      if (which == 7) {  // a float bias over the keys, causal and capped: entries
        c.set_mask(Shape{3, 1, 1, 300}, false, 0.8);
        c.set_causal(true);
        c.set_softcap(3.0F);
        decode.mask = ScoreMask{attn::MaskKind::kFloat, c.mask_floats.data(), 300, 0, 0, 1};
        decode.causal = true;
        decode.softcap = 3.0F;
      }
      std::vector<int64_t> lengths(3, shape.keys);
      if (which == 8) {  // top-left causal, ALiBi from it: keys [0, n) on the kernel
        c.set_causal(false);
        c.set_alibi();
        decode.causal = true;
        decode.alibi_slopes = c.alibi.data();
        lengths.assign(3, shape.queries);
      }
      if (which == 4) {  // per-sequence lengths: tiles of the shorter ones are masked
        lengths = {300, 120, 7};
        c.set_batch_lengths(lengths);
      }
      const AttentionForward forward = scaled_dot_product_attention(c.q, c.k, c.v, c.options);
      const auto cache = [](const Tensor& t) {
        CacheTensorView view;
        view.data = t.data();
        view.batch = t.dim(0);
        view.heads = t.dim(1);
        view.capacity = t.dim(2);
        view.cols = t.dim(3);
        view.row_stride = t.dim(3);
        view.head_stride = t.dim(2) * t.dim(3);
        view.batch_stride = t.dim(1) * view.head_stride;
        return view;
      };
      Tensor direct(forward.output.shape());
      std::vector<float> direct_lse(forward.log_sum_exp.size());
      const int64_t n = shape.queries, h = shape.q_heads;
      decode_attention_forward(
          {c.q.data(), 3, h, n, 64, h * n * 64, n * 64, 64}, cache(c.k), cache(c.v), lengths.data(),
          decode, {direct.data(), 3, h, n, 40, h * n * 40, n * 40, 40}, direct_lse.data());
      for (int64_t e = 0; e < direct.numel(); ++e)
        ASSERT_EQ(forward.output.data()[e], direct.data()[e]) << "output element " << e;
      for (size_t r = 0; r < direct_lse.size(); ++r)
        ASSERT_EQ(forward.log_sum_exp[r], direct_lse[r]) << "log-sum-exp row " << r;
      if (which == 9) {
        const int64_t rows = h * n;  // batch element 1's
        for (int64_t e = rows * 40; e < 2 * rows * 40; ++e)
          ASSERT_EQ(forward.output.data()[e], 0.0F) << "output element " << e;
        for (int64_t r = rows; r < 2 * rows; ++r) {
          ASSERT_EQ(forward.log_sum_exp[static_cast<size_t>(r)],
                    -std::numeric_limits<float>::infinity())
              << "log-sum-exp row " << r;
        }
      }
    }
}

// A mask given by which keys it hides: hidden(b, h, i, j) over the entries of `mask_shape`.
struct IntervalMaskCase {
  const char* name;
  Shape mask_shape;
  std::function<bool(int64_t, int64_t, int64_t, int64_t)> hidden;
  bool more_options = false;  // ALiBi, a soft cap and sinks beside the mask
};

// Each case as a bool mask and as a float mask of 0 and −∞, on a fresh problem of `shape`, checked
// against the reference (check_case): with the float mask's gradient, and, with
// `without_mask_gradient`, without it too (the backward pass then reads the mask as ranges).
void check_interval_masks(const SdpaShape& shape, const std::vector<IntervalMaskCase>& cases,
                          uint64_t& seed, bool without_mask_gradient) {
  for (const IntervalMaskCase& mask_case : cases) {
    for (const bool boolean : {true, false}) {
      SCOPED_TRACE(std::string(mask_case.name) + (boolean ? ", bool" : ", float") +
                   ", n = " + std::to_string(shape.queries));
      SdpaTestCase c(shape, seed++);
      c.set_mask(mask_case.mask_shape, boolean, 1.0);
      if (!boolean) std::fill_n(c.mask_floats.data(), c.mask_floats.numel(), 0.0F);
      c.hide_if(mask_case.hidden);
      if (mask_case.more_options) {
        c.set_alibi();
        c.set_softcap(20.0F);
        c.set_sinks();
      }
      if (boolean || without_mask_gradient) check_case(c, false, mask_case.more_options);
      if (!boolean) check_case(c, true, false);
    }
  }
}

// The masks transformers passes while decoding — key padding on either side, a static cache's
// empty slots under a causal pattern, a sliding window over left padding — and any mask whose
// rows are intervals of keys (per head, empty rows), bool or float of 0 and −∞: the decode
// kernel's per-row key ranges, against the reference; a mask with a gap in a row, or a float
// bias, is read as entries by the same kernel, also right.
TEST_P(FunctionalSdpa, DecodingShapesWithIntervalMasksMatchTheReference) {
  const int64_t m = 300;
  uint64_t seed = 800;
  for (const int64_t n : {1, 4}) {
    const SdpaShape shape{2, 8, 2, n, m, 64, 40};
    check_interval_masks(
        shape,
        {{"key padding, right and left", Shape{2, 1, 1, m},
          [](int64_t b, int64_t, int64_t, int64_t j) { return b == 0 ? j >= 200 : j < 50; }},
         {"static cache, causal", Shape{2, 1, n, m},
          [](int64_t, int64_t, int64_t i, int64_t j) { return j > 150 + i; }},
         {"window over left padding", Shape{2, 1, n, m},
          [n](int64_t b, int64_t, int64_t i, int64_t j) {
            const int64_t position = m - n + i;
            return j > position || j <= position - 64 || j < (b == 0 ? 0 : 251);
          }},
         {"per head, an empty row", Shape{2, 8, n, m},
          [](int64_t b, int64_t h, int64_t i, int64_t j) {
            return (b == 1 && h == 3) || j < 10 * h + i || j >= 290 - 20 * h;
          }},
         {"a gap in each row (entries)", Shape{2, 1, n, m},
          [](int64_t, int64_t, int64_t, int64_t j) { return j >= 100 && j < 120; }},
         {"sinks beside a window per head (entries; whole tiles hidden from some heads of a group)",
          Shape{2, 8, n, m},
          [](int64_t b, int64_t h, int64_t i, int64_t j) {
            return j >= 4 + b && j < (h % 2 == 0 ? 260 : 100) + i;
          }}},
        seed, false);
    // A float mask with a bias besides 0 and −∞ is no interval: entries.
    SdpaTestCase biased(shape, seed++);
    biased.set_mask(Shape{2, 1, 1, m}, false, 0.9);
    check_case(biased, true, false);
    // Random masks (tree attention, sparse patterns): per head and query, with grouped heads, one
    // head's rows hiding every key; as bools, and as floats with a soft cap and sinks beside them.
    for (const bool boolean : {true, false}) {
      SCOPED_TRACE(std::string("random mask, ") + (boolean ? "bool" : "float") +
                   ", n = " + std::to_string(n));
      SdpaTestCase c(shape, seed++);
      c.set_mask(Shape{2, 8, n, m}, boolean, 0.3);
      c.hide_if([](int64_t b, int64_t h, int64_t, int64_t) { return b == 1 && h == 5; });
      if (!boolean) {
        c.set_softcap(5.0F);
        c.set_sinks();
      }
      check_case(c, !boolean, !boolean);
    }
  }
}

// A decoding call of rank 5 runs each slice on the decode kernel with that slice's part of a mask
// read as entries: the same bits as each slice called alone.
TEST_P(FunctionalSdpa, DecodingSlicesReadTheirOwnPartOfAMask) {
  Rng rng(950);
  const Tensor q = testing::random_tensor(Shape{2, 3, 4, 2, 32}, rng);
  const Tensor k = testing::random_tensor(Shape{2, 3, 4, 200, 32}, rng);
  const Tensor v = testing::random_tensor(Shape{2, 3, 4, 200, 24}, rng);
  Tensor mask(Shape{3, 1, 2, 200});  // broadcast over N and the heads; one part per slice
  for (int64_t e = 0; e < mask.numel(); ++e)
    mask.data()[e] = rng.uniform() < 0.4 ? -std::numeric_limits<float>::infinity() : rng.normal();
  AttentionOptions options;
  options.attn_mask = AttentionMask::additive(mask);
  const AttentionForward whole = scaled_dot_product_attention(q, k, v, options);
  const int64_t q_slice = 4 * 2 * 32, kv_slice = 4 * 200 * 32, v_slice = 4 * 200 * 24;
  for (int64_t nn = 0; nn < 2; ++nn) {
    for (int64_t a = 0; a < 3; ++a) {
      const int64_t slice = nn * 3 + a;
      AttentionOptions alone;
      alone.attn_mask =
          AttentionMask::additive(ConstStridedView(mask.data() + a * 2 * 200, Shape{1, 1, 2, 200}));
      const AttentionForward part = scaled_dot_product_attention(
          ConstStridedView(q.data() + slice * q_slice, Shape{1, 4, 2, 32}),
          ConstStridedView(k.data() + slice * kv_slice, Shape{1, 4, 200, 32}),
          ConstStridedView(v.data() + slice * v_slice, Shape{1, 4, 200, 24}), alone);
      for (int64_t e = 0; e < part.output.numel(); ++e) {
        ASSERT_EQ(whole.output.data()[slice * 4 * 2 * 24 + e], part.output.data()[e])
            << "slice " << slice << ", element " << e;
      }
    }
  }
}

// A float mask read as entries by the decode kernel is checked whole first, as the prefill path
// checks it: NaN and +∞ are named with their flat index, also where the kernel reads no entry
// (key 250 of a sequence of 100 valid keys).
TEST_P(FunctionalSdpa, DecodingShapesNameAMasksNaNAndPlusInfinity) {
  uint64_t seed = 960;
  const float bad_values[] = {NAN, std::numeric_limits<float>::infinity()};
  const char* bad_names[] = {"NaN", "inf"};
  for (int which = 0; which < 2; ++which) {
    for (const int64_t flat : {int64_t{377}, int64_t{250}}) {
      SdpaTestCase c({2, 4, 4, 1, 300, 32, 16}, seed++);
      c.set_mask(Shape{2, 1, 1, 300}, false, 0.7);
      c.set_batch_lengths({100, 300});
      c.mask_floats.data()[flat] = bad_values[which];
      EXPECT_THROW_MESSAGE(scaled_dot_product_attention(c.q, c.k, c.v, c.options), ValueError,
                           std::string("attn_mask: expected finite values or -inf, got ") +
                               bad_names[which] + " at flat index " + std::to_string(flat));
    }
  }
}

// Prefill shapes with a mask whose every row is one interval of keys — as transformers passes
// causal, padding and window masks — run on key ranges instead of the mask's entries
// (mask_intervals.hpp): the same results as the reference, with other options beside them, and
// with the float mask's gradient (which keeps the entries for the backward pass).
TEST_P(FunctionalSdpa, PrefillShapesWithIntervalMasksMatchTheReference) {
  const int64_t m = 300;
  uint64_t seed = 1200;
  for (const int64_t n : {40, 150}) {
    const SdpaShape shape{2, 4, 2, n, m, 32, 24};
    check_interval_masks(
        shape,
        {{"causal, bottom-right", Shape{n, m},
          [n](int64_t, int64_t, int64_t i, int64_t j) { return j > m - n + i; }},
         {"causal over left padding", Shape{2, 1, n, m},
          [n](int64_t b, int64_t, int64_t i, int64_t j) {
            return j > m - n + i || j < (b == 0 ? 0 : 70);
          }},
         {"key padding", Shape{2, 1, 1, m},
          [](int64_t b, int64_t, int64_t, int64_t j) { return j >= (b == 0 ? 300 : 130); }},
         {"window, ALiBi, soft cap and sinks", Shape{2, 1, n, m},
          [n](int64_t, int64_t, int64_t i, int64_t j) {
            const int64_t position = m - n + i;
            return j > position || j <= position - 90;
          },
          true},
         {"per head, an empty row", Shape{2, 4, n, m},
          [](int64_t b, int64_t h, int64_t i, int64_t j) {
            return (b == 1 && h == 3 && i == 7) || j < 10 * h + i || j >= 290 - 20 * h;
          }}},
        seed, true);
  }
}

// DecodingShapesNameNonFiniteKeysAndValues for one shape.
void NamesNonFiniteKeysAndValues(const SdpaShape& shape) {
  const float bad_values[] = {NAN, std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
  const char* bad_names[] = {"NaN", "inf", "-inf"};
  uint64_t seed = 700;
  for (const bool key : {true, false}) {
    const int64_t columns = key ? shape.depth : shape.value_depth;
    const int64_t elements = shape.batch * shape.kv_heads * shape.keys * columns;
    for (const int64_t flat : {int64_t{0}, 157 * columns + 5, elements - 1}) {
      for (int which = 0; which < 3; ++which) {
        for (const bool capped : {false, true}) {
          SdpaTestCase c(shape, seed++);
          if (capped) c.set_softcap(3.0F);
          Tensor& tensor = key ? c.k : c.v;
          tensor.data()[flat] = bad_values[which];
          if (key) {
            // Every query head of that key's group: a positive entry, so that −∞ scores −∞.
            const int64_t b = flat / (shape.kv_heads * shape.keys * columns);
            const int64_t g = flat / (shape.keys * columns) % shape.kv_heads;
            const int64_t group = shape.q_heads / shape.kv_heads;
            for (int64_t h = g * group; h < (g + 1) * group; ++h)
              c.q(b, h, 0, flat % columns) = 1.0F;
          }
          const std::string expected = std::string(key ? "key" : "value") +
                                       ": expected finite values, got " + bad_names[which] +
                                       " at flat index " + std::to_string(flat);
          SCOPED_TRACE(expected + (capped ? ", soft-capped" : ""));
          EXPECT_THROW_MESSAGE(scaled_dot_product_attention(c.q, c.k, c.v, c.options), ValueError,
                               expected);
        }
      }
    }
  }
}

// Decoding shapes skip the prefill path's scan of the keys and values (decode_route.hpp): a NaN
// or ±∞ anywhere in them must still be named, as the scan names it. A key entry of −∞ under a
// positive query entry gives a score of −∞ — a weight of 0, an output that looks fine — which the
// kernel's check of its scores sees; soft-capping would turn ±∞ scores into ±softcap.
// Groups of 4 query heads (the score tile's rows fill whole 4-row steps), 1 (multi-head
// attention's one row, padded to 4) and 6 (8 rows scored in AVX-512's 16 lanes, so the kernel's
// probe of the scores skips lanes).
// One key/value head of 1000 keys: the keys split over tasks whose partial results the call merges
// after them (the other shapes' tasks write their rows themselves).
TEST_P(FunctionalSdpa, DecodingShapesNameNonFiniteKeysAndValues) {
  for (const SdpaShape& shape :
       {SdpaShape{2, 8, 2, 1, 300, 64, 40}, SdpaShape{2, 2, 2, 1, 300, 64, 40},
        SdpaShape{1, 6, 1, 1, 300, 64, 40}, SdpaShape{1, 4, 1, 1, 1000, 64, 40}}) {
    SCOPED_TRACE("query heads " + std::to_string(shape.q_heads) + ", key/value heads " +
                 std::to_string(shape.kv_heads));
    NamesNonFiniteKeysAndValues(shape);
  }
}

// Decoding shapes do not scan the query either: the decode kernel checks every query row it is
// given, also a row that sees no key (key padding that hides every key of batch element 1) and a
// row whose NaN would otherwise vanish under soft-capping, and the call is redone on the scanned
// path, which names the query: 1 and 16 queries, a group of 4 heads.
TEST_P(FunctionalSdpa, DecodingShapesNameANonFiniteQuery) {
  const float bad_values[] = {NAN, std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
  const char* bad_names[] = {"NaN", "inf", "-inf"};
  uint64_t seed = 980;
  for (const int64_t n : {1, 16}) {
    const SdpaShape shape{2, 8, 2, n, 300, 64, 40};
    const int64_t elements = shape.batch * shape.q_heads * n * shape.depth;
    // The first element, one in batch element 1 (which sees no key when masked), the last.
    for (const int64_t flat : {int64_t{0}, elements / 2 + 3 * shape.depth + 7, elements - 1}) {
      for (int which = 0; which < 3; ++which) {
        for (const bool masked : {false, true}) {
          SdpaTestCase c(shape, seed++);
          if (masked) {
            c.set_mask(Shape{2, 1, 1, 300}, true, 1.0);
            c.hide_if([](int64_t b, int64_t, int64_t, int64_t j) { return b == 1 || j >= 200; });
          } else {
            c.set_softcap(3.0F);
          }
          c.q.data()[flat] = bad_values[which];
          const std::string expected = std::string("query: expected finite values, got ") +
                                       bad_names[which] + " at flat index " + std::to_string(flat);
          SCOPED_TRACE(expected + (masked ? ", key padding" : ", soft-capped"));
          EXPECT_THROW_MESSAGE(scaled_dot_product_attention(c.q, c.k, c.v, c.options), ValueError,
                               expected);
        }
      }
    }
  }
}

// What the decode kernel never reads it does not check: a NaN value row and an infinite key row
// that a mask hides from every query, beyond every tile read, leave the output as it was (the
// prefill path, which scans every input first, refuses such a call) — for key padding (the
// kernel's key ranges) and for sinks beside a window (entries: whole tiles between them hidden).
TEST_P(FunctionalSdpa, DecodingShapesReadOnlyTheKeysTheySee) {
  for (const bool sinks : {false, true}) {
    SCOPED_TRACE(sinks ? "sinks beside a window" : "key padding");
    SdpaTestCase c({1, 4, 1, 1, 1000, 32, 16}, 900);
    c.set_mask(Shape{1, 1, 1, 1000}, true, 1.0);
    c.hide_if([sinks](int64_t, int64_t, int64_t, int64_t j) {
      return sinks ? j >= 4 && j < 700 : j >= 200;
    });
    const AttentionForward clean = scaled_dot_product_attention(c.q, c.k, c.v, c.options);
    const int64_t hidden_row = sinks ? 500 : 900, hidden_key = sinks ? 300 : 950;
    c.v.data()[hidden_row * 16 + 3] = NAN;
    c.k.data()[hidden_key * 32] = std::numeric_limits<float>::infinity();
    const AttentionForward dirty = scaled_dot_product_attention(c.q, c.k, c.v, c.options);
    for (int64_t e = 0; e < clean.output.numel(); ++e)
      ASSERT_EQ(dirty.output.data()[e], clean.output.data()[e]) << e;
  }
}

// The prefill kernels read key and value rows only where some query may see them through is_causal
// and a window, widened to the backward pass's tiles of 64 keys aligned at key 0
// (PreparedAttention::keys_read), and only those rows are scanned: NaN, ±∞ and magnitudes past
// the score bound in every other row leave the output, the log-sum-exp and the gradients as they
// were (the gradients of those rows 0). A NaN in the last row the backward pass reads is named by
// its index in the whole tensor there, and the forward pass, which checks the rows its kernel
// reads (prefill_without_scans), names a NaN in the last row some query sees.
TEST_P(FunctionalSdpa, PrefillReadsOnlyTheKeysSomeQuerySees) {
  struct Bounds {
    const char* name;
    int64_t queries, keys, first_read, end_read, last_seen;
    std::function<void(SdpaTestCase&)> set;
  };
  const Bounds cases[] = {
      // Keys [0, 37) seen, [0, 64) read.
      {"is_causal top-left, L < S", 37, 300, 0, 64, 36,
       [](SdpaTestCase& c) { c.set_causal(false); }},
      // Keys [240, 300) seen, [192, 300) read.
      {"a window of 20 keys, bottom-right", 40, 300, 192, 300, 299,
       [](SdpaTestCase& c) {
         c.set_causal(true);
         c.set_window(20, 0);
       }},
      // Keys [0, 40) seen, [0, 64) read.
      {"is_causal 10 keys behind the queries", 50, 200, 0, 64, 39,
       [](SdpaTestCase& c) {
         c.options.causal = c.problem.causal = true;
         c.set_diagonal_offset(-10);
       }},
  };
  const float unread[] = {NAN, std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(), 3e38F};
  for (const Bounds& bounds : cases) {
    SCOPED_TRACE(bounds.name);
    SdpaTestCase c({2, 4, 2, bounds.queries, bounds.keys, 64, 40}, 950);
    bounds.set(c);
    const auto run = [&c] {
      AttentionForward forward = scaled_dot_product_attention(c.q, c.k, c.v, c.options);
      AttentionBackward backward = scaled_dot_product_attention_backward(
          c.q, c.k, c.v, forward.output, c.grad_out, forward.log_sum_exp, c.options);
      Tensor weights = attention_weights(c.q, c.k, forward.log_sum_exp, c.options);
      return std::tuple{std::move(forward), std::move(backward), std::move(weights)};
    };
    const auto [clean, clean_grads, clean_weights] = run();
    int64_t written = 0;
    for (Tensor* input : {&c.k, &c.v}) {
      const int64_t cols = input->dim(-1);
      for (int64_t e = 0; e < input->numel(); ++e) {
        const int64_t row = e / cols % bounds.keys;
        if (row < bounds.first_read || row >= bounds.end_read)
          input->data()[e] = unread[written++ % 4];
      }
    }
    const auto [dirty, dirty_grads, dirty_weights] = run();
    for (int64_t e = 0; e < clean.output.numel(); ++e)
      ASSERT_EQ(dirty.output.data()[e], clean.output.data()[e]) << "output " << e;
    ASSERT_EQ(dirty_weights.values(), clean_weights.values());
    ASSERT_EQ(dirty.log_sum_exp, clean.log_sum_exp);
    const std::pair<const Tensor*, const Tensor*> gradients[] = {
        {&dirty_grads.query, &clean_grads.query},
        {&dirty_grads.key, &clean_grads.key},
        {&dirty_grads.value, &clean_grads.value}};
    for (const auto& [dirty_gradient, clean_gradient] : gradients) {
      const int64_t cols = clean_gradient->dim(-1);
      for (int64_t e = 0; e < clean_gradient->numel(); ++e) {
        ASSERT_EQ(dirty_gradient->data()[e], clean_gradient->data()[e]) << "gradient " << e;
        const int64_t row = e / cols % clean_gradient->dim(-2);
        if (clean_gradient != &clean_grads.query &&
            (row < bounds.first_read || row >= bounds.end_read)) {
          ASSERT_EQ(clean_gradient->data()[e], 0.0F) << "unread row's gradient " << e;
        }
      }
    }
    // Batch 1, key/value head 1, the last row read, column 5.
    const int64_t flat = ((1 * 2 + 1) * bounds.keys + bounds.end_read - 1) * 64 + 5;
    const float read_value = c.k.data()[flat];
    c.k.data()[flat] = NAN;
    EXPECT_THROW_MESSAGE(
        scaled_dot_product_attention_backward(c.q, c.k, c.v, clean.output, c.grad_out,
                                              clean.log_sum_exp, c.options),
        ValueError, "key: expected finite values, got NaN at flat index " + std::to_string(flat));
    // The last row seen, column 7, in the same head.
    c.k.data()[flat] = read_value;
    const int64_t seen = ((1 * 2 + 1) * bounds.keys + bounds.last_seen) * 64 + 7;
    c.k.data()[seen] = -INFINITY;
    EXPECT_THROW_MESSAGE(
        scaled_dot_product_attention(c.q, c.k, c.v, c.options), ValueError,
        "key: expected finite values, got -inf at flat index " + std::to_string(seen));
  }
}

// A prefill call whose kernel read a NaN — found after the pass, from the magnitudes it reports
// (prefill_without_scans) — leaves zeros in the caller's output and log-sum-exp, not the pass's
// result, and names the input as the scan does.
TEST_P(FunctionalSdpa, NonFiniteInputFoundAfterThePassLeavesZeros) {
  Rng rng(951);
  const Tensor q = testing::random_tensor(Shape{2, 2, 40, 16}, rng);
  const Tensor k = testing::random_tensor(Shape{2, 2, 50, 16}, rng);
  Tensor v = testing::random_tensor(Shape{2, 2, 50, 8}, rng);
  const int64_t flat = ((1 * 2 + 1) * 50 + 49) * 8 + 3;  // batch 1, head 1, the last key
  v.data()[flat] = NAN;
  Tensor out = Tensor::full(Shape{2, 2, 40, 8}, 7.0F);
  std::vector<float> log_sum_exp(2 * 2 * 40, 7.0F);
  EXPECT_THROW_MESSAGE(
      scaled_dot_product_attention(q, k, v, {}, out, log_sum_exp), ValueError,
      "value: expected finite values, got NaN at flat index " + std::to_string(flat));
  for (const float x : out.span()) ASSERT_EQ(x, 0.0F);
  for (const float x : log_sum_exp) ASSERT_EQ(x, 0.0F);
}

// The backward pass likewise (backward_without_scans): an ∞ in grad_output that its kernel read
// leaves zeros in the caller's gradients, the sinks' included, and is named as the scan names it;
// the clean call's gradients are bit for bit those of the scanned path, which a query with a
// strided last axis takes.
TEST_P(FunctionalSdpa, NonFiniteGradOutputFoundAfterThePassLeavesZeros) {
  Rng rng(952);
  const Tensor q = testing::random_tensor(Shape{2, 2, 40, 16}, rng);
  const Tensor k = testing::random_tensor(Shape{2, 2, 50, 16}, rng);
  const Tensor v = testing::random_tensor(Shape{2, 2, 50, 8}, rng);
  Tensor g = testing::random_tensor(Shape{2, 2, 40, 8}, rng);
  AttentionOptions options;
  const float sinks[] = {0.5F, -1.0F};
  options.sinks = sinks;
  const AttentionForward forward = scaled_dot_product_attention(q, k, v, options);
  // The same query with its last axis strided: the scanned path (which copies it).
  Tensor wide(Shape{2, 2, 40, 32});
  for (int64_t e = 0; e < q.numel(); ++e) wide.data()[2 * e] = q.data()[e];
  const ConstStridedView strided(wide.data(), q.shape(), std::vector<int64_t>{2560, 1280, 32, 2});
  const AttentionBackward scanned = scaled_dot_product_attention_backward(
      strided, k, v, forward.output, g, forward.log_sum_exp, options, false, true);
  const AttentionBackward unscanned = scaled_dot_product_attention_backward(
      q, k, v, forward.output, g, forward.log_sum_exp, options, false, true);
  EXPECT_EQ(unscanned.query.values(), scanned.query.values());
  EXPECT_EQ(unscanned.key.values(), scanned.key.values());
  EXPECT_EQ(unscanned.value.values(), scanned.value.values());
  EXPECT_EQ(unscanned.sinks.values(), scanned.sinks.values());
  const int64_t flat = ((1 * 2 + 1) * 40 + 39) * 8 + 5;  // batch 1, head 1, the last query
  g.data()[flat] = INFINITY;
  Tensor grad_q = Tensor::full(q.shape(), 7.0F), grad_k = Tensor::full(k.shape(), 7.0F),
         grad_v = Tensor::full(v.shape(), 7.0F);
  std::vector<float> grad_sinks(2, 7.0F);
  EXPECT_THROW_MESSAGE(
      scaled_dot_product_attention_backward(q, k, v, forward.output, g, forward.log_sum_exp,
                                            options, grad_q, grad_k, grad_v, {}, grad_sinks),
      ValueError,
      "grad_output: expected finite values, got inf at flat index " + std::to_string(flat));
  for (const Tensor* gradient : {&grad_q, &grad_k, &grad_v}) {
    for (const float x : gradient->span()) ASSERT_EQ(x, 0.0F);
  }
  for (const float x : grad_sinks) ASSERT_EQ(x, 0.0F);
  // A NaN query: the scanned path names it before it would zero the sinks' gradient itself.
  g.data()[flat] = 0.5F;
  Tensor nan_q = q;
  nan_q.data()[flat] = NAN;
  std::fill(grad_sinks.begin(), grad_sinks.end(), 7.0F);
  EXPECT_THROW_MESSAGE(
      scaled_dot_product_attention_backward(nan_q, k, v, forward.output, g, forward.log_sum_exp,
                                            options, grad_q, grad_k, grad_v, {}, grad_sinks),
      ValueError, "query: expected finite values, got NaN at flat index " + std::to_string(flat));
  for (const float x : grad_sinks) ASSERT_EQ(x, 0.0F);
}

ATTN_INSTANTIATE_FOR_EVERY_SIMD_TARGET(FunctionalSdpa);

// Rank 3 (B, L, E) is B batch elements of one head; rank 5 (N, A, H, L, E) runs each of the A
// slices as a rank-4 problem; rank 2 is one matrix; rank-3 grouped heads put the heads first.
TEST(FunctionalSdpaLayout, EveryRankMeansWhatPyTorchMeans) {
  Rng rng(8);
  const Tensor q = testing::random_tensor(Shape{2, 3, 4, 7, 8}, rng);
  const Tensor k = testing::random_tensor(Shape{2, 3, 4, 11, 8}, rng);
  const Tensor v = testing::random_tensor(Shape{2, 3, 4, 11, 5}, rng);
  const Tensor g = testing::random_tensor(Shape{2, 3, 4, 7, 5}, rng);
  Tensor mask(Shape{7, 11});
  for (int64_t e = 0; e < mask.numel(); ++e)
    mask.data()[e] = e % 5 == 0 ? -INFINITY : 0.1F * static_cast<float>(e % 7);
  AttentionOptions options;
  options.attn_mask = AttentionMask::additive(mask);
  options.causal = true;
  options.valid_lens = ValidLengths::per_batch({9, 4});
  const AttentionForward rank5 = scaled_dot_product_attention(q, k, v, options);
  const AttentionBackward grads5 = scaled_dot_product_attention_backward(
      q, k, v, rank5.output, g, rank5.log_sum_exp, options, true);
  ASSERT_EQ(rank5.output.shape(), (Shape{2, 3, 4, 7, 5}));
  Tensor mask_gradient_sum(mask.shape());
  for (int64_t a = 0; a < 3; ++a) {
    // Slice a: (2, 4, L, ·) with the batch stride of the rank-5 tensors.
    const auto slice = [a](const Tensor& x) {
      const int64_t strides[4] = {x.dim(1) * x.dim(2) * x.dim(3) * x.dim(4), x.dim(3) * x.dim(4),
                                  x.dim(4), 1};
      return ConstStridedView(x.data() + a * x.dim(2) * x.dim(3) * x.dim(4),
                              Shape{x.dim(0), x.dim(2), x.dim(3), x.dim(4)}, strides);
    };
    const AttentionForward rank4 =
        scaled_dot_product_attention(slice(q), slice(k), slice(v), options);
    const AttentionBackward grads4 = scaled_dot_product_attention_backward(
        slice(q), slice(k), slice(v), rank4.output, Tensor::from(slice_copy(slice(g))),
        rank4.log_sum_exp, options, true);
    EXPECT_TRUE(close_to(Tensor::from(slice_copy(slice(rank5.output))),
                         testing::to_doubles(rank4.output), 0.0));
    EXPECT_TRUE(close_to(Tensor::from(slice_copy(slice(grads5.query))),
                         testing::to_doubles(grads4.query), 0.0));
    for (int64_t e = 0; e < mask.numel(); ++e)
      mask_gradient_sum.data()[e] += grads4.attn_mask.data()[e];
  }
  EXPECT_TRUE(close_to(grads5.attn_mask, testing::to_doubles(mask_gradient_sum), 1e-6));

  // Rank 3 (B, L, E) = rank 4 (B, 1, L, E); rank 2 = one batch element.
  Tensor q3 = testing::random_tensor(Shape{2, 7, 8}, rng),
         k3 = testing::random_tensor(Shape{2, 11, 8}, rng),
         v3 = testing::random_tensor(Shape{2, 11, 5}, rng);
  AttentionOptions lengths;
  lengths.valid_lens = ValidLengths::per_batch({3, 11});
  const Tensor out3 = scaled_dot_product_attention(q3, k3, v3, lengths).output;
  Tensor q4 = q3, k4 = k3, v4 = v3;
  q4.reshape(Shape{2, 1, 7, 8});
  k4.reshape(Shape{2, 1, 11, 8});
  v4.reshape(Shape{2, 1, 11, 5});
  EXPECT_TRUE(close_to(scaled_dot_product_attention(q4, k4, v4, lengths).output,
                       testing::to_doubles(out3), 0.0));
  const Tensor out2 = scaled_dot_product_attention(q3.view()[1], k3.view()[1], v3.view()[1]).output;
  EXPECT_EQ(out2.shape(), (Shape{7, 5}));
  EXPECT_TRUE(close_to(out2, testing::to_doubles(Tensor::from(out3.view()[1])), 0.0));

  // PyTorch reads a rank-3 query as one batch of B heads for its mask: a (1, B or 1, L, S) mask
  // is the (B or 1, L, S) one, its gradient in its own shape. No other rank above the scores'.
  for (const int64_t heads : {int64_t{2}, int64_t{1}}) {
    Tensor mask3 = testing::random_tensor(Shape{heads, 7, 11}, rng);
    mask3.data()[3] = -INFINITY;
    Tensor mask4 = mask3;
    mask4.reshape(Shape{1, heads, 7, 11});
    AttentionOptions three, four;
    three.attn_mask = AttentionMask::additive(mask3);
    four.attn_mask = AttentionMask::additive(mask4);
    const Tensor g3 = testing::random_tensor(Shape{2, 7, 5}, rng);
    const AttentionForward forward3 = scaled_dot_product_attention(q3, k3, v3, three);
    const AttentionForward forward4 = scaled_dot_product_attention(q3, k3, v3, four);
    EXPECT_TRUE(close_to(forward4.output, testing::to_doubles(forward3.output), 0.0));
    const AttentionBackward grads3 = scaled_dot_product_attention_backward(
        q3, k3, v3, forward3.output, g3, forward3.log_sum_exp, three, true);
    const AttentionBackward grads4 = scaled_dot_product_attention_backward(
        q3, k3, v3, forward4.output, g3, forward4.log_sum_exp, four, true);
    ASSERT_EQ(grads4.attn_mask.shape(), (Shape{1, heads, 7, 11}));
    Tensor mask_gradient3 = grads3.attn_mask;
    mask_gradient3.reshape(grads4.attn_mask.shape());
    EXPECT_TRUE(close_to(grads4.attn_mask, testing::to_doubles(mask_gradient3), 0.0));
    EXPECT_TRUE(close_to(grads4.query, testing::to_doubles(grads3.query), 0.0));
  }
  AttentionOptions refused;
  refused.attn_mask = AttentionMask::additive(Tensor(Shape{2, 2, 7, 11}));
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q3, k3, v3, refused), ShapeError,
                       "attn_mask: expected a shape that broadcasts to (2, 7, 11) (the scores "
                       "(..., H_q, L, S)), got (2, 2, 7, 11)");
  refused.attn_mask = AttentionMask::additive(Tensor(Shape{1, 1, 1, 7, 11}));
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q3, k3, v3, refused), ShapeError,
                       "got (1, 1, 1, 7, 11)");
  refused.attn_mask = AttentionMask::additive(Tensor(Shape{1, 1, 7, 12}));
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q3, k3, v3, refused), ShapeError,
                       "got (1, 1, 7, 12)");
  refused.attn_mask = AttentionMask::additive(Tensor(Shape{1, 2, 4, 7, 11}));
  EXPECT_THROW_MESSAGE(
      scaled_dot_product_attention(testing::random_tensor(Shape{2, 4, 7, 8}, rng),
                                   testing::random_tensor(Shape{2, 4, 11, 8}, rng),
                                   testing::random_tensor(Shape{2, 4, 11, 5}, rng), refused),
      ShapeError, "got (1, 2, 4, 7, 11)");

  // Rank-3 grouped heads: (Hq, L, E) against (Hkv, S, E), as PyTorch's enable_gqa.
  AttentionOptions gqa;
  gqa.enable_gqa = true;
  const Tensor kv_heads = testing::random_tensor(Shape{1, 11, 8}, rng),
               values = testing::random_tensor(Shape{1, 11, 5}, rng);
  // Within float rounding, not bit for bit: grouped, the 14 rows of the key/value head take
  // AVX-512's rows-along-lanes scores (BroadcastScoreTile, more than 8 rows) where each head alone
  // (7 rows) takes the dot-product steps: the same products summed in another order (6e−8 and
  // 9e−8 apart on Zen 4).
  const Tensor grouped = scaled_dot_product_attention(q3, kv_heads, values, gqa).output;
  for (int64_t h = 0; h < 2; ++h) {
    const Tensor alone =
        scaled_dot_product_attention(q3.view()[h], kv_heads.view()[0], values.view()[0]).output;
    EXPECT_TRUE(close_to(Tensor::from(grouped.view()[h]), testing::to_doubles(alone), 1e-6));
  }
}

// Transposed views (HF transformers' (N, L, H, E).transpose(1, 2)) are read and written in place
// and give the contiguous result bit for bit; a last axis with a stride is copied first.
TEST(FunctionalSdpaLayout, StridedViewsGiveTheContiguousResult) {
  Rng rng(9);
  const int64_t N = 2, L = 13, S = 17, H = 4, E = 8;
  const Tensor q_nlhe = testing::random_tensor(Shape{N, L, H, E}, rng);
  const Tensor k_nshe = testing::random_tensor(Shape{N, S, H, E}, rng);
  const Tensor v_nshe = testing::random_tensor(Shape{N, S, H, E}, rng);
  const auto transposed = [](const Tensor& x) {  // (N, T, H, E) seen as (N, H, T, E)
    const int64_t strides[4] = {x.dim(1) * x.dim(2) * x.dim(3), x.dim(3), x.dim(2) * x.dim(3), 1};
    return ConstStridedView(x.data(), Shape{x.dim(0), x.dim(2), x.dim(1), x.dim(3)}, strides);
  };
  AttentionOptions options;
  options.causal = true;
  Tensor out_nlhe(Shape{N, L, H, E});
  const int64_t out_strides[4] = {L * H * E, E, H * E, 1};
  scaled_dot_product_attention(transposed(q_nlhe), transposed(k_nshe), transposed(v_nshe), options,
                               MutableStridedView(out_nlhe.data(), Shape{N, H, L, E}, out_strides));
  const Tensor q = Tensor::from(slice_copy(transposed(q_nlhe)));
  const Tensor k = Tensor::from(slice_copy(transposed(k_nshe)));
  const Tensor v = Tensor::from(slice_copy(transposed(v_nshe)));
  const Tensor expected = scaled_dot_product_attention(q, k, v, options).output;
  EXPECT_TRUE(
      close_to(Tensor::from(slice_copy(transposed(out_nlhe))), testing::to_doubles(expected), 0.0));

  // Every other element of the last axis: copied, same numbers.
  const Tensor wide = testing::random_tensor(Shape{N, H, L, 2 * E}, rng);
  const int64_t every_other[4] = {H * L * 2 * E, L * 2 * E, 2 * E, 2};
  const ConstStridedView q_strided(wide.data(), Shape{N, H, L, E}, every_other);
  const Tensor q_copy = Tensor::from(slice_copy(q_strided));
  EXPECT_TRUE(close_to(
      scaled_dot_product_attention(q_strided, k, v, options).output,
      testing::to_doubles(scaled_dot_product_attention(q_copy, k, v, options).output), 0.0));
}

// Outputs written over inputs, as an engine saving memory does (the output in place of the
// values or the queries; gradients in place of the queries, keys or grad_output): the result of
// separate outputs. Over the values, the kernels read V rows a later tile had overwritten
// (0.5–0.67 off at L = 128).
TEST(FunctionalSdpaLayout, EmptyAxesTakeAMaskOfNoEntries) {
  // An empty batch, head or query axis leaves the mask no entries (its data may be null, as an
  // empty vector's is): PyTorch returns the empty output, attn refused "attn_mask: expected the
  // mask's entries, got a null pointer". Float and bool masks, forward and backward, float and
  // half.
  struct Case {
    Shape query, key, mask;
  };
  const Case cases[] = {
      {Shape{0, 3, 5, 8}, Shape{0, 3, 7, 8}, Shape{0, 3, 5, 7}},
      {Shape{0, 3, 5, 8}, Shape{0, 3, 7, 8}, Shape{0, 1, 1, 7}},
      {Shape{2, 0, 5, 8}, Shape{2, 0, 7, 8}, Shape{2, 0, 5, 7}},
      {Shape{2, 3, 0, 8}, Shape{2, 3, 7, 8}, Shape{0, 7}},
      {Shape{2, 3, 5, 8}, Shape{2, 3, 0, 8}, Shape{5, 0}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.query.str() + " mask " + c.mask.str());
    const Tensor q(c.query), k(c.key), v(c.key);
    AttentionOptions additive, boolean;
    additive.attn_mask = AttentionMask::additive(StridedView<const float>(nullptr, c.mask));
    boolean.attn_mask = AttentionMask::boolean(StridedView<const uint8_t>(nullptr, c.mask));
    for (const AttentionOptions* options : {&additive, &boolean}) {
      const AttentionForward forward = scaled_dot_product_attention(q, k, v, *options);
      EXPECT_EQ(forward.output.shape(), c.query);
      // With no keys each row's output is 0, as PyTorch's (0 · nothing).
      for (const float x : forward.output.values()) EXPECT_EQ(x, 0.0F);
      const AttentionBackward gradients = scaled_dot_product_attention_backward(
          q, k, v, forward.output, forward.output, forward.log_sum_exp, *options,
          options == &additive);
      EXPECT_EQ(gradients.query.shape(), c.query);
      EXPECT_EQ(gradients.attn_mask.shape(), options == &additive ? c.mask : Shape{0});
      const std::vector<uint16_t> q16(static_cast<size_t>(c.query.numel())),
          k16(static_cast<size_t>(c.key.numel()));
      const HalfAttentionForward half = scaled_dot_product_attention(
          HalfType::kBFloat16, StridedView<const uint16_t>(q16.data(), c.query),
          StridedView<const uint16_t>(k16.data(), c.key),
          StridedView<const uint16_t>(k16.data(), c.key), *options);
      EXPECT_EQ(half.output.shape, c.query);
    }
  }
}

TEST(FunctionalSdpaLayout, AMaskWithoutItsEntriesIsNamed) {
  // A mask of entries whose data is null: the key ranges read it before the kernels' check
  // (a segmentation fault at 1, 16, 17 and 64 queries). Bool, float and half masks, forward and
  // backward.
  for (const int64_t L : {1, 16, 17, 64}) {
    SCOPED_TRACE("L = " + std::to_string(L));
    const Tensor q(Shape{1, 1, L, 8}), k(Shape{1, 1, 64, 8});
    const Shape mask{L, 64};
    AttentionOptions masks[3];
    masks[0].attn_mask = AttentionMask::boolean(StridedView<const uint8_t>(nullptr, mask));
    masks[1].attn_mask = AttentionMask::additive(StridedView<const float>(nullptr, mask));
    masks[2].attn_mask =
        AttentionMask::additive(HalfType::kBFloat16, StridedView<const uint16_t>(nullptr, mask));
    for (const AttentionOptions& options : masks) {
      EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, k, k, options), ValueError,
                           "attn_mask: expected the mask's entries, got a null pointer");
      const Tensor output(Shape{1, 1, L, 8});
      const std::vector<float> log_sum_exp(static_cast<size_t>(L));
      EXPECT_THROW_MESSAGE(
          scaled_dot_product_attention_backward(q, k, k, output, output, log_sum_exp, options),
          ValueError, "attn_mask: expected the mask's entries, got a null pointer");
    }
  }
}

TEST(FunctionalSdpaLayout, OutputsOverInputsGiveTheSeparateResult) {
  Rng rng(21);
  const int64_t B = 2, H = 2, L = 128, E = 16;
  const Shape shape{B, H, L, E};
  const Tensor q = testing::random_tensor(shape, rng), k = testing::random_tensor(shape, rng),
               v = testing::random_tensor(shape, rng), g = testing::random_tensor(shape, rng);
  for (const bool causal : {false, true}) {
    AttentionOptions options;
    options.causal = causal;
    const AttentionForward separate = scaled_dot_product_attention(q, k, v, options);
    const AttentionBackward grads = scaled_dot_product_attention_backward(
        q, k, v, separate.output, g, separate.log_sum_exp, options);
    for (const int over : {0, 1, 2}) {  // the output over the queries, keys or values
      Tensor inputs[3] = {q, k, v};
      std::vector<float> log_sum_exp(separate.log_sum_exp.size());
      scaled_dot_product_attention(inputs[0], inputs[1], inputs[2], options, inputs[over],
                                   log_sum_exp);
      EXPECT_EQ(inputs[over].values(), separate.output.values()) << over << " causal " << causal;
      EXPECT_EQ(log_sum_exp, separate.log_sum_exp);
    }
    // Each gradient over its own input, and dV over grad_output.
    Tensor gq = q, gk = k, gv = v, go = g;
    scaled_dot_product_attention_backward(gq, gk, v, separate.output, go, separate.log_sum_exp,
                                          options, gq, gk, go);
    EXPECT_EQ(gq.values(), grads.query.values()) << causal;
    EXPECT_EQ(gk.values(), grads.key.values()) << causal;
    EXPECT_EQ(go.values(), grads.value.values()) << causal;
    // An output whose heads all write one place (stride 0) is refused, as PyTorch refuses such
    // out= tensors: each head's result would overwrite the last.
    Tensor one_head(Shape{B, 1, L, E});
    const int64_t shared[4] = {L * E, 0, E, 1};
    EXPECT_THROW_MESSAGE(
        scaled_dot_product_attention(q, k, v, options,
                                     MutableStridedView(one_head.data(), shape, shared)),
        ValueError,
        "output: expected a view whose elements are each their own memory (no stride 0 on an "
        "axis of more than one element), got stride 0 on axis 1 of shape (2, 2, 128, 16)");
    Tensor grad_q(shape), grad_v(shape);
    EXPECT_THROW_MESSAGE(scaled_dot_product_attention_backward(
                             q, k, v, separate.output, g, separate.log_sum_exp, options, grad_q,
                             MutableStridedView(one_head.data(), shape, shared), grad_v),
                         ValueError,
                         "grad_key: expected a view whose elements are each their own memory");
    // Half precision: the output over the values' bits.
    for (const HalfType type : {HalfType::kFloat16, HalfType::kBFloat16}) {
      const auto bits_of = [&](const Tensor& x) {
        std::vector<uint16_t> bits;
        for (const float value : x.span()) bits.push_back(float_to_half_bits(type, value));
        return bits;
      };
      const std::vector<uint16_t> hq = bits_of(q), hk = bits_of(k);
      std::vector<uint16_t> hv = bits_of(v);
      const HalfAttentionForward half =
          scaled_dot_product_attention(type, StridedView<const uint16_t>(hq.data(), shape),
                                       StridedView<const uint16_t>(hk.data(), shape),
                                       StridedView<const uint16_t>(hv.data(), shape), options);
      std::vector<float> log_sum_exp(half.log_sum_exp.size());
      scaled_dot_product_attention(type, StridedView<const uint16_t>(hq.data(), shape),
                                   StridedView<const uint16_t>(hk.data(), shape),
                                   StridedView<const uint16_t>(hv.data(), shape), options,
                                   StridedView<uint16_t>(hv.data(), shape), log_sum_exp);
      EXPECT_EQ(hv, std::vector<uint16_t>(half.output.bits.begin(), half.output.bits.end()))
          << causal;
    }
  }
}

// A non-finite element of a strided view is named by its flat index in the view's own C order,
// whether its rows lie apart (a transposed view: scanned row by row) or back to back within each
// head with gaps between heads (scanned a head's rows at a time).
TEST(FunctionalSdpaLayout, StridedViewsNameNonFiniteElementsByTheirFlatIndex) {
  Rng rng(10);
  const int64_t N = 2, L = 20, S = 24, H = 3, E = 8;
  Tensor q_nlhe = testing::random_tensor(Shape{N, L, H, E}, rng);
  const int64_t transposed_strides[4] = {L * H * E, E, H * E, 1};
  const ConstStridedView q(q_nlhe.data(), Shape{N, H, L, E}, transposed_strides);
  // Keys of each head back to back, heads S + 5 rows apart.
  const int64_t gap = 5;
  Tensor k_padded = testing::random_tensor(Shape{N, H, S + gap, E}, rng);
  const int64_t padded_strides[4] = {H * (S + gap) * E, (S + gap) * E, E, 1};
  const ConstStridedView k(k_padded.data(), Shape{N, H, S, E}, padded_strides);
  const Tensor v = testing::random_tensor(Shape{N, H, S, E}, rng);
  // The padding rows hold a magnitude past the score bound (1e37) that no view element reaches: it
  // may not refuse the call.
  k_padded.data()[S * E + 1] = 3e38F;
  EXPECT_NO_THROW(scaled_dot_product_attention(q, k, v));

  q_nlhe.data()[((1 * L + 7) * H + 2) * E + 3] = NAN;  // (n 1, l 7, h 2, e 3)
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, k, v), ValueError,
                       "query: expected finite values, got NaN at flat index " +
                           std::to_string(((1 * H + 2) * L + 7) * E + 3));
  q_nlhe.data()[((1 * L + 7) * H + 2) * E + 3] = 0.5F;
  k_padded.data()[((1 * H + 1) * (S + gap) + 11) * E + 6] = -INFINITY;  // (n 1, h 1, s 11, e 6)
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, k, v), ValueError,
                       "key: expected finite values, got -inf at flat index " +
                           std::to_string(((1 * H + 1) * S + 11) * E + 6));
}

// Masks of a million entries and more are checked and read into key ranges on the OpenMP threads:
// a NaN deep inside is named by its flat index; a causal mask (float 0 / −∞, or bool) gives the
// causal option's result bit for bit, and with a gap in its last row (no interval: the entries
// path) the float and bool forms agree.
TEST(FunctionalSdpaArguments, LargeMasksAreCheckedAndReadOnTheThreads) {
  const int64_t n = 1100, m = 1000;  // 1.1 million entries
  Rng rng(77);
  const Tensor q = testing::random_tensor(Shape{1, 1, n, 4}, rng),
               k = testing::random_tensor(Shape{1, 1, m, 4}, rng),
               v = testing::random_tensor(Shape{1, 1, m, 3}, rng);
  Tensor floats(Shape{n, m});
  std::vector<uint8_t> bools(static_cast<size_t>(n * m));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      const bool visible = j <= m - n + i;  // bottom-right causal: the first 100 rows see nothing
      floats(i, j) = visible ? 0.0F : -std::numeric_limits<float>::infinity();
      bools[static_cast<size_t>(i * m + j)] = visible ? 1 : 0;
    }
  }
  AttentionOptions causal;
  causal.causal = true;
  causal.alignment = DiagonalAlignment::kBottomRight;
  const Tensor expected = scaled_dot_product_attention(q, k, v, causal).output;
  AttentionOptions as_floats, as_bools;
  as_floats.attn_mask = AttentionMask::additive(floats);
  as_bools.attn_mask =
      AttentionMask::boolean(StridedView<const uint8_t>(bools.data(), Shape{n, m}));
  for (const AttentionOptions* options : {&as_floats, &as_bools}) {
    const Tensor output = scaled_dot_product_attention(q, k, v, *options).output;
    for (int64_t e = 0; e < output.numel(); ++e)
      ASSERT_EQ(std::bit_cast<uint32_t>(output.data()[e]),
                std::bit_cast<uint32_t>(expected.data()[e]))
          << e;
  }
  floats(n - 1, 3) = -std::numeric_limits<float>::infinity();
  bools[static_cast<size_t>((n - 1) * m + 3)] = 0;
  const Tensor gap_floats = scaled_dot_product_attention(q, k, v, as_floats).output;
  const Tensor gap_bools = scaled_dot_product_attention(q, k, v, as_bools).output;
  for (int64_t e = 0; e < gap_floats.numel(); ++e)
    ASSERT_EQ(gap_floats.data()[e], gap_bools.data()[e]) << e;
  EXPECT_NE(gap_floats.data()[(n - 1) * 3], expected.data()[(n - 1) * 3]);
  floats.data()[987654] = NAN;
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, k, v, as_floats), ValueError,
                       "attn_mask: expected finite values or -inf, got NaN at flat index 987654");
}

TEST(FunctionalSdpaArguments, NamesWhatIsWrong) {
  const Tensor q(Shape{2, 4, 3, 8}), k(Shape{2, 2, 5, 8}), v(Shape{2, 2, 5, 6});
  const Tensor k4(Shape{2, 4, 5, 8}), v4(Shape{2, 4, 5, 6});
  EXPECT_THROW_MESSAGE(
      scaled_dot_product_attention(q, k, v), ShapeError,
      "key: expected 4 heads (those of query; set enable_gqa for grouped-query attention), got 2");
  AttentionOptions gqa;
  gqa.enable_gqa = true;
  EXPECT_THROW_MESSAGE(
      scaled_dot_product_attention(q, Tensor(Shape{2, 3, 5, 8}), Tensor(Shape{2, 3, 5, 6}), gqa),
      ShapeError, "enable_gqa: expected the key/value heads to divide the query's 4 heads, got 3");
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, Tensor(Shape{2, 4, 5, 7}), v4), ShapeError,
                       "key: expected the last axis 8 (that of query), got shape (2, 4, 5, 7)");
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, k4, Tensor(Shape{2, 4, 6, 6})), ShapeError,
                       "value: expected the shape of key (2, 4, 5, 8) up to the last axis");
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(Tensor(Shape{8}), k4, v4), ShapeError,
                       "query: expected a tensor of rank 2 to 8");
  const Tensor bad_mask(Shape{3, 4});
  AttentionOptions mask;
  mask.attn_mask = AttentionMask::additive(bad_mask);
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, k4, v4, mask), ShapeError,
                       "attn_mask: expected a shape that broadcasts to (2, 4, 3, 5) (the scores "
                       "(..., H_q, L, S)), got (3, 4)");
  Tensor nan_mask(Shape{3, 5});
  nan_mask.data()[7] = NAN;
  mask.attn_mask = AttentionMask::additive(nan_mask);
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, k4, v4, mask), ValueError,
                       "attn_mask: expected finite values or -inf, got NaN at flat index 7");
  nan_mask.data()[7] = INFINITY;
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, k4, v4, mask), ValueError,
                       "attn_mask: expected finite values or -inf, got inf at flat index 7");
  // Entries past 2^127 overflow the base-2 scores: 3e38 gave NaN weights and gradients (the
  // forward was right), so they are refused, contiguous or strided; 2^127 itself is taken.
  nan_mask.data()[7] = 0x1p127F;
  EXPECT_NO_THROW(scaled_dot_product_attention(q, k4, v4, mask));
  nan_mask.data()[7] = 3e38F;
  const std::string too_large =
      "attn_mask: expected entries of at most 2^127 (1.7e38: attn adds them to the scores in base "
      "2, where larger ones overflow), got 3e+38 at flat index ";
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, k4, v4, mask), ValueError, too_large + "7");
  const int64_t transposed[] = {1, 5};
  mask.attn_mask = AttentionMask::additive(
      ConstStridedView(nan_mask.data(), Shape{5, 3}, transposed));  // its transpose, broadcast
  EXPECT_THROW_MESSAGE(
      scaled_dot_product_attention(Tensor(Shape{2, 4, 5, 8}), Tensor(Shape{2, 4, 3, 8}),
                                   Tensor(Shape{2, 4, 3, 6}), mask),
      ValueError, too_large + "7");
  const std::vector<float> three{1, 2, 3}, four{1, 2, 3, NAN};
  AttentionOptions per_head;
  per_head.alibi_slopes = three;
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, k4, v4, per_head), ShapeError,
                       "alibi_slopes: expected one value per query head (4), got 3");
  // Slopes past float's largest over log2 e overflowed in the kernels' base-2 scores, and ∞ times
  // the diagonal's distance 0 gave NaN outputs, silently (3e38 at 70 queries).
  const std::vector<float> steep{0.5F, 0.25F, 3e38F, 0.125F};
  per_head.alibi_slopes = steep;
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, k4, v4, per_head), ValueError,
                       "alibi_slopes: expected slopes of magnitude at most 2.3586574e+38 (float's "
                       "largest over log2 e: the kernels' base-2 scores take the slope times log2 "
                       "e), got 3e+38 at index 2");
  // A negative slope whose term overflows to +∞ at the farthest key (8 positions here).
  const std::vector<float> rising{0.5F, -1e38F, 0.25F, 0.125F};
  per_head.alibi_slopes = rising;
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, k4, v4, per_head), ValueError,
                       "alibi_slopes: expected negative slopes of magnitude at most 2.9483218e+37 "
                       "(float's largest over log2 e and the 8 positions");
  per_head = {};
  per_head.sinks = four;
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, k4, v4, per_head), ValueError,
                       "sinks: expected finite values, got nan at index 3");
  // A sink of 3e38 overflowed times log2 e (an infinite log-sum-exp, NaN gradients); one of
  // −1.8e38 fell under a row a mask of float's lowest hides (raised to −2^127).
  for (const float sink : {3e38F, -1.8e38F}) {
    const std::vector<float> huge_sink{1, 2, sink, 0};
    per_head.sinks = huge_sink;
    EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, k4, v4, per_head), ValueError,
                         "sinks: expected logits of magnitude at most 2^127 (1.7e38, as an "
                         "additive mask's entries), got " +
                             number_text(sink) + " at index 2");
  }
  AttentionOptions window;
  window.window = SlidingWindow{-2, 0};
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, k4, v4, window), ValueError,
                       "window: expected sizes ≥ 0 (−1 for unbounded), got (-2, 0)");
  // Numbers quoted as given, the shortest text that reads back as the same float (six fixed
  // decimals showed −1e−9 as -0.000000 and the float after 1 as 1.000000).
  AttentionOptions softcap;
  softcap.softcap = -1e-9F;
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, k4, v4, softcap), ValueError,
                       "softcap: expected a positive finite number, got -1e-09");
  AttentionOptions dropout;
  dropout.dropout = 1.0F;
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, k4, v4, dropout), ValueError,
                       "dropout: expected a probability in [0, 1), got 1");
  dropout.dropout = std::nextafter(1.0F, 2.0F);
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, k4, v4, dropout), ValueError,
                       "dropout: expected a probability in [0, 1), got 1.0000001");
  AttentionOptions lengths;
  lengths.valid_lens = ValidLengths::per_batch({1, 6});
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(q, k4, v4, lengths), ValueError,
                       "valid_lens[1]: expected a valid length in [0, 5]");
  lengths.enable_gqa = true;
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(Tensor(Shape{4, 3, 8}), Tensor(Shape{2, 5, 8}),
                                                    Tensor(Shape{2, 5, 6}), lengths),
                       ValueError, "valid_lens: not available with enable_gqa on rank-3 inputs");
  Tensor nan_query(Shape{2, 4, 3, 8});
  nan_query.data()[5] = NAN;
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(nan_query, k4, v4), ValueError,
                       "query: expected finite values, got NaN at flat index 5");
  // Scores of 2.8e40: past float's range. (At 1e19 they would be 2.8e38, which the prefill path
  // refuses by its bound |scale|·E·max|q|·max|k| ≥ 1e37 while the decode kernel, which checks the
  // scores it computes, answers this decoding-shaped call.)
  const Tensor huge_q = Tensor::full(Shape{2, 4, 3, 8}, 1e20F),
               huge_k = Tensor::full(Shape{2, 4, 5, 8}, 1e20F);
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention(huge_q, huge_k, v4), ValueError,
                       "query, key: scores could overflow float32");
  const Tensor huge_prefill_q = Tensor::full(Shape{2, 4, 20, 8}, 1e19F),
               huge_prefill_k = Tensor::full(Shape{2, 4, 20, 8}, 1e19F);
  EXPECT_THROW_MESSAGE(
      scaled_dot_product_attention(huge_prefill_q, huge_prefill_k, Tensor(Shape{2, 4, 20, 6})),
      ValueError, "query, key: scores could overflow float32");
  const AttentionForward forward = scaled_dot_product_attention(q, k4, v4);
  std::vector<float> short_lse(forward.log_sum_exp.size() - 1);
  EXPECT_THROW_MESSAGE(scaled_dot_product_attention_backward(q, k4, v4, forward.output,
                                                             forward.output, short_lse, {}),
                       ShapeError, "log_sum_exp: expected 24 values (one per query row), got 23");
  const std::vector<uint8_t> bytes(15, 1);
  AttentionOptions bool_mask;
  bool_mask.attn_mask =
      AttentionMask::boolean(StridedView<const uint8_t>(bytes.data(), Shape{3, 5}));
  EXPECT_THROW_MESSAGE(
      scaled_dot_product_attention_backward(q, k4, v4, forward.output, forward.output,
                                            forward.log_sum_exp, bool_mask, true),
      ValueError,
      "mask_gradient: expected a float attn_mask to differentiate, got a bool attn_mask");
  EXPECT_THROW_MESSAGE(
      scaled_dot_product_attention_backward(q, k4, v4, forward.output, Tensor(Shape{2, 4, 3, 5}),
                                            forward.log_sum_exp, {}),
      ShapeError, "grad_output: expected shape (2, 4, 3, 6)");
}

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
