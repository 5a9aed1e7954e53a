// Test helpers: random tensors, reference conversion and magnitude-relative comparisons.
#include "test_support.hpp"

#include <cmath>

namespace attn::testing {

Tensor random_tensor(const Shape& shape, Rng& rng, float scale) {
  Tensor tensor(shape);
  for (float& value : tensor.span()) value = rng.normal() * scale;
  return tensor;
}

reference::Array<double> to_reference(ConstTensorView tensor) {
  std::vector<int64_t> dims(tensor.shape().data(), tensor.shape().data() + tensor.rank());
  reference::Array<double> array(dims);
  for (int64_t index = 0; index < tensor.numel(); ++index) {
    array.values[static_cast<size_t>(index)] = tensor.data()[index];
  }
  return array;
}

std::vector<double> to_doubles(ConstTensorView tensor) {
  return std::vector<double>(tensor.data(), tensor.data() + tensor.numel());
}

reference::Lengths expand(const ValidLengths& lengths, int64_t batch, int64_t queries,
                          int64_t keys) {
  reference::Lengths expanded(static_cast<size_t>(batch),
                              std::vector<int64_t>(static_cast<size_t>(queries)));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < queries; ++i)
      expanded[static_cast<size_t>(b)][static_cast<size_t>(i)] = lengths.length(b, i, keys);
  return expanded;
}

std::vector<std::vector<double>> numerical_gradients(
    const std::function<double(const std::vector<std::vector<double>>&)>& loss,
    std::vector<std::vector<double>> arguments, double step) {
  std::vector<std::vector<double>> gradients;
  for (std::vector<double>& argument : arguments) {
    std::vector<double> gradient(argument.size());
    for (size_t i = 0; i < argument.size(); ++i) {
      const double saved = argument[i];
      argument[i] = saved + step;
      const double up = loss(arguments);
      argument[i] = saved - step;
      const double down = loss(arguments);
      argument[i] = saved;
      gradient[i] = (up - down) / (2 * step);
    }
    gradients.push_back(std::move(gradient));
  }
  return gradients;
}

Tensor head_of(const Tensor& x, int64_t h, int64_t width) {
  Tensor out(Shape{x.dim(0), x.dim(1), width});
  for (int64_t b = 0; b < x.dim(0); ++b)
    for (int64_t i = 0; i < x.dim(1); ++i)
      for (int64_t t = 0; t < width; ++t) out(b, i, t) = x(b, i, h * width + t);
  return out;
}

std::string npy_header(const std::string& descr, const std::string& shape) {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  dict.append(117 - dict.size(), ' ');
  dict += '\n';
  std::string header = "\x93NUMPY\x01";
  header += '\0';
  header += static_cast<char>(dict.size());
  header += '\0';
  return header + dict;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

::testing::AssertionResult close_to(ConstTensorView actual, const std::vector<double>& expected,
                                    double relative) {
  if (static_cast<size_t>(actual.numel()) != expected.size()) {
    return ::testing::AssertionFailure()
           << "size " << actual.numel() << " vs expected " << expected.size();
  }
  double magnitude = 1.0;
  for (double value : expected) magnitude = std::max(magnitude, std::abs(value));
  double worst = 0.0;
  size_t worst_index = 0;
  for (size_t index = 0; index < expected.size(); ++index) {
    const double error = std::abs(static_cast<double>(actual.data()[index]) - expected[index]);
    if (!(error <= worst)) {  // also catches NaN
      worst = std::isnan(error) ? INFINITY : error;
      worst_index = index;
    }
  }
  if (worst <= relative * magnitude) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "element " << worst_index << " is " << actual.data()[worst_index] << ", expected "
         << expected[worst_index] << " (error " << worst << " > " << relative << " · " << magnitude
         << ")";
}

}  // namespace attn::testing
