// State dicts: PyTorch's names and (out, in) shapes, round trips, and strict loading errors.
#include "attn/nn/state_dict.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "attn/core/error.hpp"
#include "attn/nn/additive_attention.hpp"
#include "attn/nn/gaussian_kernel_pooling.hpp"
#include "attn/nn/general_attention.hpp"
#include "attn/nn/multi_head_attention.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

std::map<std::string, Shape> shapes_of(const StateDict& state) {
  std::map<std::string, Shape> shapes;
  for (const auto& [name, tensor] : state) shapes.emplace(name, tensor.shape());
  return shapes;
}

TEST(StateDict, UsesPyTorchNamesAndLayouts) {
  const AdditiveAttention additive(/*key_size=*/2, /*query_size=*/20, /*num_hiddens=*/8, 0.0F);
  EXPECT_EQ(
      shapes_of(additive.state_dict()),
      (std::map<std::string, Shape>{
          {"W_k.weight", Shape{8, 2}}, {"W_q.weight", Shape{8, 20}}, {"w_v.weight", Shape{1, 8}}}));
  const MultiHeadAttention with_bias(3, 4, 5, 6, 2, 0.0F, /*bias=*/true);
  EXPECT_EQ(shapes_of(with_bias.state_dict()),
            (std::map<std::string, Shape>{{"W_q.weight", Shape{6, 4}},
                                          {"W_q.bias", Shape{6}},
                                          {"W_k.weight", Shape{6, 3}},
                                          {"W_k.bias", Shape{6}},
                                          {"W_v.weight", Shape{6, 5}},
                                          {"W_v.bias", Shape{6}},
                                          {"W_o.weight", Shape{6, 6}},
                                          {"W_o.bias", Shape{6}}}));
  EXPECT_EQ(shapes_of(GaussianKernelPooling(2.0F).state_dict()),
            (std::map<std::string, Shape>{{"w", Shape{1}}}));
}

TEST(StateDict, RoundTripsBetweenLayers) {
  AdditiveAttention source(2, 3, 4, 0.0F, /*seed=*/1), target(2, 3, 4, 0.0F, /*seed=*/2);
  ASSERT_NE(source.state_dict().at("W_q.weight").values(),
            target.state_dict().at("W_q.weight").values());
  target.load_state_dict(source.state_dict());
  for (const auto& [name, tensor] : source.state_dict())
    EXPECT_EQ(target.state_dict().at(name).values(), tensor.values()) << name;
}

// Parameters loaded between a forward and a backward pass: the backward asks for a new forward
// pass instead of mixing the old weights' intermediates with the new weights (MultiHeadAttention,
// GeneralAttention and GaussianKernelPooling returned such mixed gradients).
template <class Layer>
void expect_load_ends_the_forward_pass(Layer layer, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const std::string& name) {
  SCOPED_TRACE(name);
  const StateDict state = layer.state_dict();
  const Tensor out = layer(q, k, v);
  layer.load_state_dict(state);
  EXPECT_THROW_MESSAGE(layer.backward(out), ValueError, "expected a forward pass first");
  layer(q, k, v);
  EXPECT_NO_THROW(layer.backward(out));
  layer.load_state_views(views_of(state));
  EXPECT_THROW_MESSAGE(layer.backward(out), ValueError, "expected a forward pass first");
}

TEST(StateDict, LoadingEndsTheLastForwardPass) {
  Rng rng(17);
  const Tensor q = testing::random_tensor(Shape{2, 3, 4}, rng),
               k = testing::random_tensor(Shape{2, 5, 4}, rng),
               v = testing::random_tensor(Shape{2, 5, 4}, rng);
  for (const AttentionPath path : {AttentionPath::kFused, AttentionPath::kReference}) {
    MultiHeadAttention mha(4, 4, 4, 8, 2, 0.0F);
    mha.set_path(path);
    expect_load_ends_the_forward_pass(mha, q, k, v, "MultiHeadAttention");
    AdditiveAttention additive(4, 4, 6, 0.0F);
    additive.set_path(path);
    expect_load_ends_the_forward_pass(additive, q, k, v, "AdditiveAttention");
    GeneralAttention general(4, 4);
    general.set_path(path);
    expect_load_ends_the_forward_pass(general, q, k, v, "GeneralAttention");
  }
  expect_load_ends_the_forward_pass(GaussianKernelPooling(), q, k, v, "GaussianKernelPooling");
}

TEST(StateDict, StrictLoadingNamesTheTensorAndChangesNothing) {
  MultiHeadAttention attention(3, 4, 5, 6, 2, 0.0F);
  const StateDict before = attention.state_dict();

  StateDict missing = before;
  missing.erase("W_v.weight");
  EXPECT_THROW_MESSAGE(
      attention.load_state_dict(missing), ShapeError,
      "MultiHeadAttention.load_state_dict: missing tensor 'W_v.weight' of shape (6, 5)");

  StateDict extra = before;
  extra.emplace("W_q.bias", Tensor(Shape{6}));
  EXPECT_THROW_MESSAGE(attention.load_state_dict(extra), ShapeError,
                       "unexpected tensor 'W_q.bias' of shape (6,)");

  StateDict misshaped = before;
  misshaped.at("W_o.weight") = Tensor(Shape{6, 5});
  misshaped.at("W_q.weight") = Tensor(Shape{6, 4});  // valid, and must not be applied either
  EXPECT_THROW_MESSAGE(attention.load_state_dict(misshaped), ShapeError,
                       "tensor 'W_o.weight' expected shape (6, 6), got shape (6, 5)");
  for (const auto& [name, tensor] : attention.state_dict())
    EXPECT_EQ(tensor.values(), before.at(name).values()) << name;
}

TEST(StateDict, ViewsLoadIntoTheParametersOwnStorageAndStrictlyAsStateDicts) {
  MultiHeadAttention source(3, 4, 5, 6, 2, 0.0F, /*bias=*/true, /*seed=*/1);
  MultiHeadAttention target(3, 4, 5, 6, 2, 0.0F, /*bias=*/true, /*seed=*/2);
  const StateDict values = source.state_dict();
  const float* storage = target.parameters().front().tensor->data();
  load_state_views(views_of(values), target.parameters(), "MultiHeadAttention");
  for (const auto& [name, tensor] : target.state_dict())
    EXPECT_EQ(tensor.values(), values.at(name).values()) << name;
  EXPECT_EQ(target.parameters().front().tensor->data(), storage) << "copied into fresh storage";

  // The same errors as load_state_dict, and nothing changed then.
  MultiHeadAttention untouched(3, 4, 5, 6, 2, 0.0F, /*bias=*/true, /*seed=*/3);
  const StateDict before = untouched.state_dict();
  StateDict misshaped = values;
  misshaped.at("W_o.weight") = Tensor(Shape{6, 5});
  EXPECT_THROW_MESSAGE(
      load_state_views(views_of(misshaped), untouched.parameters(), "MultiHeadAttention"),
      ShapeError,
      "MultiHeadAttention.load_state_dict: tensor 'W_o.weight' expected shape (6, 6), got shape "
      "(6, 5)");
  StateDict missing = values;
  missing.erase("W_k.bias");
  EXPECT_THROW_MESSAGE(
      load_state_views(views_of(missing), untouched.parameters(), "MultiHeadAttention"), ShapeError,
      "missing tensor 'W_k.bias' of shape (6,)");
  StateDict extra = values;
  extra.emplace("W_x.weight", Tensor(Shape{2}));
  EXPECT_THROW_MESSAGE(
      load_state_views(views_of(extra), untouched.parameters(), "MultiHeadAttention"), ShapeError,
      "unexpected tensor 'W_x.weight' of shape (2,)");
  for (const auto& [name, tensor] : untouched.state_dict())
    EXPECT_EQ(tensor.values(), before.at(name).values()) << name;

  // A layer's own checks come along: a width that is not finite is refused.
  GaussianKernelPooling pooling(2.0F);
  const Tensor infinite = Tensor::full(Shape{1}, INFINITY);
  EXPECT_THROW_MESSAGE(pooling.load_state_views({{"w", infinite.view()}}), ValueError,
                       "expected a finite width");
}

}  // namespace
}  // namespace attn
