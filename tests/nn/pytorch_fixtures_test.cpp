// attn's layers against the book's PyTorch code: the golden fixtures tools/make_fixtures.py writes
// under tests/fixtures/<case>/ (outputs, weights and autograd gradients), and the book's toy
// examples.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/core/tensor.hpp"
#include "attn/core/valid_lengths.hpp"
#include "attn/io/npy.hpp"
#include "attn/io/safetensors.hpp"
#include "attn/nn/additive_attention.hpp"
#include "attn/nn/attention_layer.hpp"
#include "attn/nn/dot_product_attention.hpp"
#include "attn/nn/gaussian_kernel_pooling.hpp"
#include "attn/nn/multi_head_attention.hpp"
#include "attn/nn/state_dict.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

using testing::close_to;

const std::filesystem::path kFixtures = ATTN_FIXTURES_DIR;

// Every fixture tools/make_fixtures.py writes; FixtureSetIsComplete keeps this list in step.
const std::vector<std::string> kCases = {
    "additive_per_batch",
    "additive_per_query",
    "additive_no_lens_n1",
    "dot_product_per_batch",
    "dot_product_per_query",
    "dot_product_m1",
    "multi_head_no_bias_per_batch",
    "multi_head_bias_per_query",
    "multi_head_n_ne_m",
    "gaussian_width_1",
    "gaussian_width_2_5",
    "toy_additive",
    "toy_dot_product",
};

// attn and PyTorch both compute in float32 but sum in different orders and use different exp/tanh
// implementations (each within an ulp or two). Every fixture value is a sum of at most a few
// hundred rounded terms (projections over ≤ 20 inputs, softmax over ≤ 10 keys, W_o over ≤ 8
// hidden units), so the two differ by at most a few hundred ulps (2^-24 ≈ 6e-8 each) of the
// largest magnitude: 1e-5 relative to max(1, max |expected|) bounds that with margin, while any
// real mistake (a wrong mask, head order or transposed weight) shows up at 1e-2 or more.
constexpr double kTolerance = 1e-5;

struct Fixture {
  std::string name;
  nlohmann::json config;
  Tensor queries;
  Tensor keys;
  Tensor values;
  ValidLengths valid_lens;
  bool has_params = false;
  StateDict params;
  NpyArray output;
  NpyArray weights;
};

struct LayerResult {
  Tensor output;
  Tensor weights;
};

Fixture load_fixture(const std::string& name) {
  const std::filesystem::path folder = kFixtures / name;
  Fixture fixture;
  fixture.name = name;
  std::ifstream config_file(folder / "case.json");
  if (!config_file) throw std::runtime_error("cannot open " + (folder / "case.json").string());
  fixture.config = nlohmann::json::parse(config_file);
  fixture.queries = load_npy_tensor(folder / "queries.npy", "queries");
  fixture.keys = load_npy_tensor(folder / "keys.npy", "keys");
  fixture.values = load_npy_tensor(folder / "values.npy", "values");
  if (std::filesystem::exists(folder / "valid_lens.npy")) {
    fixture.valid_lens = load_npy_valid_lengths(folder / "valid_lens.npy", "valid_lens");
  }
  fixture.has_params = std::filesystem::exists(folder / "params.safetensors");
  if (fixture.has_params) fixture.params = load_safetensors(folder / "params.safetensors");
  fixture.output = read_npy(folder / "output.npy");
  fixture.weights = read_npy(folder / "weights.npy");
  return fixture;
}

std::string valid_lens_kind(const ValidLengths& valid_lens) {
  switch (valid_lens.kind()) {
    case ValidLengths::Kind::kAll:
      return "none";
    case ValidLengths::Kind::kPerBatch:
      return "per_batch";
    case ValidLengths::Kind::kPerQuery:
      return "per_query";
  }
  return "unknown";
}

template <class Layer>
LayerResult run_layer(Layer& layer, const Fixture& fixture) {
  // The fixtures were made in eval mode; the non-zero dropout in case.json makes sure this counts.
  layer.eval();
  Tensor output = layer(fixture.queries, fixture.keys, fixture.values, fixture.valid_lens);
  return {std::move(output), layer.attention_weights()};
}

// Builds the attn layer case.json describes, loads PyTorch's parameters and returns
// use(layer).
template <class Use>
auto with_fixture_layer(const Fixture& fixture, Use&& use) {
  const nlohmann::json& config = fixture.config;
  const std::string layer = config.at("layer").get<std::string>();
  if (layer == "additive") {
    AdditiveAttention attention(
        config.at("key_size").get<int64_t>(), config.at("query_size").get<int64_t>(),
        config.at("num_hiddens").get<int64_t>(), config.at("dropout").get<float>());
    attention.load_state_dict(fixture.params);
    return use(attention);
  }
  if (layer == "dot_product") {
    DotProductAttention attention(config.at("dropout").get<float>());
    return use(attention);
  }
  if (layer == "multi_head") {
    MultiHeadAttention attention(
        config.at("key_size").get<int64_t>(), config.at("query_size").get<int64_t>(),
        config.at("value_size").get<int64_t>(), config.at("num_hiddens").get<int64_t>(),
        config.at("num_heads").get<int64_t>(), config.at("dropout").get<float>(),
        config.at("bias").get<bool>());
    attention.load_state_dict(fixture.params);
    return use(attention);
  }
  if (layer == "gaussian") {
    // Start from another width, so the comparison shows the state dict's "w" is what is used.
    GaussianKernelPooling pooling(0.5F);
    pooling.load_state_dict(fixture.params);
    EXPECT_EQ(pooling.width(), config.at("width").get<float>());
    return use(pooling);
  }
  throw std::runtime_error(fixture.name + "/case.json: unknown layer '" + layer + "'");
}

// Builds the attn layer case.json describes, loads PyTorch's parameters and runs it.
LayerResult run_fixture(const Fixture& fixture) {
  return with_fixture_layer(fixture, [&](auto& layer) { return run_layer(layer, fixture); });
}

std::vector<double> expected_values(const NpyArray& array) {
  return std::vector<double>(array.floats.begin(), array.floats.end());
}

class PyTorchFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PyTorchFixtureTest, OutputAndWeightsMatchPyTorch) {
  const Fixture fixture = load_fixture(GetParam());
  // DotProductAttention is the only layer without parameters, so the only one without a file.
  EXPECT_EQ(fixture.has_params, fixture.config.at("layer").get<std::string>() != "dot_product");
  EXPECT_EQ(valid_lens_kind(fixture.valid_lens),
            fixture.config.at("valid_lens").get<std::string>());
  ASSERT_FALSE(fixture.output.is_integer());
  ASSERT_FALSE(fixture.weights.is_integer());

  const LayerResult result = run_fixture(fixture);

  ASSERT_EQ(result.output.shape().str(), fixture.output.shape.str());
  EXPECT_TRUE(close_to(result.output, expected_values(fixture.output), kTolerance));
  ASSERT_EQ(result.weights.shape().str(), fixture.weights.shape.str());
  EXPECT_TRUE(close_to(result.weights, expected_values(fixture.weights), kTolerance));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PyTorchFixtureTest, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<std::string>& case_info) {
                           return case_info.param;
                         });

// --- Gradients: backward(G) against PyTorch autograd ---------------------------------------------

// Every case except the book's toy examples has grad_output.npy and grads/.
std::vector<std::string> gradient_cases() {
  std::vector<std::string> cases;
  for (const std::string& name : kCases) {
    if (name.rfind("toy_", 0) != 0) cases.push_back(name);
  }
  return cases;
}

// attn's backward passes run in float32 through at most four chained products, each summing ≤ 20
// terms in these cases (≤ 8 hidden units, ≤ 6 keys, ≤ 12 rows per weight gradient), so their
// round-off stays near 1e-6 of the gradient's magnitude; PyTorch's float32 gradients differ from
// float64 autograd by at most 2e-7 relative on these cases, and attn's from PyTorch's by at most
// 5e-7 (both measured when the fixtures were made). 1e-4 leaves wide margin, while a wrong or
// missing term (a transposed weight, a dropped scale, a mask leaking gradient into masked keys)
// gives errors comparable to the gradients themselves, 1e-2 to 4 here. close_to measures against
// max(1, max |expected|), which matters for gradients that are zero by cancellation (W_k.bias of
// multi-head attention, since adding q·b to a row of scores leaves the softmax unchanged; queries
// and keys when m = 1): both sides then hold only round-off.
constexpr double kGradientTolerance = 1e-4;

// PyTorch's gradients of (output * G).sum(), by name: "queries", "keys", "values" and the
// state-dict names of the parameters.
struct ExpectedGradients {
  Tensor grad_output;
  std::map<std::string, NpyArray> by_name;
};

ExpectedGradients load_expected_gradients(const std::string& name) {
  const std::filesystem::path folder = kFixtures / name;
  ExpectedGradients expected;
  expected.grad_output = load_npy_tensor(folder / "grad_output.npy", "grad_output");
  const std::filesystem::path grads = folder / "grads";
  if (!std::filesystem::is_directory(grads)) {
    throw std::runtime_error("missing gradient folder " + grads.string());
  }
  for (const auto& entry : std::filesystem::directory_iterator(grads)) {
    if (entry.path().extension() != ".npy") {
      throw std::runtime_error("unexpected file " + entry.path().string());
    }
    // "W_q.weight.npy" → "W_q.weight": stem() drops only the last extension.
    expected.by_name.emplace(entry.path().stem().string(), read_npy(entry.path()));
  }
  return expected;
}

struct GradientResult {
  Tensor output;
  AttentionGradients inputs;
  std::map<std::string, Tensor> parameters;  // each parameter's accumulated gradient, by name
};

template <class Layer>
GradientResult run_backward(Layer& layer, const Fixture& fixture, ConstTensorView grad_output) {
  layer.eval();
  GradientResult result;
  result.output = layer(fixture.queries, fixture.keys, fixture.values, fixture.valid_lens);
  result.inputs = layer.backward(grad_output);
  if constexpr (requires { layer.parameters(); }) {
    for (const NamedParameter& parameter : layer.parameters()) {
      if (parameter.grad == nullptr) {
        throw std::runtime_error(fixture.name + ": parameter " + parameter.name +
                                 " has no gradient");
      }
      result.parameters.emplace(parameter.name, *parameter.grad);
    }
  }
  return result;
}

::testing::AssertionResult gradient_matches(const std::string& name, ConstTensorView actual,
                                            const ExpectedGradients& expected) {
  const auto found = expected.by_name.find(name);
  if (found == expected.by_name.end()) {
    return ::testing::AssertionFailure() << "no grads/" << name << ".npy";
  }
  const NpyArray& array = found->second;
  if (array.is_integer() || actual.shape() != array.shape) {
    return ::testing::AssertionFailure()
           << name << ": attn's gradient has shape " << actual.shape().str() << ", PyTorch's "
           << array.shape.str() << (array.is_integer() ? " (integer)" : "");
  }
  return close_to(actual, expected_values(array), kGradientTolerance)
         << " (gradient of " << name << ")";
}

class PyTorchGradientTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PyTorchGradientTest, InputAndParameterGradientsMatchAutograd) {
  const Fixture fixture = load_fixture(GetParam());
  const ExpectedGradients expected = load_expected_gradients(GetParam());
  ASSERT_EQ(expected.grad_output.shape().str(), fixture.output.shape.str());

  const GradientResult result = with_fixture_layer(
      fixture, [&](auto& layer) { return run_backward(layer, fixture, expected.grad_output); });

  // The forward pass that backward() differentiates is the one PyTorch's fixture holds.
  EXPECT_TRUE(close_to(result.output, expected_values(fixture.output), kTolerance));
  EXPECT_TRUE(gradient_matches("queries", result.inputs.queries, expected));
  EXPECT_TRUE(gradient_matches("keys", result.inputs.keys, expected));
  EXPECT_TRUE(gradient_matches("values", result.inputs.values, expected));
  for (const auto& [name, gradient] : result.parameters) {
    EXPECT_TRUE(gradient_matches(name, gradient, expected));
  }

  // One file per input and per parameter, and nothing else: a parameter attn has but the fixture
  // lacks (or the reverse) would otherwise go unchecked.
  std::set<std::string> expected_names = {"queries", "keys", "values"};
  for (const auto& [name, gradient] : result.parameters) expected_names.insert(name);
  std::set<std::string> file_names;
  for (const auto& [name, array] : expected.by_name) file_names.insert(name);
  EXPECT_EQ(file_names, expected_names);
  // The parameters with gradients are exactly those of the state dict PyTorch wrote.
  std::set<std::string> state_dict_names;
  for (const auto& [name, tensor] : fixture.params) state_dict_names.insert(name);
  std::set<std::string> parameter_names;
  for (const auto& [name, gradient] : result.parameters) parameter_names.insert(name);
  EXPECT_EQ(parameter_names, state_dict_names);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PyTorchGradientTest, ::testing::ValuesIn(gradient_cases()),
                         [](const ::testing::TestParamInfo<std::string>& case_info) {
                           return case_info.param;
                         });

TEST(PyTorchFixtures, GradientsExistForExactlyTheNonToyCases) {
  // A case without grads/ would silently skip the gradient check; the toy cases have none.
  std::set<std::string> with_gradients;
  for (const auto& entry : std::filesystem::directory_iterator(kFixtures)) {
    if (std::filesystem::exists(entry.path() / "grads") ||
        std::filesystem::exists(entry.path() / "grad_output.npy")) {
      with_gradients.insert(entry.path().filename().string());
    }
  }
  const std::vector<std::string> cases = gradient_cases();
  EXPECT_EQ(with_gradients, std::set<std::string>(cases.begin(), cases.end()));
  EXPECT_EQ(cases.size(), 11U);
}

TEST(PyTorchFixtures, FixtureSetIsComplete) {
  // A fixture folder this test does not list would silently go unchecked.
  std::set<std::string> on_disk;
  for (const auto& entry : std::filesystem::directory_iterator(kFixtures)) {
    if (std::filesystem::exists(entry.path() / "case.json")) {
      on_disk.insert(entry.path().filename().string());
    }
  }
  EXPECT_EQ(on_disk, std::set<std::string>(kCases.begin(), kCases.end()));
}

// The book's toy examples: all keys are equal, so the weights are uniform over the valid keys
// (lengths 2 and 6) whatever the queries and parameters, and the outputs average the first rows
// of arange(40).reshape(10, 4). Each output averages at most 6 values ≤ 23; float32 round-off is
// a few ulps of 13 (≈ 1e-6), so 1e-5 absolute leaves margin.
constexpr double kToyTolerance = 1e-5;

void expect_toy_result(const LayerResult& result) {
  ASSERT_EQ(result.output.shape().str(), "(2, 1, 4)");
  const float expected_output[2][4] = {{2, 3, 4, 5}, {10, 11, 12, 13}};
  for (int b = 0; b < 2; ++b) {
    for (int t = 0; t < 4; ++t) {
      EXPECT_NEAR(result.output(b, 0, t), expected_output[b][t], kToyTolerance)
          << "output[" << b << ", 0, " << t << "]";
    }
  }
  ASSERT_EQ(result.weights.shape().str(), "(2, 1, 10)");
  const int valid[2] = {2, 6};
  for (int b = 0; b < 2; ++b) {
    for (int j = 0; j < 10; ++j) {
      const double expected = j < valid[b] ? 1.0 / valid[b] : 0.0;
      EXPECT_NEAR(result.weights(b, 0, j), expected, kToyTolerance)
          << "weights[" << b << ", 0, " << j << "]";
    }
  }
}

TEST(PyTorchToyExamples, AdditiveAttentionAveragesTheValidValues) {
  const Fixture fixture = load_fixture("toy_additive");
  ASSERT_EQ(fixture.queries.shape().str(), "(2, 1, 20)");
  expect_toy_result(run_fixture(fixture));
}

TEST(PyTorchToyExamples, DotProductAttentionAveragesTheValidValues) {
  const Fixture fixture = load_fixture("toy_dot_product");
  ASSERT_EQ(fixture.queries.shape().str(), "(2, 1, 2)");
  expect_toy_result(run_fixture(fixture));
}

}  // namespace
}  // namespace attn
