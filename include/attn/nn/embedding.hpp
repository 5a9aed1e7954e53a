// Embedding: a lookup table of learned vectors, one row per token id, as PyTorch's nn.Embedding
// (its state-dict entry is "weight").
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attn/core/random.hpp"
#include "attn/core/tensor.hpp"
#include "attn/nn/state_dict.hpp"

namespace attn {

class Embedding {
 public:
  // weight (num_embeddings, embedding_dim) drawn from N(0, 1), nn.Embedding's default. ValueError
  // for a non-positive size.
  Embedding(int64_t num_embeddings, int64_t embedding_dim, Rng& rng);

  // The rows of `ids` in order: (ids.size(), embedding_dim). ValueError naming `name`, the
  // position and the id for an id outside [0, num_embeddings).
  Tensor forward(std::span<const int64_t> ids, std::string_view name = "ids") const;
  // Given the forward ids and grad (ids.size(), embedding_dim): weight_grad[ids[i]] += grad[i].
  void backward(std::span<const int64_t> ids, ConstTensorView grad);

  int64_t num_embeddings() const { return weight_.dim(0); }
  int64_t embedding_dim() const { return weight_.dim(1); }
  Tensor& weight() { return weight_; }
  const Tensor& weight() const { return weight_; }
  const Tensor& weight_grad() const { return weight_grad_; }

  // "prefix.weight".
  void append_parameters(const std::string& prefix, std::vector<NamedParameter>& parameters);

 private:
  void check_ids(std::span<const int64_t> ids, std::string_view name) const;

  Tensor weight_;
  Tensor weight_grad_;
};

}  // namespace attn
