// Runs the book's dot-product toy example through the installed attn package; exits non-zero
// unless the outputs are [[2, 3, 4, 5]] and [[10, 11, 12, 13]].
#include <attn/nn/dot_product_attention.hpp>

#include <cmath>
#include <cstdio>

int main() {
  attn::Rng rng(0);
  attn::Tensor queries(attn::Shape{2, 1, 2});
  for (float& value : queries.span()) value = rng.normal();
  const attn::Tensor keys = attn::Tensor::full(attn::Shape{2, 10, 2}, 1.0F);
  attn::Tensor values(attn::Shape{2, 10, 4});
  for (int64_t index = 0; index < values.numel(); ++index) values.data()[index] = static_cast<float>(index % 40);
  attn::DotProductAttention attention(0.5F);
  attention.eval();
  const attn::Tensor out = attention(queries, keys, values, attn::ValidLengths::per_batch({2, 6}));
  const float expected[] = {2, 3, 4, 5, 10, 11, 12, 13};
  for (int index = 0; index < 8; ++index) {
    if (std::abs(out.data()[index] - expected[index]) > 1e-5F) {
      std::printf("element %d is %g, expected %g\n", index, out.data()[index], expected[index]);
      return 1;
    }
  }
  std::printf("consumer: installed attn gives [[2, 3, 4, 5]] and [[10, 11, 12, 13]]\n");
  return 0;
}
