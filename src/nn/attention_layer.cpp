// AttentionLayer: the shared pooling step (masked softmax → dropout → weighted sum) and input
// checks.
#include "attn/nn/attention_layer.hpp"

#include "attn/kernels/masked_softmax.hpp"
#include "attn/kernels/matmul.hpp"

namespace attn {

Tensor AttentionLayer::pool(Tensor scores, const ValidLengths& valid_lens, ConstTensorView values) {
  masked_softmax(scores, valid_lens, scores);
  attention_weights_ = scores;
  if (training_) dropout_.apply(scores);
  Tensor output(Shape{values.dim(0), scores.dim(1), values.dim(2)});
  batched_matmul(scores, values, output);
  return output;
}

void check_attention_inputs(ConstTensorView queries, ConstTensorView keys, ConstTensorView values) {
  require_rank("queries", queries.shape(), 3);
  require_rank("keys", keys.shape(), 3);
  require_rank("values", values.shape(), 3);
  require_dim("keys", keys.shape(), 0, queries.dim(0), "the batch size of queries");
  require_dim("values", values.shape(), 0, queries.dim(0), "the batch size of queries");
  require_dim("values", values.shape(), 1, keys.dim(1), "the number of keys");
}

}  // namespace attn
