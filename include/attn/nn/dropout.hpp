// Dropout: zeroes each element with probability p and scales the survivors by 1/(1−p) (inverted
// dropout, as nn.Dropout), drawing from its own seeded generator so a run can be reproduced.
#pragma once

#include <cstdint>

#include "attn/core/random.hpp"
#include "attn/core/tensor.hpp"

namespace attn {

class Dropout {
 public:
  // ValueError unless p is in [0, 1].
  explicit Dropout(float p, uint64_t seed = 0);

  float p() const { return p_; }
  void seed(uint64_t seed) { rng_ = Rng(seed); }
  // 64 random bits from this generator, e.g. to key a counter-based mask.
  uint64_t next_seed() { return rng_.next_u64(); }
  // In place; p = 1 zeroes everything, p = 0 leaves `values` untouched.
  void apply(TensorView values);
  // The multipliers apply() would use — 0 for a dropped element, 1/(1−p) for a kept one — so a
  // backward pass can reuse the forward pass's mask.
  Tensor draw_mask(const Shape& shape);
  // values ⊙= mask, elementwise: a mask from draw_mask applied again (forward values, or the
  // gradients of a backward pass). ShapeError unless the shapes agree.
  static void apply_mask(TensorView values, ConstTensorView mask);

 private:
  float p_;
  Rng rng_;
};

}  // namespace attn
