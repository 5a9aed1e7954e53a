// Helpers shared by attn's tests: random tensors, conversion to the double reference, tolerance
// checks relative to the result's magnitude, hand-made .npy headers, and matching error messages.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attn/core/random.hpp"
#include "attn/core/tensor.hpp"
#include "attn/core/valid_lengths.hpp"
#include "attn/kernels/fused_options.hpp"
#include "reference.hpp"

namespace attn::testing {

// The fused kernels' options for the book's cases: scale, bottom-right causal, dropout and seed.
inline FlashAttentionOptions kernel_options(float scale, bool causal = false, float dropout = 0.0F,
                                            uint64_t seed = 0) {
  FlashAttentionOptions options;
  options.scale = scale;
  options.causal = causal;
  options.dropout = dropout;
  options.seed = seed;
  return options;
}

// Normal entries times `scale`, from `rng`.
Tensor random_tensor(const Shape& shape, Rng& rng, float scale = 1.0F);
// The tensor's values in double, for the reference.
reference::Array<double> to_reference(ConstTensorView tensor);
std::vector<double> to_doubles(ConstTensorView tensor);
// Columns [h·width, (h+1)·width) of a (B, rows, heads·width) tensor: head h, as split_heads sees
// it.
Tensor head_of(const Tensor& x, int64_t h, int64_t width);
// Lengths expanded to (B, n), as the reference takes them.
reference::Lengths expand(const ValidLengths& lengths, int64_t batch, int64_t queries,
                          int64_t keys);

// ∂loss/∂arguments[a][i] for every argument and coordinate, by central differences in double:
// (loss(x + h) − loss(x − h)) / 2h, truncation error ~h²·|f'''|.
std::vector<std::vector<double>> numerical_gradients(
    const std::function<double(const std::vector<std::vector<double>>&)>& loss,
    std::vector<std::vector<double>> arguments, double step);
double dot(const std::vector<double>& a, const std::vector<double>& b);

// The 128-byte header of a version 1.0 .npy file holding `descr` data of shape `shape` (Python's
// tuple text, e.g. "(2,)"), for files the writers would never make: no data follows.
std::string npy_header(const std::string& descr, const std::string& shape);

// max |actual − expected| ≤ relative · max(1, max |expected|); reports the worst index.
::testing::AssertionResult close_to(ConstTensorView actual, const std::vector<double>& expected,
                                    double relative);

}  // namespace attn::testing

// EXPECT_THROW_MESSAGE(statement, ExceptionType, "substring"): throws that type, message contains
// it.
#define EXPECT_THROW_MESSAGE(statement, exception_type, substring)                          \
  do {                                                                                      \
    try {                                                                                   \
      statement;                                                                            \
      ADD_FAILURE() << "expected " #exception_type " containing \"" << (substring) << "\""; \
    } catch (const exception_type& error) {                                                 \
      EXPECT_NE(std::string(error.what()).find(substring), std::string::npos)               \
          << "message: " << error.what() << "\nexpected to contain: " << (substring);       \
    }                                                                                       \
  } while (false)
