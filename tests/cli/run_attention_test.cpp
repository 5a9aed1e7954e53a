// End-to-end tests of `attn run`'s functional path (issue #10): every attention flag (--mask bool
// and float, --window, --causal, --alignment, --softcap, --alibi, --sinks, --heads/--kv-heads,
// rank-4 inputs) against attn::scaled_dot_product_attention / attn::additive_attention called on
// the same inputs, the gradients it writes, --layer general, weights computed only on request, and
// the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/core/half.hpp"
#include "attn/core/random.hpp"
#include "attn/core/tensor.hpp"
#include "attn/core/valid_lengths.hpp"
#include "attn/functional/additive_attention.hpp"
#include "attn/functional/scaled_dot_product_attention.hpp"
#include "attn/io/npy.hpp"
#include "attn/io/safetensors.hpp"
#include "attn/nn/additive_attention.hpp"
#include "attn/nn/general_attention.hpp"
#include "attn/nn/multi_head_attention.hpp"
#include "cli_fixture.hpp"
#include "test_support.hpp"

namespace attn {
namespace {

namespace fs = std::filesystem;
using testing::random_tensor;

// (B, L, H·d) → (B, H, L, d), copied element by element: the layout the CLI's strided views of
// --heads must agree with, built independently of them.
Tensor to_heads(const Tensor& x, int64_t heads) {
  const int64_t batch = x.dim(0), rows = x.dim(1), size = x.dim(2) / heads;
  Tensor result(Shape{batch, heads, rows, size});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t c = 0; c < size; ++c) result(b, h, i, c) = x(b, i, h * size + c);
  return result;
}

// (B, H, L, d) → (B, L, H·d), the inverse.
Tensor from_heads(const Tensor& x) {
  const int64_t batch = x.dim(0), heads = x.dim(1), rows = x.dim(2), size = x.dim(3);
  Tensor result(Shape{batch, rows, heads * size});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t c = 0; c < size; ++c) result(b, i, h * size + c) = x(b, h, i, c);
  return result;
}

// The CLI runs the same float32 kernels on the same numbers, read through other strides; they
// agree to a few ulps (exactly, in practice). 1e-6 of the magnitude still catches any wrong head,
// mask entry, alignment or scale, which move results by a sizeable fraction.
::testing::AssertionResult same_values(const Tensor& actual, const Tensor& expected) {
  if (actual.shape() != expected.shape()) {
    return ::testing::AssertionFailure()
           << "shape " << actual.shape().str() << ", expected " << expected.shape().str();
  }
  double largest = 1.0;
  for (const float value : expected.span()) largest = std::max(largest, std::fabs(double{value}));
  for (int64_t i = 0; i < actual.numel(); ++i) {
    const double error = std::fabs(double{actual.data()[i]} - double{expected.data()[i]});
    if (!(error <= 1e-6 * largest) && !(actual.data()[i] == expected.data()[i])) {
      return ::testing::AssertionFailure() << "element " << i << " is " << actual.data()[i]
                                           << ", expected " << expected.data()[i];
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult differ(const Tensor& a, const Tensor& b) {
  if (same_values(a, b)) return ::testing::AssertionFailure() << "the two results are equal";
  return ::testing::AssertionSuccess();
}

std::set<std::string> file_names(const fs::path& directory) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(directory)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

class RunAttentionTest : public CliTest {
 protected:
  Tensor load(const std::string& name) const { return load_npy_tensor(path(name), name); }

  // Runs `attn run <arguments> --out o.npy`, asserting success, and returns the output.
  Tensor run(const std::string& arguments) const {
    const CommandResult result = attn("run " + arguments + " --out o.npy");
    EXPECT_EQ(result.exit_code, 0) << "attn run " << arguments << "\n" << result.err;
    return load("o.npy");
  }

  // Random (B, n, d) queries, (B, m, d) keys, (B, m, dv) values as q.npy, k.npy, v.npy.
  void write_qkv(const Shape& queries, const Shape& keys, const Shape& values, uint64_t seed) {
    Rng rng(seed);
    queries_ = random_tensor(queries, rng);
    keys_ = random_tensor(keys, rng);
    values_ = random_tensor(values, rng);
    save("q.npy", queries_);
    save("k.npy", keys_);
    save("v.npy", values_);
  }

  Tensor queries_, keys_, values_;
};

const std::string kDot = "--layer dot-product --queries q.npy --keys k.npy --values v.npy";

// --- layouts ---

TEST_F(RunAttentionTest, HeadsSplitTheLastAxisInPlaceWithGroupedKeyValueHeads) {
  // H = 4 query heads of d = 3, G = 2 key/value heads, dv = 2; per-batch valid lengths.
  write_qkv(Shape{2, 3, 12}, Shape{2, 5, 6}, Shape{2, 5, 4}, 21);
  save_npy(path("lens.npy"), std::vector<int64_t>{4, 2}, Shape{2});
  const CommandResult result = attn("run " + kDot +
                                    " --heads 4 --kv-heads 2 --valid-lens lens.npy --out o.npy "
                                    "--weights-out w.npy --heatmap h.png");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("output (2, 3, 8) -> o.npy"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("weights (2, 4, 3, 5) -> w.npy"), std::string::npos) << result.out;

  AttentionOptions options;
  options.enable_gqa = true;
  options.valid_lens = ValidLengths::per_batch({4, 2});
  const Tensor q = to_heads(queries_, 4), k = to_heads(keys_, 2), v = to_heads(values_, 2);
  const AttentionForward expected = scaled_dot_product_attention(q, k, v, options);
  EXPECT_TRUE(same_values(load("o.npy"), from_heads(expected.output)));
  EXPECT_TRUE(same_values(load("w.npy"), attention_weights(q, k, expected.log_sum_exp, options)));
  EXPECT_TRUE(starts_with_bytes(path("h.png"), kPngSignature));

  // Without --kv-heads, keys and values have --heads heads too.
  write_qkv(Shape{2, 3, 12}, Shape{2, 5, 12}, Shape{2, 5, 8}, 22);
  const AttentionForward plain = scaled_dot_product_attention(
      to_heads(queries_, 4), to_heads(keys_, 4), to_heads(values_, 4), AttentionOptions{});
  EXPECT_TRUE(same_values(run(kDot + " --heads 4"), from_heads(plain.output)));
}

TEST_F(RunAttentionTest, RankFourInputsArePyTorchsLayout) {
  // (N, H, L, E) queries against (N, G, S, E) keys: grouped-query attention from the files' shapes.
  write_qkv(Shape{2, 4, 3, 5}, Shape{2, 2, 6, 5}, Shape{2, 2, 6, 3}, 23);
  const CommandResult result = attn("run " + kDot + " --out o.npy --weights-out w.npy");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  AttentionOptions options;
  options.enable_gqa = true;
  const AttentionForward expected = scaled_dot_product_attention(queries_, keys_, values_, options);
  const Tensor output = load("o.npy");
  EXPECT_EQ(output.shape(), (Shape{2, 4, 3, 3}));
  EXPECT_TRUE(same_values(output, expected.output));
  EXPECT_TRUE(same_values(load("w.npy"),
                          attention_weights(queries_, keys_, expected.log_sum_exp, options)));

  // Equal heads, with a per-query length: the batch is the first axis.
  write_qkv(Shape{2, 2, 3, 4}, Shape{2, 2, 5, 4}, Shape{2, 2, 5, 4}, 24);
  save_npy(path("lens.npy"), std::vector<int64_t>{5, 1, 3, 0, 2, 5}, Shape{2, 3});
  AttentionOptions lengths;
  lengths.valid_lens = ValidLengths::per_query({5, 1, 3, 0, 2, 5}, 2, 3);
  EXPECT_TRUE(same_values(run(kDot + " --valid-lens lens.npy"),
                          scaled_dot_product_attention(queries_, keys_, values_, lengths).output));
}

// Lengths that do not fit rank-4 inputs name the scores the user's files make, (N, H, L, S), and
// with --heads the split ones; the library named (2, 5, 6), the heads left out.
TEST_F(RunAttentionTest, ValidLengthsOfTheWrongShapeNameTheRealScores) {
  write_qkv(Shape{2, 2, 5, 8}, Shape{2, 2, 6, 8}, Shape{2, 2, 6, 8}, 25);
  save_npy(path("lens.npy"), std::vector<int64_t>{1, 2, 3}, Shape{3});
  expect_error("run " + kDot + " --valid-lens lens.npy --out o.npy",
               "valid_lens: expected shape (2,) to match the scores (2, 2, 5, 6) (B, H, n, m), "
               "got shape (3,)");
  save_npy(path("lens.npy"), std::vector<int64_t>{1, 2, 3, 4}, Shape{2, 2});
  expect_error("run " + kDot + " --valid-lens lens.npy --out o.npy",
               "valid_lens: expected shape (2, 5) to match the scores (2, 2, 5, 6) (B, H, n, m), "
               "got shape (2, 2)");
  write_qkv(Shape{2, 3, 12}, Shape{2, 5, 12}, Shape{2, 5, 8}, 26);
  expect_error("run " + kDot + " --heads 4 --valid-lens lens.npy --out o.npy",
               "valid_lens: expected shape (2, 3) to match the scores (2, 4, 3, 5) (B, H, n, m)");
  EXPECT_FALSE(fs::exists(path("o.npy")));
}

// --- masks ---

TEST_F(RunAttentionTest, BoolMasksOfEveryBroadcastShape) {
  write_qkv(Shape{2, 3, 4}, Shape{2, 5, 4}, Shape{2, 5, 6}, 25);
  Rng rng(26);
  for (const Shape& shape : {Shape{2, 3, 5}, Shape{3, 5}, Shape{2, 1, 5}, Shape{5}}) {
    SCOPED_TRACE(shape.str());
    std::vector<uint8_t> bools(static_cast<size_t>(shape.numel()));
    for (uint8_t& entry : bools) entry = rng.uniform() < 0.6F ? 1 : 0;
    bools[0] = 0;  // at least one key hidden
    save_npy_bool(path("mask.npy"), bools, shape);
    AttentionOptions options;
    options.attn_mask = AttentionMask::boolean(StridedView<const uint8_t>(bools.data(), shape));
    const Tensor expected = scaled_dot_product_attention(queries_, keys_, values_, options).output;
    const Tensor output = run(kDot + " --mask mask.npy");
    EXPECT_TRUE(same_values(output, expected));
    EXPECT_TRUE(differ(output, scaled_dot_product_attention(queries_, keys_, values_).output));
  }
}

TEST_F(RunAttentionTest, FloatMasksAreAddedWithHeads) {
  // (B, H, n, m) scores with --heads 2; a (1, 2, 3, 5) float mask (per head) with −∞ entries, and
  // a float64 file (read as float32, as every input).
  write_qkv(Shape{2, 3, 8}, Shape{2, 5, 8}, Shape{2, 5, 6}, 27);
  Rng rng(28);
  Tensor mask = random_tensor(Shape{1, 2, 3, 5}, rng);
  mask(0, 1, 2, 0) = -std::numeric_limits<float>::infinity();
  mask(0, 0, 0, 4) = -std::numeric_limits<float>::infinity();
  save("mask.npy", mask);
  AttentionOptions options;
  options.attn_mask = AttentionMask::additive(mask);
  const Tensor expected =
      from_heads(scaled_dot_product_attention(to_heads(queries_, 2), to_heads(keys_, 2),
                                              to_heads(values_, 2), options)
                     .output);
  EXPECT_TRUE(same_values(run(kDot + " --heads 2 --mask mask.npy"), expected));
}

// --- window, causal, softcap, ALiBi, sinks, scale ---

TEST_F(RunAttentionTest, WindowsAndBothCausalAlignments) {
  // n = 3 < m = 6, so top-left and bottom-right put the diagonal on different keys.
  write_qkv(Shape{2, 3, 4}, Shape{2, 6, 4}, Shape{2, 6, 5}, 29);
  const auto expect_run = [&](const std::string& flags, const AttentionOptions& options) {
    SCOPED_TRACE(flags);
    const Tensor output = run(kDot + " " + flags);
    EXPECT_TRUE(same_values(
        output, scaled_dot_product_attention(queries_, keys_, values_, options).output));
    return output;
  };
  AttentionOptions top_left;
  top_left.causal = true;
  top_left.alignment = DiagonalAlignment::kTopLeft;
  AttentionOptions bottom_right = top_left;
  bottom_right.alignment = DiagonalAlignment::kBottomRight;
  const Tensor tl = expect_run("--causal top-left", top_left);
  const Tensor br = expect_run("--causal bottom-right", bottom_right);
  EXPECT_TRUE(differ(tl, br));
  // A bare --causal is the book's layers' alignment, bottom-right.
  EXPECT_TRUE(same_values(expect_run("--causal", bottom_right), br));
  EXPECT_TRUE(same_values(run(kDot + " --causal=bottom-right"), br));

  AttentionOptions window;
  window.window = SlidingWindow{1, 0};
  expect_run("--window 1,0", window);
  window.window = SlidingWindow{-1, 1};
  expect_run("--window -1,1", window);
  // The window sits on the causal diagonal's alignment.
  window.window = SlidingWindow{0, 2};
  window.alignment = DiagonalAlignment::kBottomRight;
  window.causal = true;
  expect_run("--window=0,2 --causal bottom-right", window);
  // Without --causal, --alignment places the window (top-left, PyTorch's, unless it says).
  AttentionOptions bottom_window;
  bottom_window.window = SlidingWindow{1, 0};
  bottom_window.alignment = DiagonalAlignment::kBottomRight;
  const Tensor shifted = expect_run("--window 1,0 --alignment bottom-right", bottom_window);
  EXPECT_TRUE(differ(shifted, run(kDot + " --window 1,0")));
  EXPECT_TRUE(
      same_values(run(kDot + " --window 1,0 --alignment top-left"), run(kDot + " --window 1,0")));
  EXPECT_TRUE(same_values(run(kDot + " --causal --alignment bottom-right"), br));
  expect_error("run " + kDot + " --causal top-left --alignment bottom-right --out o.npy",
               "--alignment: bottom-right disagrees with --causal top-left");
  expect_error("run " + kDot + " --window 1,0 --alignment diagonal --out o.npy",
               "--alignment: expected top-left");
}

TEST_F(RunAttentionTest, SoftcapAlibiSinksAndScaleTogetherWithHeads) {
  write_qkv(Shape{2, 4, 6}, Shape{2, 5, 6}, Shape{2, 5, 6}, 30);
  const Tensor slopes(Shape{3}, {0.5F, 0.25F, 0.125F});
  const Tensor sinks(Shape{3}, {0.3F, -1.0F, 2.0F});
  save("alibi.npy", slopes);
  save("sinks.npy", sinks);
  AttentionOptions options;
  options.softcap = 1.5F;
  options.scale = 0.8F;
  options.alibi_slopes = slopes.span();
  options.sinks = sinks.span();
  options.causal = true;
  options.alignment = DiagonalAlignment::kTopLeft;
  const Tensor q = to_heads(queries_, 3), k = to_heads(keys_, 3), v = to_heads(values_, 3);
  const AttentionForward expected = scaled_dot_product_attention(q, k, v, options);
  const CommandResult result =
      attn("run " + kDot +
           " --heads 3 --softcap 1.5 --scale 0.8 --alibi alibi.npy --sinks sinks.npy "
           "--causal top-left --out o.npy --weights-out w.npy");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_TRUE(same_values(load("o.npy"), from_heads(expected.output)));
  EXPECT_TRUE(same_values(load("w.npy"), attention_weights(q, k, expected.log_sum_exp, options)));

  // Each option on its own changes the result: none of them is silently dropped.
  const Tensor combined = load("o.npy");
  for (const std::string without :
       {" --softcap 1.5 --scale 0.8 --alibi alibi.npy --causal top-left",
        " --softcap 1.5 --scale 0.8 --sinks sinks.npy --causal top-left",
        " --scale 0.8 --alibi alibi.npy --sinks sinks.npy --causal top-left",
        " --softcap 1.5 --alibi alibi.npy --sinks sinks.npy --causal top-left"}) {
    EXPECT_TRUE(differ(run(kDot + " --heads 3" + without), combined)) << without;
  }
}

// --- gradients ---

TEST_F(RunAttentionTest, GradientsIncludeTheFloatMaskAndTheSinks) {
  write_qkv(Shape{2, 3, 8}, Shape{2, 5, 4}, Shape{2, 5, 3}, 31);
  Rng rng(32);
  const Tensor mask = random_tensor(Shape{3, 5}, rng);  // broadcast over batch and heads
  const Tensor sinks(Shape{2}, {0.5F, -0.5F});
  const Tensor grad_output = random_tensor(Shape{2, 3, 6}, rng);  // (B, n, H·dv), H = 2, dv = 3
  save("mask.npy", mask);
  save("sinks.npy", sinks);
  save("g.npy", grad_output);
  const CommandResult result = attn("run " + kDot +
                                    " --heads 2 --kv-heads 1 --mask mask.npy --sinks sinks.npy "
                                    "--out o.npy --out-grad g.npy --grads-out grads");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(file_names(path("grads")),
            (std::set<std::string>{"queries.npy", "keys.npy", "values.npy", "attn_mask.npy",
                                   "sinks.npy"}));

  AttentionOptions options;
  options.enable_gqa = true;
  options.attn_mask = AttentionMask::additive(mask);
  options.sinks = sinks.span();
  const Tensor q = to_heads(queries_, 2), k = to_heads(keys_, 1), v = to_heads(values_, 1);
  const AttentionForward forward = scaled_dot_product_attention(q, k, v, options);
  const AttentionBackward expected = scaled_dot_product_attention_backward(
      q, k, v, forward.output, to_heads(grad_output, 2), forward.log_sum_exp, options, true, true);
  EXPECT_TRUE(same_values(load("o.npy"), from_heads(forward.output)));
  EXPECT_TRUE(same_values(load("grads/queries.npy"), from_heads(expected.query)));
  EXPECT_TRUE(same_values(load("grads/keys.npy"), from_heads(expected.key)));
  EXPECT_TRUE(same_values(load("grads/values.npy"), from_heads(expected.value)));
  EXPECT_TRUE(same_values(load("grads/attn_mask.npy"), expected.attn_mask));
  EXPECT_TRUE(same_values(load("grads/sinks.npy"), expected.sinks));
  EXPECT_EQ(load("grads/attn_mask.npy").shape(), (Shape{3, 5}));

  // A bool mask has no gradient.
  std::vector<uint8_t> bools(15, 1);
  bools[3] = 0;
  save_npy_bool(path("bool.npy"), bools, Shape{3, 5});
  ASSERT_EQ(attn("run " + kDot +
                 " --heads 2 --kv-heads 1 --mask bool.npy --out o.npy --out-grad g.npy "
                 "--grads-out bool_grads")
                .exit_code,
            0);
  EXPECT_EQ(file_names(path("bool_grads")),
            (std::set<std::string>{"queries.npy", "keys.npy", "values.npy"}));
}

// The gradient of a float16 --mask or --sinks is float16, as PyTorch's autograd gives a tensor's
// gradient its dtype (they were written float32): the float32 gradient of the widened values,
// rounded once. A float32 mask beside float16 inputs keeps float32.
TEST_F(RunAttentionTest, AFloat16MaskAndSinksGetFloat16Gradients) {
  write_qkv(Shape{2, 3, 8}, Shape{2, 5, 4}, Shape{2, 5, 3}, 33);
  Rng rng(34);
  std::vector<uint16_t> mask_bits(15), sinks_bits = {float_to_half(0.5F), float_to_half(-0.25F)};
  for (uint16_t& bits : mask_bits) bits = float_to_half(rng.normal());
  save_npy_float16(path("mask16.npy"), mask_bits, Shape{3, 5});
  save_npy_float16(path("sinks16.npy"), sinks_bits, Shape{2});
  const Tensor grad_output = random_tensor(Shape{2, 3, 6}, rng);
  save("g.npy", grad_output);
  const CommandResult result = attn("run " + kDot +
                                    " --heads 2 --kv-heads 1 --mask mask16.npy --sinks "
                                    "sinks16.npy --out o.npy --out-grad g.npy --grads-out grads");
  ASSERT_EQ(result.exit_code, 0) << result.err;

  const auto widened = [](const std::vector<uint16_t>& bits, const Shape& shape) {
    Tensor tensor(shape);
    for (size_t i = 0; i < bits.size(); ++i) tensor.span()[i] = half_to_float(bits[i]);
    return tensor;
  };
  const Tensor mask = widened(mask_bits, Shape{3, 5}), sinks = widened(sinks_bits, Shape{2});
  AttentionOptions options;
  options.enable_gqa = true;
  options.attn_mask = AttentionMask::additive(mask);
  options.sinks = sinks.span();
  const Tensor q = to_heads(queries_, 2), k = to_heads(keys_, 1), v = to_heads(values_, 1);
  const AttentionForward forward = scaled_dot_product_attention(q, k, v, options);
  const AttentionBackward expected = scaled_dot_product_attention_backward(
      q, k, v, forward.output, to_heads(grad_output, 2), forward.log_sum_exp, options, true, true);
  for (const auto& [name, gradient] :
       {std::pair{"attn_mask", &expected.attn_mask}, std::pair{"sinks", &expected.sinks}}) {
    const NpyArray file = read_npy(path(std::string("grads/") + name + ".npy"));
    EXPECT_EQ(file.dtype, NpyDType::kFloat16) << name;
    EXPECT_EQ(file.shape, gradient->shape()) << name;
    std::vector<uint16_t> rounded;
    for (const float value : gradient->span()) rounded.push_back(float_to_half(value));
    EXPECT_EQ(file.halves, rounded) << name;
  }
  EXPECT_EQ(read_npy(path("grads/queries.npy")).dtype, NpyDType::kFloat32);  // the inputs' type

  // float16 inputs with a float32 mask: the mask's gradient in float32.
  for (const std::string name : {"q", "k", "v"}) {
    const Shape shape = name == "q"   ? Shape{2, 3, 8}
                        : name == "k" ? Shape{2, 5, 4}
                                      : Shape{2, 5, 3};
    std::vector<uint16_t> bits(static_cast<size_t>(shape.numel()));
    for (uint16_t& element : bits) element = float_to_half(rng.normal());
    save_npy_float16(path(name + "16.npy"), bits, shape);
  }
  save("mask32.npy", mask);
  const CommandResult half = attn(
      "run --layer dot-product --queries q16.npy --keys k16.npy --values v16.npy --heads 2 "
      "--kv-heads 1 --mask mask32.npy --out o16.npy --out-grad g.npy --grads-out grads16");
  ASSERT_EQ(half.exit_code, 0) << half.err;
  EXPECT_EQ(read_npy(path("grads16/attn_mask.npy")).dtype, NpyDType::kFloat32);
  EXPECT_EQ(read_npy(path("grads16/queries.npy")).dtype, NpyDType::kFloat16);
}

// --- float16 ---

// A rank-3 (B, L, count·d) file's elements viewed as (B, count, L, d) heads, as --heads reads them.
template <class T>
StridedView<T> heads_view(T* data, const Shape& shape, int64_t count) {
  const int64_t rows = shape[1], width = shape[2];
  const int64_t strides[] = {rows * width, width / count, width, 1};
  return StridedView<T>(data, Shape{shape[0], count, rows, width / count}, strides);
}

// A (B, H, L, d) half gradient's bits laid out as the (B, L, H·d) file the CLI writes.
std::vector<uint16_t> regrouped_bits(const HalfTensor& gradient) {
  const int64_t batch = gradient.shape[0], count = gradient.shape[1], rows = gradient.shape[2],
                size = gradient.shape[3];
  std::vector<uint16_t> bits(gradient.bits.size());
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < count; ++h)
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t c = 0; c < size; ++c)
          bits[static_cast<size_t>(((b * rows + i) * count + h) * size + c)] =
              gradient.bits[static_cast<size_t>(((b * count + h) * rows + i) * size + c)];
  return bits;
}

// What `attn run --heads 2 --kv-heads 1 --causal` must write for half files of `type`: q (2, 3, 8),
// k (2, 5, 4), v (2, 5, 3) and G (2, 3, 6), H = 2 query heads of d = 4 over one key/value head,
// dv = 3: the library's half overloads on the same bits.
struct ExpectedHalfRun {
  std::vector<uint16_t> out;
  HalfAttentionBackward gradients;
};
ExpectedHalfRun expected_causal_gqa_run(HalfType type, const std::vector<uint16_t>& q,
                                        const std::vector<uint16_t>& k,
                                        const std::vector<uint16_t>& v,
                                        const std::vector<uint16_t>& g) {
  AttentionOptions options;
  options.enable_gqa = true;
  options.causal = true;
  options.alignment = DiagonalAlignment::kBottomRight;
  const Shape out_shape{2, 3, 6};
  ExpectedHalfRun expected;
  expected.out.resize(static_cast<size_t>(out_shape.numel()));
  std::vector<float> lse(2 * 2 * 3);
  scaled_dot_product_attention(type, heads_view(q.data(), Shape{2, 3, 8}, 2),
                               heads_view(k.data(), Shape{2, 5, 4}, 1),
                               heads_view(v.data(), Shape{2, 5, 3}, 1), options,
                               heads_view(expected.out.data(), out_shape, 2), lse);
  expected.gradients = scaled_dot_product_attention_backward(
      type, heads_view(q.data(), Shape{2, 3, 8}, 2), heads_view(k.data(), Shape{2, 5, 4}, 1),
      heads_view(v.data(), Shape{2, 5, 3}, 1),
      heads_view(static_cast<const uint16_t*>(expected.out.data()), out_shape, 2),
      heads_view(g.data(), out_shape, 2), lse, options);
  return expected;
}

// float16 files run PyTorch's float16 attention: the half overloads on the files' bits (fp32 sums,
// output and input gradients rounded once to float16, written as '<f2'), compared bit for bit with
// the library called on the same bits; a float16 file beside float32 ones is refused.
TEST_F(RunAttentionTest, Float16FilesRunInHalfPrecisionAndWriteFloat16) {
  Rng rng(41);
  const auto half_file = [&](const std::string& name, const Shape& shape) {
    std::vector<uint16_t> bits(static_cast<size_t>(shape.numel()));
    for (uint16_t& element : bits) element = float_to_half(rng.normal());
    save_npy_float16(path(name), bits, shape);
    return bits;
  };
  // H = 2 query heads of d = 4 over one key/value head, dv = 3.
  std::vector<uint16_t> q = half_file("q.npy", Shape{2, 3, 8});
  std::vector<uint16_t> k = half_file("k.npy", Shape{2, 5, 4});
  std::vector<uint16_t> v = half_file("v.npy", Shape{2, 5, 3});
  std::vector<uint16_t> g = half_file("g.npy", Shape{2, 3, 6});
  const CommandResult result =
      attn("run " + kDot +
           " --heads 2 --kv-heads 1 --causal bottom-right --out o.npy --out-grad g.npy "
           "--grads-out grads --weights-out w.npy");
  ASSERT_EQ(result.exit_code, 0) << result.err;

  constexpr HalfType kType = HalfType::kFloat16;
  const Shape out_shape{2, 3, 6};
  const ExpectedHalfRun run = expected_causal_gqa_run(kType, q, k, v, g);
  const std::vector<uint16_t>& out = run.out;
  const HalfAttentionBackward& expected = run.gradients;

  const NpyArray written = read_npy(path("o.npy"));
  EXPECT_EQ(written.dtype, NpyDType::kFloat16);
  EXPECT_EQ(written.shape, out_shape);
  EXPECT_EQ(written.halves, out);
  // The gradients come back (B, H, L, d) from the library; the files keep the inputs' layouts.
  for (const auto& [name, gradient] :
       {std::pair{"queries", &expected.query}, std::pair{"keys", &expected.key},
        std::pair{"values", &expected.value}}) {
    const NpyArray file = read_npy(path(std::string("grads/") + name + ".npy"));
    EXPECT_EQ(file.dtype, NpyDType::kFloat16) << name;
    EXPECT_EQ(file.halves, regrouped_bits(*gradient)) << name;
  }
  // The weights stay float32.
  EXPECT_EQ(read_npy(path("w.npy")).dtype, NpyDType::kFloat32);

  // A bool mask broadcast over the batch and the heads: the scores' shape from the float16 files'
  // shapes (their bits are all a float16 run keeps of them).
  const std::vector<uint8_t> bools = {1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 1, 1};
  save_npy_bool(path("mask.npy"), bools, Shape{3, 5});
  const CommandResult masked =
      attn("run " + kDot + " --heads 2 --kv-heads 1 --mask mask.npy --out om.npy");
  ASSERT_EQ(masked.exit_code, 0) << masked.err;
  AttentionOptions mask_options;
  mask_options.enable_gqa = true;
  mask_options.attn_mask =
      AttentionMask::boolean(StridedView<const uint8_t>(bools.data(), Shape{3, 5}));
  std::vector<uint16_t> masked_out(out.size());
  std::vector<float> lse(2 * 2 * 3);
  scaled_dot_product_attention(kType, heads_view(q.data(), Shape{2, 3, 8}, 2),
                               heads_view(k.data(), Shape{2, 5, 4}, 1),
                               heads_view(v.data(), Shape{2, 5, 3}, 1), mask_options,
                               heads_view(masked_out.data(), out_shape, 2), lse);
  EXPECT_EQ(read_npy(path("om.npy")).halves, masked_out);

  // float16 queries and values with float32 keys: refused, naming the odd one out.
  save("k.npy", random_tensor(Shape{2, 5, 4}, rng));
  expect_error("run " + kDot + " --heads 2 --kv-heads 1 --out o.npy",
               "keys: expected float16 data like the other inputs");
  // float32 queries and values beside them: the keys again (it named the queries).
  save("q.npy", random_tensor(Shape{2, 3, 8}, rng));
  save("v.npy", random_tensor(Shape{2, 5, 3}, rng));
  save_npy_float16(path("k.npy"), std::vector<uint16_t>(40, float_to_half(0.5F)), Shape{2, 5, 4});
  expect_error("run " + kDot + " --heads 2 --kv-heads 1 --out o.npy",
               "keys: expected float32 or float64 data like the other inputs (float16 or bfloat16 "
               "inputs run in their type when all three are), got float16");
}

// G is read in the precision the run computes in: a float32 G for a float16 run is rounded once
// to float16 (the same gradients as its float16 file), a float16 G for a float32 run widened
// exactly (the same gradients as its values in a float32 file).
TEST_F(RunAttentionTest, GradOutputIsReadInTheRunsPrecision) {
  Rng rng(43);
  Tensor g32 = random_tensor(Shape{2, 3, 3}, rng);
  std::vector<uint16_t> g16(static_cast<size_t>(g32.numel()));
  Tensor widened(g32.shape());
  for (int64_t e = 0; e < g32.numel(); ++e) {
    g16[static_cast<size_t>(e)] = float_to_half(g32.data()[e]);
    widened.data()[e] = half_to_float(g16[static_cast<size_t>(e)]);
  }
  save("g32.npy", g32);
  save_npy_float16(path("g16.npy"), g16, g32.shape());
  save("gw.npy", widened);
  const auto grads_of = [&](const std::string& g, const std::string& directory) {
    const CommandResult result =
        attn("run " + kDot + " --out o.npy --out-grad " + g + " --grads-out " + directory);
    EXPECT_EQ(result.exit_code, 0) << result.err;
    std::vector<NpyArray> files;
    for (const char* name : {"queries", "keys", "values"})
      files.push_back(read_npy(path(directory + "/" + name + ".npy")));
    return files;
  };
  const auto half_file = [&](const std::string& name, const Shape& shape) {
    std::vector<uint16_t> bits(static_cast<size_t>(shape.numel()));
    for (uint16_t& element : bits) element = float_to_half(rng.normal());
    save_npy_float16(path(name), bits, shape);
  };
  half_file("q.npy", Shape{2, 3, 4});
  half_file("k.npy", Shape{2, 5, 4});
  half_file("v.npy", Shape{2, 5, 3});
  const std::vector<NpyArray> from_floats = grads_of("g32.npy", "h32");
  const std::vector<NpyArray> from_halves = grads_of("g16.npy", "h16");
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(from_floats[i].dtype, NpyDType::kFloat16);
    EXPECT_EQ(from_floats[i].halves, from_halves[i].halves) << i;
  }
  write_qkv(Shape{2, 3, 4}, Shape{2, 5, 4}, Shape{2, 5, 3}, 44);
  const std::vector<NpyArray> widened_in_file = grads_of("gw.npy", "f32");
  const std::vector<NpyArray> widened_on_load = grads_of("g16.npy", "f16");
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(widened_on_load[i].dtype, NpyDType::kFloat32);
    EXPECT_EQ(widened_in_file[i].floats, widened_on_load[i].floats) << i;
  }
}

// --- additive and general ---

// bfloat16 arrives in safetensors files (.npy has no bfloat16): the half overloads on the files'
// bits, the output and the input gradients written as BF16 safetensors tensors, bit for bit the
// library's on the same bits; a .npy --out for a bfloat16 result is refused before anything is
// written; FILE.safetensors:NAME picks one tensor of several, and a file of several without a name
// is refused listing them.
TEST_F(RunAttentionTest, BFloat16SafetensorsRunInBFloat16AndWriteSafetensors) {
  constexpr HalfType kType = HalfType::kBFloat16;
  Rng rng(47);
  const auto half_file = [&](const std::string& name, const Shape& shape) {
    std::vector<uint16_t> bits(static_cast<size_t>(shape.numel()));
    for (uint16_t& element : bits) element = float_to_half_bits(kType, rng.normal());
    save_safetensors_half(path(name), "x", kType, shape, bits);
    return bits;
  };
  const std::vector<uint16_t> q = half_file("q.safetensors", Shape{2, 3, 8});
  const std::vector<uint16_t> k = half_file("k.safetensors", Shape{2, 5, 4});
  const std::vector<uint16_t> v = half_file("v.safetensors", Shape{2, 5, 3});
  const std::vector<uint16_t> g = half_file("g.safetensors", Shape{2, 3, 6});
  const std::string bf16 =
      "run --layer dot-product --queries q.safetensors --keys k.safetensors --values "
      "v.safetensors --heads 2 --kv-heads 1 --causal ";
  const CommandResult result =
      attn(bf16 + "--out o.safetensors --out-grad g.safetensors --grads-out grads");
  ASSERT_EQ(result.exit_code, 0) << result.err;

  const Shape out_shape{2, 3, 6};
  const ExpectedHalfRun run = expected_causal_gqa_run(kType, q, k, v, g);
  const std::vector<uint16_t>& out = run.out;
  const HalfAttentionBackward& expected = run.gradients;
  const SafetensorsTensor written = load_safetensors_tensor(path("o.safetensors"), "output");
  ASSERT_EQ(written.half, kType);
  EXPECT_EQ(written.shape, out_shape);
  EXPECT_EQ(written.bits, out);
  for (const auto& [name, gradient] :
       {std::pair{"queries", &expected.query}, std::pair{"keys", &expected.key},
        std::pair{"values", &expected.value}}) {
    const SafetensorsTensor file =
        load_safetensors_tensor(path(std::string("grads/") + name + ".safetensors"), name);
    EXPECT_EQ(file.half, kType) << name;
    EXPECT_EQ(file.bits, regrouped_bits(*gradient)) << name;
  }

  // bfloat16 into .npy: refused, and no file left behind.
  expect_error(bf16 + "--out o.npy", "--out: a bfloat16 result needs a .safetensors file");
  EXPECT_FALSE(fs::exists(path("o.npy")));
  expect_error(bf16 + "--out o.txt", "--out: expected a file name ending in .npy or .safetensors");

  // float32 tensors picked by name from one file, against the same values as .npy files.
  write_qkv(Shape{2, 3, 4}, Shape{2, 5, 4}, Shape{2, 5, 3}, 48);
  StateDict all;
  all.emplace("q", queries_);
  all.emplace("k", keys_);
  all.emplace("v", values_);
  save_safetensors(path("all.safetensors"), all);
  ASSERT_EQ(attn("run " + kDot + " --out ref.npy").exit_code, 0);
  const CommandResult named = attn(
      "run --layer dot-product --queries all.safetensors:q --keys all.safetensors:k --values "
      "all.safetensors:v --out named.safetensors");
  ASSERT_EQ(named.exit_code, 0) << named.err;
  const SafetensorsTensor named_out = load_safetensors_tensor(path("named.safetensors"), "");
  EXPECT_FALSE(named_out.half);
  EXPECT_EQ(named_out.floats.span().size(), load("ref.npy").span().size());
  EXPECT_TRUE(same_values(named_out.floats, load("ref.npy")));
  expect_error(
      "run --layer dot-product --queries all.safetensors --keys k.npy --values v.npy --out o.npy",
      "expected one tensor (or FILE:NAME to choose one), got 3: 'k', 'q', 'v'");
  expect_error(
      "run --layer dot-product --queries all.safetensors:nope --keys k.npy --values v.npy "
      "--out o.npy",
      "no tensor 'nope': it holds 'k', 'q', 'v'");

  // The file of FILE.safetensors:NAME is the input that no output may overwrite (it was written
  // over, its tensors lost); --out FILE.safetensors:NAME names the output's tensor; FILE ends at
  // the first ".safetensors" followed by ':', so a name may hold ':'.
  const std::string from_all =
      "run --layer dot-product --queries all.safetensors:q --keys all.safetensors:k --values "
      "all.safetensors:v ";
  expect_error(from_all + "--out all.safetensors",
               "--out all.safetensors: the same file as --queries all.safetensors (writing it "
               "would overwrite an input)");
  expect_error(from_all + "--out all.safetensors:o", "the same file as --queries all.safetensors");
  EXPECT_EQ(load_safetensors(path("all.safetensors")).size(), 3U);
  all.emplace("layer:0.q", queries_);
  save_safetensors(path("all.safetensors"), all);
  const CommandResult renamed = attn(
      "run --layer dot-product --queries all.safetensors:layer:0.q --keys all.safetensors:k "
      "--values all.safetensors:v --out renamed.safetensors:attention:out");
  ASSERT_EQ(renamed.exit_code, 0) << renamed.err;
  const SafetensorsTensor renamed_out =
      load_safetensors_tensor(path("renamed.safetensors"), "attention:out");
  EXPECT_TRUE(same_values(renamed_out.floats, load("ref.npy")));
}

// The other layers compute in float32 on half inputs and write their output (and the inputs'
// gradients) in the inputs' type, as PyTorch's output dtype follows its inputs': the float32 run
// on the widened values, rounded once.
TEST_F(RunAttentionTest, AdditiveOnFloat16FilesWritesFloat16) {
  write_qkv(Shape{2, 3, 4}, Shape{2, 5, 3}, Shape{2, 5, 6}, 49);
  const AdditiveAttention layer(/*key_size=*/3, /*query_size=*/4, /*num_hiddens=*/7, 0.0F, 50);
  save_safetensors(path("p.safetensors"), layer.state_dict());
  const auto to_half_file = [&](const std::string& name, const Tensor& values) {
    std::vector<uint16_t> bits(static_cast<size_t>(values.numel()));
    Tensor widened(values.shape());
    for (int64_t e = 0; e < values.numel(); ++e) {
      bits[static_cast<size_t>(e)] = float_to_half(values.data()[e]);
      widened.data()[e] = half_to_float(bits[static_cast<size_t>(e)]);
    }
    save_npy_float16(path(name), bits, values.shape());
    save(name + ".f32.npy", widened);
  };
  to_half_file("q16.npy", queries_);
  to_half_file("k16.npy", keys_);
  to_half_file("v16.npy", values_);
  const std::string params = "run --layer additive --params p.safetensors ";
  ASSERT_EQ(
      attn(params + "--queries q16.npy --keys k16.npy --values v16.npy --out o16.npy").exit_code,
      0);
  ASSERT_EQ(
      attn(params + "--queries q16.npy.f32.npy --keys k16.npy.f32.npy --values v16.npy.f32.npy "
                    "--out o32.npy")
          .exit_code,
      0);
  const NpyArray half = read_npy(path("o16.npy"));
  EXPECT_EQ(half.dtype, NpyDType::kFloat16);
  const Tensor wide = load("o32.npy");
  ASSERT_EQ(half.halves.size(), static_cast<size_t>(wide.numel()));
  for (size_t e = 0; e < half.halves.size(); ++e)
    EXPECT_EQ(half.halves[e], float_to_half(wide.data()[e])) << "element " << e;
}

TEST_F(RunAttentionTest, AdditiveTakesMasksWindowsAndCausal) {
  write_qkv(Shape{2, 3, 4}, Shape{2, 5, 3}, Shape{2, 5, 6}, 33);
  const AdditiveAttention layer(/*key_size=*/3, /*query_size=*/4, /*num_hiddens=*/7, 0.0F, 34);
  const StateDict state = layer.state_dict();
  save_safetensors(path("p.safetensors"), state);
  std::vector<uint8_t> bools = {1, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 1, 1};
  save_npy_bool(path("mask.npy"), bools, Shape{3, 5});
  Rng rng(35);
  const Tensor grad_output = random_tensor(Shape{2, 3, 6}, rng);
  save("g.npy", grad_output);
  const CommandResult result = attn(
      "run --layer additive --params p.safetensors --queries q.npy --keys k.npy --values "
      "v.npy --mask mask.npy --window 2,1 --causal bottom-right --out o.npy --weights-out "
      "w.npy --out-grad g.npy --grads-out grads");
  ASSERT_EQ(result.exit_code, 0) << result.err;

  AttentionOptions options;
  options.attn_mask = AttentionMask::boolean(StridedView<const uint8_t>(bools.data(), Shape{3, 5}));
  options.window = SlidingWindow{2, 1};
  options.causal = true;
  options.alignment = DiagonalAlignment::kBottomRight;
  const AdditiveParameters parameters{state.at("W_q.weight"), state.at("W_k.weight"),
                                      state.at("w_v.weight").span()};
  const AttentionForward forward =
      additive_attention(queries_, keys_, values_, parameters, options);
  EXPECT_TRUE(same_values(load("o.npy"), forward.output));
  EXPECT_TRUE(same_values(load("w.npy"), additive_attention_weights(queries_, keys_, parameters,
                                                                    forward.log_sum_exp, options)));
  AdditiveGradients expected =
      additive_attention_backward(queries_, keys_, values_, parameters, forward.output, grad_output,
                                  forward.log_sum_exp, options);
  EXPECT_TRUE(same_values(load("grads/queries.npy"), expected.queries));
  EXPECT_TRUE(same_values(load("grads/keys.npy"), expected.keys));
  EXPECT_TRUE(same_values(load("grads/values.npy"), expected.values));
  EXPECT_TRUE(same_values(load("grads/W_q.weight.npy"), expected.W_q));
  EXPECT_TRUE(same_values(load("grads/W_k.weight.npy"), expected.W_k));
  expected.w_v.reshape(Shape{1, 7});  // the state dict's (1, h)
  EXPECT_TRUE(same_values(load("grads/w_v.weight.npy"), expected.w_v));
}

TEST_F(RunAttentionTest, AdditiveWritesTheFloatMasksGradient) {
  // --grads-out promises attn_mask.npy for a float --mask; the additive layer wrote none (exit 0).
  // Against central differences of sum(output · G) through the library's forward, in float32:
  // step 1e-2 on masks of magnitude 1, so the differences' rounding (36 outputs near 1, 2⁻²⁴
  // each, over the step) and their h² error are both under 1e-3.
  write_qkv(Shape{2, 3, 4}, Shape{2, 5, 3}, Shape{2, 5, 6}, 39);
  const AdditiveAttention layer(/*key_size=*/3, /*query_size=*/4, /*num_hiddens=*/7, 0.0F, 40);
  const StateDict state = layer.state_dict();
  save_safetensors(path("p.safetensors"), state);
  Rng rng(41);
  const Tensor grad_output = random_tensor(Shape{2, 3, 6}, rng);
  save("g.npy", grad_output);
  const AdditiveParameters parameters{state.at("W_q.weight"), state.at("W_k.weight"),
                                      state.at("w_v.weight").span()};
  for (const Shape& mask_shape : {Shape{3, 5}, Shape{2, 1, 5}}) {
    SCOPED_TRACE(mask_shape.str());
    Tensor mask = random_tensor(mask_shape, rng);
    save("mask.npy", mask);
    const CommandResult result = attn(
        "run --layer additive --params p.safetensors --queries q.npy --keys k.npy --values v.npy "
        "--mask mask.npy --out o.npy --out-grad g.npy --grads-out grads");
    ASSERT_EQ(result.exit_code, 0) << result.err;
    const Tensor gradient = load("grads/attn_mask.npy");
    ASSERT_EQ(gradient.shape(), mask_shape);
    const auto loss = [&](const Tensor& entries) {
      AttentionOptions options;
      options.attn_mask = AttentionMask::additive(entries);
      const AttentionForward forward =
          additive_attention(queries_, keys_, values_, parameters, options);
      double total = 0.0;
      for (int64_t e = 0; e < forward.output.numel(); ++e)
        total += static_cast<double>(forward.output.data()[e]) * grad_output.data()[e];
      return total;
    };
    for (int64_t e = 0; e < mask.numel(); ++e) {
      const float entry = mask.data()[e];
      mask.data()[e] = entry + 1e-2F;
      const double above = loss(mask);
      mask.data()[e] = entry - 1e-2F;
      const double below = loss(mask);
      mask.data()[e] = entry;
      EXPECT_NEAR(gradient.data()[e], (above - below) / 2e-2, 1e-3) << "entry " << e;
    }
  }
}

TEST_F(RunAttentionTest, GeneralLayerInfersItsSizesFromW) {
  // Queries of size 4 scored against keys of size 3 through W (3, 4).
  write_qkv(Shape{2, 3, 4}, Shape{2, 5, 3}, Shape{2, 5, 6}, 36);
  GeneralAttention layer(/*query_size=*/4, /*key_size=*/3, 0.0F, 37);
  layer.eval();
  save_safetensors(path("p.safetensors"), layer.state_dict());
  save_npy(path("lens.npy"), std::vector<int64_t>{2, 5}, Shape{2});
  Rng rng(38);
  const Tensor grad_output = random_tensor(Shape{2, 3, 6}, rng);
  save("g.npy", grad_output);
  const CommandResult result = attn(
      "run --layer general --params p.safetensors --queries q.npy --keys k.npy --values v.npy"
      " --valid-lens lens.npy --out o.npy --weights-out w.npy --out-grad g.npy "
      "--grads-out grads");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("general attention, output (2, 3, 6)"), std::string::npos)
      << result.out;
  const Tensor expected = layer(queries_, keys_, values_, ValidLengths::per_batch({2, 5}));
  EXPECT_TRUE(same_values(load("o.npy"), expected));
  EXPECT_TRUE(same_values(load("w.npy"), layer.attention_weights()));
  const AttentionGradients gradients = layer.backward(grad_output);
  EXPECT_EQ(file_names(path("grads")),
            (std::set<std::string>{"queries.npy", "keys.npy", "values.npy", "W.weight.npy"}));
  EXPECT_TRUE(same_values(load("grads/queries.npy"), gradients.queries));
  EXPECT_TRUE(same_values(load("grads/keys.npy"), gradients.keys));
  EXPECT_TRUE(same_values(load("grads/values.npy"), gradients.values));
  EXPECT_TRUE(same_values(load("grads/W.weight.npy"), *layer.parameters()[0].grad));
}

// The layers on bfloat16 safetensors inputs: computed in float32 on the widened values, the output
// and the inputs' gradients rounded once to bfloat16 (.safetensors files), the parameter's
// gradient float32 as the parameter.
TEST_F(RunAttentionTest, GeneralLayerOnBFloat16FilesWritesBFloat16) {
  constexpr HalfType kType = HalfType::kBFloat16;
  GeneralAttention layer(/*query_size=*/4, /*key_size=*/3, 0.0F, 39);
  layer.eval();
  save_safetensors(path("p.safetensors"), layer.state_dict());
  Rng rng(40);
  const auto half_file = [&](const std::string& name, const Shape& shape) {
    std::vector<uint16_t> bits(static_cast<size_t>(shape.numel()));
    Tensor widened(shape);
    for (int64_t e = 0; e < shape.numel(); ++e) {
      bits[static_cast<size_t>(e)] = float_to_half_bits(kType, rng.normal());
      widened.data()[e] = half_bits_to_float(kType, bits[static_cast<size_t>(e)]);
    }
    save_safetensors_half(path(name), "x", kType, shape, bits);
    return widened;
  };
  const Tensor q = half_file("q.safetensors", Shape{2, 3, 4});
  const Tensor k = half_file("k.safetensors", Shape{2, 5, 3});
  const Tensor v = half_file("v.safetensors", Shape{2, 5, 6});
  const Tensor g = half_file("g.safetensors", Shape{2, 3, 6});
  const CommandResult result = attn(
      "run --layer general --params p.safetensors --queries q.safetensors --keys k.safetensors "
      "--values v.safetensors --out o.safetensors --out-grad g.safetensors --grads-out grads");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const auto expect_rounded = [&](const std::string& file, const std::string& name,
                                  const Tensor& wide) {
    const SafetensorsTensor written = load_safetensors_tensor(path(file), name);
    ASSERT_EQ(written.half, kType) << file;
    ASSERT_EQ(written.bits.size(), static_cast<size_t>(wide.numel())) << file;
    // The CLI's float32 run on the same values (the layer's own kernels) rounded once: equal
    // bits but where the two float32 results sit a few ulps apart across a rounding boundary.
    for (size_t e = 0; e < written.bits.size(); ++e) {
      const float got = half_bits_to_float(kType, written.bits[e]);
      EXPECT_NEAR(got, wide.data()[e], 0x1p-8 * std::fabs(wide.data()[e]) + 1e-6F)
          << file << " element " << e;
    }
  };
  const Tensor expected = layer(q, k, v, ValidLengths());
  expect_rounded("o.safetensors", "output", expected);
  const AttentionGradients gradients = layer.backward(g);
  expect_rounded("grads/queries.safetensors", "queries", gradients.queries);
  expect_rounded("grads/keys.safetensors", "keys", gradients.keys);
  expect_rounded("grads/values.safetensors", "values", gradients.values);
  const SafetensorsTensor weight = load_safetensors_tensor(path("grads/W.weight.safetensors"), "");
  EXPECT_FALSE(weight.half);
  EXPECT_TRUE(same_values(weight.floats, *layer.parameters()[0].grad));
}

// --- weights only on request ---

// n = m = 2^23 queries and keys: their (1, n, m) weights would be 2^46 floats (256 TiB), more than
// an x86-64 process can address, so a run that built them would fail with an allocation error.
// Under --window 0,0 each query sees its diagonal key only, the kernels skip every other tile,
// and the output is the values themselves, to the rounding of P·v/P (P of a lone key is
// 2^(S − ⌈S⌉) where the running maximum is kept as an integer, AVX2 and below; 1 elsewhere): the
// run takes seconds and 100 MB of files.
TEST_F(RunAttentionTest, WeightsAreNeverBuiltUnlessAsked) {
  const int64_t n = int64_t{1} << 23;
  Tensor ones = Tensor::full(Shape{1, n, 1}, 1.0F);
  Tensor values(Shape{1, n, 1});
  for (int64_t i = 0; i < n; ++i) values.data()[i] = static_cast<float>(i % 1000) - 500.0F;
  save("q.npy", ones);
  save("k.npy", ones);
  save("v.npy", values);
  ones = Tensor();
  const CommandResult result = attn("run " + kDot + " --window 0,0 --out o.npy");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const Tensor output = load("o.npy");
  ASSERT_EQ(output.shape(), values.shape());
  // Three roundings of at most 2⁻²⁴ each (P·v, 1/P, the product).
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(output.data()[i], values.data()[i], 2e-7 * std::abs(values.data()[i])) << i;
  }
}

// --- errors: exit code 1 and a message naming the flag (and file) ---

TEST_F(RunAttentionTest, MaskErrorsNameTheFlagAndTheFile) {
  write_qkv(Shape{2, 3, 4}, Shape{2, 5, 4}, Shape{2, 5, 6}, 39);
  save_npy_bool(path("square.npy"), std::vector<uint8_t>(16, 1), Shape{4, 4});
  expect_error("run " + kDot + " --mask square.npy --out o.npy",
               "attn_mask: expected a shape that broadcasts to the scores (2, 3, 5) (B, n, m)");
  expect_error("run " + kDot + " --mask square.npy --out o.npy",
               "got (4, 4) (attn_mask from --mask square.npy)");
  save("wide.npy", Tensor(Shape{3, 2, 3, 5}));  // (3, ·) against B = 2 with --heads 2
  expect_error("run " + kDot + " --heads 2 --mask wide.npy --out o.npy",
               "broadcasts to the scores (2, 2, 3, 5) (B, H, n, m)");
  save_npy(path("ints.npy"), std::vector<int64_t>{1, 0, 1, 1, 1}, Shape{5});
  expect_error("run " + kDot + " --mask ints.npy --out o.npy",
               "expected a bool or floating-point (float16, bfloat16, float32, float64) mask, "
               "got an integer array");
  expect_error("run " + kDot + " --mask absent.npy --out o.npy", "--mask: absent.npy");
  EXPECT_FALSE(fs::exists(path("o.npy")));
}

// Errors about a tensor read from --out-grad or --params name the option and the file, not only
// the library's name for the argument.
TEST_F(RunAttentionTest, NonFiniteGradOutputAndParametersNameTheirFiles) {
  write_qkv(Shape{2, 3, 4}, Shape{2, 5, 4}, Shape{2, 5, 6}, 42);
  Tensor grad = Tensor::full(Shape{2, 3, 6}, 1.0F);
  grad.data()[0] = std::numeric_limits<float>::quiet_NaN();
  save("g.npy", grad);
  expect_error("run " + kDot + " --out o.npy --out-grad g.npy --grads-out grads",
               "(grad_output from --out-grad g.npy)");
  StateDict state = AdditiveAttention(4, 4, 7, 0.0F).state_dict();
  state.at("W_q.weight").data()[0] = std::numeric_limits<float>::quiet_NaN();
  save_safetensors(path("p.safetensors"), state);
  expect_error(
      "run --layer additive --params p.safetensors --queries q.npy --keys k.npy --values v.npy "
      "--out o.npy",
      "(W_q.weight from --params p.safetensors)");
  // A safetensors input that holds no tensor says so.
  save_safetensors(path("empty.safetensors"), StateDict{});
  expect_error(
      "run --layer dot-product --queries empty.safetensors --keys k.npy --values v.npy --out o.npy",
      "--queries: empty.safetensors: expected one tensor (or FILE:NAME to choose one), got 0 (the "
      "file holds none)");
  EXPECT_FALSE(fs::exists(path("o.npy")));
  EXPECT_FALSE(fs::exists(path("grads")));
}

// Valid lengths of a dtype the .npy reader does not read at all (int16, uint64): the message says
// int32 or int64, not every dtype the reader knows (floats included).
TEST_F(RunAttentionTest, ValidLengthsOfAnUnreadDTypeSayInt32OrInt64) {
  write_qkv(Shape{2, 3, 4}, Shape{2, 5, 4}, Shape{2, 5, 6}, 43);
  for (const auto& [descr, bytes] :
       std::vector<std::pair<std::string, size_t>>{{"<i2", 2}, {"<u8", 8}}) {
    std::ofstream(path("lens.npy"), std::ios::binary)
        << testing::npy_header(descr, "(2,)") << std::string(2 * bytes, '\1');
    expect_error("run " + kDot + " --valid-lens lens.npy --out o.npy",
                 "--valid-lens: lens.npy: expected int32 ('<i4') or int64 ('<i8') valid lengths, "
                 "got dtype '" +
                     descr + "'");
  }
  EXPECT_FALSE(fs::exists(path("o.npy")));
}

TEST_F(RunAttentionTest, HeadErrorsNameBothFlags) {
  write_qkv(Shape{2, 3, 8}, Shape{2, 5, 4}, Shape{2, 5, 6}, 40);
  expect_error("run " + kDot + " --heads 4 --kv-heads 3 --out o.npy",
               "--kv-heads: expected a divisor of --heads 4");
  expect_error("run " + kDot + " --heads 4 --kv-heads 0 --out o.npy",
               "--kv-heads: expected a divisor of --heads 4");
  expect_error("run " + kDot + " --kv-heads 2 --out o.npy", "--kv-heads: needs --heads");
  expect_error("run " + kDot + " --heads 0 --out o.npy", "--heads: expected a positive number");
  expect_error("run " + kDot + " --heads 3 --out o.npy",
               "queries: expected a last axis that splits into --heads 3 heads, got shape "
               "(2, 3, 8) (queries from --queries q.npy)");
  // Two heads of 4 need keys of 8 (or --kv-heads 1).
  expect_error("run " + kDot + " --heads 2 --out o.npy",
               "keys: expected the last dimension to be 8 (--heads 2 × the queries' head size 4)");
  write_qkv(Shape{2, 4, 3, 5}, Shape{2, 3, 6, 5}, Shape{2, 3, 6, 3}, 41);
  expect_error("run " + kDot + " --out o.npy",
               "keys: expected a number of heads (axis 1) dividing the queries' 4");
  expect_error("run " + kDot + " --heads 4 --out o.npy",
               "--heads: the inputs are rank 4 (N, H, L, E)");
  EXPECT_FALSE(fs::exists(path("o.npy")));
}

TEST_F(RunAttentionTest, BadWindowCausalSoftcapAlibiAndSinks) {
  write_qkv(Shape{2, 3, 4}, Shape{2, 5, 4}, Shape{2, 5, 6}, 42);
  for (const std::string window : {"3", "a,b", "-2,0", "1,-5", "1,2,3", ",", "1.5,2"}) {
    expect_error("run " + kDot + " --window=" + window + " --out o.npy",
                 "--window: expected L,R, two integers ≥ -1");
  }
  expect_error("run " + kDot + " --causal diagonal --out o.npy",
               "--causal: expected top-left (PyTorch's is_causal");
  expect_error("run " + kDot + " --causal diagonal --out o.npy", "got 'diagonal'");
  expect_error("run " + kDot + " --softcap 0 --out o.npy",
               "--softcap: expected a positive finite number");
  expect_error("run " + kDot + " --softcap -2 --out o.npy", "--softcap");
  save("three.npy", Tensor(Shape{3}, {0.5F, 0.25F, 0.125F}));
  expect_error("run " + kDot + " --heads 2 --alibi three.npy --out o.npy",
               "alibi_slopes: expected one slope per query head, shape (2,) (the heads from "
               "--heads 2), got shape (3,) (alibi_slopes from --alibi three.npy)");
  expect_error("run " + kDot + " --alibi three.npy --out o.npy",
               "shape (1,) (rank-3 inputs without --heads have one head)");
  expect_error("run " + kDot + " --sinks three.npy --out o.npy",
               "sinks: expected one sink logit per query head");
  save_npy_bool(path("bool.npy"), std::vector<uint8_t>{1}, Shape{1});
  expect_error("run " + kDot + " --sinks bool.npy --out o.npy", "got bool dtype '|b1'");
  EXPECT_FALSE(fs::exists(path("o.npy")));
}

TEST_F(RunAttentionTest, FlagsALayerDoesNotTakeAreErrorsNamingBoth) {
  write_qkv(Shape{2, 3, 4}, Shape{2, 5, 3}, Shape{2, 5, 5}, 43);
  save_safetensors(path("mh.safetensors"), MultiHeadAttention(3, 4, 5, 8, 2, 0.0F).state_dict());
  save_safetensors(path("add.safetensors"), AdditiveAttention(3, 4, 7, 0.0F).state_dict());
  save_safetensors(path("gen.safetensors"), GeneralAttention(4, 3).state_dict());
  const std::string inputs = " --queries q.npy --keys k.npy --values v.npy --out o.npy";
  expect_error("run --layer multi-head --heads 2 --params mh.safetensors --window 1,1" + inputs,
               "--window: not supported by --layer multi-head");
  expect_error("run --layer multi-head --heads 2 --params mh.safetensors --kv-heads 1" + inputs,
               "--kv-heads: not supported by --layer multi-head");
  expect_error("run --layer multi-head --heads 2 --params mh.safetensors --causal" + inputs,
               "--causal: not supported by --layer multi-head");
  expect_error("run --layer additive --params add.safetensors --softcap 2" + inputs,
               "--softcap: not supported by --layer additive");
  expect_error("run --layer additive --params add.safetensors --heads 2" + inputs,
               "--heads: not supported by --layer additive");
  expect_error("run --layer additive --params add.safetensors --alibi a.npy" + inputs,
               "--alibi: not supported by --layer additive");
  expect_error("run --layer general --params gen.safetensors --mask m.npy" + inputs,
               "--mask: not supported by --layer general");
  expect_error("run --layer general --params gen.safetensors --sinks s.npy" + inputs,
               "--sinks: not supported by --layer general");
  expect_error("run --layer general --params gen.safetensors --scale 2" + inputs,
               "--scale: only --layer dot-product takes a scale, got --layer general");
  expect_error("run --layer general" + inputs, "--params: required for --layer general");
  expect_error("run --layer general --params add.safetensors" + inputs,
               "missing tensor 'W.weight' needed by --layer general");
  EXPECT_FALSE(fs::exists(path("o.npy")));
}

}  // namespace
}  // namespace attn
