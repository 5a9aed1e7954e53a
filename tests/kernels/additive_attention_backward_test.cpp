// The fused additive-attention backward kernel against the double chain-rule reference on every
// SIMD target (strided heads, tails, n = 1, m = 1, lengths 0 and m, per-query lengths, causal,
// dropout, large scores, heads split over threads), its argument checks, and AdditiveAttention's
// fused backward pass against its reference path.
#include <gtest/gtest.h>
#include <hwy/targets.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <map>
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
using testing::head_of;
using testing::random_tensor;
using testing::to_doubles;
using testing::to_reference;

// Each gradient is a float32 sum of up to a few hundred terms (da over m keys, db over n queries,
// dw over B·H·n·m pairs), each a product of a few rounded factors with the kernels' tanh (3.5e-7
// relative): errors grow like √terms · 2⁻²⁴ ≈ 1e-6 relative to the terms' magnitude, and the scores
// the probabilities come from are rounded to about |S|·2⁻²⁴. 1e-5 relative to each gradient's
// largest entry (floor 1) holds with margin on these shapes, while a wrong mask, dropout multiplier
// or missing term shows up at 1e-2 or more.
constexpr double kTolerance = 1e-5;

class AdditiveAttentionBackwardKernel : public testing::EverySimdTarget {};

// Head h's (B, n, m) slice of the kernels' (B·heads, n, m) dropout multipliers.
std::vector<double> dropout_of_head(const Tensor& mask, int64_t batch, int64_t heads, int64_t h) {
  std::vector<double> slice;
  const int64_t n = mask.dim(1), m = mask.dim(2);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) slice.push_back(mask(b * heads + h, i, j));
  return slice;
}

struct Case {
  int64_t batch, heads, queries, keys, hidden, value_depth;
  int mask_kind;  // 0 none, 1 per batch (m, 0, m/2, …), 2 per query (every length 0 … m)
  bool causal;
  float weight_scale, dropout;
};

std::string describe(const Case& c) {
  return " B=" + std::to_string(c.batch) + " H=" + std::to_string(c.heads) +
         " n=" + std::to_string(c.queries) + " m=" + std::to_string(c.keys) +
         " h=" + std::to_string(c.hidden) + " dv=" + std::to_string(c.value_depth) +
         " mask=" + std::to_string(c.mask_kind) + " causal=" + std::to_string(c.causal) +
         " w=" + std::to_string(c.weight_scale) + " dropout=" + std::to_string(c.dropout);
}

ValidLengths mask_for(const Case& c) {
  std::vector<int64_t> lengths;
  if (c.mask_kind == 1) {
    for (int64_t b = 0; b < c.batch; ++b)
      lengths.push_back(b % 3 == 0 ? c.keys : b % 3 == 1 ? 0 : c.keys / 2);
    return ValidLengths::per_batch(lengths);
  }
  if (c.mask_kind == 2) {
    for (int64_t index = 0; index < c.batch * c.queries; ++index)
      lengths.push_back(index % (c.keys + 1));
    return ValidLengths::per_query(lengths, c.batch, c.queries);
  }
  return {};
}

struct KernelGradients {
  Tensor queries, keys, values, w_v;
};

// Inputs of one case, the fused forward pass, and its backward pass into NaN-filled gradients (so
// an entry the kernel fails to overwrite is caught).
struct FusedRun {
  Tensor a, b, v, w, grad_out;
  ValidLengths mask;
  FlashAttentionOptions options;

  FusedRun(const Case& c, Rng& rng)
      : a(random_tensor(Shape{c.batch, c.queries, c.heads * c.hidden}, rng)),
        b(random_tensor(Shape{c.batch, c.keys, c.heads * c.hidden}, rng)),
        v(random_tensor(Shape{c.batch, c.keys, c.heads * c.value_depth}, rng)),
        w(random_tensor(Shape{c.hidden}, rng, c.weight_scale)),
        grad_out(random_tensor(Shape{c.batch, c.queries, c.heads * c.value_depth}, rng)),
        mask(mask_for(c)),
        options(testing::kernel_options(1.0F, c.causal, c.dropout, 1234)) {}

  KernelGradients backward(const Case& c) const {
    Tensor out(Shape{c.batch, c.queries, c.heads * c.value_depth});
    std::vector<float> lse(static_cast<size_t>(c.batch * c.heads * c.queries));
    additive_attention_forward(split_heads(a, c.heads, "a"), split_heads(b, c.heads, "b"), w.span(),
                               split_heads(v, c.heads, "v"), mask, options,
                               split_heads(out, c.heads, "out"), lse.data());
    KernelGradients grads{
        Tensor::full(a.shape(), std::nanf("")), Tensor::full(b.shape(), std::nanf("")),
        Tensor::full(v.shape(), std::nanf("")), Tensor::full(w.shape(), std::nanf(""))};
    additive_attention_backward(
        split_heads(a, c.heads, "a"), split_heads(b, c.heads, "b"), w.span(),
        split_heads(v, c.heads, "v"), split_heads(out, c.heads, "out"),
        split_heads(grad_out, c.heads, "g"), lse.data(), mask, options,
        split_heads(grads.queries, c.heads, "da"), split_heads(grads.keys, c.heads, "db"),
        grads.w_v.span(), split_heads(grads.values, c.heads, "dv"));
    return grads;
  }

  // Compares `grads` with the double reference, head by head.
  void expect_matches_reference(const Case& c, const KernelGradients& grads,
                                const std::string& where) const {
    const ValidLengths effective =
        c.causal ? mask.with_causal_mask(c.batch, c.queries, c.keys) : mask;
    const Tensor multipliers = c.dropout > 0.0F ? flash_attention_dropout_mask(
                                                      options, c.batch * c.heads, c.queries, c.keys)
                                                : Tensor();
    std::vector<double> expected_w(static_cast<size_t>(c.hidden));
    for (int64_t h = 0; h < c.heads; ++h) {
      const auto expected = reference::additive_attention_backward(
          to_reference(head_of(a, h, c.hidden)), to_reference(head_of(b, h, c.hidden)),
          to_reference(head_of(v, h, c.value_depth)),
          testing::expand(effective, c.batch, c.queries, c.keys), to_doubles(w),
          to_reference(head_of(grad_out, h, c.value_depth)),
          c.dropout > 0.0F ? dropout_of_head(multipliers, c.batch, c.heads, h)
                           : std::vector<double>{});
      EXPECT_TRUE(
          close_to(head_of(grads.queries, h, c.hidden), expected.queries.values, kTolerance))
          << where << " d(projected queries) head " << h;
      EXPECT_TRUE(close_to(head_of(grads.keys, h, c.hidden), expected.keys.values, kTolerance))
          << where << " d(projected keys) head " << h;
      EXPECT_TRUE(
          close_to(head_of(grads.values, h, c.value_depth), expected.values.values, kTolerance))
          << where << " dV head " << h;
      for (size_t t = 0; t < expected_w.size(); ++t) expected_w[t] += expected.w_v[t];
    }
    EXPECT_TRUE(close_to(grads.w_v, expected_w, kTolerance)) << where << " dw_v";
  }
};

TEST_P(AdditiveAttentionBackwardKernel, MatchesReference) {
  Rng rng(41);
  const Case cases[] = {
      {1, 1, 1, 1, 1, 1, 0, false, 1.0F, 0.0F},      // the smallest problem
      {2, 1, 1, 5, 3, 2, 1, false, 1.0F, 0.0F},      // n = 1, lengths m and 0
      {1, 2, 7, 1, 4, 4, 2, false, 1.0F, 0.0F},      // m = 1, two strided heads
      {3, 1, 37, 131, 19, 7, 1, false, 1.0F, 0.0F},  // tails of every tile, lengths m, 0, m/2
      {2, 3, 37, 131, 19, 7, 2, false, 1.0F, 0.0F},  // per-query lengths 0 … m, three heads
      {2, 2, 20, 90, 8, 5, 2, true, 1.0F, 0.0F},     // causal n < m with per-query lengths
      {1, 2, 50, 20, 8, 8, 0, true, 1.0F, 0.0F},     // causal n > m: rows that see nothing
      {2, 2, 33, 140, 12, 6, 1, false, 1.0F, 0.3F},  // dropout
      {1, 1, 45, 160, 10, 3, 2, true, 1.0F, 0.5F},   // dropout, causal, one head split by keys
      {2, 1, 30, 70, 16, 4, 0, false, 6.0F, 0.0F},   // scores of magnitude ~50: near one-hot P
      {1, 1, 150, 200, 9, 5, 0, false, 1.0F, 0.0F},  // several query tiles at every width
      {2, 1, 70, 90, 8, 32, 1, true, 1.0F, 0.0F},    // one head, dv = 32: dO read in place
  };
  for (const Case& c : cases) {
    const FusedRun run(c, rng);
    run.expect_matches_reference(
        c, run.backward(c), "target " + std::string(hwy::TargetName(GetParam())) + describe(c));
  }
}

// The kernels take the exponential form of the scores while every projected query and key lies
// within ±10.5 (kAdditiveExponentialLimit), the direct tanh past it: inputs of magnitude up to 10.4
// put e^{2(a+b)} near e^{±42} and a pair of terms' denominators' product near e^84, the form's
// extremes; 30 sends the same shapes down the direct form. Inputs clamped to ±3.99 and ±7.99 (many
// at the limit) take eight and four terms a reciprocal at their extremes (additive_score_form), in
// the forward pass and in the backward pass's recomputed scores alike.
// Saturated tanh makes (1 − u²) tiny, the gradients' hardest case for either form.
TEST_P(AdditiveAttentionBackwardKernel, MatchesReferenceInEveryScoreForm) {
  Rng rng(7);
  struct Inputs {
    float scale, clamp;  // inputs x·scale, then within ±clamp (0: not clamped)
    AdditiveScoreForm form;
  };
  for (const Inputs& inputs : {Inputs{10.4F, 0.0F, AdditiveScoreForm::kTanh},
                               Inputs{30.0F, 0.0F, AdditiveScoreForm::kTanh},
                               Inputs{3.0F, 3.99F, AdditiveScoreForm::kExponentialEights},
                               Inputs{6.0F, 7.99F, AdditiveScoreForm::kExponentialQuads}}) {
    for (const Case& c : {Case{2, 2, 37, 131, 19, 7, 2, false, 1.0F, 0.0F},
                          Case{1, 1, 20, 90, 8, 5, 2, true, 0.3F, 0.0F}}) {
      FusedRun run(c, rng);
      for (Tensor* input : {&run.a, &run.b}) {
        for (float& x : input->span()) {
          x *= inputs.scale;
          if (inputs.clamp > 0.0F) x = std::clamp(x, -inputs.clamp, inputs.clamp);
        }
      }
      const std::string where = "target " + std::string(hwy::TargetName(GetParam())) + " inputs x" +
                                std::to_string(inputs.scale) + describe(c);
      const auto whole = [](const Tensor& t) {  // every element, as one row
        return ConstHeadsView{t.data(), 1, 1, 1, t.numel(), t.numel(), t.numel(), t.numel()};
      };
      ASSERT_EQ(additive_score_form(whole(run.a), whole(run.b), run.w.span()), inputs.form)
          << where;
      run.expect_matches_reference(c, run.backward(c), where);
    }
  }
}

// Tiles of one query (OneQueryAdditiveGradients: vectors over the hidden units): n = 1 with 256
// units and with a tail of units, two strided heads and per-query lengths, dropout, and n = 17,
// 33, 65 (one query after a full tile on SSE4, AVX2, AVX-512: db's lane-wise sums), in every score
// form (inputs within ±3.99, ±7.99, ±10.4 and ±20).
TEST_P(AdditiveAttentionBackwardKernel, MatchesReferenceForTilesOfOneQuery) {
  Rng rng(43);
  for (const float limit : {3.99F, 7.99F, 10.4F, 20.0F}) {
    for (const Case& c : {Case{3, 1, 1, 10, 256, 4, 1, false, 1.0F, 0.0F},
                          Case{2, 2, 1, 70, 19, 3, 2, false, 1.0F, 0.0F},
                          Case{2, 1, 1, 30, 21, 3, 0, false, 1.0F, 0.4F},
                          Case{1, 1, 17, 20, 19, 3, 2, false, 1.0F, 0.0F},
                          Case{1, 1, 33, 20, 40, 3, 2, true, 1.0F, 0.0F},
                          Case{1, 1, 65, 12, 19, 3, 0, false, 1.0F, 0.0F}}) {
      FusedRun run(c, rng);
      for (Tensor* input : {&run.a, &run.b})
        for (float& x : input->span()) x = rng.uniform(-limit, limit);
      run.expect_matches_reference(c, run.backward(c),
                                   "target " + std::string(hwy::TargetName(GetParam())) +
                                       " inputs within " + std::to_string(limit) + describe(c));
    }
  }
}

// Fewer heads than threads splits each head's keys into chunks whose partial sums are added after
// the parallel region: the same gradients (within rounding) as one thread, and bit-identical
// results from repeated calls with the same thread count.
TEST_P(AdditiveAttentionBackwardKernel, SplitsHeadsOverThreadsReproducibly) {
  Rng rng(42);
  const Case c{1, 1, 40, 300, 11, 6, 2, false, 1.0F, 0.2F};
  const FusedRun run(c, rng);
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const KernelGradients single = run.backward(c);
  omp_set_num_threads(3);  // 5 key tiles in 3 chunks of unequal length
  const KernelGradients split = run.backward(c), again = run.backward(c);
  omp_set_num_threads(saved_threads);
  const std::string where = "target " + std::string(hwy::TargetName(GetParam()));
  run.expect_matches_reference(c, split, where);
  EXPECT_TRUE(close_to(split.queries, to_doubles(single.queries), kTolerance)) << where;
  EXPECT_TRUE(close_to(split.w_v, to_doubles(single.w_v), kTolerance)) << where;
  // Keys and values belong to exactly one chunk: identical to the single-threaded result.
  EXPECT_EQ(split.keys.values(), single.keys.values()) << where;
  EXPECT_EQ(split.values.values(), single.values.values()) << where;
  EXPECT_EQ(split.queries.values(), again.queries.values()) << where;
  EXPECT_EQ(split.w_v.values(), again.w_v.values()) << where;
}

TEST_P(AdditiveAttentionBackwardKernel, RejectsInconsistentArguments) {
  const Tensor a(Shape{1, 2, 4}), b(Shape{1, 3, 4}), v(Shape{1, 3, 5}), out(Shape{1, 2, 5});
  const Tensor w(Shape{4});
  Tensor da(Shape{1, 2, 4}), db(Shape{1, 3, 4}), dv(Shape{1, 3, 5}), dw(Shape{4});
  Tensor wrong_dw(Shape{3}), wrong_db(Shape{1, 2, 4});
  const std::vector<float> lse(2);
  const auto call = [&](std::span<const float> weights, const Tensor& keys, const Tensor& values,
                        const float* log_sum_exp, const FlashAttentionOptions& options,
                        Tensor& grad_keys, Tensor& grad_w) {
    additive_attention_backward(
        single_head(a, "a"), single_head(keys, "b"), weights, single_head(values, "v"),
        single_head(out, "out"), single_head(out, "g"), log_sum_exp, {}, options,
        single_head(da, "da"), single_head(grad_keys, "db"), grad_w.span(), single_head(dv, "dv"));
  };
  EXPECT_THROW_MESSAGE(call(Tensor(Shape{3}).span(), b, v, lse.data(), {}, db, dw), ShapeError,
                       "w_v: expected 4 values (the hidden size of projected_queries), got 3");
  EXPECT_THROW_MESSAGE(call(w.span(), b, v, lse.data(), {}, db, wrong_dw), ShapeError,
                       "grad_w_v: expected 4 values (the hidden size of projected_queries), got 3");
  EXPECT_THROW_MESSAGE(call(w.span(), Tensor(Shape{1, 3, 5}), v, lse.data(), {}, db, dw),
                       ShapeError,
                       "projected_keys: expected 1 × 1 heads of 3 × 4 (the hidden size of "
                       "projected_queries), got 1 × 1 of 3 × 5");
  EXPECT_THROW_MESSAGE(
      call(w.span(), b, Tensor(Shape{1, 2, 5}), lse.data(), {}, db, dw), ShapeError,
      "values: expected 1 × 1 heads of 3 × 5 (one row per key), got 1 × 1 of 2 × 5");
  EXPECT_THROW_MESSAGE(call(w.span(), b, v, lse.data(), {}, wrong_db, dw), ShapeError,
                       "grad_projected_keys: expected 1 × 1 heads of 3 × 4 (as projected_keys), "
                       "got 1 × 1 of 2 × 4");
  EXPECT_THROW_MESSAGE(call(w.span(), b, v, nullptr, {}, db, dw), ValueError,
                       "log_sum_exp: expected the forward pass's values, got a null pointer");
  EXPECT_THROW_MESSAGE(
      call(w.span(), b, v, lse.data(), testing::kernel_options(1.0F, false, 1.0F), db, dw),
      ValueError, "dropout: expected a probability in [0, 1)");
  EXPECT_THROW_MESSAGE(
      additive_attention_backward(
          single_head(a, "a"), single_head(b, "b"), w.span(), single_head(v, "v"),
          single_head(out, "out"), single_head(Tensor(Shape{1, 2, 4}), "g"), lse.data(), {}, {},
          single_head(da, "da"), single_head(db, "db"), dw.span(), single_head(dv, "dv")),
      ShapeError, "grad_out: expected 1 × 1 heads of 2 × 5 (as out), got 1 × 1 of 2 × 4");
}

ATTN_INSTANTIATE_FOR_EVERY_SIMD_TARGET(AdditiveAttentionBackwardKernel);

// Every parameter and input gradient of the layer's fused backward pass against its reference
// path (the book's computation with materialised weights).
TEST(AdditiveAttentionLayer, FusedBackwardMatchesReferencePath) {
  Rng rng(43);
  struct LayerCase {
    int64_t batch, queries, keys;
    ValidLengths mask;
  };
  const LayerCase cases[] = {
      {2, 30, 140, ValidLengths::per_batch({0, 99})},
      {3, 17, 9, {}},
      {2, 5, 70, ValidLengths::per_query({0, 1, 70, 35, 2, 9, 0, 69, 3, 70}, 2, 5)}};
  for (const LayerCase& c : cases) {
    const Tensor q = random_tensor(Shape{c.batch, c.queries, 7}, rng);
    const Tensor k = random_tensor(Shape{c.batch, c.keys, 5}, rng);
    const Tensor v = random_tensor(Shape{c.batch, c.keys, 3}, rng);
    const Tensor g = random_tensor(Shape{c.batch, c.queries, 3}, rng);
    AdditiveAttention fused(5, 7, 16, 0.0F, 4), reference(5, 7, 16, 0.0F, 4);
    reference.set_path(AttentionPath::kReference);
    fused(q, k, v, c.mask);
    reference(q, k, v, c.mask);
    const AttentionGradients fused_grads = fused.backward(g);
    const AttentionGradients reference_grads = reference.backward(g);
    const std::string where = "B=" + std::to_string(c.batch) + " n=" + std::to_string(c.queries) +
                              " m=" + std::to_string(c.keys);
    EXPECT_TRUE(close_to(fused_grads.queries, to_doubles(reference_grads.queries), kTolerance))
        << where;
    EXPECT_TRUE(close_to(fused_grads.keys, to_doubles(reference_grads.keys), kTolerance)) << where;
    EXPECT_TRUE(close_to(fused_grads.values, to_doubles(reference_grads.values), kTolerance))
        << where;
    std::map<std::string, const Tensor*> reference_parameters;
    for (const NamedParameter& parameter : reference.parameters())
      reference_parameters[parameter.name] = parameter.grad;
    int compared = 0;
    for (const NamedParameter& parameter : fused.parameters()) {
      EXPECT_TRUE(close_to(*parameter.grad, to_doubles(*reference_parameters.at(parameter.name)),
                           kTolerance))
          << where << " " << parameter.name;
      ++compared;
    }
    EXPECT_EQ(compared, 3);
  }
}

TEST(AdditiveAttentionLayer, FusedBackwardChecksTheGradientShape) {
  AdditiveAttention attention(2, 3, 4, 0.0F);
  attention(Tensor(Shape{1, 2, 3}), Tensor(Shape{1, 4, 2}), Tensor(Shape{1, 4, 5}));
  EXPECT_THROW_MESSAGE(attention.backward(Tensor(Shape{1, 2, 4})), ShapeError,
                       "grad_output: expected shape (1, 2, 5) (that of the last forward pass's "
                       "output), got shape (1, 2, 4)");
}

}  // namespace
}  // namespace attn
