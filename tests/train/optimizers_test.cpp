// SGD, Adam and gradient clipping against PyTorch's own trajectories
// (tests/fixtures/optimizers, written by tools/make_optimizer_fixtures.py).
#include <gtest/gtest.h>

#include <cmath>

#include "attn/core/error.hpp"
#include "attn/io/safetensors.hpp"
#include "attn/train/adam.hpp"
#include "attn/train/gradient_clipping.hpp"
#include "attn/train/sgd.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

const std::string kFixture = std::string(ATTN_FIXTURES_DIR) + "/optimizers/updates.safetensors";

// Each update is a handful of float32 operations on values of order one, in the same order as
// PyTorch's: a few ulps (2⁻²⁴ ≈ 6e-8) per step; 1e-6 allows for three steps with margin.
constexpr double kTolerance = 1e-6;

template <class MakeOptimizer>
void expect_trajectory(const StateDict& fixture, const std::string& name,
                       MakeOptimizer make_optimizer) {
  Tensor parameter = fixture.at("initial");
  Tensor grad(parameter.shape());
  auto optimizer = make_optimizer(std::vector<NamedParameter>{{"p", &parameter, &grad}});
  const Tensor& grads = fixture.at("grads");
  const Tensor& expected = fixture.at(name);
  for (int64_t step = 0; step < 3; ++step) {
    for (int64_t i = 0; i < 5; ++i) grad.data()[i] = grads(step, i);
    optimizer.step();
    std::vector<double> row;
    for (int64_t i = 0; i < 5; ++i) row.push_back(expected(step, i));
    EXPECT_TRUE(testing::close_to(parameter, row, kTolerance)) << name << " step " << step + 1;
  }
}

TEST(Optimizers, SgdWithMomentumAndWeightDecayMatchesPyTorch) {
  expect_trajectory(load_safetensors(kFixture), "sgd", [](std::vector<NamedParameter> p) {
    return Sgd(std::move(p), 0.1F, 0.9F, 0.01F);
  });
}

TEST(Optimizers, AdamMatchesPyTorch) {
  AdamOptions options;
  options.lr = 0.01F;
  options.weight_decay = 0.1F;
  expect_trajectory(load_safetensors(kFixture), "adam",
                    [&](std::vector<NamedParameter> p) { return Adam(std::move(p), options); });
}

TEST(Optimizers, ClipGradNormMatchesPyTorch) {
  const StateDict fixture = load_safetensors(kFixture);
  Tensor first(Shape{3}), second(Shape{2, 2});
  Tensor first_grad(Shape{3}, {3, 0, 4}), second_grad(Shape{2, 2}, {12, 0, 0, 0});
  const float norm =
      clip_grad_norm({{"a", &first, &first_grad}, {"b", &second, &second_grad}}, 6.5F);
  EXPECT_FLOAT_EQ(norm, fixture.at("clip_norm")(0));
  EXPECT_TRUE(
      testing::close_to(first_grad, testing::to_doubles(fixture.at("clipped_first")), kTolerance));
  EXPECT_TRUE(testing::close_to(second_grad, testing::to_doubles(fixture.at("clipped_second")),
                                kTolerance));
  // Below the threshold nothing changes.
  EXPECT_FLOAT_EQ(clip_grad_norm({{"a", &first, &first_grad}}, 100.0F), 2.5F);
  EXPECT_TRUE(testing::close_to(first_grad, testing::to_doubles(fixture.at("clipped_first")), 0.0));
}

TEST(Optimizers, RejectBadSettingsAndNonFiniteGradients) {
  Tensor parameter(Shape{2}), grad(Shape{2}, {1.0F, std::nanf("")});
  const std::vector<NamedParameter> parameters{{"p", &parameter, &grad}};
  EXPECT_THROW_MESSAGE(Sgd(parameters, -0.1F), ValueError,
                       "Sgd: expected a finite, non-negative lr, got -0.1");
  AdamOptions options;
  options.beta2 = 1.0F;
  EXPECT_THROW_MESSAGE(Adam(parameters, options), ValueError,
                       "Adam: expected beta2 in [0, 1), got 1");
  EXPECT_THROW_MESSAGE(clip_grad_norm(parameters, 1.0F), ValueError,
                       "clip_grad_norm: expected finite gradients");
  EXPECT_THROW_MESSAGE(Sgd({{"p", &parameter, nullptr}}, 0.1F), ValueError,
                       "parameter 'p' has no tensor or no gradient");
}

TEST(Optimizers, StateRoundTripsAndContinuesIdentically) {
  Tensor a(Shape{3}, {1, 2, 3}), a_grad(Shape{3}, {0.5F, -1, 2});
  Tensor b = a, b_grad = a_grad;
  Adam first({{"p", &a, &a_grad}}), second({{"p", &b, &b_grad}});
  first.step();
  second.load_state_dict(first.state_dict());
  b = a;
  first.step();
  second.step();
  EXPECT_EQ(a.values(), b.values());
  EXPECT_EQ(second.steps(), 2);
  StateDict wrong = first.state_dict();
  wrong.erase("p.exp_avg_sq");
  EXPECT_THROW_MESSAGE(second.load_state_dict(wrong), ShapeError,
                       "Adam.load_state_dict: missing tensor 'p.exp_avg_sq'");
}

}  // namespace
}  // namespace attn
