// MultiHeadAttention: the book's transpose_qkv / transpose_output around DotProductAttention.
#include "attn/nn/multi_head_attention.hpp"

#include <string>

#include "attn/core/error.hpp"

namespace attn {

namespace {

int64_t checked_heads(int64_t num_hiddens, int64_t num_heads) {
  if (num_heads <= 0 || num_hiddens <= 0 || num_hiddens % num_heads != 0) {
    throw ValueError("num_heads: expected a positive divisor of num_hiddens = " +
                     std::to_string(num_hiddens) + ", got " + std::to_string(num_heads));
  }
  return num_heads;
}

// (B, n, heads·d) → (B·heads, n, d): the book's transpose_qkv.
Tensor split_heads(const Tensor& x, int64_t heads) {
  const int64_t batch = x.dim(0), n = x.dim(1), d = x.dim(2) / heads;
  Tensor out(Shape{batch * heads, n, d});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t t = 0; t < d; ++t) out(b * heads + h, i, t) = x(b, i, h * d + t);
  return out;
}

// (B·heads, n, d) → (B, n, heads·d): the book's transpose_output.
Tensor merge_heads(const Tensor& x, int64_t heads) {
  const int64_t batch = x.dim(0) / heads, n = x.dim(1), d = x.dim(2);
  Tensor out(Shape{batch, n, heads * d});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t t = 0; t < d; ++t) out(b, i, h * d + t) = x(b * heads + h, i, t);
  return out;
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(int64_t key_size, int64_t query_size, int64_t value_size,
                                       int64_t num_hiddens, int64_t num_heads, float dropout,
                                       bool bias, uint64_t seed)
    : num_heads_(checked_heads(num_hiddens, num_heads)),
      init_rng_(seed),
      attention_(dropout, std::nullopt, seed ^ 0x5eed'd50'9017ULL),
      W_q_(require_positive_size("query_size", query_size), num_hiddens, bias, init_rng_),
      W_k_(require_positive_size("key_size", key_size), num_hiddens, bias, init_rng_),
      W_v_(require_positive_size("value_size", value_size), num_hiddens, bias, init_rng_),
      W_o_(num_hiddens, num_hiddens, bias, init_rng_) {}

Tensor MultiHeadAttention::forward(ConstTensorView queries, ConstTensorView keys,
                                   ConstTensorView values, const ValidLengths& valid_lens) {
  check_attention_inputs(queries, keys, values);
  valid_lens.check("valid_lens", queries.dim(0), queries.dim(1), keys.dim(1));
  const Tensor q = split_heads(W_q_.forward(queries, "queries"), num_heads_);
  const Tensor k = split_heads(W_k_.forward(keys, "keys"), num_heads_);
  const Tensor v = split_heads(W_v_.forward(values, "values"), num_heads_);
  const Tensor heads = attention_.forward(q, k, v, valid_lens.repeat_interleave(num_heads_));
  queries_ = Tensor::from(queries);
  keys_ = Tensor::from(keys);
  values_ = Tensor::from(values);
  concatenated_heads_ = merge_heads(heads, num_heads_);
  return W_o_.forward(concatenated_heads_, "concatenated heads");
}

// The forward pass in reverse: W_o, the head split (whose adjoint is the merge), the per-head
// attention, then the three input projections.
AttentionGradients MultiHeadAttention::backward(ConstTensorView grad_output) {
  if (concatenated_heads_.rank() != 3) {
    throw ValueError("MultiHeadAttention.backward: expected a forward pass first, got none");
  }
  const Shape output_shape{queries_.dim(0), queries_.dim(1), num_hiddens()};
  if (grad_output.shape() != output_shape) {
    throw ShapeError("grad_output: expected shape " + output_shape.str() +
                     " (that of the last forward pass's output), got shape " +
                     grad_output.shape().str());
  }
  const Tensor grad_concatenated = W_o_.backward(concatenated_heads_, grad_output);
  const AttentionGradients heads = attention_.backward(split_heads(grad_concatenated, num_heads_));
  return {W_q_.backward(queries_, merge_heads(heads.queries, num_heads_)),
          W_k_.backward(keys_, merge_heads(heads.keys, num_heads_)),
          W_v_.backward(values_, merge_heads(heads.values, num_heads_))};
}

std::vector<NamedParameter> MultiHeadAttention::parameters() {
  std::vector<NamedParameter> parameters;
  W_q_.append_parameters("W_q", parameters);
  W_k_.append_parameters("W_k", parameters);
  W_v_.append_parameters("W_v", parameters);
  W_o_.append_parameters("W_o", parameters);
  return parameters;
}

StateDict MultiHeadAttention::state_dict() const {
  // parameters() hands out mutable pointers, but collecting only copies through them.
  return collect_state_dict(const_cast<MultiHeadAttention*>(this)->parameters());
}

void MultiHeadAttention::load_state_dict(const StateDict& state) {
  attn::load_state_dict(state, parameters(), "MultiHeadAttention");
}

}  // namespace attn
