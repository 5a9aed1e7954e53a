// MultiHeadAttention: the book's transpose_qkv / transpose_output around DotProductAttention.
#include "attn/nn/multi_head_attention.hpp"

#include <cmath>
#include <string>

#include "attn/core/error.hpp"

namespace attn {

namespace {

int64_t checked_heads(int64_t num_hiddens, int64_t num_heads) {
  require_positive_size("num_hiddens", num_hiddens);
  if (num_heads <= 0 || num_hiddens % num_heads != 0) {
    throw ValueError("num_heads: expected a positive divisor of num_hiddens = " +
                     std::to_string(num_hiddens) + ", got " + std::to_string(num_heads));
  }
  return num_heads;
}

// (B, n, heads·d) → (B·heads, n, d): the book's transpose_qkv.
Tensor copy_heads_apart(const Tensor& x, int64_t heads) {
  const int64_t batch = x.dim(0), n = x.dim(1), d = x.dim(2) / heads;
  Tensor out(Shape{batch * heads, n, d});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t t = 0; t < d; ++t) out(b * heads + h, i, t) = x(b, i, h * d + t);
  return out;
}

// (B·heads, n, d) → (B, n, heads·d): the book's transpose_output.
Tensor copy_heads_together(const Tensor& x, int64_t heads) {
  const int64_t batch = x.dim(0) / heads, n = x.dim(1), d = x.dim(2);
  Tensor out(Shape{batch, n, heads * d});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t t = 0; t < d; ++t) out(b, i, h * d + t) = x(b * heads + h, i, t);
  return out;
}

// ValueError "<parameter>.weight: expected finite values, ..." for a parameter loaded with a NaN
// or an infinity (a state dict from a diverged run, a hostile file).
void require_finite_parameters(const Linear& layer, const std::string& parameter) {
  require_finite(parameter + ".weight", layer.weight());
  if (layer.has_bias()) require_finite(parameter + ".bias", layer.bias());
}

// layer(x), or a ValueError naming `parameter` and `input` when the product of finite values
// overflows float32: an infinite output would otherwise leave the layer with exit status 0. Only
// the output is scanned when all is well; its largest magnitude goes to `largest` when given (the
// score bound of the projected queries and keys needs no second scan).
void checked_projection_into(const Linear& layer, ConstTensorView x, Tensor& y,
                             const std::string& input, const std::string& parameter,
                             float* largest = nullptr) {
  layer.forward_into(x, y, input);
  const float y_max = max_magnitude(y);
  if (largest != nullptr) *largest = y_max;
  if (std::isfinite(y_max)) return;
  require_finite(input, x);
  require_finite_parameters(layer, parameter);
  throw ValueError(parameter + ": the projection of the " + input +
                   " overflows float32 (beyond ±3.4e38) although both are finite; scale the " +
                   input + " or " + parameter + ".weight down");
}

Tensor checked_projection(const Linear& layer, ConstTensorView x, const std::string& input,
                          const std::string& parameter) {
  Tensor y;
  checked_projection_into(layer, x, y, input, parameter);
  return y;
}

// A gradient through `parameter`, or a ValueError naming it when the finite gradient overflows.
Tensor checked_gradient(Tensor gradient, const std::string& name, const std::string& parameter) {
  if (all_finite(gradient)) return gradient;
  throw ValueError(name + ": the gradient through " + parameter +
                   " overflows float32 (beyond ±3.4e38) for these inputs and grad_output");
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(int64_t key_size, int64_t query_size, int64_t value_size,
                                       int64_t num_hiddens, int64_t num_heads, float dropout,
                                       bool bias, uint64_t seed)
    : num_heads_(checked_heads(num_hiddens, num_heads)),
      init_rng_(seed),
      attention_(dropout, std::nullopt, seed ^ 0x5eed'd50'9017ULL),
      dropout_seeds_(seed ^ 0xd509'5eedULL),
      W_q_(require_positive_size("query_size", query_size), num_hiddens, bias, init_rng_),
      W_k_(require_positive_size("key_size", key_size), num_hiddens, bias, init_rng_),
      W_v_(require_positive_size("value_size", value_size), num_hiddens, bias, init_rng_),
      W_o_(num_hiddens, num_hiddens, bias, init_rng_) {}

Tensor MultiHeadAttention::forward(ConstTensorView queries, ConstTensorView keys,
                                   ConstTensorView values, const ValidLengths& valid_lens) {
  check_attention_inputs(queries, keys, values);
  valid_lens.check("valid_lens", queries.dim(0), queries.dim(1), keys.dim(1));
  queries_.assign(queries);
  keys_.assign(keys);
  values_.assign(values);
  // The last fused pass's projections (and output, which it keeps) lend their storage to this
  // call's: 33.5 MB each at B = 4, n = 4096, 512 wide, whose fresh pages would fault in again.
  FusedAttentionPass::Inputs projected = fused_.release_inputs();
  concatenated_heads_ = Tensor();
  fused_weights_ = Tensor();
  fused_mask_ = Tensor();
  float query_max = 0.0F, key_max = 0.0F;
  checked_projection_into(W_q_, queries, projected.queries, "queries", "W_q", &query_max);
  checked_projection_into(W_k_, keys, projected.keys, "keys", "W_k", &key_max);
  checked_projection_into(W_v_, values, projected.values, "values", "W_v");
  const int64_t head_size = num_hiddens() / num_heads_;
  const float scale = 1.0F / std::sqrt(static_cast<float>(head_size));
  const float applied_dropout = is_training() ? dropout() : 0.0F;
  // The fused kernel takes dropout in [0, 1); p = 1 (everything dropped) takes the reference path.
  if (path_ == AttentionPath::kFused && applied_dropout < 1.0F &&
      dot_scores_stay_finite(query_max, key_max, head_size, scale)) {
    // attn::scaled_dot_product_attention reads and writes the heads in place, through strides:
    // no transpose copies.
    AttentionOptions options;
    options.valid_lens = valid_lens;
    options.scale = scale;
    options.dropout = applied_dropout;
    options.seed = applied_dropout > 0.0F ? dropout_seeds_.next_u64() : 0;
    // The concatenated heads stay in the pass (its output), which backward() reads.
    const Tensor& heads =
        fused_.dot_product(std::move(projected.queries), std::move(projected.keys),
                           std::move(projected.values), num_heads_, std::move(options));
    return checked_projection(W_o_, heads, "concatenated heads", "W_o");
  }
  fused_.clear();
  const Tensor heads = attention_.forward(
      copy_heads_apart(projected.queries, num_heads_), copy_heads_apart(projected.keys, num_heads_),
      copy_heads_apart(projected.values, num_heads_), valid_lens.repeat_interleave(num_heads_));
  concatenated_heads_ = copy_heads_together(heads, num_heads_);
  return checked_projection(W_o_, concatenated_heads_, "concatenated heads", "W_o");
}

const Tensor& MultiHeadAttention::dropout_mask() const {
  if (!fused_.ran()) return attention_.dropout_mask();
  if (fused_mask_.rank() != 3) fused_mask_ = fused_.dropout_mask();
  return fused_mask_;
}

const Tensor& MultiHeadAttention::attention_weights() const {
  if (!fused_.ran()) return attention_.attention_weights();
  if (fused_weights_.rank() != 3) fused_weights_ = fused_.weights();
  return fused_weights_;
}

// The forward pass in reverse: W_o, the head split (whose adjoint is the merge), the per-head
// attention, then the three input projections.
AttentionGradients MultiHeadAttention::backward(ConstTensorView grad_output) {
  // The input of W_o: the fused pass's output, or the reference path's merged heads.
  const Tensor& concatenated_heads = fused_.ran() ? fused_.output() : concatenated_heads_;
  if (concatenated_heads.rank() != 3) {
    throw ValueError("MultiHeadAttention.backward: expected a forward pass first, got none");
  }
  const Shape output_shape{queries_.dim(0), queries_.dim(1), num_hiddens()};
  check_grad_output(grad_output, output_shape);
  require_finite("grad_output", grad_output);
  const Tensor grad_concatenated =
      checked_gradient(W_o_.backward(concatenated_heads, grad_output), "grad_output", "W_o");
  if (fused_.ran()) {
    const AttentionBackward heads = fused_.dot_product_backward(grad_concatenated);
    return {checked_gradient(W_q_.backward(queries_, heads.query), "grad_queries", "W_q"),
            checked_gradient(W_k_.backward(keys_, heads.key), "grad_keys", "W_k"),
            checked_gradient(W_v_.backward(values_, heads.value), "grad_values", "W_v")};
  }
  const AttentionGradients heads =
      attention_.backward(copy_heads_apart(grad_concatenated, num_heads_));
  return {checked_gradient(W_q_.backward(queries_, copy_heads_together(heads.queries, num_heads_)),
                           "grad_queries", "W_q"),
          checked_gradient(W_k_.backward(keys_, copy_heads_together(heads.keys, num_heads_)),
                           "grad_keys", "W_k"),
          checked_gradient(W_v_.backward(values_, copy_heads_together(heads.values, num_heads_)),
                           "grad_values", "W_v")};
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
  load_state_views(views_of(state));
}

void MultiHeadAttention::load_state_views(const StateViews& state) {
  attn::load_state_views(state, parameters(), "MultiHeadAttention");
  fused_.clear();
  concatenated_heads_ = Tensor();
  fused_weights_ = Tensor();
  fused_mask_ = Tensor();
}

}  // namespace attn
