// The benchmark case table: dot-product attention forward, fused (attn::flash_attention_forward on
// strided heads) and plain (the book's bmm + masked softmax + bmm), without mask, with padded
// batches and causal.
#include "bench/attention_cases.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>

#include "attn/core/error.hpp"
#include "attn/core/random.hpp"
#include "attn/core/tensor.hpp"
#include "attn/core/valid_lengths.hpp"
#include "attn/kernels/flash_attention.hpp"
#include "attn/kernels/heads_view.hpp"
#include "attn/kernels/masked_softmax.hpp"
#include "attn/kernels/matmul.hpp"

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

double useful_flops(Mask mask, const AttentionShape& shape, const ValidLengths& padding) {
  const int64_t n = shape.queries, m = shape.keys;
  double visible = 0.0;  // Σ over batch and query of the keys the query sees
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      int64_t keys = padding.length(b, i, m);
      if (mask == Mask::kCausal) keys = std::min(keys, std::clamp<int64_t>(i + m - n + 1, 0, m));
      visible += static_cast<double>(keys);
    }
  }
  return 4.0 * static_cast<double>(shape.heads * shape.head_dim) * visible;
}

float default_scale(const AttentionShape& shape) {
  return 1.0F / std::sqrt(static_cast<float>(shape.head_dim));
}

// Fused: the multi-head layout (B, n, heads·d) read in place through split_heads.
PreparedCase prepare_fused(Mask mask, const AttentionShape& shape, uint64_t seed) {
  struct State {
    Tensor q, k, v, out;
    ValidLengths lengths;
    FlashAttentionOptions options;
    int64_t heads = 0;
  };
  auto state = std::make_shared<State>();
  Rng rng(seed);
  const int64_t width = shape.heads * shape.head_dim;
  state->q = random_tensor(Shape{shape.batch, shape.queries, width}, rng);
  state->k = random_tensor(Shape{shape.batch, shape.keys, width}, rng);
  state->v = random_tensor(Shape{shape.batch, shape.keys, width}, rng);
  state->out = Tensor(Shape{shape.batch, shape.queries, width});
  state->lengths = padding_lengths(mask, shape, seed);
  state->options = {default_scale(shape), mask == Mask::kCausal};
  state->heads = shape.heads;
  PreparedCase prepared;
  prepared.useful_flops = useful_flops(mask, shape, state->lengths);
  prepared.padding_lengths = state->lengths.values();
  prepared.run = [state] {
    const State& s = *state;
    flash_attention_forward(split_heads(s.q, s.heads, "queries"), split_heads(s.k, s.heads, "keys"),
                            split_heads(s.v, s.heads, "values"), s.lengths, s.options,
                            split_heads(state->out, s.heads, "out"));
  };
  return prepared;
}

// Plain: the book's code on (B·heads, n, d) tensors, materialising the (B·heads, n, m) scores.
PreparedCase prepare_plain(Mask mask, const AttentionShape& shape, uint64_t seed) {
  struct State {
    Tensor q, k, v, out;
    ValidLengths lengths;  // per (batch·head), as the book's repeat_interleave gives them
    float scale = 1.0F;
  };
  auto state = std::make_shared<State>();
  Rng rng(seed);
  const int64_t batch_heads = shape.batch * shape.heads;
  state->q = random_tensor(Shape{batch_heads, shape.queries, shape.head_dim}, rng);
  state->k = random_tensor(Shape{batch_heads, shape.keys, shape.head_dim}, rng);
  state->v = random_tensor(Shape{batch_heads, shape.keys, shape.head_dim}, rng);
  state->out = Tensor(Shape{batch_heads, shape.queries, shape.head_dim});
  const ValidLengths padding = padding_lengths(mask, shape, seed);
  state->lengths = padding.repeat_interleave(shape.heads);
  if (mask == Mask::kCausal) {
    state->lengths = state->lengths.with_causal_mask(batch_heads, shape.queries, shape.keys);
  }
  state->scale = default_scale(shape);
  PreparedCase prepared;
  prepared.useful_flops = useful_flops(mask, shape, padding);
  prepared.padding_lengths = padding.values();
  prepared.run = [state] {
    State& s = *state;
    Tensor scores(Shape{s.q.dim(0), s.q.dim(1), s.k.dim(1)});
    batched_matmul_transposed(s.q, s.k, scores);
    for (float& score : scores.span()) score *= s.scale;
    masked_softmax(scores, s.lengths, scores);
    batched_matmul(scores, s.v, s.out);
  };
  return prepared;
}

double score_bytes(const AttentionShape& shape) {
  return 4.0 * static_cast<double>(shape.batch * shape.heads) * static_cast<double>(shape.queries) *
         static_cast<double>(shape.keys);
}

AttentionCase dot_case(std::string name, std::string workload, Mask mask, bool fused) {
  AttentionCase entry;
  entry.name = std::move(name);
  entry.workload = std::move(workload);
  entry.path = fused ? "fused" : "plain";
  entry.uses_threads = fused;  // attn's plain matmuls and softmax are serial loops
  entry.working_set_bytes =
      fused
          ? std::function<double(const AttentionShape&)>([](const AttentionShape&) { return 0.0; })
          : score_bytes;
  entry.prepare = [mask, fused](const AttentionShape& shape, uint64_t seed) {
    return fused ? prepare_fused(mask, shape, seed) : prepare_plain(mask, shape, seed);
  };
  return entry;
}

}  // namespace

const std::vector<AttentionCase>& attention_cases() {
  static const std::vector<AttentionCase> cases = {
      dot_case("fused", "dot", Mask::kNone, true),
      dot_case("plain", "dot", Mask::kNone, false),
      dot_case("fused-padded", "dot-padded", Mask::kPadded, true),
      dot_case("plain-padded", "dot-padded", Mask::kPadded, false),
      dot_case("fused-causal", "dot-causal", Mask::kCausal, true),
      dot_case("plain-causal", "dot-causal", Mask::kCausal, false),
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
