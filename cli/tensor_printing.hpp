// Printing tensors exactly as PyTorch prints them with its default options (4 decimals, 80
// columns, summarised above 1000 elements), so the CLI's numbers can be read next to the book's.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "attn/core/shape.hpp"
#include "attn/core/tensor.hpp"
#include "attn/core/valid_lengths.hpp"

namespace attn::cli {

// A float32 tensor as str(torch_tensor) shows it, e.g. "tensor([[0.5000, 0.5000]])"; integral
// values switch to PyTorch's "2." style and wide ranges to scientific notation, as PyTorch does.
std::string format_tensor(ConstTensorView tensor);

// An int64 tensor of the given shape as PyTorch prints it, e.g. "tensor([2, 3])".
std::string format_integer_tensor(std::span<const int64_t> values, const Shape& shape);

// Valid lengths as the integer tensor they were built from; "None" when there is no mask.
std::string format_valid_lengths(const ValidLengths& valid_lens);

}  // namespace attn::cli
