// Embedding: initialisation, row lookup and the scatter-add of its backward pass.
#include "attn/nn/embedding.hpp"

#include <algorithm>

#include "attn/core/error.hpp"

namespace attn {

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, Rng& rng) {
  if (num_embeddings <= 0 || embedding_dim <= 0) {
    throw ValueError("Embedding: expected positive num_embeddings and embedding_dim, got " +
                     std::to_string(num_embeddings) + " and " + std::to_string(embedding_dim));
  }
  weight_ = Tensor(Shape{num_embeddings, embedding_dim});
  weight_grad_ = Tensor(weight_.shape());
  for (float& value : weight_.span()) value = rng.normal();
}

void Embedding::check_ids(std::span<const int64_t> ids, std::string_view name) const {
  for (size_t position = 0; position < ids.size(); ++position) {
    if (ids[position] < 0 || ids[position] >= num_embeddings()) {
      throw ValueError(std::string(name) + ": expected ids in [0, " +
                       std::to_string(num_embeddings()) + "), got " +
                       std::to_string(ids[position]) + " at position " + std::to_string(position));
    }
  }
}

Tensor Embedding::forward(std::span<const int64_t> ids, std::string_view name) const {
  check_ids(ids, name);
  const int64_t dim = embedding_dim();
  Tensor rows(Shape{static_cast<int64_t>(ids.size()), dim});
  for (size_t position = 0; position < ids.size(); ++position) {
    const float* source = weight_.data() + ids[position] * dim;
    std::copy(source, source + dim, rows.data() + static_cast<int64_t>(position) * dim);
  }
  return rows;
}

void Embedding::backward(std::span<const int64_t> ids, ConstTensorView grad) {
  check_ids(ids, "ids");
  const int64_t dim = embedding_dim();
  if (grad.numel() != static_cast<int64_t>(ids.size()) * dim || grad.rank() < 1 ||
      grad.dim(-1) != dim) {
    throw ShapeError("Embedding.backward: grad expected " + std::to_string(ids.size()) +
                     " rows of " + std::to_string(dim) + " (one per id), got shape " +
                     grad.shape().str());
  }
  for (size_t position = 0; position < ids.size(); ++position) {
    const float* row = grad.data() + static_cast<int64_t>(position) * dim;
    float* target = weight_grad_.data() + ids[position] * dim;
    for (int64_t j = 0; j < dim; ++j) target[j] += row[j];
  }
}

void Embedding::append_parameters(const std::string& prefix,
                                  std::vector<NamedParameter>& parameters) {
  parameters.push_back({prefix + ".weight", &weight_, &weight_grad_});
}

}  // namespace attn
