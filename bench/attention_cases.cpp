// The benchmark case table: dot-product attention forward, fused (attn::flash_attention_forward on
// strided heads) and plain (the book's bmm + masked softmax + bmm), without mask, with padded
// batches and causal; its backward pass, fused and plain; the functional API
// (attn::scaled_dot_product_attention) without mask, with a sliding window, bool and float
// attention masks and grouped-query heads; and the AdditiveAttention layer's forward and backward
// passes, fused and on its reference path.
#include "bench/attention_cases.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#include "attn/core/error.hpp"
#include "attn/core/half.hpp"
#include "attn/core/random.hpp"
#include "attn/core/strided_view.hpp"
#include "attn/core/tensor.hpp"
#include "attn/core/valid_lengths.hpp"
#include "attn/functional/attention_options.hpp"
#include "attn/functional/scaled_dot_product_attention.hpp"
#include "attn/kernels/additive_attention.hpp"
#include "attn/kernels/flash_attention.hpp"
#include "attn/kernels/heads_view.hpp"
#include "attn/kernels/masked_softmax.hpp"
#include "attn/kernels/masked_softmax_backward.hpp"
#include "attn/kernels/matmul.hpp"
#include "attn/nn/additive_attention.hpp"
#include "attn/nn/multi_head_attention.hpp"

namespace attn::bench {

namespace {

enum class Mask { kNone, kPadded, kCausal };

Tensor random_tensor(const Shape& shape, Rng& rng) {
  Tensor tensor(shape);
  for (float& x : tensor.span()) x = rng.uniform(-1.0F, 1.0F);
  return tensor;
}

// Per batch element for kPadded (uniform in [1, m], seeded), none otherwise: the causal mask is
// the kernel's own option on the fused path and per-query lengths on the plain one.
ValidLengths padding_lengths(Mask mask, const AttentionShape& shape, uint64_t seed) {
  if (mask != Mask::kPadded) return {};
  Rng rng(seed ^ 0x9e3779b97f4a7c15ULL);
  std::vector<int64_t> lengths;
  for (int64_t b = 0; b < shape.batch; ++b) {
    const auto drawn = static_cast<int64_t>(rng.uniform() * static_cast<float>(shape.keys));
    lengths.push_back(std::clamp<int64_t>(1 + drawn, 1, shape.keys));
  }
  return ValidLengths::per_batch(std::move(lengths));
}

// `flops_per_pair` times the visible (query, key) pairs of every batch element and head.
double useful_flops(Mask mask, const AttentionShape& shape, const ValidLengths& padding,
                    double flops_per_pair) {
  const int64_t n = shape.queries, m = shape.keys;
  double visible = 0.0;  // Σ over batch and query of the keys the query sees
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      visible += static_cast<double>(padding.visible_length(b, i, n, m, mask == Mask::kCausal));
    }
  }
  return flops_per_pair * static_cast<double>(shape.heads) * visible;
}

double dot_forward_flops(const AttentionShape& shape) {
  return 4.0 * static_cast<double>(shape.head_dim);
}

float default_scale(const AttentionShape& shape) {
  return 1.0F / std::sqrt(static_cast<float>(shape.head_dim));
}

// Fused: the multi-head layout (B, n, heads·d) read in place through split_heads. The backward
// case runs the forward pass (with its log-sum-exp) in preparation and times
// flash_attention_backward alone, on the same strided heads.
PreparedCase prepare_fused(Mask mask, bool backward, const AttentionShape& shape, uint64_t seed) {
  struct State {
    Tensor q, k, v, out, grad_out, grad_q, grad_k, grad_v;
    std::vector<float> log_sum_exp;
    ValidLengths lengths;
    FlashAttentionOptions options;
    int64_t heads = 0;

    void forward(float* lse) {
      flash_attention_forward(split_heads(q, heads, "queries"), split_heads(k, heads, "keys"),
                              split_heads(v, heads, "values"), lengths, options,
                              split_heads(out, heads, "out"), lse);
    }
  };
  auto state = std::make_shared<State>();
  Rng rng(seed);
  const int64_t width = shape.heads * shape.head_dim;
  const Shape query_shape{shape.batch, shape.queries, width},
      key_shape{shape.batch, shape.keys, width};
  state->q = random_tensor(query_shape, rng);
  state->k = random_tensor(key_shape, rng);
  state->v = random_tensor(key_shape, rng);
  state->out = Tensor(query_shape);
  state->lengths = padding_lengths(mask, shape, seed);
  state->options.scale = default_scale(shape);
  state->options.causal = mask == Mask::kCausal;
  state->heads = shape.heads;
  PreparedCase prepared;
  prepared.useful_flops =
      useful_flops(mask, shape, state->lengths, (backward ? 2 : 1) * dot_forward_flops(shape));
  prepared.padding_lengths = state->lengths.values();
  if (!backward) {
    prepared.run = [state] { state->forward(nullptr); };
    return prepared;
  }
  state->grad_out = random_tensor(query_shape, rng);
  state->grad_q = Tensor(query_shape);
  state->grad_k = Tensor(key_shape);
  state->grad_v = Tensor(key_shape);
  state->log_sum_exp.resize(static_cast<size_t>(shape.batch * shape.heads * shape.queries));
  state->forward(state->log_sum_exp.data());
  prepared.run = [state] {
    State& s = *state;
    flash_attention_backward(
        split_heads(s.q, s.heads, "queries"), split_heads(s.k, s.heads, "keys"),
        split_heads(s.v, s.heads, "values"), split_heads(s.out, s.heads, "out"),
        split_heads(s.grad_out, s.heads, "grad_out"), s.log_sum_exp.data(), s.lengths, s.options,
        split_heads(s.grad_q, s.heads, "grad_q"), split_heads(s.grad_k, s.heads, "grad_k"),
        split_heads(s.grad_v, s.heads, "grad_v"));
  };
  return prepared;
}

// Plain: the book's code on (B·heads, n, d) tensors, materialising the (B·heads, n, m) scores.
// The backward case is what autograd runs from the weights P the forward pass saved (computed in
// preparation): dV = Pᵀ dO, dP = dO Vᵀ, dS = softmax backward, dQ = c·dS K, dK = c·dSᵀ Q.
PreparedCase prepare_plain(Mask mask, bool backward, const AttentionShape& shape, uint64_t seed) {
  struct State {
    Tensor q, k, v, out, weights, grad_out, grad_q, grad_k, grad_v;
    ValidLengths lengths;  // per (batch·head), as the book's repeat_interleave gives them
    float scale = 1.0F;

    Tensor attention_weights() const {
      Tensor scores(Shape{q.dim(0), q.dim(1), k.dim(1)});
      batched_matmul_transposed(q, k, scores);
      for (float& score : scores.span()) score *= scale;
      masked_softmax(scores, lengths, scores);
      return scores;
    }
  };
  auto state = std::make_shared<State>();
  Rng rng(seed);
  const int64_t batch_heads = shape.batch * shape.heads;
  const Shape query_shape{batch_heads, shape.queries, shape.head_dim},
      key_shape{batch_heads, shape.keys, shape.head_dim};
  state->q = random_tensor(query_shape, rng);
  state->k = random_tensor(key_shape, rng);
  state->v = random_tensor(key_shape, rng);
  state->out = Tensor(query_shape);
  const ValidLengths padding = padding_lengths(mask, shape, seed);
  state->lengths = padding.repeat_interleave(shape.heads);
  if (mask == Mask::kCausal) {
    state->lengths = state->lengths.with_causal_mask(batch_heads, shape.queries, shape.keys);
  }
  state->scale = default_scale(shape);
  PreparedCase prepared;
  prepared.useful_flops =
      useful_flops(mask, shape, padding, (backward ? 2 : 1) * dot_forward_flops(shape));
  prepared.padding_lengths = padding.values();
  if (!backward) {
    prepared.run = [state] { batched_matmul(state->attention_weights(), state->v, state->out); };
    return prepared;
  }
  state->grad_out = random_tensor(query_shape, rng);
  state->grad_q = Tensor(query_shape);
  state->grad_k = Tensor(key_shape);
  state->grad_v = Tensor(key_shape);
  state->weights = state->attention_weights();
  prepared.run = [state] {
    State& s = *state;
    batched_transposed_matmul(s.weights, s.grad_out, s.grad_v);
    Tensor grad_scores(s.weights.shape());
    batched_matmul_transposed(s.grad_out, s.v, grad_scores);
    masked_softmax_backward(s.weights, grad_scores, grad_scores);
    for (float& value : grad_scores.span()) value *= s.scale;
    batched_matmul(grad_scores, s.k, s.grad_q);
    batched_transposed_matmul(grad_scores, s.q, s.grad_k);
  };
  return prepared;
}

// The functional API, attn::scaled_dot_product_attention, as users call it: query, key and value
// stored (B, n, H·d) as the fused cases' (what a projection writes) and passed as (B, H, n, d)
// views of it (PyTorch's view(B, n, H, d).transpose(1, 2)), read in place; the output likewise.
// Forward passes without the log-sum-exp (inference), as the fused case.
enum class Functional {
  kFull,        // no mask: the base of the others' ratios
  kWindow,      // causal sliding window, keys i − window … i (Mistral's), shape.window
  kMaskBool,    // bool key-padding mask (B, 1, 1, S): fused-padded's lengths, as a mask
  kMaskCausal,  // bool (L, S) mask j ≤ i: fused-causal as a materialised mask
  kMaskFloat,   // float (L, S) mask −|i − j|/256: an ALiBi bias of one slope as a mask
  kGqa,         // grouped-query heads: H_kv = H / 4 (1 when 4 does not divide H)
};

int64_t kv_heads(Functional variant, const AttentionShape& shape) {
  if (variant != Functional::kGqa) return shape.heads;
  return shape.heads % 4 == 0 ? shape.heads / 4 : 1;
}

// (B, heads, rows, depth) over storage laid out (B, rows, heads·depth).
template <class T>
StridedView<T> heads_first(T* data, int64_t batch, int64_t heads, int64_t rows, int64_t depth) {
  const std::array<int64_t, 4> strides{rows * heads * depth, depth, heads * depth, 1};
  return StridedView<T>(data, Shape{batch, heads, rows, depth}, strides);
}

// Σ over batch elements and queries of the keys each query sees, times the heads and 4·d.
double functional_flops(Functional variant, const AttentionShape& shape,
                        const std::vector<int64_t>& padding) {
  const int64_t n = shape.queries, m = shape.keys;
  double visible = 0.0;
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      switch (variant) {
        case Functional::kWindow:
          visible +=
              static_cast<double>(std::min(m, i + 1) - std::max<int64_t>(0, i - shape.window));
          break;
        case Functional::kMaskBool:
          visible += static_cast<double>(padding[static_cast<size_t>(b)]);
          break;
        case Functional::kMaskCausal:
          visible += static_cast<double>(std::min(m, i + 1));
          break;
        default:
          visible += static_cast<double>(m);
      }
    }
  }
  return dot_forward_flops(shape) * static_cast<double>(shape.heads) * visible;
}

PreparedCase prepare_functional(Functional variant, const AttentionShape& shape, uint64_t seed) {
  struct State {
    Tensor q, k, v, out, float_mask;
    std::vector<uint8_t> bool_mask;
    AttentionOptions options;
    ConstStridedView query, key, value;
    MutableStridedView output;
  };
  auto state = std::make_shared<State>();
  Rng rng(seed);
  const int64_t n = shape.queries, m = shape.keys, d = shape.head_dim;
  const int64_t heads = shape.heads, kv = kv_heads(variant, shape);
  state->q = random_tensor(Shape{shape.batch, n, heads * d}, rng);
  state->k = random_tensor(Shape{shape.batch, m, kv * d}, rng);
  state->v = random_tensor(Shape{shape.batch, m, kv * d}, rng);
  state->out = Tensor(Shape{shape.batch, n, heads * d});
  state->query = heads_first<const float>(state->q.data(), shape.batch, heads, n, d);
  state->key = heads_first<const float>(state->k.data(), shape.batch, kv, m, d);
  state->value = heads_first<const float>(state->v.data(), shape.batch, kv, m, d);
  state->output = heads_first<float>(state->out.data(), shape.batch, heads, n, d);
  AttentionOptions& options = state->options;
  std::vector<int64_t> padding;
  switch (variant) {
    case Functional::kFull:
      break;
    case Functional::kWindow:
      options.causal = true;
      options.window = SlidingWindow{shape.window, 0};
      break;
    case Functional::kMaskBool: {
      padding = padding_lengths(Mask::kPadded, shape, seed).values();
      state->bool_mask.resize(static_cast<size_t>(shape.batch * m));
      for (int64_t b = 0; b < shape.batch; ++b) {
        for (int64_t j = 0; j < m; ++j)
          state->bool_mask[static_cast<size_t>(b * m + j)] = j < padding[static_cast<size_t>(b)];
      }
      options.attn_mask = AttentionMask::boolean(
          StridedView<const uint8_t>(state->bool_mask.data(), Shape{shape.batch, 1, 1, m}));
      break;
    }
    case Functional::kMaskCausal:
      state->bool_mask.resize(static_cast<size_t>(n * m));
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < m; ++j) state->bool_mask[static_cast<size_t>(i * m + j)] = j <= i;
      }
      options.attn_mask =
          AttentionMask::boolean(StridedView<const uint8_t>(state->bool_mask.data(), Shape{n, m}));
      break;
    case Functional::kMaskFloat:
      state->float_mask = Tensor(Shape{n, m});
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < m; ++j)
          state->float_mask.data()[i * m + j] = -static_cast<float>(std::abs(i - j)) / 256.0F;
      }
      options.attn_mask = AttentionMask::additive(state->float_mask);
      break;
    case Functional::kGqa:
      options.enable_gqa = true;
      break;
  }
  PreparedCase prepared;
  prepared.useful_flops = functional_flops(variant, shape, padding);
  prepared.padding_lengths = padding;
  prepared.run = [state] {
    scaled_dot_product_attention(state->query, state->key, state->value, state->options,
                                 state->output);
  };
  return prepared;
}

// Additive attention is the AdditiveAttention layer in evaluation mode, projections included, on
// the book's shapes: B batch elements (no heads) of n queries, m keys and values of size d, and
// hidden size h = d. Forward passes time forward(); backward passes time backward() after a
// forward pass in preparation.
PreparedCase prepare_additive(bool fused, bool backward, const AttentionShape& shape,
                              uint64_t seed) {
  struct State {
    std::unique_ptr<AdditiveAttention> layer;
    Tensor q, k, v, grad_out;
  };
  auto state = std::make_shared<State>();
  Rng rng(seed);
  const int64_t d = shape.head_dim;
  state->layer = std::make_unique<AdditiveAttention>(d, d, d, 0.0F, seed);
  state->layer->eval();
  state->layer->set_path(fused ? AttentionPath::kFused : AttentionPath::kReference);
  state->q = random_tensor(Shape{shape.batch, shape.queries, d}, rng);
  state->k = random_tensor(Shape{shape.batch, shape.keys, d}, rng);
  state->v = random_tensor(Shape{shape.batch, shape.keys, d}, rng);
  state->grad_out = random_tensor(Shape{shape.batch, shape.queries, d}, rng);
  PreparedCase prepared;
  const double pairs =
      static_cast<double>(shape.batch) * static_cast<double>(shape.queries * shape.keys);
  prepared.useful_flops = pairs * (backward ? 2.0 : 1.0) *
                          (3.0 * static_cast<double>(d) + 2.0 * static_cast<double>(d));
  if (backward) {
    state->layer->forward(state->q, state->k, state->v);
    prepared.run = [state] { state->layer->backward(state->grad_out); };
  } else {
    prepared.run = [state] { state->layer->forward(state->q, state->k, state->v); };
  }
  return prepared;
}

// Multi-head self-attention as nn.MultiheadAttention computes it (bench/compare_pytorch.py's
// torch-mha): the MultiHeadAttention layer in evaluation mode with biases, D = heads·d, on
// x (B, n, D) as queries, keys and values. Its flops count the four D × D projections too.
PreparedCase prepare_multi_head(const AttentionShape& shape, uint64_t seed) {
  struct State {
    std::unique_ptr<MultiHeadAttention> layer;
    Tensor x;
  };
  auto state = std::make_shared<State>();
  Rng rng(seed);
  const int64_t width = shape.heads * shape.head_dim;
  state->layer = std::make_unique<MultiHeadAttention>(width, width, width, width, shape.heads, 0.0F,
                                                      /*bias=*/true, seed);
  state->layer->eval();
  state->x = random_tensor(Shape{shape.batch, shape.queries, width}, rng);
  PreparedCase prepared;
  prepared.useful_flops =
      useful_flops(Mask::kNone, shape, {}, dot_forward_flops(shape)) +
      8.0 * static_cast<double>(shape.batch * shape.queries) * static_cast<double>(width * width);
  prepared.run = [state] { state->layer->forward(state->x, state->x, state->x); };
  return prepared;
}

double score_bytes(const AttentionShape& shape) {
  return 4.0 * static_cast<double>(shape.batch * shape.heads) * static_cast<double>(shape.queries) *
         static_cast<double>(shape.keys);
}

// The fused forward pass (or, with `backward`, the backward pass after one untimed forward) on fp16
// or bf16 inputs rounded from the same normal draws as the fp32 case, (B, n, H·d) heads read in
// place, the output and gradients in the inputs' type.
PreparedCase prepare_half(HalfType type, const AttentionShape& shape, uint64_t seed, bool backward,
                          bool causal) {
  struct State {
    std::vector<uint16_t> q, k, v, out, grad_out, grad_q, grad_k, grad_v;
    std::vector<float> log_sum_exp;
    FlashAttentionOptions options;
    ConstHalfHeadsView q_view, k_view, v_view, grad_out_view;
    HalfHeadsView out_view, grad_q_view, grad_k_view, grad_v_view;
  };
  auto state = std::make_shared<State>();
  Rng rng(seed);
  const int64_t width = shape.heads * shape.head_dim;
  const auto rounded = [&](int64_t rows) {
    std::vector<uint16_t> bits(static_cast<size_t>(shape.batch * rows * width));
    for (uint16_t& element : bits) element = float_to_half_bits(type, rng.normal());
    return bits;
  };
  state->q = rounded(shape.queries);
  state->k = rounded(shape.keys);
  state->v = rounded(shape.keys);
  state->out.resize(state->q.size());
  state->options.scale = default_scale(shape);
  state->options.causal = causal;
  const auto heads = [&](auto* data, int64_t rows) {
    return BasicHeadsView<std::remove_pointer_t<decltype(data)>>{
        data, shape.batch, shape.heads, rows, shape.head_dim, rows * width, shape.head_dim, width};
  };
  state->q_view = heads(static_cast<const uint16_t*>(state->q.data()), shape.queries);
  state->k_view = heads(static_cast<const uint16_t*>(state->k.data()), shape.keys);
  state->v_view = heads(static_cast<const uint16_t*>(state->v.data()), shape.keys);
  state->out_view = heads(state->out.data(), shape.queries);
  PreparedCase prepared;
  prepared.useful_flops = useful_flops(causal ? Mask::kCausal : Mask::kNone, shape, {},
                                       (backward ? 2 : 1) * dot_forward_flops(shape));
  if (!backward) {
    prepared.run = [state, type] {
      flash_attention_forward(type, state->q_view, state->k_view, state->v_view, {}, state->options,
                              state->out_view);
    };
    return prepared;
  }
  state->grad_out = rounded(shape.queries);
  state->grad_q.resize(state->q.size());
  state->grad_k.resize(state->k.size());
  state->grad_v.resize(state->v.size());
  state->log_sum_exp.resize(static_cast<size_t>(shape.batch * shape.heads * shape.queries));
  state->grad_out_view = heads(static_cast<const uint16_t*>(state->grad_out.data()), shape.queries);
  state->grad_q_view = heads(state->grad_q.data(), shape.queries);
  state->grad_k_view = heads(state->grad_k.data(), shape.keys);
  state->grad_v_view = heads(state->grad_v.data(), shape.keys);
  flash_attention_forward(type, state->q_view, state->k_view, state->v_view, {}, state->options,
                          state->out_view, state->log_sum_exp.data());
  prepared.run = [state, type] {
    flash_attention_backward(type, state->q_view, state->k_view, state->v_view, state->out_view,
                             state->grad_out_view, state->log_sum_exp.data(), {}, state->options,
                             state->grad_q_view, state->grad_k_view, state->grad_v_view);
  };
  return prepared;
}

AttentionCase half_case(std::string name, HalfType type, bool backward = false,
                        bool causal = false) {
  AttentionCase entry;
  entry.name = std::move(name);
  entry.workload = std::string(backward ? "dot-backward-"
                               : causal ? "dot-causal-"
                                        : "dot-") +
                   (type == HalfType::kBFloat16 ? "bf16" : "fp16");
  entry.path = "fused";
  entry.working_set_bytes = [](const AttentionShape&) { return 0.0; };
  entry.prepare = [type, backward, causal](const AttentionShape& shape, uint64_t seed) {
    return prepare_half(type, shape, seed, backward, causal);
  };
  return entry;
}

AttentionCase dot_case(std::string name, std::string workload, Mask mask, bool fused,
                       bool backward = false) {
  AttentionCase entry;
  entry.name = std::move(name);
  entry.workload = std::move(workload);
  entry.path = fused ? "fused" : "plain";
  entry.uses_threads = fused;  // attn's plain matmuls and softmax are serial loops
  entry.working_set_bytes =
      fused
          ? std::function<double(const AttentionShape&)>([](const AttentionShape&) { return 0.0; })
          : std::function<double(const AttentionShape&)>([backward](const AttentionShape& shape) {
              // The backward pass holds the weights and the score gradients.
              return (backward ? 2.0 : 1.0) * score_bytes(shape);
            });
  entry.prepare = [mask, fused, backward](const AttentionShape& shape, uint64_t seed) {
    return fused ? prepare_fused(mask, backward, shape, seed)
                 : prepare_plain(mask, backward, shape, seed);
  };
  return entry;
}

AttentionCase multi_head_case() {
  AttentionCase entry;
  entry.name = "fused-mha";
  entry.workload = "mha";
  entry.path = "fused";
  entry.working_set_bytes = [](const AttentionShape&) { return 0.0; };
  entry.prepare = [](const AttentionShape& shape, uint64_t seed) {
    return prepare_multi_head(shape, seed);
  };
  return entry;
}

AttentionCase functional_case(std::string name, std::string workload, Functional variant) {
  AttentionCase entry;
  entry.name = std::move(name);
  entry.workload = std::move(workload);
  entry.path = "fused";
  // Nothing is materialised but the (L, S) masks, inputs the size of the scores' plane: counted,
  // so that --max-working-set-mib skips sizes where they would not fit.
  entry.working_set_bytes = [variant](const AttentionShape& shape) {
    const double plane = static_cast<double>(shape.queries) * static_cast<double>(shape.keys);
    return variant == Functional::kMaskCausal  ? plane
           : variant == Functional::kMaskFloat ? 4.0 * plane
                                               : 0.0;
  };
  entry.prepare = [variant](const AttentionShape& shape, uint64_t seed) {
    return prepare_functional(variant, shape, seed);
  };
  return entry;
}

AttentionCase additive_case(std::string name, std::string workload, bool fused, bool backward) {
  AttentionCase entry;
  entry.name = std::move(name);
  entry.workload = std::move(workload);
  entry.path = fused ? "fused" : "plain";
  // The fused kernels thread; the reference path's score loops are serial.
  entry.uses_threads = fused;
  entry.max_length = fused ? 0 : 1024;
  entry.working_set_bytes = [fused, backward](const AttentionShape& shape) {
    if (fused) return 0.0;
    const double scores = 4.0 * static_cast<double>(shape.batch) *
                          static_cast<double>(shape.queries) * static_cast<double>(shape.keys);
    return (backward ? 2.0 : 1.0) * scores;
  };
  entry.prepare = [fused, backward](const AttentionShape& shape, uint64_t seed) {
    return prepare_additive(fused, backward, shape, seed);
  };
  return entry;
}

}  // namespace

const std::vector<AttentionCase>& attention_cases() {
  static const std::vector<AttentionCase> cases = {
      dot_case("fused", "dot", Mask::kNone, true),
      dot_case("plain", "dot", Mask::kNone, false),
      half_case("fused-bf16", HalfType::kBFloat16),
      half_case("fused-fp16", HalfType::kFloat16),
      half_case("fused-bf16-causal", HalfType::kBFloat16, false, true),
      half_case("fused-bf16-backward", HalfType::kBFloat16, true),
      half_case("fused-fp16-backward", HalfType::kFloat16, true),
      dot_case("fused-padded", "dot-padded", Mask::kPadded, true),
      dot_case("plain-padded", "dot-padded", Mask::kPadded, false),
      dot_case("fused-causal", "dot-causal", Mask::kCausal, true),
      dot_case("plain-causal", "dot-causal", Mask::kCausal, false),
      dot_case("fused-backward", "dot-backward", Mask::kNone, true, true),
      dot_case("plain-backward", "dot-backward", Mask::kNone, false, true),
      multi_head_case(),
      functional_case("fused-sdpa", "sdpa", Functional::kFull),
      functional_case("fused-window", "sdpa-window", Functional::kWindow),
      functional_case("fused-mask-bool", "sdpa-mask-bool", Functional::kMaskBool),
      functional_case("fused-mask-causal", "sdpa-mask-causal", Functional::kMaskCausal),
      functional_case("fused-mask-float", "sdpa-mask-float", Functional::kMaskFloat),
      functional_case("fused-gqa", "sdpa-gqa", Functional::kGqa),
      additive_case("fused-additive", "additive", true, false),
      additive_case("plain-additive", "additive", false, false),
      additive_case("fused-add-backward", "additive-backward", true, true),
      additive_case("plain-add-backward", "additive-backward", false, true),
  };
  return cases;
}

const AttentionCase& find_attention_case(const std::string& name) {
  std::string known;
  for (const AttentionCase& entry : attention_cases()) {
    if (entry.name == name) return entry;
    known += (known.empty() ? "" : ", ") + entry.name;
  }
  throw ValueError("--cases: expected one of " + known + ", got '" + name + "'");
}

}  // namespace attn::bench
