// Fuzz target: the state-dict loader. The bytes are read as a safetensors file, and its tensors
// are loaded, strictly, into each layer that takes parameters — built from the file's own shapes,
// as `attn run` and attn.load() build them — which then runs a forward and a backward pass on small
// inputs: a loaded layer must give finite outputs and gradients or refuse with attn's error.
#include <optional>

#include "attn/core/random.hpp"
#include "attn/io/safetensors.hpp"
#include "attn/nn/additive_attention.hpp"
#include "attn/nn/general_attention.hpp"
#include "attn/nn/multi_head_attention.hpp"
#include "fuzz_support.hpp"

namespace {

using attn::Shape;
using attn::StateDict;
using attn::Tensor;

// A parameter the layer's sizes are read from: a non-empty matrix, or nothing.
std::optional<Shape> matrix_shape(const StateDict& state, const std::string& name) {
  const auto found = state.find(name);
  if (found == state.end() || found->second.rank() != 2 || found->second.numel() == 0) return {};
  return found->second.shape();
}

Tensor inputs(const Shape& shape, attn::Rng& rng) {
  Tensor tensor(shape);
  for (float& value : tensor.span()) value = rng.uniform(-1.0F, 1.0F);
  return tensor;
}

// Forward and backward on (1, 2, query_size) queries and (1, 3, ·) keys and values, in evaluation
// mode; every output must be finite (the layer's attn::Error is an accepted refusal).
template <class Layer>
void run_layer(Layer& layer, int64_t query_size, int64_t key_size, int64_t value_size) {
  attn::Rng rng(7);
  const Tensor queries = inputs(Shape{1, 2, query_size}, rng);
  const Tensor keys = inputs(Shape{1, 3, key_size}, rng);
  const Tensor values = inputs(Shape{1, 3, value_size}, rng);
  layer.eval();
  const Tensor output = layer(queries, keys, values);
  attn::fuzz::require_finite_output(output, "a finite layer gave a non-finite output");
  const attn::AttentionGradients grads = layer.backward(Tensor::full(output.shape(), 1.0F));
  attn::fuzz::require_finite_output(grads.queries, "non-finite query gradient");
  attn::fuzz::require_finite_output(grads.keys, "non-finite key gradient");
  attn::fuzz::require_finite_output(grads.values, "non-finite value gradient");
}

void multi_head(const StateDict& state) {
  const auto W_q = matrix_shape(state, "W_q.weight");
  const auto W_k = matrix_shape(state, "W_k.weight");
  const auto W_v = matrix_shape(state, "W_v.weight");
  if (!W_q || !W_k || !W_v) return;
  const int64_t hidden = (*W_q)[0];
  attn::MultiHeadAttention layer((*W_k)[1], (*W_q)[1], (*W_v)[1], hidden, hidden % 2 == 0 ? 2 : 1,
                                 0.0F, state.contains("W_q.bias"));
  layer.load_state_dict(state);
  run_layer(layer, (*W_q)[1], (*W_k)[1], (*W_v)[1]);
}

void additive(const StateDict& state) {
  const auto W_q = matrix_shape(state, "W_q.weight");
  const auto W_k = matrix_shape(state, "W_k.weight");
  if (!W_q || !W_k) return;
  attn::AdditiveAttention layer((*W_k)[1], (*W_q)[1], (*W_q)[0], 0.0F);
  layer.load_state_dict(state);
  run_layer(layer, (*W_q)[1], (*W_k)[1], 2);
}

void general(const StateDict& state) {
  const auto W = matrix_shape(state, "W.weight");
  if (!W) return;
  attn::GeneralAttention layer((*W)[1], (*W)[0]);
  layer.load_state_dict(state);
  run_layer(layer, (*W)[1], (*W)[0], 2);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  StateDict state;
  attn::fuzz::refuse_only_with_attn_errors(
      [&] { state = attn::parse_safetensors(attn::fuzz::bytes_of(data, size), "fuzz.st"); });
  if (state.empty()) return 0;
  // Each layer separately: one refusing the file says nothing about the others.
  attn::fuzz::refuse_only_with_attn_errors([&] { multi_head(state); });
  attn::fuzz::refuse_only_with_attn_errors([&] { additive(state); });
  attn::fuzz::refuse_only_with_attn_errors([&] { general(state); });
  return 0;
}
