// Gru: the layer-by-layer forward pass over a sequence and backpropagation through time, with the
// matrix products in dense_products.hpp.
#include "attn/nn/gru.hpp"

#include <algorithm>
#include <cmath>

#include "attn/core/error.hpp"
#include "dense_products.hpp"

namespace attn {

namespace {

float sigmoid(float x) {
  return 1.0F / (1.0F + std::exp(-x));
}

// The default view (shape (0)) means "start from zeros".
bool is_absent(ConstTensorView view) {
  return view.rank() == 1 && view.numel() == 0;
}

void require_state_shape(std::string_view name, ConstTensorView state, int64_t layers,
                         int64_t batch, int64_t hidden) {
  require_rank(name, state.shape(), 3);
  require_dim(name, state.shape(), 0, layers, "the GRU's number of layers");
  require_dim(name, state.shape(), 1, batch, "the batch size");
  require_dim(name, state.shape(), 2, hidden, "the GRU's hidden size");
}

}  // namespace

Gru::Gru(int64_t input_size, int64_t hidden_size, int64_t num_layers, float dropout, uint64_t seed)
    : input_size_(input_size), hidden_size_(hidden_size), dropout_(dropout, seed ^ 0x6a09e667ULL) {
  if (input_size <= 0 || hidden_size <= 0 || num_layers <= 0) {
    throw ValueError("Gru: expected positive input_size, hidden_size and num_layers, got " +
                     std::to_string(input_size) + ", " + std::to_string(hidden_size) + " and " +
                     std::to_string(num_layers));
  }
  Rng rng(seed);
  const float bound = 1.0F / std::sqrt(static_cast<float>(hidden_size));
  const int64_t gates = 3 * hidden_size;
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    const int64_t in = layer == 0 ? input_size : hidden_size;
    LayerParameters parameters{Tensor(Shape{gates, in}), Tensor(Shape{gates, hidden_size}),
                               Tensor(Shape{gates}),     Tensor(Shape{gates}),
                               Tensor(Shape{gates, in}), Tensor(Shape{gates, hidden_size}),
                               Tensor(Shape{gates}),     Tensor(Shape{gates})};
    // nn.GRU's order: weight_ih, weight_hh, bias_ih, bias_hh, layer by layer.
    for (Tensor* tensor :
         {&parameters.weight_ih, &parameters.weight_hh, &parameters.bias_ih, &parameters.bias_hh}) {
      for (float& value : tensor->span()) value = rng.uniform(-bound, bound);
    }
    layers_.push_back(std::move(parameters));
  }
}

GruOutput Gru::forward(ConstTensorView inputs, ConstTensorView initial_state, Trace& trace) {
  require_rank("inputs", inputs.shape(), 3);
  require_dim("inputs", inputs.shape(), 2, input_size_, "the GRU's input_size");
  const int64_t steps = inputs.dim(0), batch = inputs.dim(1), hidden = hidden_size_,
                gates = 3 * hidden, layers = num_layers();
  const bool has_initial_state = !is_absent(initial_state);
  if (has_initial_state) require_state_shape("initial_state", initial_state, layers, batch, hidden);

  trace.layers_.assign(static_cast<size_t>(layers), {});
  GruOutput result{Tensor(Shape{steps, batch, hidden}), Tensor(Shape{layers, batch, hidden})};
  Tensor layer_input = Tensor::from(inputs);
  Tensor transposed_ih, transposed_hh(Shape{hidden, gates});
  Tensor gates_x, gates_h(Shape{batch, gates});
  for (int64_t layer = 0; layer < layers; ++layer) {
    const LayerParameters& parameters = layers_[static_cast<size_t>(layer)];
    Trace::Layer& record = trace.layers_[static_cast<size_t>(layer)];
    const int64_t in = layer_input.dim(2);
    if (layer > 0 && training_ && dropout_.p() > 0.0F) {
      record.dropout_mask = dropout_.draw_mask(layer_input.shape());
      Dropout::apply_mask(layer_input, record.dropout_mask);
    }
    record.inputs = std::move(layer_input);
    record.states = Tensor(Shape{steps + 1, batch, hidden});
    record.reset = Tensor(Shape{steps, batch, hidden});
    record.update = Tensor(Shape{steps, batch, hidden});
    record.candidate = Tensor(Shape{steps, batch, hidden});
    record.hidden_new = Tensor(Shape{steps, batch, hidden});
    if (has_initial_state) {
      const float* source = initial_state.data() + layer * batch * hidden;
      std::copy(source, source + batch * hidden, record.states.data());
    }

    // The input contributions of every step at once: one (T·B, in) × (in, 3H) product.
    transposed_ih = Tensor(Shape{in, gates});
    detail::transpose(parameters.weight_ih.data(), transposed_ih.data(), gates, in);
    detail::transpose(parameters.weight_hh.data(), transposed_hh.data(), gates, hidden);
    gates_x = Tensor(Shape{steps * batch, gates});
    for (int64_t row = 0; row < steps * batch; ++row)
      std::copy(parameters.bias_ih.data(), parameters.bias_ih.data() + gates,
                gates_x.data() + row * gates);
    detail::add_product(record.inputs.data(), transposed_ih.data(), gates_x.data(), steps * batch,
                        in, gates);

    for (int64_t t = 0; t < steps; ++t) {
      const float* h_prev = record.states.data() + t * batch * hidden;
      float* h_next = record.states.data() + (t + 1) * batch * hidden;
      for (int64_t b = 0; b < batch; ++b)
        std::copy(parameters.bias_hh.data(), parameters.bias_hh.data() + gates,
                  gates_h.data() + b * gates);
      detail::add_product(h_prev, transposed_hh.data(), gates_h.data(), batch, hidden, gates);
      for (int64_t b = 0; b < batch; ++b) {
        const float* gx = gates_x.data() + (t * batch + b) * gates;
        const float* gh = gates_h.data() + b * gates;
        const int64_t offset = (t * batch + b) * hidden;
        for (int64_t j = 0; j < hidden; ++j) {
          const float r = sigmoid(gx[j] + gh[j]);
          const float z = sigmoid(gx[hidden + j] + gh[hidden + j]);
          const float hn = gh[2 * hidden + j];
          const float n = std::tanh(gx[2 * hidden + j] + r * hn);
          record.reset.data()[offset + j] = r;
          record.update.data()[offset + j] = z;
          record.candidate.data()[offset + j] = n;
          record.hidden_new.data()[offset + j] = hn;
          h_next[b * hidden + j] = (1.0F - z) * n + z * h_prev[b * hidden + j];
        }
      }
    }
    const float* last = record.states.data() + steps * batch * hidden;
    const float* first_output = record.states.data() + batch * hidden;
    std::copy(last, last + batch * hidden, result.state.data() + layer * batch * hidden);
    layer_input = Tensor(Shape{steps, batch, hidden});
    std::copy(first_output, last + batch * hidden, layer_input.data());
  }
  result.outputs = std::move(layer_input);
  return result;
}

// With g the gradient reaching h' (from the outputs and from the next step):
//   dn = g (1 − z),  dz = g (h − n),  dh = g z + [the hidden products' share below]
//   d(pre-n) = dn (1 − n²) → the input gate gradient of n, and r ⊙ d(pre-n) for W_hn h + b_hn
//   dr = d(pre-n) ⊙ (W_hn h + b_hn),  d(pre-r) = dr r (1 − r),  d(pre-z) = dz z (1 − z)
// The gate gradients of every step then give the weight gradients in two large products, and
// dx = dG_x W_ih, dh += dG_h W_hh.
GruGradients Gru::backward(const Trace& trace, ConstTensorView grad_outputs,
                           ConstTensorView grad_state) {
  if (trace.empty()) throw ValueError("Gru.backward: expected a forward pass first, got none");
  const int64_t layers = num_layers(), hidden = hidden_size_, gates = 3 * hidden;
  const Trace::Layer& top = trace.layers_.back();
  const int64_t steps = top.reset.dim(0), batch = top.reset.dim(1);
  if (grad_outputs.shape() != Shape{steps, batch, hidden}) {
    throw ShapeError("grad_outputs: expected shape " + Shape{steps, batch, hidden}.str() +
                     " (that of the forward pass's outputs), got shape " +
                     grad_outputs.shape().str());
  }
  const bool has_grad_state = !is_absent(grad_state);
  if (has_grad_state) require_state_shape("grad_state", grad_state, layers, batch, hidden);

  GruGradients result{Tensor(), Tensor(Shape{layers, batch, hidden})};
  Tensor grad_layer_outputs = Tensor::from(grad_outputs);
  Tensor grad_h(Shape{batch, hidden}), grad_h_next(Shape{batch, hidden});
  for (int64_t layer = layers - 1; layer >= 0; --layer) {
    LayerParameters& parameters = layers_[static_cast<size_t>(layer)];
    const Trace::Layer& record = trace.layers_[static_cast<size_t>(layer)];
    const int64_t in = record.inputs.dim(2);
    std::fill(grad_h.span().begin(), grad_h.span().end(), 0.0F);
    if (has_grad_state) {
      const float* source = grad_state.data() + layer * batch * hidden;
      std::copy(source, source + batch * hidden, grad_h.data());
    }
    Tensor grad_gates_x(Shape{steps * batch, gates});
    Tensor grad_gates_h(Shape{steps * batch, gates});
    for (int64_t t = steps - 1; t >= 0; --t) {
      const float* h_prev = record.states.data() + t * batch * hidden;
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t offset = (t * batch + b) * hidden;
        float* dgx = grad_gates_x.data() + (t * batch + b) * gates;
        float* dgh = grad_gates_h.data() + (t * batch + b) * gates;
        for (int64_t j = 0; j < hidden; ++j) {
          const float g = grad_h.data()[b * hidden + j] + grad_layer_outputs.data()[offset + j];
          const float r = record.reset.data()[offset + j];
          const float z = record.update.data()[offset + j];
          const float n = record.candidate.data()[offset + j];
          const float hn = record.hidden_new.data()[offset + j];
          const float d_pre_n = g * (1.0F - z) * (1.0F - n * n);
          const float d_pre_z = g * (h_prev[b * hidden + j] - n) * z * (1.0F - z);
          const float d_pre_r = d_pre_n * hn * r * (1.0F - r);
          dgx[j] = d_pre_r;
          dgx[hidden + j] = d_pre_z;
          dgx[2 * hidden + j] = d_pre_n;
          dgh[j] = d_pre_r;
          dgh[hidden + j] = d_pre_z;
          dgh[2 * hidden + j] = d_pre_n * r;
          grad_h_next.data()[b * hidden + j] = g * z;
        }
      }
      detail::add_product(grad_gates_h.data() + t * batch * gates, parameters.weight_hh.data(),
                          grad_h_next.data(), batch, gates, hidden);
      std::swap(grad_h, grad_h_next);
    }
    std::copy(grad_h.data(), grad_h.data() + batch * hidden,
              result.initial_state.data() + layer * batch * hidden);
    detail::add_transposed_product(grad_gates_h.data(), record.states.data(),
                                   parameters.weight_hh_grad.data(), steps * batch, gates, hidden);
    detail::add_row_sums(grad_gates_h.data(), parameters.bias_hh_grad.data(), steps * batch, gates);
    detail::add_transposed_product(grad_gates_x.data(), record.inputs.data(),
                                   parameters.weight_ih_grad.data(), steps * batch, gates, in);
    detail::add_row_sums(grad_gates_x.data(), parameters.bias_ih_grad.data(), steps * batch, gates);
    Tensor grad_inputs(Shape{steps, batch, in});
    detail::add_product(grad_gates_x.data(), parameters.weight_ih.data(), grad_inputs.data(),
                        steps * batch, gates, in);
    if (record.dropout_mask.numel() > 0) Dropout::apply_mask(grad_inputs, record.dropout_mask);
    grad_layer_outputs = std::move(grad_inputs);
  }
  result.inputs = std::move(grad_layer_outputs);
  return result;
}

void Gru::append_parameters(const std::string& prefix, std::vector<NamedParameter>& parameters) {
  const std::string head = prefix.empty() ? "" : prefix + ".";
  for (size_t layer = 0; layer < layers_.size(); ++layer) {
    LayerParameters& p = layers_[layer];
    const std::string suffix = "_l" + std::to_string(layer);
    parameters.push_back({head + "weight_ih" + suffix, &p.weight_ih, &p.weight_ih_grad});
    parameters.push_back({head + "weight_hh" + suffix, &p.weight_hh, &p.weight_hh_grad});
    parameters.push_back({head + "bias_ih" + suffix, &p.bias_ih, &p.bias_ih_grad});
    parameters.push_back({head + "bias_hh" + suffix, &p.bias_hh, &p.bias_hh_grad});
  }
}

std::vector<NamedParameter> Gru::parameters() {
  std::vector<NamedParameter> parameters;
  append_parameters("", parameters);
  return parameters;
}

StateDict Gru::state_dict() const {
  // parameters() hands out mutable pointers, but collecting only copies through them.
  return collect_state_dict(const_cast<Gru*>(this)->parameters());
}

void Gru::load_state_dict(const StateDict& state) {
  attn::load_state_dict(state, parameters(), "Gru");
}

}  // namespace attn
