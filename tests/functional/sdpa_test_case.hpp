// A random scaled-dot-product-attention problem for the functional API's tests: float32 inputs
// shaped (N, Hq, L, E) / (N, Hkv, S, E), AttentionOptions over them (a mask of any broadcast
// shape, bool or float, valid lengths, windows, ALiBi, soft-capping, sinks, dropout), and the
// same problem in double for reference::sdpa_forward / sdpa_backward.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "attn/core/random.hpp"
#include "attn/core/tensor.hpp"
#include "attn/functional/scaled_dot_product_attention.hpp"
#include "sdpa_reference.hpp"
#include "test_support.hpp"

namespace attn::testing {

struct SdpaShape {
  int64_t batch, q_heads, kv_heads, queries, keys, depth, value_depth;
};

class SdpaTestCase {
 public:
  explicit SdpaTestCase(const SdpaShape& shape, uint64_t seed, float magnitude = 1.0F)
      : shape_(shape), rng_(seed) {
    q = random_tensor(Shape{shape.batch, shape.q_heads, shape.queries, shape.depth}, rng_,
                      magnitude);
    k = random_tensor(Shape{shape.batch, shape.kv_heads, shape.keys, shape.depth}, rng_, magnitude);
    v = random_tensor(Shape{shape.batch, shape.kv_heads, shape.keys, shape.value_depth}, rng_);
    grad_out =
        random_tensor(Shape{shape.batch, shape.q_heads, shape.queries, shape.value_depth}, rng_);
    options.enable_gqa = shape.kv_heads != shape.q_heads;
    problem.batch = shape.batch;
    problem.q_heads = shape.q_heads;
    problem.kv_heads = shape.kv_heads;
    problem.queries = shape.queries;
    problem.keys = shape.keys;
    problem.depth = shape.depth;
    problem.value_depth = shape.value_depth;
    problem.scale = 1.0 / std::sqrt(static_cast<double>(shape.depth));
  }

  // A mask of `mask_shape` (right-aligned against (N, Hq, L, S)): bool entries true with
  // probability `keep`, or float entries normal, −∞ with probability 1 − keep.
  void set_mask(const Shape& mask_shape, bool boolean, double keep) {
    const int64_t count = mask_shape.numel();
    mask_floats = Tensor(mask_shape);
    mask_bytes.assign(static_cast<size_t>(count), 0);
    for (int64_t e = 0; e < count; ++e) {
      const bool kept = rng_.uniform() < keep;
      mask_bytes[static_cast<size_t>(e)] = kept ? 1 : 0;
      mask_floats.data()[e] = kept ? rng_.normal() : -std::numeric_limits<float>::infinity();
    }
    options.attn_mask =
        boolean ? AttentionMask::boolean(StridedView<const uint8_t>(mask_bytes.data(), mask_shape))
                : AttentionMask::additive(mask_floats);
    problem.mask_kind =
        boolean ? reference::SdpaProblem::Mask::kBool : reference::SdpaProblem::Mask::kFloat;
    problem.mask.assign(scores_count(), 0.0);
    for_each_score([&](int64_t b, int64_t h, int64_t i, int64_t j, size_t index) {
      const int64_t e = mask_offset(mask_shape, b, h, i, j);
      problem.mask[index] =
          boolean ? mask_bytes[static_cast<size_t>(e)] : static_cast<double>(mask_floats.data()[e]);
    });
  }
  // Hides every key from query row i (of every head and batch element) through the mask; with a
  // mask broadcast over the queries, from every row.
  void hide_row(int64_t i) {
    hide_if([i](int64_t, int64_t, int64_t row, int64_t) { return row == i; });
  }
  // Hides key j from query row `row` of head h, batch element b, through the mask (set_mask
  // first), wherever hidden(b, h, row, j) holds; a mask broadcast over an axis takes the entry
  // its first index decides last.
  template <class Hidden>
  void hide_if(const Hidden& hidden) {
    const Shape& shape = mask_floats.shape();
    for_each_score([&](int64_t b, int64_t h, int64_t row, int64_t j, size_t) {
      if (!hidden(b, h, row, j)) return;
      const int64_t e = mask_offset(shape, b, h, row, j);
      mask_bytes[static_cast<size_t>(e)] = 0;
      mask_floats.data()[e] = -std::numeric_limits<float>::infinity();
    });
    const bool boolean = problem.mask_kind == reference::SdpaProblem::Mask::kBool;
    for_each_score([&](int64_t b, int64_t h, int64_t row, int64_t j, size_t index) {
      const int64_t e = mask_offset(shape, b, h, row, j);
      problem.mask[index] =
          boolean ? mask_bytes[static_cast<size_t>(e)] : static_cast<double>(mask_floats.data()[e]);
    });
  }
  void set_lengths(std::vector<int64_t> per_query) {  // (N, L)
    problem.lengths = per_query;
    options.valid_lens = ValidLengths::per_query(per_query, shape_.batch, shape_.queries);
  }
  void set_batch_lengths(const std::vector<int64_t>& per_batch) {  // (N)
    problem.lengths.clear();
    for (const int64_t length : per_batch)
      problem.lengths.insert(problem.lengths.end(), shape_.queries, length);
    options.valid_lens = ValidLengths::per_batch(per_batch);
  }
  void set_causal(bool bottom_right) {
    options.causal = problem.causal = true;
    set_alignment(bottom_right);
  }
  void set_alignment(bool bottom_right) {
    options.alignment =
        bottom_right ? DiagonalAlignment::kBottomRight : DiagonalAlignment::kTopLeft;
    problem.bottom_right = bottom_right;
  }
  void set_diagonal_offset(int64_t offset) {
    options.alignment = DiagonalAlignment::kOffset;
    options.diagonal_offset = offset;
    problem.diagonal_offset = offset;
  }
  void set_window(int64_t left, int64_t right) {
    options.window = SlidingWindow{left, right};
    problem.window_left = left;
    problem.window_right = right;
  }
  void set_softcap(float cap) {
    options.softcap = cap;
    problem.softcap = cap;
  }
  void set_alibi() {
    alibi.clear();
    for (int64_t h = 0; h < shape_.q_heads; ++h)
      alibi.push_back(std::exp2(-1.0F - static_cast<float>(h)));
    options.alibi_slopes = alibi;
    problem.alibi.assign(alibi.begin(), alibi.end());
  }
  void set_sinks() {
    sinks.clear();
    for (int64_t h = 0; h < shape_.q_heads; ++h) sinks.push_back(rng_.normal());
    options.sinks = sinks;
    problem.sinks.assign(sinks.begin(), sinks.end());
  }
  void set_scale(float scale) {
    options.scale = scale;
    problem.scale = scale;
  }
  void set_dropout(float p, uint64_t seed) {
    options.dropout = p;
    options.seed = seed;
    const Tensor multipliers = attention_dropout_mask(q.shape(), k.shape(), options);
    problem.dropout.assign(multipliers.data(), multipliers.data() + multipliers.numel());
  }

  reference::SdpaForward expected_forward() const {
    return reference::sdpa_forward(problem, to_doubles(q), to_doubles(k), to_doubles(v));
  }
  reference::SdpaGradients expected_backward() const {
    return reference::sdpa_backward(problem, to_doubles(q), to_doubles(k), to_doubles(v),
                                    to_doubles(grad_out));
  }
  // dS summed over the axes the mask broadcasts: the float mask's gradient, in its shape.
  std::vector<double> reduce_to_mask(const std::vector<double>& scores) const {
    const Shape& shape = mask_floats.shape();
    std::vector<double> reduced(static_cast<size_t>(shape.numel()), 0.0);
    for_each_score([&](int64_t b, int64_t h, int64_t i, int64_t j, size_t index) {
      reduced[static_cast<size_t>(mask_offset(shape, b, h, i, j))] += scores[index];
    });
    return reduced;
  }

  Tensor q, k, v, grad_out;
  Tensor mask_floats;
  std::vector<uint8_t> mask_bytes;
  std::vector<float> alibi, sinks;
  AttentionOptions options;
  reference::SdpaProblem problem;

 private:
  size_t scores_count() const {
    return static_cast<size_t>(shape_.batch * shape_.q_heads * shape_.queries * shape_.keys);
  }
  template <class Visit>
  void for_each_score(const Visit& visit) const {
    size_t index = 0;
    for (int64_t b = 0; b < shape_.batch; ++b)
      for (int64_t h = 0; h < shape_.q_heads; ++h)
        for (int64_t i = 0; i < shape_.queries; ++i)
          for (int64_t j = 0; j < shape_.keys; ++j) visit(b, h, i, j, index++);
  }
  // The flat index of score (b, h, i, j) in a mask of `shape`, broadcast as PyTorch does.
  static int64_t mask_offset(const Shape& shape, int64_t b, int64_t h, int64_t i, int64_t j) {
    const int64_t coordinates[4] = {b, h, i, j};
    int64_t offset = 0;
    for (int axis = 0; axis < shape.rank(); ++axis) {
      const int64_t coordinate = coordinates[4 - shape.rank() + axis];
      offset = offset * shape[axis] + (shape[axis] == 1 ? 0 : coordinate);
    }
    return offset;
  }

  SdpaShape shape_;
  Rng rng_;
};

}  // namespace attn::testing
