// Runs the book's masked-softmax example through the installed attn::kernels alone (no layers, no
// Cairo); exits non-zero unless each row's weights past its valid length are 0 and the rest sum to 1.
#include <attn/kernels/masked_softmax.hpp>

#include <cmath>
#include <cstdio>

int main() {
  attn::Tensor scores(attn::Shape{2, 2, 4});
  for (int64_t index = 0; index < scores.numel(); ++index) {
    scores.data()[index] = static_cast<float>(index % 5) * 0.25F;
  }
  const attn::Tensor weights = attn::masked_softmax(scores, attn::ValidLengths::per_batch({2, 3}));
  const int64_t valid[] = {2, 3};
  for (int64_t row = 0; row < 4; ++row) {
    const int64_t length = valid[row / 2];
    float sum = 0.0F;
    for (int64_t key = 0; key < 4; ++key) {
      const float weight = weights.data()[row * 4 + key];
      if (key >= length && weight != 0.0F) {
        std::printf("row %lld key %lld: weight %g past the valid length\n", static_cast<long long>(row),
                    static_cast<long long>(key), weight);
        return 1;
      }
      sum += weight;
    }
    if (std::abs(sum - 1.0F) > 1e-6F) {
      std::printf("row %lld sums to %g\n", static_cast<long long>(row), sum);
      return 1;
    }
  }
  std::printf("consumer_kernels: installed attn::kernels masks and normalises every row\n");
  return 0;
}
