// BahdanauDecoder: the attention step with keys projected once per batch, the GRU step, the dense
// layer, and backpropagation through all the steps in reverse.
#include "attn/seq2seq/decoder.hpp"

#include <algorithm>
#include <cmath>

#include "../nn/dense_products.hpp"
#include "attn/core/error.hpp"

namespace attn {

namespace {

// out (rows, out_features) = bias + x (rows, in) · Wᵀ, through a transposed copy of W so the inner
// loop is contiguous.
Tensor affine(const Linear& layer, const float* x, int64_t rows) {
  const int64_t in = layer.in_features(), out = layer.out_features();
  Tensor transposed(Shape{in, out});
  detail::transpose(layer.weight().data(), transposed.data(), out, in);
  Tensor y(Shape{rows, out});
  if (layer.has_bias()) {
    for (int64_t r = 0; r < rows; ++r)
      std::copy(layer.bias().data(), layer.bias().data() + out, y.data() + r * out);
  }
  detail::add_product(x, transposed.data(), y.data(), rows, in, out);
  return y;
}

}  // namespace

BahdanauDecoder::BahdanauDecoder(int64_t vocab_size, int64_t embed_size, int64_t num_hiddens,
                                 int64_t num_layers, float dropout, uint64_t seed)
    : init_rng_(seed),
      W_k_(num_hiddens, num_hiddens, false, init_rng_),
      W_q_(num_hiddens, num_hiddens, false, init_rng_),
      w_v_(num_hiddens, 1, false, init_rng_),
      embedding_(vocab_size, embed_size, init_rng_),
      rnn_(num_hiddens + embed_size, num_hiddens, num_layers, dropout, seed ^ 0xbb67ae85ULL),
      dense_(num_hiddens, vocab_size, true, init_rng_),
      attention_dropout_(dropout, seed ^ 0xa54ff53aULL) {}

void BahdanauDecoder::train(bool training) {
  training_ = training;
  rnn_.train(training);
}

void BahdanauDecoder::seed_dropout(uint64_t seed) {
  rnn_.seed_dropout(seed);
  attention_dropout_.seed(seed ^ 0xa54ff53aULL);
}

void BahdanauDecoder::begin(ConstTensorView enc_outputs, ConstTensorView enc_state,
                            std::span<const int64_t> valid_lens) {
  const int64_t hidden = num_hiddens();
  require_rank("enc_outputs", enc_outputs.shape(), 3);
  require_dim("enc_outputs", enc_outputs.shape(), 2, hidden, "the decoder's num_hiddens");
  const int64_t keys = enc_outputs.dim(0), batch = enc_outputs.dim(1);
  require_rank("enc_state", enc_state.shape(), 3);
  require_dim("enc_state", enc_state.shape(), 0, rnn_.num_layers(), "the decoder's num_layers");
  require_dim("enc_state", enc_state.shape(), 1, batch, "the batch size of enc_outputs");
  require_dim("enc_state", enc_state.shape(), 2, hidden, "the decoder's num_hiddens");
  if (static_cast<int64_t>(valid_lens.size()) != batch) {
    throw ShapeError("valid_lens: expected " + std::to_string(batch) +
                     " lengths (one per batch element), got " + std::to_string(valid_lens.size()));
  }
  for (size_t b = 0; b < valid_lens.size(); ++b) {
    if (valid_lens[b] < 0 || valid_lens[b] > keys) {
      throw ValueError("valid_lens: expected lengths in [0, " + std::to_string(keys) + "], got " +
                       std::to_string(valid_lens[b]) + " at index " + std::to_string(b));
    }
  }
  keys_ = Tensor(Shape{batch, keys, hidden});
  for (int64_t j = 0; j < keys; ++j)
    for (int64_t b = 0; b < batch; ++b)
      std::copy(&enc_outputs(j, b, 0), &enc_outputs(j, b, 0) + hidden, &keys_(b, j, 0));
  projected_keys_ = affine(W_k_, keys_.data(), batch * keys);
  projected_keys_.reshape(Shape{batch, keys, W_k_.out_features()});
  valid_lens_.assign(valid_lens.begin(), valid_lens.end());
  hidden_ = Tensor::from(enc_state);
  steps_.clear();
  begun_ = true;
}

Tensor BahdanauDecoder::step(std::span<const int64_t> tokens) {
  if (!begun_) throw ValueError("BahdanauDecoder.step: expected begin() first, got none");
  const int64_t batch = keys_.dim(0), keys = keys_.dim(1), hidden = num_hiddens(),
                attention_size = W_q_.out_features(), layers = rnn_.num_layers();
  if (static_cast<int64_t>(tokens.size()) != batch) {
    throw ShapeError("tokens: expected " + std::to_string(batch) +
                     " ids (one per batch element), got " + std::to_string(tokens.size()));
  }
  StepRecord record;
  record.tokens.assign(tokens.begin(), tokens.end());
  record.query = Tensor(Shape{batch, hidden});
  std::copy(hidden_.data() + (layers - 1) * batch * hidden,
            hidden_.data() + layers * batch * hidden, record.query.data());
  const Tensor projected_query = affine(W_q_, record.query.data(), batch);

  // Additive attention: score_j = w_vᵀ tanh(W_q q + W_k k_j), softmax over the valid keys.
  record.features = Tensor(Shape{batch, keys, attention_size});
  record.weights = Tensor(Shape{batch, keys});
  const float* w_v = w_v_.weight().data();
  std::vector<float> scores(static_cast<size_t>(keys));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t length = valid_lens_[static_cast<size_t>(b)];
    const float* q = projected_query.data() + b * attention_size;
    float highest = -INFINITY;
    for (int64_t j = 0; j < length; ++j) {
      const float* k = &projected_keys_(b, j, 0);
      float* u = &record.features(b, j, 0);
      float score = 0.0F;
      for (int64_t t = 0; t < attention_size; ++t) {
        u[t] = std::tanh(q[t] + k[t]);
        score += w_v[t] * u[t];
      }
      scores[static_cast<size_t>(j)] = score;
      highest = std::max(highest, score);
    }
    float total = 0.0F;
    for (int64_t j = 0; j < length; ++j) {
      const float e = std::exp(scores[static_cast<size_t>(j)] - highest);
      record.weights(b, j) = e;
      total += e;
    }
    for (int64_t j = 0; j < length; ++j) record.weights(b, j) /= total;
  }
  if (training_ && attention_dropout_.p() > 0.0F)
    record.dropout_mask = attention_dropout_.draw_mask(record.weights.shape());

  // GRU input: [context, embedding], as the book's torch.cat((context, x), dim=-1).
  const int64_t embed = embedding_.embedding_dim();
  const Tensor embedded = embedding_.forward(tokens, "tokens");
  Tensor input(Shape{1, batch, hidden + embed});
  for (int64_t b = 0; b < batch; ++b) {
    float* context = &input(0, b, 0);
    const int64_t length = valid_lens_[static_cast<size_t>(b)];
    for (int64_t j = 0; j < length; ++j) {
      float weight = record.weights(b, j);
      if (record.dropout_mask.numel() > 0) weight *= record.dropout_mask(b, j);
      const float* value = &keys_(b, j, 0);
      for (int64_t t = 0; t < hidden; ++t) context[t] += weight * value[t];
    }
    std::copy(&embedded(b, 0), &embedded(b, 0) + embed, context + hidden);
  }
  GruOutput next = rnn_.forward(input, hidden_, record.gru);
  hidden_ = std::move(next.state);
  record.output = std::move(next.outputs);
  record.output.reshape(Shape{batch, hidden});
  Tensor logits = affine(dense_, record.output.data(), batch);
  steps_.push_back(std::move(record));
  return logits;
}

Tensor BahdanauDecoder::forward(std::span<const int64_t> inputs, int64_t steps) {
  if (!begun_) throw ValueError("BahdanauDecoder.forward: expected begin() first, got none");
  const int64_t batch = keys_.dim(0), vocab = vocab_size();
  if (steps < 0 || static_cast<int64_t>(inputs.size()) != batch * steps) {
    throw ShapeError("inputs: expected batch × steps = " + std::to_string(batch) + " × " +
                     std::to_string(steps) + " ids, got " + std::to_string(inputs.size()));
  }
  Tensor logits(Shape{batch, steps, vocab});
  std::vector<int64_t> column(static_cast<size_t>(batch));
  for (int64_t t = 0; t < steps; ++t) {
    for (int64_t b = 0; b < batch; ++b)
      column[static_cast<size_t>(b)] = inputs[static_cast<size_t>(b * steps + t)];
    const Tensor step_logits = step(column);
    for (int64_t b = 0; b < batch; ++b)
      std::copy(&step_logits(b, 0), &step_logits(b, 0) + vocab, &logits(b, t, 0));
  }
  return logits;
}

// Step t, in reverse: the dense layer's backward gives d(output); the GRU's gives d(input) and the
// gradient of the state before the step; d(input) splits into d(context) and d(embedding). With
// c = Σ_j a_j D_j v_j (D the dropout multipliers), dv_j += a_j D_j dc and da_j = D_j (dc · v_j);
// the softmax backward gives ds_j = a_j (da_j − Σ_k a_k da_k); with u = tanh(W_q q + W_k k_j),
// dw_v += ds_j u, d(W_q q) += ds_j w_v ⊙ (1 − u²) and likewise d(W_k k_j). The query was the top
// layer's previous state, so W_q's backward adds to that state's gradient. W_k's backward runs
// once after all steps, on the summed gradient of the projected keys.
BahdanauDecoder::Gradients BahdanauDecoder::backward(ConstTensorView grad_logits) {
  if (steps_.empty())
    throw ValueError("BahdanauDecoder.backward: expected decoding steps first, got none");
  const int64_t batch = keys_.dim(0), keys = keys_.dim(1), hidden = num_hiddens(),
                attention_size = W_q_.out_features(), layers = rnn_.num_layers(),
                vocab = vocab_size(), steps = steps_taken(), embed = embedding_.embedding_dim();
  const Shape expected{batch, steps, vocab};
  if (grad_logits.shape() != expected) {
    throw ShapeError("grad_logits: expected shape " + expected.str() +
                     " (batch, steps since begin(), vocabulary), got shape " +
                     grad_logits.shape().str());
  }
  Tensor grad_keys(keys_.shape());
  Tensor grad_projected_keys(projected_keys_.shape());
  Tensor grad_state(Shape{layers, batch, hidden});
  Tensor grad_w_v(Shape{1, attention_size});
  Tensor grad_step_logits(Shape{batch, vocab});
  const float* w_v = w_v_.weight().data();
  std::vector<float> grad_weights(static_cast<size_t>(keys));
  for (int64_t t = steps - 1; t >= 0; --t) {
    const StepRecord& record = steps_[static_cast<size_t>(t)];
    for (int64_t b = 0; b < batch; ++b)
      std::copy(&grad_logits(b, t, 0), &grad_logits(b, t, 0) + vocab, &grad_step_logits(b, 0));
    Tensor grad_output = dense_.backward(record.output, grad_step_logits);
    grad_output.reshape(Shape{1, batch, hidden});
    GruGradients grads = rnn_.backward(record.gru, grad_output, grad_state);
    grad_state = std::move(grads.initial_state);

    Tensor grad_embedded(Shape{batch, embed});
    Tensor grad_projected_query(Shape{batch, attention_size});
    for (int64_t b = 0; b < batch; ++b) {
      const float* grad_context = &grads.inputs(0, b, 0);
      std::copy(grad_context + hidden, grad_context + hidden + embed, &grad_embedded(b, 0));
      const int64_t length = valid_lens_[static_cast<size_t>(b)];
      float weighted_sum = 0.0F;
      for (int64_t j = 0; j < length; ++j) {
        const float mask = record.dropout_mask.numel() > 0 ? record.dropout_mask(b, j) : 1.0F;
        const float* value = &keys_(b, j, 0);
        float* grad_value = &grad_keys(b, j, 0);
        const float dropped = record.weights(b, j) * mask;
        float dot = 0.0F;
        for (int64_t i = 0; i < hidden; ++i) {
          dot += grad_context[i] * value[i];
          grad_value[i] += dropped * grad_context[i];
        }
        grad_weights[static_cast<size_t>(j)] = dot * mask;
        weighted_sum += record.weights(b, j) * grad_weights[static_cast<size_t>(j)];
      }
      float* grad_q = &grad_projected_query(b, 0);
      for (int64_t j = 0; j < length; ++j) {
        const float grad_score =
            record.weights(b, j) * (grad_weights[static_cast<size_t>(j)] - weighted_sum);
        if (grad_score == 0.0F) continue;
        const float* u = &record.features(b, j, 0);
        float* grad_k = &grad_projected_keys(b, j, 0);
        for (int64_t i = 0; i < attention_size; ++i) {
          grad_w_v.data()[i] += grad_score * u[i];
          const float grad_pre = grad_score * w_v[i] * (1.0F - u[i] * u[i]);
          grad_q[i] += grad_pre;
          grad_k[i] += grad_pre;
        }
      }
    }
    embedding_.backward(record.tokens, grad_embedded);
    const Tensor grad_query = W_q_.backward(record.query, grad_projected_query);
    float* top = grad_state.data() + (layers - 1) * batch * hidden;
    for (int64_t index = 0; index < batch * hidden; ++index) top[index] += grad_query.data()[index];
  }
  w_v_.accumulate_weight_grad(grad_w_v);
  const Tensor grad_keys_projection = W_k_.backward(keys_, grad_projected_keys);
  Gradients result{Tensor(Shape{keys, batch, hidden}), std::move(grad_state)};
  for (int64_t j = 0; j < keys; ++j) {
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t i = 0; i < hidden; ++i)
        result.enc_outputs(j, b, i) = grad_keys(b, j, i) + grad_keys_projection(b, j, i);
    }
  }
  return result;
}

Tensor BahdanauDecoder::attention_weights() const {
  if (!begun_) return Tensor(Shape{0, 0, 0});
  const int64_t batch = keys_.dim(0), keys = keys_.dim(1);
  Tensor weights(Shape{steps_taken(), batch, keys});
  for (size_t t = 0; t < steps_.size(); ++t)
    std::copy(steps_[t].weights.data(), steps_[t].weights.data() + batch * keys,
              weights.data() + static_cast<int64_t>(t) * batch * keys);
  return weights;
}

void BahdanauDecoder::append_parameters(const std::string& prefix,
                                        std::vector<NamedParameter>& parameters) {
  W_k_.append_parameters(prefix + ".attention.W_k", parameters);
  W_q_.append_parameters(prefix + ".attention.W_q", parameters);
  w_v_.append_parameters(prefix + ".attention.w_v", parameters);
  embedding_.append_parameters(prefix + ".embedding", parameters);
  rnn_.append_parameters(prefix + ".rnn", parameters);
  dense_.append_parameters(prefix + ".dense", parameters);
}

}  // namespace attn
