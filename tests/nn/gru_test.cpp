// Gru and Embedding: the GRU against PyTorch's nn.GRU (forward and autograd gradients, from
// tools/make_seq2seq_fixtures.py) and against central differences of a double-precision
// reference, dropout between layers, and the shape and value errors of both layers.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/core/error.hpp"
#include "attn/io/safetensors.hpp"
#include "attn/nn/embedding.hpp"
#include "attn/nn/gru.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

using testing::close_to;
using testing::random_tensor;
using testing::to_doubles;
using Flat = std::vector<double>;

const std::filesystem::path kFixtures = ATTN_FIXTURES_DIR;

// attn and PyTorch both compute in float32; every value here is a sum of at most 3·6 + 6 terms
// per gate through ≤ 4 steps and 2 layers, so they differ by a few ulps (2^-24 ≈ 6e-8) of values
// of order one. 1e-5 (the bound) leaves a wide margin; a wrong gate order or transposed
// weight gives errors of order 0.1.
constexpr double kForwardTolerance = 1e-5;
// Gradients chain ≤ 4 steps × 2 layers of such products, so their round-off is ~1e-6 of their
// magnitude; 1e-4 is the bound.
constexpr double kGradientTolerance = 1e-4;

Tensor require(const StateDict& tensors, const std::string& name) {
  const auto found = tensors.find(name);
  if (found == tensors.end()) throw std::runtime_error("fixture lacks tensor " + name);
  return found->second;
}

TEST(Gru, MatchesPyTorchForwardAndGradients) {
  const StateDict fixture = load_safetensors(kFixtures / "seq2seq" / "gru.safetensors");
  Gru gru(5, 6, 2);
  StateDict parameters;
  for (const auto& [name, tensor] : fixture)
    if (name.rfind("rnn.", 0) == 0) parameters.emplace(name.substr(4), tensor);
  gru.load_state_dict(parameters);
  gru.eval();
  const GruOutput output =
      gru.forward(require(fixture, "inputs"), require(fixture, "initial_state"));
  EXPECT_TRUE(close_to(output.outputs, to_doubles(require(fixture, "outputs")), kForwardTolerance));
  EXPECT_TRUE(close_to(output.state, to_doubles(require(fixture, "state")), kForwardTolerance));
  const GruGradients grads =
      gru.backward(require(fixture, "grad_outputs"), require(fixture, "grad_state"));
  EXPECT_TRUE(
      close_to(grads.inputs, to_doubles(require(fixture, "grads.inputs")), kGradientTolerance));
  EXPECT_TRUE(close_to(grads.initial_state, to_doubles(require(fixture, "grads.initial_state")),
                       kGradientTolerance));
  int checked = 0;
  for (const NamedParameter& parameter : gru.parameters()) {
    EXPECT_TRUE(close_to(*parameter.grad,
                         to_doubles(require(fixture, "grads.rnn." + parameter.name)),
                         kGradientTolerance))
        << parameter.name;
    ++checked;
  }
  EXPECT_EQ(checked, 8);
}

TEST(Gru, ParameterNamesAndShapesFollowPyTorch) {
  Gru gru(3, 4, 2);
  const std::vector<NamedParameter> parameters = gru.parameters();
  const std::vector<std::pair<std::string, Shape>> expected = {
      {"weight_ih_l0", Shape{12, 3}}, {"weight_hh_l0", Shape{12, 4}},
      {"bias_ih_l0", Shape{12}},      {"bias_hh_l0", Shape{12}},
      {"weight_ih_l1", Shape{12, 4}}, {"weight_hh_l1", Shape{12, 4}},
      {"bias_ih_l1", Shape{12}},      {"bias_hh_l1", Shape{12}}};
  ASSERT_EQ(parameters.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(parameters[i].name, expected[i].first);
    EXPECT_EQ(parameters[i].tensor->shape(), expected[i].second);
    // nn.GRU draws everything from U(±1/√H) = U(±0.5).
    for (const float value : parameters[i].tensor->span()) EXPECT_LE(std::abs(value), 0.5F);
  }
  std::vector<NamedParameter> prefixed;
  gru.append_parameters("encoder.rnn", prefixed);
  EXPECT_EQ(prefixed.front().name, "encoder.rnn.weight_ih_l0");
}

// The double-precision reference: nn.GRU's equations, written out directly. Parameters are
// given in parameters() order (weight_ih, weight_hh, bias_ih, bias_hh per layer).
struct Outputs {
  Flat outputs;  // (T, B, H)
  Flat state;    // (L, B, H)
};

Outputs reference_gru(const Flat& inputs, const Flat& initial_state,
                      const std::vector<Flat>& parameters, int64_t steps, int64_t batch,
                      int64_t input_size, int64_t hidden, int64_t layers) {
  Flat layer_input = inputs;
  Outputs result{{}, Flat(static_cast<size_t>(layers * batch * hidden))};
  int64_t in = input_size;
  for (int64_t l = 0; l < layers; ++l) {
    const Flat& w_ih = parameters[static_cast<size_t>(4 * l)];
    const Flat& w_hh = parameters[static_cast<size_t>(4 * l + 1)];
    const Flat& b_ih = parameters[static_cast<size_t>(4 * l + 2)];
    const Flat& b_hh = parameters[static_cast<size_t>(4 * l + 3)];
    Flat h(initial_state.begin() + l * batch * hidden,
           initial_state.begin() + (l + 1) * batch * hidden);
    Flat outputs(static_cast<size_t>(steps * batch * hidden));
    for (int64_t t = 0; t < steps; ++t) {
      Flat next(h.size());
      for (int64_t b = 0; b < batch; ++b) {
        const double* x = &layer_input[static_cast<size_t>((t * batch + b) * in)];
        const double* hb = &h[static_cast<size_t>(b * hidden)];
        auto gate = [&](int64_t row) {
          double gx = b_ih[static_cast<size_t>(row)], gh = b_hh[static_cast<size_t>(row)];
          for (int64_t k = 0; k < in; ++k) gx += w_ih[static_cast<size_t>(row * in + k)] * x[k];
          for (int64_t k = 0; k < hidden; ++k)
            gh += w_hh[static_cast<size_t>(row * hidden + k)] * hb[k];
          return std::pair<double, double>{gx, gh};
        };
        for (int64_t j = 0; j < hidden; ++j) {
          const auto [rx, rh] = gate(j);
          const auto [zx, zh] = gate(hidden + j);
          const auto [nx, nh] = gate(2 * hidden + j);
          const double r = 1.0 / (1.0 + std::exp(-(rx + rh)));
          const double z = 1.0 / (1.0 + std::exp(-(zx + zh)));
          const double n = std::tanh(nx + r * nh);
          next[static_cast<size_t>(b * hidden + j)] = (1.0 - z) * n + z * hb[j];
        }
      }
      h = next;
      std::copy(h.begin(), h.end(), outputs.begin() + t * batch * hidden);
    }
    std::copy(h.begin(), h.end(), result.state.begin() + l * batch * hidden);
    layer_input = outputs;
    in = hidden;
  }
  result.outputs = layer_input;
  return result;
}

// Central differences (h = 1e-5) of the double reference have truncation error ~h²·|f'''| ≈
// 1e-10, far below the float32 backward pass's round-off (~1e-6 of the gradient's magnitude);
// 1e-4 relative to the largest gradient leaves margin while a wrong term shows at 1e-2 or more.
TEST(Gru, BackwardMatchesFiniteDifferencesOfTheDoubleReference) {
  struct Case {
    int64_t steps, batch, input_size, hidden, layers;
  };
  Rng rng(41);
  for (const Case c : {Case{1, 1, 2, 3, 1}, Case{3, 2, 4, 3, 2}, Case{5, 3, 2, 4, 3}}) {
    Gru gru(c.input_size, c.hidden, c.layers, 0.0F, 7);
    for (const NamedParameter& parameter : gru.parameters())
      for (float& value : parameter.tensor->span()) value = rng.uniform(-0.8F, 0.8F);
    const Tensor inputs = random_tensor(Shape{c.steps, c.batch, c.input_size}, rng);
    const Tensor initial = random_tensor(Shape{c.layers, c.batch, c.hidden}, rng, 0.5F);
    const Tensor grad_outputs = random_tensor(Shape{c.steps, c.batch, c.hidden}, rng);
    const Tensor grad_state = random_tensor(Shape{c.layers, c.batch, c.hidden}, rng);
    gru.forward(inputs, initial);
    const GruGradients grads = gru.backward(grad_outputs, grad_state);

    std::vector<Flat> arguments = {to_doubles(inputs), to_doubles(initial)};
    for (const NamedParameter& parameter : gru.parameters())
      arguments.push_back(to_doubles(*parameter.tensor));
    const auto loss = [&](const std::vector<Flat>& a) {
      const std::vector<Flat> parameters(a.begin() + 2, a.end());
      const Outputs out =
          reference_gru(a[0], a[1], parameters, c.steps, c.batch, c.input_size, c.hidden, c.layers);
      return testing::dot(out.outputs, to_doubles(grad_outputs)) +
             testing::dot(out.state, to_doubles(grad_state));
    };
    const std::vector<Flat> expected = testing::numerical_gradients(loss, arguments, 1e-5);
    const std::string label = "T=" + std::to_string(c.steps) + " L=" + std::to_string(c.layers);
    EXPECT_TRUE(close_to(grads.inputs, expected[0], kGradientTolerance)) << label;
    EXPECT_TRUE(close_to(grads.initial_state, expected[1], kGradientTolerance)) << label;
    const std::vector<NamedParameter> parameters = gru.parameters();
    for (size_t p = 0; p < parameters.size(); ++p) {
      EXPECT_TRUE(close_to(*parameters[p].grad, expected[p + 2], kGradientTolerance))
          << label << " " << parameters[p].name;
    }
  }
}

TEST(Gru, GradientsAccumulateAcrossBackwardPassesAndTraces) {
  Rng rng(42);
  Gru gru(2, 3, 1);
  const Tensor inputs = random_tensor(Shape{2, 1, 2}, rng);
  const Tensor grad = random_tensor(Shape{2, 1, 3}, rng);
  Gru::Trace first, second;
  gru.forward(inputs, {}, first);
  gru.forward(inputs, {}, second);
  gru.backward(first, grad, {});
  const Tensor once = *gru.parameters()[0].grad;
  gru.backward(second, grad, {});
  const Tensor twice = *gru.parameters()[0].grad;
  for (int64_t i = 0; i < once.numel(); ++i) {
    EXPECT_NE(once.data()[i], 0.0F);
    EXPECT_FLOAT_EQ(twice.data()[i], 2.0F * once.data()[i]);
  }
}

TEST(Gru, DropoutBetweenLayersIsReproducibleAndUsedByBackward) {
  Rng rng(43);
  const Tensor inputs = random_tensor(Shape{3, 2, 4}, rng);
  Gru gru(4, 5, 2, 0.5F, 11);
  const GruOutput evaluated = [&] {
    gru.eval();
    return gru.forward(inputs);
  }();
  gru.train();
  gru.seed_dropout(3);
  const GruOutput first = gru.forward(inputs);
  gru.seed_dropout(3);
  const GruOutput again = gru.forward(inputs);
  EXPECT_EQ(first.outputs.values(), again.outputs.values());
  EXPECT_NE(first.outputs.values(), evaluated.outputs.values());
  // The first layer never sees dropout: its final state matches evaluation mode exactly.
  for (int64_t i = 0; i < 2 * 5; ++i) EXPECT_EQ(first.state.data()[i], evaluated.state.data()[i]);

  // With p = 1 the second layer reads zeros, so the outputs carry no gradient to the inputs.
  Gru dropped(4, 5, 2, 1.0F, 11);
  dropped.forward(inputs);
  const GruGradients grads = dropped.backward(random_tensor(Shape{3, 2, 5}, rng));
  for (const float value : grads.inputs.span()) EXPECT_EQ(value, 0.0F);
}

TEST(Gru, ZeroInitialStateIsTheDefault) {
  Rng rng(44);
  Gru gru(3, 4, 2);
  const Tensor inputs = random_tensor(Shape{2, 3, 3}, rng);
  const GruOutput implicit = gru.forward(inputs);
  const GruOutput explicit_zero = gru.forward(inputs, Tensor(Shape{2, 3, 4}));
  EXPECT_EQ(implicit.outputs.values(), explicit_zero.outputs.values());
  EXPECT_EQ(implicit.state.values(), explicit_zero.state.values());
}

TEST(Gru, RejectsBadShapesAndArguments) {
  EXPECT_THROW_MESSAGE(Gru(0, 4, 1), ValueError, "input_size");
  EXPECT_THROW_MESSAGE(Gru(3, 4, 1, 1.5F), ValueError, "1.5");
  Gru gru(3, 4, 2);
  EXPECT_THROW_MESSAGE(gru.backward(Tensor(Shape{1, 1, 4})), ValueError, "forward pass first");
  EXPECT_THROW_MESSAGE(gru.forward(Tensor(Shape{2, 3})), ShapeError, "inputs");
  EXPECT_THROW_MESSAGE(gru.forward(Tensor(Shape{2, 1, 5})), ShapeError, "input_size");
  EXPECT_THROW_MESSAGE(gru.forward(Tensor(Shape{2, 1, 3}), Tensor(Shape{1, 1, 4})), ShapeError,
                       "initial_state");
  gru.forward(Tensor(Shape{2, 1, 3}));
  EXPECT_THROW_MESSAGE(gru.backward(Tensor(Shape{2, 2, 4})), ShapeError, "(2, 1, 4)");
  EXPECT_THROW_MESSAGE(gru.backward(Tensor(Shape{2, 1, 4}), Tensor(Shape{2, 1, 3})), ShapeError,
                       "grad_state");
}

TEST(Embedding, LooksUpRowsAndScattersGradients) {
  Rng rng(45);
  Embedding embedding(5, 3, rng);
  const std::vector<int64_t> ids = {4, 0, 4};
  const Tensor rows = embedding.forward(ids);
  ASSERT_EQ(rows.shape(), (Shape{3, 3}));
  for (int64_t j = 0; j < 3; ++j) {
    EXPECT_EQ(rows(0, j), embedding.weight()(4, j));
    EXPECT_EQ(rows(1, j), embedding.weight()(0, j));
  }
  const Tensor grad(Shape{3, 3}, {1, 2, 3, 4, 5, 6, 10, 20, 30});
  embedding.backward(ids, grad);
  const Tensor& weight_grad = embedding.weight_grad();
  EXPECT_EQ(weight_grad(4, 0), 11.0F);  // the repeated id sums its rows
  EXPECT_EQ(weight_grad(4, 2), 33.0F);
  EXPECT_EQ(weight_grad(0, 1), 5.0F);
  EXPECT_EQ(weight_grad(2, 1), 0.0F);
  std::vector<NamedParameter> parameters;
  embedding.append_parameters("decoder.embedding", parameters);
  ASSERT_EQ(parameters.size(), 1U);
  EXPECT_EQ(parameters[0].name, "decoder.embedding.weight");
}

TEST(Embedding, InitialisesFromTheStandardNormal) {
  Rng rng(46);
  Embedding embedding(200, 50, rng);
  double sum = 0, squares = 0;
  for (const float value : embedding.weight().span()) {
    sum += value;
    squares += static_cast<double>(value) * value;
  }
  const double count = 200.0 * 50.0;
  // 10 000 draws: the sample mean has standard error 0.01 and the variance about 0.014.
  EXPECT_NEAR(sum / count, 0.0, 0.05);
  EXPECT_NEAR(squares / count, 1.0, 0.07);
}

TEST(Embedding, RejectsOutOfRangeIdsAndBadGradients) {
  Rng rng(47);
  EXPECT_THROW_MESSAGE(Embedding(0, 3, rng), ValueError, "num_embeddings");
  Embedding embedding(5, 3, rng);
  EXPECT_THROW_MESSAGE(embedding.forward(std::vector<int64_t>{1, 5}, "tokens"), ValueError,
                       "tokens: expected ids in [0, 5), got 5 at position 1");
  EXPECT_THROW_MESSAGE(embedding.forward(std::vector<int64_t>{-1}), ValueError, "got -1");
  EXPECT_THROW_MESSAGE(embedding.backward(std::vector<int64_t>{1}, Tensor(Shape{2, 3})), ShapeError,
                       "grad");
}

}  // namespace
}  // namespace attn
